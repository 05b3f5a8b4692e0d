"""Checkpoints every gencraft trainer shares: one atomic file per run, resume-or-say-why, and
Ctrl-C that saves instead of losing work.

The rule, for every trainer (``fit`` and the pointer's TBPTT trainer):

* a run writes ``OUTPUT/checkpoint/state.pt`` periodically (every ``save_every`` seconds), at
  every evaluation, at the end, and when interrupted; it holds the trainable weights, the
  optimizer and schedule state, the RNG states, the position in the data and the history;
* re-running the same command resumes from it. A finished run whose budget
  (``--max-steps``, ``--max-time``, ``--epochs``) is raised continues; one whose budget is
  unchanged says so and does nothing; one started with different settings is refused with
  the differing settings named (``--restart`` starts over);
* an output directory holding results but no checkpoint is never silently overwritten;
* Ctrl-C finishes the current step, saves, prints one line naming the checkpoint and the
  command that resumes, and ends without a traceback (:class:`Interrupted`). A second Ctrl-C
  stops at once.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.training.state import atomic_torch_save
from gencraft.utils import world_rank
from gencraft.utils import world_size as _world_size

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.pt"


def resume_command(argv: list[str] | None = None, world_size: int | None = None) -> str | None:
    """The command line of this process, as a user would retype it, shell-quoted (None
    outside a CLI). gencraft run as ``python -m gencraft``, ``-m gencraft.cli.main`` or its
    script is ``gencraft``; under ``accelerate launch`` (``WORLD_SIZE`` > 1) the line starts
    ``accelerate launch --multi_gpu --num_processes N -m gencraft``."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not argv[0]:
        return None
    if world_size is None:
        world_size = _world_size()
    prog = Path(argv[0]).name
    ours = prog == "gencraft" or _is_gencraft_entry(argv[0])
    if not ours and (prog in ("-c", "__main__.py") or prog.startswith("pytest")):
        return None
    args = [a for a in argv[1:] if a != "--restart"]
    if world_size > 1:
        launch = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(world_size)]
        head = [*launch, "-m", "gencraft"] if ours else [*launch, argv[0]]
    else:
        head = ["gencraft" if ours else prog]
    return " ".join(shlex.quote(a) for a in [*head, *args])


def _is_gencraft_entry(path: str) -> bool:
    """``path`` is gencraft's own ``__main__.py`` or ``cli/main.py``."""
    import gencraft

    root = Path(gencraft.__file__).resolve().parent
    try:
        here = Path(path).resolve()
    except OSError:
        return False
    return here in (root / "__main__.py", root / "cli" / "main.py")


