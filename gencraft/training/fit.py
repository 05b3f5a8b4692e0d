"""``fit``: the one training loop of gencraft, on ``accelerate``.

A method supplies a model, an optimizer, a dataset and ``loss_fn(model, batch)``; ``fit``
does the rest the same way for every method:

* a ``DataLoader`` passed through ``accelerate.prepare`` (batches are sharded across
  processes under ``accelerate launch``; the shuffle order depends only on the seed and the
  epoch, so every process agrees and a resumed run sees the same batches);
* gradient accumulation, clipping, warm-up and decay of the learning rate;
* validation every ``eval_every`` steps or each epoch; ``best/`` (by ``metric``), ``last/`` and
  ``history.json`` written atomically by the main process;
* budgets ``max_steps`` (optimizer steps), ``max_time`` (seconds of training and validation
  together; time between an interrupt and its resumption does not count) and ``epochs``,
  meaning the same for every trainer;
* checkpoints and resumption by the rule of :mod:`gencraft.training.checkpoint`: Ctrl-C
  saves, a re-run resumes or says why not, and the resumed run ends with the same weights
  as an uninterrupted one;
* callbacks (:class:`TrainerCallback`, the shape of transformers' ``TrainerCallback``): after
  each optimizer step (one may stop the run, saved, to be resumed) and after each checkpoint.

A trainer whose batches are not items of a dataset (the pointer's truncated BPTT over
carried state) passes a :class:`Steps` plug-in in place of the dataset: ``fit`` keeps the
loop, the budgets, validation, checkpoints and resumption; the plug-in makes each step's loss,
keeps its own state and may act after each validation.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler

from gencraft.errors import ConfigError, GencraftError, Interrupted
from gencraft.progress import tqdm
from gencraft.training.checkpoint import (
    InterruptGuard,
    RunCheckpoint,
    budget_reason,
    load_trainable_state,
    resume_command,
    save_directory,
    trainable_state,
)
from gencraft.training.config import (
    FitConfig,
    check_mixed_precision,
)
from gencraft.training.schedules import warmup_schedule
from gencraft.training.state import rng_state, set_rng_state, write_json
from gencraft.utils import world_rank


def make_accelerator(mixed_precision: str = "no", device: str | None = None, **kwargs: Any) -> Any:
    """An ``accelerate.Accelerator`` for gencraft's trainers. On a machine without CUDA it is
    made with ``cpu=True``, which is what lets ``accelerate launch --multi_gpu
    --num_processes N`` (torchrun underneath) run N CPU processes with the gloo backend.
    ``mixed_precision``: ``no``, ``bf16`` or ``fp16`` (the trainers' ``--mixed-precision``);
    the weights stay float32, the forward and loss run under autocast. ``device``: the
    trainers' ``--device`` (``cpu`` trains on the CPU of a GPU machine; ``cuda:N`` picks the
    GPU of a one-process run; processes and GPUs beyond that are accelerate's)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    check_mixed_precision(mixed_precision)
    # accelerate keeps one state per process: a second training in the same process (a
    # notebook, the tests) with another precision is allowed when there is one process
    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision", mixed_precision) != mixed_precision:
        if PartialState().num_processes > 1:
            raise ConfigError(
                f"this process already trains with mixed_precision "
                f"{shared.get('_mixed_precision')!r}; a distributed run cannot switch to "
                f"{mixed_precision!r}"
            )
        AcceleratorState._reset_state()
    from gencraft.models.placement import check_device

    dev = check_device(device)
    if dev.type == "cuda" and dev.index is not None and PartialState().num_processes == 1:
        torch.cuda.set_device(dev.index)  # accelerate's one process runs on the current GPU
    cpu = dev.type == "cpu" or not torch.cuda.is_available()
    return Accelerator(cpu=cpu, mixed_precision=mixed_precision, **kwargs)


#: :class:`~gencraft.errors.Interrupted`'s ``why`` when a callback stopped the run
STOPPED_BY_CALLBACK = "stopped by a callback"


def _now() -> float:
    """The loop's clock (seconds; its own name, so a test can drive it)."""
    return time.perf_counter()


@dataclass(frozen=True)
class StepState:
    """What a :class:`TrainerCallback` sees after an optimizer step: ``step``, the budget's
    ``total`` steps (0 when only time bounds it), the step this call of :func:`fit` began at,
    its ``seconds`` since then, and whether a checkpoint keeps the run (stopping without one
    loses it)."""

    step: int
    total: int
    first_step: int
    seconds: float
    checkpointed: bool

    @property
    def seconds_per_step(self) -> float:
        """This call's seconds per step so far."""
        return self.seconds / max(1, self.step - self.first_step)


class TrainerCallback:
    """A hook into :func:`fit`; subclass it and override what you need."""

    def on_step_end(self, state: StepState) -> bool:
        """After each optimizer step; True stops the run: ``fit`` saves a checkpoint and raises
        :class:`~gencraft.errors.Interrupted` (the same call resumes it), unless a Ctrl-C or the
        run's own end comes first. Every process must answer alike (they are agreed)."""
        return False

    def on_save(self, step: int, total: int) -> None:
        """After each checkpoint, on the main process: its first ``step`` of ``total`` steps are
        saved (a resumed run starts after them; ``total`` 0: only time bounds the run)."""


@dataclass
class FitResult:
    """``stopped``: which budget ended the run (``epochs``, ``max_steps``, ``max_time``);
    ``history``: one row per evaluation; ``best``: the best value of the metric."""

    steps: int
    epochs_done: float
    train_time: float
    best: float | None
    stopped: str
    history: list[dict[str, Any]]
    trained_examples: int = 0
    resumed: bool = False
    earlier_wall: float = 0.0  # wall seconds of the invocations before this one (resumed)
    processes: int = 1
    global_batch: int | None = None  # examples per optimizer step over every process

    def write_summary(self, directory: str | Path, started: float, **extra: Any) -> dict[str, Any]:
        """Write ``directory/train_summary.json`` (steps, budget, best validation loss, times,
        processes, global batch, examples trained on, ``extra``, history) and return it.
        ``wall_seconds`` is the whole run's: this call's since ``started``
        (a :func:`time.perf_counter` reading) plus the earlier invocations' that it resumed."""
        if started > time.perf_counter():  # a time.time() reading (never a perf_counter one)
            raise GencraftError(f"started={started:g} is not a time.perf_counter() reading")
        now = _now()
        summary = {
            "steps": self.steps,
            "epochs_done": self.epochs_done,
            "best_valid_loss": self.best,
            "stopped": self.stopped,
            "wall_seconds": self.earlier_wall + now - started,
            "train_seconds": self.train_time,
            "processes": self.processes,
            "global_batch": self.global_batch,
            "trained_examples": self.trained_examples,
            **extra,
            "history": self.history,
        }
        if world_rank() == 0:  # one writer under accelerate launch
            write_json(Path(directory) / "train_summary.json", summary)
        return summary


class EpochSampler(Sampler[int]):
    """A shuffle that depends only on ``seed`` and the epoch (``set_epoch``): identical on
    every process and across an interrupt."""

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


@dataclass
class Validated:
    """What :meth:`Steps.after_validation` receives: the unwrapped model, the prepared
    optimizer, the validation ``value`` of the metric (None without validation), whether it is
    a new best (``best/`` is already written) and the history ``row``, which it may extend."""

    model: nn.Module
    optimizer: Any
    value: float | None
    better: bool
    row: dict[str, Any]


class Steps:
    """The steps protocol: a trainer's own batches, for :func:`fit` in place of a dataset.

    ``len(steps)``: optimizer steps per epoch (one batch each: no accumulation). ``fit`` calls
    ``loss(model, index)`` for the epoch's ``index``-th step on this process (``model`` is the
    prepared one), ``end_epoch()`` after an epoch's last step, ``state_dict()`` on every
    process at each checkpoint (only the main process's is written; gather what other
    processes hold) and ``load_state_dict(state)`` on resuming, and ``after_validation`` after
    each validation (True stops the run: ``early_stop``). ``global_batch``: examples per step
    over every process. ``owns_learning_rate``: ``fit`` leaves the learning rate to the plug-in
    (no warm-up or decay schedule). ``epochs_flag``: the trainer's flag for the epochs budget."""

    global_batch: int = 1
    owns_learning_rate: bool = False
    epochs_flag: str = "--epochs"  # the flag of the epochs budget, in messages

    def __len__(self) -> int:
        raise NotImplementedError

    def loss(self, model: nn.Module, index: int) -> Any:
        raise NotImplementedError

    def end_epoch(self) -> None:
        """After an epoch's last step."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""

    def after_validation(self, event: Validated) -> bool:
        return False


@dataclass
class _State:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_time: float = 0.0
    eval_time: float = 0.0
    trained_examples: int = 0
    best: float | None = None
    last_eval_step: int = -1
    bad_evals: int = 0  # validations since the last new best (early stopping)
    history: list[dict[str, Any]] = field(default_factory=list)
    running: float = 0.0  # training loss summed since the last validation
    running_n: int = 0  # the batches in that sum
    wall_time: float = 0.0  # wall seconds of every invocation up to the last save
    processes: int = 1  # how many processes trained (a resume may change it)
    early_stop: bool = False  # a Steps plug-in stopped the run after a validation


LossFn = Callable[[nn.Module, Any], "torch.Tensor | tuple[torch.Tensor, dict[str, float]]"]


def _split(out: Any) -> tuple[torch.Tensor, dict[str, float]]:
    if isinstance(out, tuple):
        return out[0], dict(out[1])
    return out, {}


def _batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return _batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        return (
            len(batch) if not isinstance(first, (torch.Tensor, list, dict)) else _batch_size(first)
        )
    return 1


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train: Sequence[Any] | Steps,
    *,
    loss_fn: LossFn | None = None,
    config: FitConfig,
    output_dir: str | Path | None = None,
    valid: Sequence[Any] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    evaluate_fn: Callable[[nn.Module, Any], dict[str, float]] | None = None,
    save_fn: Callable[[nn.Module, Path], None] | None = None,
    settings: dict[str, Any] | None = None,
    accelerator: Any = None,
    resume: bool = True,
    restart: bool = False,
    progress: bool = True,
    on_step: Callable[[int, Any], None] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
) -> FitResult:
    """Train ``model`` on ``train`` with ``loss_fn(model, batch) -> loss`` (or ``(loss,
    {name: float})``), batches made by ``collate_fn`` from lists of ``train`` items; or on a
    :class:`Steps` plug-in's own steps (``train=steps``, no ``loss_fn``).

    Args:
        valid: validation items; evaluated with ``evaluate_fn(model, loader) -> {name: value}``
            (default: the mean of ``loss_fn``'s loss and parts over the batches).
        save_fn: ``save_fn(model, directory)`` writes a loadable model (``best/``, ``last/``);
            default: nothing but the checkpoint.
        settings: what defines the run, compared on resume (the config is added).
        resume / restart: continue from ``output_dir/checkpoint`` (default) / start over,
            removing the earlier run's checkpoint and results (``resume=False`` does the same).
        on_step: called after every optimizer step with ``(step, batch)``.
        callbacks: :class:`TrainerCallback` objects, called after each step and checkpoint.
    Returns a :class:`FitResult`. Raises :class:`Interrupted` after saving, on Ctrl-C or when a
    callback stops the run, and :class:`~gencraft.training.folder_lock.FolderInUse` before any
    work when another live process holds ``output_dir``.
    """
    if len(train) == 0:
        raise GencraftError("no training examples")
    if isinstance(train, Steps):
        loss_fn = train.loss
    elif loss_fn is None:
        raise GencraftError("fit needs a loss_fn for a dataset (or a Steps plug-in as train)")
    loop = _Loop(model, optimizer, loss_fn, config, accelerator, output_dir, progress)
    loop.evaluate_fn, loop.save_fn, loop.on_step = evaluate_fn, save_fn, on_step
    loop.callbacks = tuple(callbacks)
    with _holding(loop):  # before the run is opened: a restart clears the folder
        loop.open_run(settings, resume=resume, restart=restart)
        loop.prepare(train, valid, collate_fn)
        if resume and not restart:
            loop.restore()
        return loop.run()


def _holding(loop: _Loop) -> contextlib.AbstractContextManager:
    """The run's folder held by this process while it trains (:mod:`gencraft.training.folder_lock`:
    a second process training into it is refused); process 0 holds it for a launch."""
    from gencraft.training.folder_lock import folder_lock

    if loop.out is None or not loop.acc.is_main_process:
        return contextlib.nullcontext()
    return folder_lock(loop.out)


class _Loop:
    """One call of :func:`fit`: the prepared objects, the run's :class:`_State` and one method
    per step of the loop (open the run, prepare, restore, train a batch, validate, save, end
    an epoch)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        cfg: FitConfig,
        accelerator: Any,
        output_dir: str | Path | None,
        progress: bool,
    ) -> None:
        self.model, self.optimizer, self.loss_fn, self.cfg = model, optimizer, loss_fn, cfg
        self.acc = accelerator or make_accelerator(
            cfg.mixed_precision, cfg.device, gradient_accumulation_steps=cfg.grad_accum
        )
        self.out = Path(output_dir) if output_dir is not None else None
        self.progress = progress
        self.evaluate_fn: Callable[[nn.Module, Any], dict[str, float]] | None = None
        self.save_fn: Callable[[nn.Module, Path], None] | None = None
        self.on_step: Callable[[int, Any], None] | None = None
        self.callbacks: tuple[TrainerCallback, ...] = ()
        self.ckpt: RunCheckpoint | None = None
        self.st = _State(processes=self.acc.num_processes)
        self.pending_rng: Any = None
        self.resumed = False
        self.last_save = self.started = _now()
        self.earlier_wall = 0.0  # st.wall_time when this invocation began

    def open_run(self, settings: dict[str, Any] | None, *, resume: bool, restart: bool) -> None:
        """The run's checkpoint, compared with ``settings`` and the config on resume;
        ``restart`` clears an earlier run, a fresh run refuses an output holding results."""
        if self.out is not None:
            fit_settings = {k: v for k, v in asdict(self.cfg).items() if k != "save_every"}
            own = tuple(settings or {})
            self.ckpt = RunCheckpoint(self.out, {**(settings or {}), **fit_settings}, own_keys=own)
            if self.acc.is_main_process:
                if restart or not resume:  # start over (as PointerTrainer.train(resume=False))
                    self.ckpt.clear()
                elif not self.ckpt.exists():
                    self.ckpt.check_fresh_output()
        self.acc.wait_for_everyone()

    def prepare(
        self, train: Sequence[Any] | Steps, valid: Sequence[Any] | None, collate_fn: Any
    ) -> None:
        """Loaders (the shuffle depends only on the seed and the epoch), ``accelerate.prepare``
        and the learning-rate schedule over the whole run."""
        cfg, acc = self.cfg, self.acc
        torch.manual_seed(cfg.seed)
        self.steps = train if isinstance(train, Steps) else None
        self.valid_loader = None
        if self.steps is not None:
            self.model, self.optimizer = acc.prepare(self.model, self.optimizer)
            self.n_batches = len(self.steps)
            self.validates = self.evaluate_fn is not None
        else:
            self.prepare_loaders(train, valid, collate_fn)
        steps_per_epoch = max(1, math.ceil(self.n_batches / cfg.grad_accum))
        self.total = cfg.max_steps or steps_per_epoch * cfg.epochs
        # stepped by hand once per optimizer step (accelerate would step it once per process)
        self.scheduler = None
        if self.steps is None or not self.steps.owns_learning_rate:
            self.scheduler = warmup_schedule(self.optimizer, self.total, cfg.warmup, cfg.decay)
        self.raw = self.acc.unwrap_model(self.model)

    def prepare_loaders(self, train: Sequence[Any], valid: Any, collate_fn: Any) -> None:
        """The training loader (its shuffle from the seed and the epoch only), the validation
        loader, both through ``accelerate.prepare`` with the model and optimizer."""
        cfg, acc = self.cfg, self.acc
        self.sampler = EpochSampler(len(train), cfg.seed)
        # the loader's own generator: iterating it never draws from torch's global RNG
        loader = DataLoader(
            train,
            batch_size=cfg.batch_size,
            sampler=self.sampler,
            collate_fn=collate_fn,
            generator=torch.Generator().manual_seed(cfg.seed),
        )
        if valid:
            batch = cfg.eval_batch_size or cfg.batch_size
            self.valid_loader = DataLoader(valid, batch_size=batch, collate_fn=collate_fn)
        self.model, self.optimizer, self.loader = acc.prepare(self.model, self.optimizer, loader)
        if self.valid_loader is not None:
            self.valid_loader = acc.prepare(self.valid_loader)
        self.n_batches = len(self.loader)
        self.validates = self.valid_loader is not None

    def restore(self) -> None:
        """Continue from the run's checkpoint, if it has one."""
        if self.ckpt is None or not self.ckpt.exists():
            return
        payload = self.ckpt.load()
        load_trainable_state(self.raw, payload["model"], self.ckpt.path)
        self.optimizer.load_state_dict(payload["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(payload["scheduler"])
        if self.steps is not None:
            self.steps.load_state_dict(payload["steps"])
        self.st = _State(**payload["state"])
        self.earlier_wall = self.st.wall_time
        self.pending_rng = payload["rng"]
        self.resumed = True
        self.rescale_to_processes()

    @property
    def global_batch(self) -> int:
        """Examples per optimizer step over every process (``--batch-size`` is per process;
        a :class:`Steps` plug-in says its own)."""
        if self.steps is not None:
            return self.steps.global_batch
        return self.cfg.batch_size * self.cfg.grad_accum * self.acc.num_processes

    def rescale_to_processes(self) -> None:
        """A run resumed on another number of processes: its place in the epoch in this run's
        batches (the same examples seen), and one line saying so (history rows record the
        processes and global batch of each evaluation)."""
        st, now = self.st, self.acc.num_processes
        if st.processes == now:
            return
        if self.steps is not None:  # its steps hold every process's streams: nothing moves
            st.processes = now
            return
        seen = st.batch_in_epoch * self.cfg.batch_size * st.processes
        was = self.cfg.batch_size * self.cfg.grad_accum * st.processes
        st.batch_in_epoch = seen // (self.cfg.batch_size * now)
        if self.acc.is_main_process:
            print(
                f"gencraft: warning: {self.out} was trained on {st.processes} process(es) and "
                f"resumes on {now}: the global batch is now {self.global_batch} (was {was})",
                file=sys.stderr,
            )
        st.processes = now

    def budget_left(self) -> str | None:
        """Which budget has run out (None: train on)."""
        cfg, st = self.cfg, self.st
        if cfg.patience is not None and st.bad_evals >= cfg.patience:
            return "patience"
        if st.early_stop:
            return "early_stop"
        return budget_reason(
            step=st.step,
            seconds=st.train_time + st.eval_time,
            epoch=st.epoch,
            max_steps=cfg.max_steps,
            max_time=cfg.max_time,
            max_epochs=cfg.epochs,
        )

    def save_checkpoint(self) -> None:
        self.st.wall_time = self.earlier_wall + _now() - self.started
        if self.ckpt is not None:
            # on every process: a plug-in gathers what the other processes hold
            steps = self.steps.state_dict() if self.steps is not None else None
            if self.acc.is_main_process:
                self.ckpt.save(
                    {
                        "model": trainable_state(self.raw),
                        "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler and self.scheduler.state_dict(),
                        "steps": steps,
                        "state": asdict(self.st),
                        "rng": rng_state(),
                    }
                )
                self.saved()
            self.acc.wait_for_everyone()
        self.last_save = _now()

    def save_model(self, name: str) -> None:
        if self.out is None or self.save_fn is None:
            return
        if self.acc.is_main_process:
            save_directory(lambda d: self.save_fn(self.raw, d), self.out / name)
        self.acc.wait_for_everyone()

    def validate(self) -> None:
        """One row of the history (training loss since the last row, validation metrics);
        a new best writes ``best/``."""
        st, cfg = self.st, self.cfg
        row: dict[str, Any] = {
            "step": st.step,
            "epoch": round(st.epoch + st.batch_in_epoch / max(1, self.n_batches), 4),
            "train_time": round(st.train_time, 3),
            "processes": self.acc.num_processes,
            "global_batch": self.global_batch,
        }
        if st.running_n:  # over the whole interval, an interrupt and resume included
            row["train_loss"] = st.running / st.running_n
        st.running, st.running_n = 0.0, 0
        value = None
        if self.validates:
            metrics = self.validation_metrics()
            row.update({f"valid_{k}": v for k, v in metrics.items()})
            value = float(metrics[cfg.metric])
        better = value is None or (
            st.best is None
            or (value < st.best if cfg.mode == "min" else value > st.best)
            or math.isnan(st.best)
        )
        if better:
            st.best = value
            self.save_model("best")
        st.bad_evals = 0 if better else st.bad_evals + 1
        row["best"] = better
        if self.steps is not None:
            event = Validated(self.raw, self.optimizer, value, better, row)
            st.early_stop = self.steps.after_validation(event) or st.early_stop
        st.history.append(row)
        st.last_eval_step = st.step
        if self.out is not None and self.acc.is_main_process:
            write_json(self.out / "history.json", st.history)
        if self.progress and self.acc.is_main_process:
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
            tqdm.write(f"eval: {shown}")

    def validation_metrics(self) -> dict[str, float]:
        t0 = _now()
        self.model.eval()
        with torch.no_grad():
            run = self.evaluate_fn or mean_loss(self.loss_fn, self.acc)
            metrics = run(self.model, self.valid_loader)
        self.model.train()
        self.st.eval_time += _now() - t0
        if self.cfg.metric not in metrics:
            raise GencraftError(
                f"validation gave {sorted(metrics)}, not the metric {self.cfg.metric!r}"
            )
        return metrics

    def train_batch(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward, backward and (at the end of an accumulation) the optimizer step."""
        if self.pending_rng is not None:
            # restored once the loader has drawn whatever it draws when it starts
            # (as it did before the interrupted run saved this state)
            set_rng_state(self.pending_rng)
            self.pending_rng = None
        st, acc = self.st, self.acc
        t0 = _now()
        with acc.accumulate(self.model):
            with acc.autocast():  # a no-op without mixed precision
                loss, parts = _split(self.loss_fn(self.model, batch))
            acc.backward(loss)
            if acc.sync_gradients and self.cfg.clip:
                acc.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
            self.optimizer.step()
            self.optimizer.zero_grad()
        st.batch_in_epoch += 1
        if self.steps is not None:
            st.trained_examples += self.steps.global_batch
        else:
            st.trained_examples += _batch_size(batch) * acc.num_processes
        st.running += float(loss.detach())
        st.running_n += 1
        st.train_time += _now() - t0
        return loss, parts

    def after_step(self, loss: torch.Tensor, parts: dict[str, float], batch: Any) -> None:
        """The bookkeeping of one optimizer step: schedule, counters, progress, validation
        every ``eval_every`` steps."""
        if self.scheduler is not None:
            self.scheduler.step()
        self.st.step += 1
        value = float(loss.detach())
        if not math.isfinite(value):
            raise GencraftError(
                f"training loss became {value} at step {self.st.step}; lower the learning rate"
            )
        if self.on_step is not None:
            self.on_step(self.st.step, batch)
        self.bar.update(1)
        postfix = {k: f"{v:.3f}" for k, v in parts.items()}
        self.bar.set_postfix(loss=f"{self.st.running / max(1, self.st.running_n):.4f}", **postfix)
        if self.cfg.eval_every and self.st.step % self.cfg.eval_every == 0:
            self.validate()
            self.save_checkpoint()

    def run_epoch(self, guard: InterruptGuard) -> tuple[str | None, bool]:
        """The rest of the current epoch: (the budget that stopped it, interrupted)."""
        st = self.st
        batches = self.epoch_batches()
        stopped = None
        for batch in batches:
            loss, parts = self.train_batch(batch)
            if not self.acc.sync_gradients:
                continue
            self.after_step(loss, parts, batch)
            since_save = _now() - self.last_save
            interrupt, save_now, late = _agree(
                self.acc, [guard.requested, since_save > self.cfg.save_every, self.asked_to_stop()]
            )
            stopped = self.budget_left() if st.batch_in_epoch < self.n_batches else None
            # a Ctrl-C, or the training's own end, comes before a callback's stop
            self.late = late and not interrupt and stopped is None and st.step < self.total
            if interrupt or self.late:
                return stopped, True
            if stopped is not None:
                return stopped, False
            if save_now:
                self.save_checkpoint()
        return self.end_epoch(), False

    def asked_to_stop(self) -> bool:
        """Whether a callback stops the run after this step (every callback sees it)."""
        st = self.st
        state = StepState(
            st.step, self.total, self.first_step, _now() - self.run_started, self.ckpt is not None
        )
        return any([cb.on_step_end(state) for cb in self.callbacks])

    def saved(self) -> None:
        """Tell the callbacks what the checkpoint holds (main process)."""
        for cb in self.callbacks:
            cb.on_save(self.st.step, self.total)

    def epoch_batches(self) -> Any:
        """The rest of the current epoch's batches (a plug-in's: its step indices)."""
        st = self.st
        if self.steps is not None:
            return range(st.batch_in_epoch, self.n_batches)
        loader = self.loader
        batches = (
            self.acc.skip_first_batches(loader, st.batch_in_epoch) if st.batch_in_epoch else loader
        )
        # accelerate's loaders set the sampler's epoch from their own counter when iterated
        if hasattr(batches, "set_epoch"):
            batches.set_epoch(st.epoch)
        self.sampler.set_epoch(st.epoch)
        return batches

    def end_epoch(self) -> str | None:
        """Count a completed epoch (validating at its end unless ``eval_every`` is set)."""
        st = self.st
        if st.batch_in_epoch < self.n_batches:
            return None
        if self.steps is not None:
            self.steps.end_epoch()
        st.epoch += 1
        st.batch_in_epoch = 0
        if not self.cfg.eval_every:
            self.validate()
        self.save_checkpoint()
        return self.budget_left()

    def result(self, stopped: str | None, epochs_done: float) -> FitResult:
        st = self.st
        return FitResult(
            st.step,
            epochs_done,
            st.train_time,
            st.best,
            stopped,
            st.history,
            st.trained_examples,
            self.resumed,
            self.earlier_wall,
            self.acc.num_processes,
            self.global_batch,
        )

    def run(self) -> FitResult:
        """Train until a budget runs out; Ctrl-C saves and raises :class:`Interrupted`."""
        st = self.st
        stopped = self.budget_left()
        if stopped is not None and self.resumed:
            if self.acc.is_main_process:
                print(
                    f"{self.out} already finished ({stopped}: step {st.step}, "
                    f"{st.train_time:.0f} s, epoch {st.epoch}); raise --max-steps/--max-time/"
                    f"{self.steps.epochs_flag if self.steps else '--epochs'} to continue, or pass "
                    "--restart"
                )
            return self.result(stopped, st.epoch)
        self.model.train()
        show = self.progress
        self.bar = tqdm(  # one bar, the main process's
            total=self.total,
            initial=st.step,
            desc="train",
            disable=not show or not self.acc.is_main_process,
            unit="step",
        )
        self.last_save = _now()
        self.first_step, self.late, self.run_started = st.step, False, _now()
        if self.ckpt is not None and self.acc.is_main_process:
            self.saved()  # where it resumes (0: its checkpoint is gone)
        interrupted = False
        with InterruptGuard() as guard:
            while stopped is None and not interrupted:
                stopped, interrupted = self.run_epoch(guard)
            self.bar.close()
            if interrupted:
                self.save_checkpoint()
                directory = self.ckpt.directory if self.ckpt else None
                why = STOPPED_BY_CALLBACK if self.late else "interrupted"
                raise Interrupted(directory, resume_command(), st.step, self.total, why)
        if st.last_eval_step != st.step or not st.history:
            self.validate()
        self.save_model("last")
        self.save_checkpoint()
        return self.result(stopped, st.epoch + st.batch_in_epoch / max(1, self.n_batches))


def _agree(acc: Any, flags: list[bool]) -> list[bool]:
    """Flags that every process must act on together (any process raising one)."""
    if acc.num_processes == 1:
        return flags
    t = torch.tensor([float(f) for f in flags], device=acc.device)
    return [bool(v > 0) for v in acc.reduce(t, reduction="sum").tolist()]


def mean_loss(loss_fn: LossFn, acc: Any) -> Callable[[nn.Module, Any], dict[str, float]]:
    """Validation by default: the mean over batches of the loss and its parts (all processes).
    Returns ``run(model, loader) -> {"loss": ..., part: ...}``, for an ``evaluate_fn`` that adds
    metrics to it."""

    def run(model: nn.Module, loader: Any) -> dict[str, float]:
        sums: dict[str, float] = {}
        n = 0
        for batch in loader:
            with acc.autocast():
                loss, parts = _split(loss_fn(model, batch))
            for k, v in {"loss": float(loss), **parts}.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys] + [float(n)], device=acc.device)
        if acc.num_processes > 1:
            t = acc.reduce(t, reduction="sum")
        return {k: float(v) / max(float(t[-1]), 1.0) for k, v in zip(keys, t[:-1], strict=True)}

    return run
