"""Training of :class:`PointerSentinelLSTM` on a token stream (PTB, WikiText).

Truncated BPTT follows Merity et al.'s Algorithm 1: every ``k1`` tokens, backpropagate through
the last ``k2`` (``k1 = k2 = bptt`` by default; the paper's ``k1 = 1, k2 = L`` is one option).
The pointer's window must hold outputs of the *current* parameters: with
``window_refresh="regenerate"`` (default) each step re-runs, without gradient, the
``max(0, L - 1 - (k2 - k1))`` positions the window reaches before the backpropagated span,
from the carried LSTM state. Cost per step: that prefix (forward only) plus k2 positions
(forward and backward) for k1 trained tokens. ``"stale"`` (k1 = k2 only) reuses the previous
step's outputs: no extra cost, one update out of date. The carried LSTM state itself is, as
in every truncated BPTT, from the previous step.

Training runs on :func:`gencraft.training.fit` through its steps protocol: ``fit`` keeps the
loop, budgets, checkpoints and resumption; :class:`PointerTrainer` makes each step's loss from
the carried state, keeps that state (gathered from every process at each checkpoint) and, after
each validation, applies the plateau rule (halve the learning rate, revert to the best weights
on request, stop). Several processes (``accelerate launch``) each take a contiguous share of
the B streams; dropout masks are drawn for all B streams and sliced, so a run's steps do not
depend on the process count and a run resumes on another one.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gencraft.data.lm import LMCorpus
from gencraft.errors import GencraftError
from gencraft.pointer.config import TrainConfig
from gencraft.pointer.evaluate import detach_state, evaluate
from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.training import (
    FitResult,
    PlateauSchedule,
    Step,
    Steps,
    Validated,
    batchify,
    fit,
    make_accelerator,
    tbptt_schedule,
    write_json,
)

MEDIUM_K1 = 1
"""k1 for ``--preset medium`` when none is given: the paper's schedule (k1 = 1, k2 = 100)."""


def preset_k1(preset: str, k1: int | None) -> int | None:
    """The k1 a run uses: the one given, else the paper's schedule for the paper's (medium)
    model, else None (k1 = k2)."""
    return MEDIUM_K1 if k1 is None and preset == "medium" else k1