class InterruptGuard:
    """Turns the first SIGINT (Ctrl-C) into a flag the training loop checks between steps;
    a second SIGINT raises ``KeyboardInterrupt`` as usual. A no-op outside the main thread.

    Under ``accelerate launch`` the launcher answers Ctrl-C by sending its workers SIGTERM
    (and SIGKILL 30 s later): a worker treats SIGTERM as the same request, so every process
    finishes its step and the checkpoint is written before the launcher ends them."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._previous_term: Any = None
        self._first = 0.0

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.requested:
            # under a launcher one Ctrl-C arrives twice (the terminal's, then the launcher's
            # forwarded copy): only a second press, later, stops at once
            if _world_size() > 1 and now - self._first < 2.0:
                return
            raise KeyboardInterrupt
        self.requested, self._first = True, now
        if world_rank() == 0:
            print(
                "\ngencraft: stopping after this step (Ctrl-C again to stop now)", file=sys.stderr
            )

    def _handle_term(self, signum: int, frame: Any) -> None:
        # never "stop now": the launcher waits for the save. A first request starts the
        # 2 s in which the same press's SIGINT is ignored, whichever of the two came first
        if not self.requested:
            self.requested, self._first = True, time.monotonic()

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            if _world_size() > 1:  # the launcher's SIGTERM after a Ctrl-C
                self._previous_term = signal.signal(signal.SIGTERM, self._handle_term)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)
            self._previous_term = None


def budget_reason(
    *,
    step: int,
    seconds: float,
    epoch: int,
    max_steps: int | None,
    max_time: float | None,
    max_epochs: int,
    epochs_name: str = "epochs",
) -> str | None:
    """Which budget has run out (``max_steps``: optimizer steps; ``max_time``: seconds of
    training and validation; ``epochs_name``: passes over the data), or None: the one meaning
    every trainer gives its budgets."""
    if max_steps is not None and step >= max_steps:
        return "max_steps"
    if max_time is not None and seconds >= max_time:
        return "max_time"
    if epoch >= max_epochs:
        return epochs_name
    return None


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (``requires_grad``), detached on the CPU: what a checkpoint
    must keep; a frozen base is rebuilt from its name."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path):
    params = dict(model.named_parameters())
    missing = sorted(set(state) - set(params))
    if missing:
        raise GencraftError(
            f"{where} holds weights this model does not have ({', '.join(missing[:3])}...); "
            "use --restart or another --output"
        )
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value.to(params[name].device))


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``{"train.lr": 0.1, ...}``, so a change names its one setting."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _differences(saved: dict[str, Any], now: dict[str, Any], ignore: set[str]) -> list[str]:
    """``name old -> new`` for each setting (at any depth) that changed, but those whose last
    name is in ``ignore`` (budgets, where and how often it saves)."""
    saved, now = _flat(saved), _flat(now)
    keys = sorted(k for k in set(saved) | set(now) if k.rsplit(".", 1)[-1] not in ignore)
    return [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]


#: settings a continuation may change: budgets, how often it saves, where it runs
RESUMABLE = ("max_steps", "max_time", "epochs", "max_epochs", "save_every", "device")


class RunCheckpoint:
    """``OUTPUT/checkpoint/state.pt`` of one training run.

    Args:
        output_dir: the run's output directory.
        settings: what defines the run (method and training settings, JSON-like); a
            checkpoint written with other settings is refused.
        budget_keys: settings that may change between a run and its continuation
            (``max_steps``, ``max_time``, ``epochs``...).
        own_keys: the top-level settings the method itself gives (not the loop's): a saved
            run that has none of them is another method's, refused as such.
    """

    def __init__(
        self,
        output_dir: str | Path,
        settings: dict[str, Any],
        budget_keys: tuple[str, ...] = RESUMABLE,
        own_keys: tuple[str, ...] = (),
    ) -> None:
        self.output_dir = Path(output_dir)
        self.directory = self.output_dir / CHECKPOINT_DIR
        self.path = self.directory / STATE_FILE
        self.settings = settings
        self.budget_keys = set(budget_keys)
        self.own_keys = set(own_keys)

    def exists(self) -> bool:
        return self.path.is_file()

    def save(self, payload: dict[str, Any]) -> None:
        atomic_torch_save({**payload, "settings": self.settings}, self.path)

    def load(self) -> dict[str, Any]:
        """The saved payload; a clear error naming the file when it is damaged or was written
        by a run with other settings."""
        try:
            payload = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception as err:  # truncated or foreign file: name it
            raise GencraftError(
                f"checkpoint file {self.path} cannot be read ({type(err).__name__}: {err}); "
                "delete it or pass --restart"
            ) from None
        if not isinstance(payload, dict) or "settings" not in payload:
            raise GencraftError(f"{self.path} is not a gencraft checkpoint; pass --restart")
        self._check_kind(payload["settings"])
        diff = _differences(payload["settings"], self.settings, self.budget_keys)
        if diff:
            more = f"; and {len(diff) - 5} more" if len(diff) > 5 else ""
            raise GencraftError(
                f"{self.output_dir} holds a run with other settings ({'; '.join(diff[:5])}{more}); "
                "re-run with the same settings to resume, or pass --restart or another --output"
            )
        return payload

    def _check_kind(self, saved: dict[str, Any]) -> None:
        """Refuse, naming it, a run of another kind (another method's: its settings have other
        parts), rather than list every setting as changed."""
        if not isinstance(saved, dict) or not self.own_keys or self.own_keys & set(saved):
            return
        from gencraft.training.run import run_method

        found = next(
            (m for n in ("best", "last") if (m := run_method(self.output_dir / n)) is not None),
            None,
        )
        kind = f"a {found} run" if found else "a run of another kind (another method's)"
        raise GencraftError(
            f"{self.output_dir} holds {kind}, not one of this command; pass --restart to "
            "replace it, or another --output"
        )

    def check_fresh_output(self, result_names: tuple[str, ...] = ("best", "last")) -> None:
        """Refuse to train over results that have no checkpoint to resume from."""
        if self.exists():
            return
        found = [n for n in result_names if (self.output_dir / n).exists()]
        if found:
            raise GencraftError(
                f"{self.output_dir} already holds {', '.join(found)}/ but no {CHECKPOINT_DIR}/ "
                "to resume from; pass --restart to overwrite it, or another --output"
            )

    def clear(self, result_names: tuple[str, ...] = ("best", "last")) -> None:
        """``--restart``: remove the checkpoint and earlier results."""
        for name in (CHECKPOINT_DIR, *result_names):
            shutil.rmtree(self.output_dir / name, ignore_errors=True)
        (self.output_dir / "history.json").unlink(missing_ok=True)


def save_directory(save: Any, directory: str | Path) -> Path:
    """Run ``save(tmp_dir)`` and move the result to ``directory``, so that ``directory`` always
    holds one complete save (never a half-written or mixed one)."""
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save(tmp)
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory
