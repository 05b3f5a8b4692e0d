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

Multi-device: the B streams are split across processes by ``accelerate``; nothing else changes.
"""

from __future__ import annotations

import math
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
from gencraft.progress import tqdm
from gencraft.training import (
    Interrupted,
    InterruptGuard,
    PlateauSchedule,
    RunCheckpoint,
    Step,
    batchify,
    make_accelerator,
    resume_command,
    rng_state,
    save_directory,
    set_rng_state,
    tbptt_schedule,
    write_json,
)
from gencraft.training.checkpoint import CHECKPOINT_DIR, budget_reason

MEDIUM_K1 = 1
"""k1 for ``--preset medium`` when none is given: the paper's schedule (k1 = 1, k2 = 100)."""


def preset_k1(preset: str, k1: int | None) -> int | None:
    """The k1 a run uses: the one given, else the paper's schedule for the paper's (medium)
    model, else None (k1 = k2)."""
    return MEDIUM_K1 if k1 is None and preset == "medium" else k1


BUDGET_KEYS = (
    "max_steps",
    "max_time",
    "max_epochs",
    "eval_every",
    "save_every",
    "device",
)


class PointerTrainer:
    """Trains a :class:`PointerSentinelLSTM` on ``corpus`` and writes to ``output_dir``:
    the one run format of :mod:`gencraft.training.run`: ``checkpoint/`` (resumable),
    ``best/`` (best validation model) and ``last/`` (the final one), both
    ``from_pretrained``-able, ``history.json``, ``train_summary.json`` and
    ``train_config.json``."""

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
        if len(corpus.vocab) != model.config.vocab_size:
            raise GencraftError(
                f"vocabulary mismatch: the model has {model.config.vocab_size} words, corpus "
                f"{corpus.name!r} has {len(corpus.vocab)}"
            )
        for split in ("train", "valid"):
            if split not in corpus.splits:
                raise GencraftError(f"corpus {corpus.name!r} has no {split!r} split loaded")
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
        self.streams = streams[acc.process_index :: acc.num_processes].to(acc.device)
        self.n = self.streams.shape[1] - 1
        if config.optimizer == "sgd":
            opt = torch.optim.SGD(
                model.parameters(), lr=config.lr, weight_decay=config.weight_decay
            )
        else:
            opt = torch.optim.Adam(
                model.parameters(), lr=config.lr, weight_decay=config.weight_decay
            )
        self.model, self.optimizer = acc.prepare(model, opt)
        if acc.device.type == "cpu":
            # the softmax gradient is full of denormals, which make CPU matmuls up to 20x slower
            torch.set_flush_denormal(True)
        self.last_nll: torch.Tensor | None = None
        self.schedule = PlateauSchedule(decay=config.lr_decay, patience=config.patience)
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.train_time, self.eval_time, self.trained_tokens = 0.0, 0.0, 0
        self.carry: Any = None  # LSTM state at the next step's start
        self.memory: Any = None  # (outputs, ids) for window_refresh="stale"
        self.history: list[dict[str, Any]] = []
        self.early_stopped = False
        self.last_eval_step = -1
        self.wall_time = 0.0  # wall seconds of every invocation up to the last checkpoint
        self.started, self.earlier_wall = time.perf_counter(), 0.0

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

    # -- one step -------------------------------------------------------------------------
    def train_step(self, st: Step) -> float:
        cfg, m, data = self.config, self.raw_model, self.streams
        self.model.train()
        masks = m.sample_masks(data.shape[0], data.device)
        state = self.carry
        memory = memory_ids = None
        kept = None
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
        with self.accelerator.autocast():  # a no-op without mixed precision
            out = self.model(
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
        self.optimizer.zero_grad(set_to_none=True)
        self.accelerator.backward(loss)
        if cfg.clip:
            self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.clip)
        self.optimizer.step()
        self.carry = detach_state(kept if kept is not None else out.kept_state)
        if cfg.window_refresh == "stale" and m.config.pointer and m.config.window > 1:
            keep = m.config.window - 1
            outs, ids = out.outputs.detach(), x
            if self.memory is not None:
                outs = torch.cat([self.memory[0], outs], 1)
                ids = torch.cat([self.memory[1], ids], 1)
            self.memory = (outs[:, -keep:], ids[:, -keep:])
        self.trained_tokens += y.numel() * self.accelerator.num_processes
        return float(out.nll.detach().mean())

    # -- evaluation, checkpoints ----------------------------------------------------------
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

    def _set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _checkpoint(self) -> RunCheckpoint:
        settings = {"model_config": self.raw_model.config.to_dict(), **asdict(self.config)}
        return RunCheckpoint(self.output_dir, settings, budget_keys=BUDGET_KEYS)

    def save_checkpoint(self) -> None:
        """Write ``output_dir/checkpoint/state.pt`` (atomically) with everything a resumed run
        needs: weights, optimizer, schedule, position, carried state, history, RNG."""
        if not self.accelerator.is_main_process:
            return
        self._checkpoint().save(
            {
                "model": self.raw_model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(),
                "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step,
                "train_time": self.train_time,
                "eval_time": self.eval_time,
                "trained_tokens": self.trained_tokens,
                "carry": self.carry,
                "memory": self.memory,
                "history": self.history,
                "early_stopped": self.early_stopped,
                "last_eval_step": self.last_eval_step,
                "wall_time": self.earlier_wall + time.perf_counter() - self.started,
                "rng": rng_state(),
            }
        )

    def load_checkpoint(self, directory: str | Path | None = None) -> bool:
        """Resume from the run in ``directory`` (default ``output_dir``); False if it has no
        checkpoint. Raises, naming the file or the differing settings, when it cannot."""
        ckpt = self._checkpoint()
        if directory is not None:
            d = Path(directory)
            ckpt = RunCheckpoint(
                d.parent if d.name == CHECKPOINT_DIR else d, ckpt.settings, budget_keys=BUDGET_KEYS
            )
        if not ckpt.exists():
            return False
        st = ckpt.load()
        self.raw_model.load_state_dict(st["model"])
        self.optimizer.load_state_dict(st["optimizer"])
        self.schedule.load_state_dict(st["schedule"])
        for k in (
            "epoch",
            "step_in_epoch",
            "global_step",
            "train_time",
            "eval_time",
            "trained_tokens",
            "history",
            "early_stopped",
            "last_eval_step",
        ):
            setattr(self, k, st[k])
        dev = self.accelerator.device
        self.carry = None if st["carry"] is None else tuple(t.to(dev) for t in st["carry"])
        self.memory = None if st["memory"] is None else tuple(t.to(dev) for t in st["memory"])
        self.wall_time = st.get("wall_time", 0.0)  # absent from older checkpoints
        set_rng_state(st["rng"])
        return True

    def _evaluate_and_schedule(self) -> bool:
        """Validate, save best, halve the LR / stop as the recipe says. True = stop."""
        res = self.validate("valid")
        improved, decay, stop = self.schedule.step(res["nll"] / res["tokens"])
        row = {
            "epoch": self.epoch,
            "step": self.global_step,
            "valid_ppl": res["ppl"],
            "lr": self.lr,
            "train_time": self.train_time,
            "eval_time": self.eval_time,
            "train_tokens_per_s": self.trained_tokens / max(self.train_time, 1e-9),
        }
        self.history.append(row)
        self.last_eval_step = self.global_step
        if improved and self.accelerator.is_main_process:
            save_directory(self.raw_model.save_pretrained, self.output_dir / "best")
        if decay:
            self._set_lr(self.lr * self.config.lr_decay)
            if self.config.revert_on_worse and not improved:
                self._revert_to_best()
        if self.accelerator.is_main_process:
            write_json(self.output_dir / "history.json", self.history)
            tqdm.write(
                f"epoch {self.epoch} step {self.global_step}: valid ppl {res['ppl']:.2f}"
                f"{' (best)' if improved else ''}, lr {self.lr:g}"
            )
        return stop

    def _revert_to_best(self) -> None:
        """Continue from the best weights so far, with the (already lowered) learning rate, a
        fresh optimizer state and fresh recurrent state: a diverged update is undone."""
        best = PointerSentinelLSTM.from_pretrained(self.output_dir / "best")
        self.raw_model.load_state_dict(best.state_dict())
        getattr(self.optimizer, "optimizer", self.optimizer).state.clear()
        self.carry = self.memory = None
        row = self.history[-1]
        row["reverted_to_best"] = True

    # -- the loop -------------------------------------------------------------------------
    def budget_left(self) -> str | None:
        """Which budget has run out (``max_steps``, ``max_time``, ``max_epochs``, or
        ``early_stop`` by the plateau rule), or None."""
        cfg = self.config
        if self.early_stopped:
            return "early_stop"
        return budget_reason(
            step=self.global_step,
            seconds=self.train_time + self.eval_time,
            epoch=self.epoch,
            max_steps=cfg.max_steps,
            max_time=cfg.max_time,
            max_epochs=cfg.max_epochs,
            epochs_name="max_epochs",
        )

    def train(self, resume: bool = True, restart: bool = False) -> list[dict[str, Any]]:
        """Train until a budget runs out or validation stops improving; returns the history.
        A re-run resumes (``resume=False`` or ``restart=True`` starts over); Ctrl-C saves a
        checkpoint and raises :class:`~gencraft.training.Interrupted`."""
        cfg = self.config
        ckpt = self._checkpoint()
        if self.accelerator.is_main_process:
            if restart or not resume:
                ckpt.clear()
            elif not ckpt.exists():
                ckpt.check_fresh_output()
            write_json(self.output_dir / "train_config.json", asdict(cfg))
        self.accelerator.wait_for_everyone()
        self.started = time.perf_counter()
        resumed = resume and not restart and self.load_checkpoint()
        self.earlier_wall = self.wall_time
        if not resumed:
            torch.manual_seed(cfg.seed)
        stopped = self.budget_left()
        if resumed and stopped is not None:
            if self.accelerator.is_main_process:
                print(
                    f"{self.output_dir} already finished ({stopped} at step {self.global_step}, "
                    f"{self.train_time + self.eval_time:.0f} s); "
                    + (
                        "validation stopped improving; pass --restart to train again"
                        if stopped == "early_stop"
                        else "raise --max-steps/--max-time/--max-epochs to continue, or pass "
                        "--restart"
                    )
                )
            self._write_summary(stopped)
            return self.history
        steps = self.steps()
        eval_every = cfg.eval_every or len(steps)
        last_save = time.perf_counter()
        with InterruptGuard() as guard:
            while self.budget_left() is None:
                bar = tqdm(
                    total=len(steps),
                    initial=self.step_in_epoch,
                    desc=f"epoch {self.epoch + 1}",
                    disable=not self.progress,
                    unit="step",
                )
                while self.step_in_epoch < len(steps) and self.budget_left() is None:
                    t0 = time.perf_counter()
                    loss = self.train_step(steps[self.step_in_epoch])
                    if not math.isfinite(loss):
                        raise GencraftError(
                            f"training loss became {loss} at step {self.global_step}; lower the "
                            "learning rate or the clipping threshold"
                        )
                    self.train_time += time.perf_counter() - t0
                    self.step_in_epoch += 1
                    self.global_step += 1
                    bar.update(1)
                    bar.set_postfix(ppl=f"{math.exp(min(loss, 50)):.1f}", lr=f"{self.lr:g}")
                    if self.step_in_epoch == len(steps):
                        self.epoch += 1
                        self.step_in_epoch = 0
                        self.carry = self.memory = None
                    at_eval = self.global_step % eval_every == 0 or self.step_in_epoch == 0
                    if at_eval or self.budget_left() is not None:
                        self._timed_eval()
                        self.save_checkpoint()
                        last_save = time.perf_counter()
                    elif time.perf_counter() - last_save > cfg.save_every:
                        self.save_checkpoint()
                        last_save = time.perf_counter()
                    if guard.requested:
                        bar.close()
                        self.save_checkpoint()
                        raise Interrupted(self.output_dir / CHECKPOINT_DIR, resume_command())
                    if self.step_in_epoch == 0:
                        break
                bar.close()
        if self.last_eval_step != self.global_step:  # best/ always exists at the end
            self._timed_eval()
        self.save_checkpoint()
        if self.accelerator.is_main_process:
            save_directory(self.raw_model.save_pretrained, self.output_dir / "last")
        self._write_summary(self.budget_left() or "max_epochs")
        return self.history

    def _write_summary(self, stopped: str) -> None:
        """``train_summary.json``, with the keys every trainer writes (the loss: nats/token)."""
        if not self.accelerator.is_main_process:
            return
        ppls = [r["valid_ppl"] for r in self.history]
        write_json(
            self.output_dir / "train_summary.json",
            {
                "steps": self.global_step,
                "epochs_done": self.epoch,
                "best_valid_loss": math.log(min(ppls)) if ppls else None,
                "stopped": stopped,
                "wall_seconds": self.earlier_wall + time.perf_counter() - self.started,
                "train_seconds": self.train_time,
                "history": self.history,
            },
        )

    def _timed_eval(self) -> None:
        t1 = time.perf_counter()
        self.early_stopped = self._evaluate_and_schedule() or self.early_stopped
        self.eval_time += time.perf_counter() - t1