class PointerTrainer(Steps):
    """Trains a :class:`PointerSentinelLSTM` on ``corpus`` and writes to ``output_dir``
    the one run format of :mod:`gencraft.training.run`: ``checkpoint/`` (resumable),
    ``best/`` (best validation model) and ``last/`` (the final one), both
    ``from_pretrained``-able, ``history.json``, ``train_summary.json`` and
    ``train_config.json``. It is :func:`fit`'s plug-in (:class:`~gencraft.training.Steps`)."""

    owns_learning_rate = True
    epochs_flag = "--max-epochs"

    def __init__(
        self,
        model: PointerSentinelLSTM,
        corpus: LMCorpus,
        config: TrainConfig,
        output_dir: str | Path,
        *,
        progress: bool = True,
        accelerator: Any = None,
    ) -> None:
        self._check(model, corpus)
        self.config, self.corpus, self.progress = config, corpus, progress
        self.output_dir = Path(output_dir)
        self.accelerator = accelerator or make_accelerator(config.mixed_precision, config.device)
        acc = self.accelerator
        if config.batch_size % acc.num_processes:
            raise GencraftError(
                f"batch_size {config.batch_size} is not divisible by {acc.num_processes} processes"
            )
        from gencraft.models.placement import check_dtype

        dtype = check_dtype(config.dtype, acc.device)
        if dtype is not None:  # the LSTM stays float32 (gencraft.pointer.rnn)
            model = model.to(dtype)
        torch.manual_seed(config.seed)
        streams = batchify(corpus["train"], config.batch_size, "the train split", "--batch-size")
        share = config.batch_size // acc.num_processes  # a contiguous share of the streams
        self.rows = slice(acc.process_index * share, (acc.process_index + 1) * share)
        self.streams = streams[self.rows].to(acc.device)  # [B / processes, N]
        self.global_batch = config.batch_size
        self.n = self.streams.shape[1] - 1
        optimizer = torch.optim.SGD if config.optimizer == "sgd" else torch.optim.Adam
        self.model = model.to(acc.device)
        self.optimizer = optimizer(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        if acc.device.type == "cpu":
            # the softmax gradient is full of denormals, which make CPU matmuls up to 20x slower
            torch.set_flush_denormal(True)
        self.last_nll: torch.Tensor | None = None
        self.schedule = PlateauSchedule(decay=config.lr_decay, patience=config.patience)
        self.trained_tokens = 0
        self.carry: Any = None  # LSTM state at the next step's start, (h, c) [layers, B, H]
        self.memory: Any = None  # (outputs [B, L-1, H], ids [B, L-1]) for window_refresh="stale"
        self.result: FitResult | None = None
        self._schedule_steps = self.steps()

    @staticmethod
    def _check(model: PointerSentinelLSTM, corpus: LMCorpus) -> None:
        if len(corpus.vocab) != model.config.vocab_size:
            raise GencraftError(
                f"vocabulary mismatch: the model has {model.config.vocab_size} words, corpus "
                f"{corpus.name!r} has {len(corpus.vocab)}"
            )
        for split in ("train", "valid"):
            if split not in corpus.splits:
                raise GencraftError(f"corpus {corpus.name!r} has no {split!r} split loaded")

    @property
    def raw_model(self) -> PointerSentinelLSTM:
        return self.accelerator.unwrap_model(self.model)

    def _prefix(self) -> int:
        m = self.raw_model
        if not m.config.pointer or self.config.window_refresh == "stale":
            return 0
        return m.config.window - 1

    def steps(self) -> list[Step]:
        return list(tbptt_schedule(self.n, self.config.step_tokens, self.config.k2, self._prefix()))

    # -- the steps protocol ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._schedule_steps)

    def loss(self, model: torch.nn.Module, index: int) -> torch.Tensor:
        """The loss of the epoch's ``index``-th truncated-BPTT step (``fit`` backpropagates)."""
        return self.step_loss(model, self._schedule_steps[index])

    def end_epoch(self) -> None:
        self.carry = self.memory = None  # each epoch starts the streams afresh

    def state_dict(self) -> dict[str, Any]:
        """The carried state of every process's streams (gathered: [.., B, ..]), the plateau
        rule and the token count."""
        return {
            "carry": _gather_rows(self.accelerator, self.carry, dim=1),
            "memory": _gather_rows(self.accelerator, self.memory, dim=0),
            "schedule": self.schedule.state_dict(),
            "trained_tokens": self.trained_tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.accelerator.device
        self.carry = _rows(state["carry"], self.rows, dim=1, device=dev)
        self.memory = _rows(state["memory"], self.rows, dim=0, device=dev)
        self.schedule.load_state_dict(state["schedule"])
        self.trained_tokens = state["trained_tokens"]

    def after_validation(self, event: Validated) -> bool:
        """The plateau rule: halve the learning rate on a worse validation (optionally
        reverting to the best weights); True (stop) after ``patience`` without a new best.
        The row records the learning rate that led to it."""
        improved, decay, stop = self.schedule.step(event.value)
        event.row["lr"] = lr = float(event.optimizer.param_groups[0]["lr"])
        event.row["train_tokens_per_s"] = self.trained_tokens / max(event.row["train_time"], 1e-9)
        if decay:
            for group in event.optimizer.param_groups:
                group["lr"] = lr * self.config.lr_decay
            if self.config.revert_on_worse and not improved:
                self._revert_to_best(event)
        return stop

    def _revert_to_best(self, event: Validated) -> None:
        """Continue from the best weights so far, with the (already lowered) learning rate, a
        fresh optimizer state and fresh recurrent state: a diverged update is undone."""
        best = PointerSentinelLSTM.from_pretrained(self.output_dir / "best")
        event.model.load_state_dict(best.state_dict())
        getattr(event.optimizer, "optimizer", event.optimizer).state.clear()
        self.carry = self.memory = None
        event.row["reverted_to_best"] = True

    # -- one step -------------------------------------------------------------------------
    def _masks(self, m: PointerSentinelLSTM) -> dict[str, Any]:
        """Locked-dropout masks of this process's streams: drawn for all B, then sliced, so
        that a stream's masks do not depend on the process count."""
        masks = m.sample_masks(self.global_batch, self.streams.device)

        def mine(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[self.rows]

        return {"layers": [mine(t) for t in masks["layers"]], "output": mine(masks["output"])}

    def step_loss(self, model: torch.nn.Module, st: Step) -> torch.Tensor:
        """Forward one step with the carried state and window, update that state, and return
        the loss (cross-entropy [+ the pointer loss]) to backpropagate."""
        cfg, m, data = self.config, self.raw_model, self.streams
        masks = self._masks(m)
        state, memory, memory_ids, kept = self.carry, None, None, None
        if st.grad_start > st.start:  # regenerate the window with the current parameters
            with torch.no_grad():
                keep = st.keep if st.keep <= st.grad_start - st.start else None
                memory, state, kept = m.encode(
                    data[:, st.start : st.grad_start], state, masks=masks, keep_state_at=keep
                )
            memory_ids = data[:, st.start : st.grad_start]
        elif self.memory is not None:
            memory, memory_ids = self.memory
        x = data[:, st.grad_start : st.end]
        y = data[:, st.loss_start + 1 : st.end + 1]
        keep_in_grad = st.keep - (st.grad_start - st.start) if kept is None else None
        out = model(
            x,
            y,
            state,
            memory=memory,
            memory_ids=memory_ids,
            masks=masks,
            keep_state_at=keep_in_grad,
        )
        self.last_nll = out.nll.detach()  # [B, k1], for inspection
        loss = out.nll.mean()
        if out.pointer_nll is not None and cfg.pointer_loss_weight:
            loss = loss + cfg.pointer_loss_weight * out.pointer_nll.mean()
        self.carry = detach_state(kept if kept is not None else out.kept_state)
        if cfg.window_refresh == "stale" and m.config.pointer and m.config.window > 1:
            self._keep_stale(out.outputs.detach(), x, m.config.window - 1)
        self.trained_tokens += y.numel() * self.accelerator.num_processes
        return loss

    def _keep_stale(self, outs: torch.Tensor, ids: torch.Tensor, keep: int) -> None:
        """The last ``keep`` outputs [B, keep, H] and ids, the next step's stale window."""
        if self.memory is not None:
            outs = torch.cat([self.memory[0], outs], 1)
            ids = torch.cat([self.memory[1], ids], 1)
        self.memory = (outs[:, -keep:], ids[:, -keep:])

    def train_step(self, st: Step) -> float:
        """One step outside :func:`fit` (the throughput benchmark, tests): ``step_loss``,
        backward, clipping, the optimizer step. Returns the mean cross-entropy."""
        self.model.train()
        with self.accelerator.autocast():  # a no-op without mixed precision
            loss = self.step_loss(self.model, st)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip)
        self.optimizer.step()
        return float(self.last_nll.mean())

    # -- the run --------------------------------------------------------------------------
    def validate(self, split: str = "valid") -> dict[str, Any]:
        return evaluate(
            self.raw_model,
            self.corpus[split],
            batch_size=self.config.eval_batch_size,
            bptt=self.config.bptt,
            progress=self.progress,
            desc=split,
            flag="--eval-batch-size",
        )

    def _valid_metrics(self, model: torch.nn.Module, loader: Any) -> dict[str, float]:
        res = self.validate("valid")
        return {"loss": res["nll"] / res["tokens"], "ppl": res["ppl"]}

    def train(self, resume: bool = True, restart: bool = False) -> list[dict[str, Any]]:
        """Train until a budget runs out or validation stops improving; returns the history.
        A re-run resumes (``resume=False`` or ``restart=True`` starts over); Ctrl-C saves a
        checkpoint and raises :class:`~gencraft.training.Interrupted`."""
        started = time.perf_counter()
        if self.accelerator.is_main_process:
            write_json(self.output_dir / "train_config.json", asdict(self.config))
        settings = {"model_config": self.raw_model.config.to_dict(), **asdict(self.config)}
        self.result = fit(
            self.model,
            self.optimizer,
            self,
            config=self.config.fit_config(),
            output_dir=self.output_dir,
            evaluate_fn=self._valid_metrics,
            save_fn=lambda model, d: model.save_pretrained(d),
            settings=settings,
            accelerator=self.accelerator,
            resume=resume,
            restart=restart,
            progress=self.progress,
        )
        self.result.write_summary(self.output_dir, started)
        return self.result.history

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.result.history if self.result is not None else []

    @property
    def global_step(self) -> int:
        return self.result.steps if self.result is not None else 0

    @property
    def epoch(self) -> int:
        return int(self.result.epochs_done) if self.result is not None else 0

    @property
    def train_time(self) -> float:
        return self.result.train_time if self.result is not None else 0.0

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


def _gather_rows(acc: Any, tensors: tuple[torch.Tensor, ...] | None, dim: int) -> Any:
    """Every process's rows of ``tensors`` (batch on ``dim``) in stream order, on the CPU."""
    if tensors is None:
        return None
    out = []
    for t in tensors:
        if acc.num_processes > 1:
            t = acc.gather(t.movedim(dim, 0).contiguous()).movedim(0, dim)
        out.append(t.cpu())
    return tuple(out)


def _rows(tensors: Any, rows: slice, dim: int, device: torch.device) -> Any:
    """This process's ``rows`` of saved, gathered tensors."""
    if tensors is None:
        return None
    index = (slice(None),) * dim + (rows,)
    return tuple(t[index].to(device) for t in tensors)


def train_head(
    head: Any,
    blocks: dict[str, torch.Tensor],
    output_dir: str | Path,
    *,
    config: Any,
    lr: float = 1e-3,
    settings: dict[str, Any] | None = None,
    progress: bool = True,
    restart: bool = False,
) -> FitResult:
    """The recipe for a :class:`~gencraft.pointer.PointerSentinelHead` on a pretrained LM:
    the base frozen, the H² + 2H pointer parameters trained with Adam (``lr``) on the
    ``blocks["train"]`` [N, T] token blocks through :func:`gencraft.training.fit`
    (``config``: a :class:`~gencraft.training.FitConfig`; budgets, checkpoints, resumption),
    ``best/`` picked by the mean NLL on ``blocks["valid"]``. ``settings``: what else defines
    the run (the model, corpus, block size), compared on resume and saved beside the head
    (``run_settings.json``: ``pointer eval`` reads its corpus there)."""
    from gencraft.training.run import RUN_SETTINGS

    params = [p for p in head.parameters() if p.requires_grad]
    if not params:
        raise GencraftError("the pointer head has no trainable parameters")

    recorded = {"head": {**(settings or {}), "lr": lr, "window": head.window}}

    def loss_fn(model: Any, batch: torch.Tensor) -> torch.Tensor:  # batch: [B, T] token ids
        return model(batch).loss

    def save_fn(model: Any, directory: Path) -> None:  # the head, and what its run was
        model.save_pretrained(directory)
        write_json(directory / RUN_SETTINGS, recorded)

    return fit(
        head,
        torch.optim.Adam(params, lr=lr),
        list(blocks["train"]),
        loss_fn=loss_fn,
        config=config,
        output_dir=Path(output_dir),
        valid=list(blocks["valid"]),
        collate_fn=torch.stack,
        save_fn=save_fn,
        settings=recorded,
        restart=restart,
        progress=progress,
    )
