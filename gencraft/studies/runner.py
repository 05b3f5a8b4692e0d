"""Named experiments behind the tables of docs/results/, and ``gencraft reproduce``.

Each method registers its experiments in its own ``experiments.py`` (:func:`register`): a
name (the one docs/results/ gives beside the table), a settings dataclass whose defaults are
the documented CPU run, overrides per scale (``tiny``: random tiny models, seconds, for tests;
``cpu``: the documented CPU run; ``gpu``: the documented GPU run), an estimate of its CPU
time, and a function that fills an :class:`ExperimentRun`.

An :class:`ExperimentRun` is one output folder: ``results.json`` keeps every finished unit
of work (a prompt, a model, a depth...) as it completes, so a re-run of the same command goes
on where it stopped; ``report.md`` holds the tables and the PNG plots written beside it.

    gencraft reproduce --list
    gencraft reproduce search-memory --scale cpu --output outputs/search-memory
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import json
import math
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gencraft.config import option
from gencraft.errors import GencraftError
from gencraft.studies.timing import running_clock
from gencraft.training.checkpoint import CHECKPOINT_DIR
from gencraft.training.fit import STOPPED_BY_CALLBACK, StepState, TrainerCallback
from gencraft.training.state import write_json

#: modules whose import registers experiments (one per study; a new study adds its own)
EXPERIMENT_MODULES = (
    "gencraft.studies.search_speed",
    "gencraft.studies.search_empty",
    "gencraft.studies.search_errors",
    "gencraft.studies.search_conditional",
    "gencraft.studies.search_mbr",
    "gencraft.studies.pointer",
    "gencraft.studies.focus",
    "gencraft.studies.prefix",
    "gencraft.studies.hso",
    "gencraft.studies.recurrence",
    "gencraft.studies.nar",
    "gencraft.studies.focus_vs_cad",
    "gencraft.studies.throughput",  # every decoder batched against its loop and its peer
    "gencraft.studies.campaign",  # the trained methods' claims in a time budget
)
SCALES = ("tiny", "cpu", "gpu")
#: settings that say where things are or how long to run, not what is computed: a run resumes
#: across a change of them (an offline GPU machine reads the same data from another folder)
VOLATILE = ("data_dir", "runs_dir", "work_dir")


@dataclass(frozen=True)
class Kept:
    """What a unit (a training) leaves in its run folder for later units to read."""

    made: str  # the folder, under the run folder, the finished unit leaves (its model)
    checkpoint: str  # the folder its unfinished work resumes from
    readers: tuple[str, ...]  # the unit keys that read ``made``


def kept_models(keys: list[str]) -> dict[str, Kept]:
    """The :class:`Kept` of a run whose ``train NAME`` units save their model in folder NAME
    (``NAME/best``, resumed from ``NAME/checkpoint``), read by every other unit whose key's
    second word is NAME (``eval NAME test``, ``curve NAME 15``)."""
    names = [k.split()[1] for k in keys if k.startswith("train ")]
    return {
        f"train {n}": Kept(
            f"{n}/best",
            f"{n}/{CHECKPOINT_DIR}",
            tuple(k for k in keys if k.split()[1:2] == [n] and not k.startswith("train ")),
        )
        for n in names
    }


class Lost(NamedTuple):
    """:func:`lost_work`'s answer: the unit keys to compute again and to start over."""

    redo: list[str]
    restart: list[str]


def lost_work(
    kept: dict[str, Kept], folder: Path, units: dict[str, Any], progress: dict[str, Any]
) -> Lost:
    """Work a run's results.json records but its folder no longer holds (results copied to
    another machine, a cleaned or new checkout): (finished units whose ``made`` is gone while
    a unit that reads it is not finished: they are computed again; unfinished units whose
    saved steps are gone with their ``checkpoint``: they start over)."""
    redo = [
        k
        for k, keep in kept.items()
        if k in units
        and not (folder / keep.made).exists()
        and any(r not in units for r in keep.readers)
    ]
    restart = [
        k for k, keep in kept.items() if k in progress and not (folder / keep.checkpoint).exists()
    ]
    return Lost(redo, restart)


def units_left(expected: Sequence[str], units: dict[str, Any]) -> list[str]:
    """The ``expected`` unit keys a run has not finished; a unit saved whole, before an
    experiment split it, covers the keys it prefixes."""
    return [k for k in expected if k not in units and not any(k.startswith(u + " ") for u in units)]


class Pooled(NamedTuple):
    """:func:`folder_verdicts`' answer: the experiment, its verdict rows, and how many of
    the runs' expected units had finished (``expected`` None: the experiment declares none)."""

    experiment: Experiment
    rows: list[dict[str, Any]]
    finished: int
    expected: int | None


def runs_by_settings(
    runs: Sequence[tuple[Any, dict[str, Any]]], but: tuple[str, ...] = ()
) -> list[list[tuple[Any, dict[str, Any]]]]:
    """A verdict's ``(settings, units)`` runs grouped by their settings, fields ``but``
    aside (``("seed",)``: the runs of one setup under several seeds), in first-seen order.
    Tuples and lists compare equal (a run read from results.json holds lists)."""
    groups: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for s, units in runs:
        key = {k: v for k, v in dataclasses.asdict(s).items() if k not in but}
        groups.setdefault(json.dumps(key, sort_keys=True, default=str), []).append((s, units))
    return list(groups.values())


@dataclass
class Experiment:
    """A registered experiment (see the module docstring)."""

    name: str
    title: str
    settings: type
    run: Callable[[Any, ExperimentRun], None]
    scales: dict[str, dict[str, Any]]
    cpu_minutes: float
    description: str = ""
    #: the unit keys a run at these settings computes, in order (None: not declared)
    units: Callable[[Any], list[str]] | None = None
    #: paired verdicts of the experiment's claims from its settings and finished units
    verdict: Callable[[Any, dict[str, Any]], list[dict[str, Any]]] | None = None
    #: settings besides VOLATILE that a resumed run may change
    volatile: tuple[str, ...] = ()
    #: its units may be shared among accelerate's processes (:mod:`gencraft.studies.shards`):
    #: all its costly work is in units, and no unit calls a collective
    shardable: bool = False
    #: a run holds its folder, one process at a time (:mod:`gencraft.training.folder_lock`);
    #: False for a coordinator whose runs hold their own folders (the campaign)
    exclusive: bool = True
    #: unit key -> what it leaves for later units (:class:`Kept`), from the settings
    kept: Callable[[Any], dict[str, Kept]] | None = None

    def settings_for(self, scale: str, overrides: dict[str, Any] | None = None) -> Any:
        if scale not in self.scales:
            raise GencraftError(
                f"experiment {self.name!r} has no {scale!r} scale; it has {', '.join(self.scales)}"
            )
        return self.settings(**{**self.scales[scale], **(overrides or {})})


_REGISTRY: dict[str, Experiment] = {}


def register(
    name: str,
    *,
    title: str,
    settings: type,
    scales: dict[str, dict[str, Any]],
    cpu_minutes: float,
    units: Callable[[Any], list[str]] | None = None,
    verdict: Callable[[Any, dict[str, Any]], list[dict[str, Any]]] | None = None,
    volatile: tuple[str, ...] = (),
    shardable: bool = False,
    exclusive: bool = True,
    kept: Callable[[Any], dict[str, Kept]] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: ``@register("search-speed", ...)`` on ``def run(settings, out)``; see
    :class:`Experiment` for ``units``, ``verdict``, ``volatile``, ``shardable``,
    ``exclusive`` and ``kept``."""

    def wrap(fn: Callable) -> Callable:
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = Experiment(
            name,
            title,
            settings,
            fn,
            scales,
            cpu_minutes,
            doc[0] if doc else "",
            units,
            verdict,
            volatile,
            shardable,
            exclusive,
            kept,
        )
        return fn

    return wrap


def experiments() -> dict[str, Experiment]:
    """Every registered experiment, by name."""
    for mod in EXPERIMENT_MODULES:
        importlib.import_module(mod)
    return dict(sorted(_REGISTRY.items()))


def get_experiment(name: str) -> Experiment:
    known = experiments()
    if name not in known:
        raise GencraftError(
            f"unknown experiment {name!r}; `gencraft reproduce --list` shows them: "
            f"{', '.join(known)}"
        )
    return known[name]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    dev = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else (platform.processor() or platform.machine())
    )
    return {"device": dev, "threads": torch.get_num_threads(), "torch": torch.__version__}


class OutOfTime(Exception):
    """Raised by :meth:`ExperimentRun.unit` when the time budget in force (:func:`time_budget`)
    leaves less than the next unit's estimate (a unit in parts: its next part's); every
    finished unit and part is saved already. ``done``: the unit's items finished, of
    ``total`` (0 of 0 for a unit not in parts), or its training's steps saved (``what``)."""

    def __init__(
        self,
        key: str,
        estimate: float,
        left: float,
        done: int = 0,
        total: int = 0,
        what: str = "items",
    ) -> None:
        super().__init__(f"unit {key!r} needs about {estimate:.0f} s, {left:.0f} s left")
        self.key, self.estimate, self.left = key, estimate, left
        self.done, self.total, self.what = done, total, what

    def where(self) -> str:
        """``before 'KEY'``, or ``inside 'KEY' (k of N items done)`` (``steps`` for a
        training stopped at the deadline)."""
        if not self.done:
            return f"before {self.key!r}"
        return f"inside {self.key!r} ({self.done} of {self.total} {self.what} done)"


@dataclass
class Clock:
    """A time budget: a unit starts only if its estimate fits before ``deadline``
    (``time.monotonic()`` seconds). A unit's estimate is the longest finished unit of its kind
    (the key's first word: ``train``, ``eval``...) in the same run, else ``default_seconds``."""

    deadline: float
    default_seconds: float = 0.0
    started: list[str] = field(default_factory=list)  # the units computed under this clock
    # unit seconds of other runs of the same work (a campaign claim's other seeds)
    known: dict[str, float] = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()


class _Deadline(TrainerCallback):
    """A resumable unit's :class:`~gencraft.training.TrainerCallback`: each checkpoint's saved
    steps go to ``report``; under ``clock`` the training stops, saved, before a step that would
    end after its deadline at this call's pace (``fired``). Without a checkpoint it trains
    on: stopping would lose the work."""

    def __init__(self, clock: Clock | None, report: Callable[[int, int], None]) -> None:
        self.clock, self.report, self.fired = clock, report, False

    def on_step_end(self, state: StepState) -> bool:
        if self.clock is None or not state.checkpointed:
            return False
        self.fired = self.clock.left() < state.seconds_per_step
        return self.fired

    def on_save(self, step: int, total: int) -> None:
        if total:
            self.report(step, total)


_CLOCK: contextvars.ContextVar[Clock | None] = contextvars.ContextVar("clock", default=None)


@contextlib.contextmanager
def time_budget(clock: Clock | None) -> Iterator[Clock | None]:
    """Units computed inside start only while ``clock`` allows (None: no budget)."""
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


def unit_kind(key: str) -> str:
    """The kind of a unit, whose earlier timings estimate the next: its key's first word."""
    return key.split(" ", 1)[0]


def _unseeded(key: str) -> str:
    """A unit's key without its ``seed=...`` words: the same work under another seed."""
    return " ".join(w for w in key.split() if not w.startswith("seed="))


def unit_estimate(
    seconds: dict[str, float], key: str, default: float, known: dict[str, float] | None = None
) -> float:
    """Seconds unit ``key`` is expected to take (``seconds``: unit key -> wall time in its run;
    ``known``: the same in other runs of the same work, such as a campaign claim's other
    seeds): the longest finished unit that differs from it only in its seed, in its run, else
    in the other runs; else the longest of its kind, in its run, else in the others; else
    ``default``. A seed's unit costs what another seed's did; a kind may mix costs
    (hso-fewshot's ``n=4 seed=0 baseline`` took 2 s where its ``dynamic eval`` took 240)."""
    bare, kind = _unseeded(key), unit_kind(key)
    for pool in (seconds, known or {}):
        same = [t for k, t in pool.items() if _unseeded(k) == bare]
        if same:
            return max(same)
    for pool in (seconds, known or {}):
        same = [t for k, t in pool.items() if unit_kind(k) == kind]
        if same:
            return max(same)
    return default


def estimate_left(
    seconds: dict[str, float],
    key: str,
    default: float,
    known: dict[str, float] | None = None,
    parts: dict[str, dict[str, Any]] | None = None,
    progress: dict[str, list[int]] | None = None,
    spent: dict[str, float] | None = None,
) -> float:
    """Seconds unit ``key`` still needs: :func:`unit_estimate` at the share of its work not
    yet saved, the items of a unit in parts (``parts``: key -> ``{"total", "items"}``) or the
    steps a resumable unit's checkpoint holds (``progress``: key -> ``[done, total]``).

    When no finished unit measures it (the estimate would be ``default``, a guess), a unit
    with saved work is estimated at its own pace instead: the seconds ``spent`` on it so far
    (key -> seconds) per item or step saved, times those left."""
    measured = unit_estimate(seconds, key, math.nan, known)
    guessed = math.isnan(measured)
    whole = default if guessed else measured
    if parts and key in parts and parts[key]["total"]:
        done, total = len(parts[key]["items"]), parts[key]["total"]
    elif progress and key in progress and progress[key][1]:
        done, total = progress[key]
    else:
        return whole
    if guessed and done and spent and spent.get(key, 0.0) > 0:
        return spent[key] / done * (total - done)  # its own pace beats the claim's guess
    return whole * (1 - done / total)


def _changes(before: Any, now: Any) -> str:
    """How a unit computed again differs from its result ``before``, wall times aside (a
    training seeded alike on the same machine gives the same model)."""
    if not (isinstance(before, dict) and isinstance(now, dict)):
        return "the same result as before" if before == now else "another result than before"
    keys = [k for k in {**before, **now} if not str(k).endswith("seconds")]
    diff = [k for k in keys if before.get(k) != now.get(k)]
    if not diff:
        return "the same result as before"
    return "; ".join(f"{k} {now.get(k)} (before: {before.get(k)})" for k in diff)


class ExperimentRun:
    """One experiment's output folder: resumable units, tables, plots and the report."""

    def __init__(
        self, directory: str | Path, experiment: Experiment, settings: Any, scale: str
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.experiment, self.settings, self.scale = experiment, settings, scale
        self.results_path = self.directory / "results.json"
        self._settings = json.loads(json.dumps(dataclasses.asdict(settings), default=str))
        self.units: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}  # each unit's wall time, as it was computed
        # the wall time of units interrupted so far (a training resumes from its checkpoint):
        # added to the unit's seconds when it finishes
        self.partial: dict[str, float] = {}
        # the finished items of units computed in parts (:meth:`unit_over`), until whole
        self.parts: dict[str, dict[str, Any]] = {}
        # the steps saved of resumable units (a training's checkpoint), until whole
        self.progress: dict[str, list[int]] = {}
        self._mark = 0.0  # when the running unit's time was last added to ``partial``
        # finished units being computed again (:func:`lost_work`): their earlier results, kept
        # (and saved) until the new one is in, to compare and to order the work left
        self.earlier: dict[str, Any] = {}
        if self.results_path.is_file():
            saved = json.loads(self.results_path.read_text())
            old = saved.get("settings", {})
            skip = set(VOLATILE) | set(experiment.volatile)
            diff = sorted(
                k
                for k in set(old) | set(self._settings)
                if k not in skip and old.get(k) != self._settings.get(k)
            )
            if diff:
                raise GencraftError(
                    f"{self.directory} holds results of {experiment.name} with other settings "
                    f"({', '.join(diff)}); use another --output or --restart"
                )
            self.units = saved.get("units", {})
            self.seconds = saved.get("unit_seconds", {})
            self.partial = saved.get("unit_partial_seconds", {})
            self.parts = saved.get("unit_parts", {})
            self.progress = saved.get("unit_progress", {})
            self.earlier = saved.get("units_earlier", {})
        from gencraft.studies.shards import load_unit_files

        load_unit_files(self, set(VOLATILE) | set(experiment.volatile))  # a sharded run's
        self.shard: Any = None  # set during a sharded run's passes
        self.blocks: list[str] = []
        self._forget_lost()
        self.resumed = bool(self.units)

    def _forget_lost(self) -> None:
        """Forget the work :func:`lost_work` finds gone from the folder, saying so in one line
        each: a finished unit whose model is gone is computed again (its earlier result is
        kept in ``earlier`` to compare; its seconds still estimate it); an unfinished one whose
        checkpoint is gone counts its steps from 0."""
        if self.experiment.kept is None:
            return
        kept = self.experiment.kept(self.settings)
        redo, restart = lost_work(kept, self.directory, self.units, self.progress)
        for key in redo:
            self.earlier[key] = self.units.pop(key)
            readers = [r for r in kept[key].readers if r not in self.units]
            print(
                f"{self.experiment.name}: {key!r} runs again: {self.directory / kept[key].made} "
                f"is gone, and {readers[0]!r} reads it"
            )
        for key in restart:
            del self.progress[key]
            self.partial.pop(key, None)  # the time spent went with the checkpoint
            print(
                f"{self.experiment.name}: {key!r} starts over: its checkpoint "
                f"{self.directory / kept[key].checkpoint} is gone"
            )

    def unit(
        self,
        key: str,
        compute: Callable[[], Any],
        *,
        in_parts: bool = False,
        resumes: bool = False,
    ) -> Any:
        """The result of unit ``key``: from an earlier run if it finished there, else computed
        now and saved at once (JSON-able values). Under a :func:`time_budget`, a unit whose
        estimate does not fit raises :class:`OutOfTime` instead of starting (``in_parts``:
        ``compute`` checks the budget before each part itself, :meth:`unit_over`).
        ``resumes``: ``compute(callbacks)`` is one training that resumes from its own
        checkpoint and passes ``callbacks`` to :func:`~gencraft.training.fit`: the steps each
        checkpoint saves are kept as the unit's progress, so that its estimate counts only the
        steps left, and under a budget it stops, saved, before a step that would end after the
        deadline (:class:`OutOfTime` inside the unit)."""
        if key not in self.units and self.shard is not None:
            from gencraft.studies.shards import shard_unit

            return shard_unit(self, key, (lambda: compute(())) if resumes else compute)
        if key not in self.units:
            clock = _CLOCK.get()
            if clock is not None and not in_parts:
                estimate = self.estimate(key, clock.default_seconds, clock.known)
                if estimate > clock.left():
                    raise OutOfTime(key, estimate, clock.left())
                clock.started.append(f"{self.experiment.name}: {key}")
            self._mark = running_clock()
            try:
                value = self._compute(key, compute, clock, resumes)
            except OutOfTime:  # before a part or a step: what is done and its time are saved
                raise
            except BaseException:  # Ctrl-C, a time limit, a failure: the time spent is kept
                self._bank(key)
                self._save()
                raise
            self._bank(key)
            self.units[key] = value
            self.seconds[key] = self.partial.pop(key)
            self.parts.pop(key, None)
            self.progress.pop(key, None)
            again = key in self.earlier
            before = self.earlier.pop(key, None)
            self._save()
            if again:
                print(f"{self.experiment.name}: {key!r} again: {_changes(before, value)}")
        return self.units[key]

    def _compute(self, key: str, compute: Callable[..., Any], clock: Clock | None, resumes: bool):
        """``compute()`` as JSON-able values; a resumable job, ``compute(callbacks)``, reports
        its saved steps and stops at ``clock``'s deadline (:class:`_Deadline`), raising
        :class:`OutOfTime` inside unit ``key``."""
        from gencraft.errors import Interrupted

        if not resumes:
            return json.loads(json.dumps(compute(), default=float))
        deadline = _Deadline(clock, self._saved_upto(key))
        try:
            return json.loads(json.dumps(compute([deadline]), default=float))
        except Interrupted as stop:
            # the stop every process agreed on (one process's own reading may differ)
            if clock is None or stop.why != STOPPED_BY_CALLBACK:  # a Ctrl-C
                raise
            self._bank(key)
            self._save()
            need = self.estimate(key, clock.default_seconds, clock.known)
            raise OutOfTime(key, need, clock.left(), stop.step, stop.total, "steps") from None

    def _saved_upto(self, key: str) -> Callable[[int, int], None]:
        """What a resumable unit's job calls when it saves its first ``done`` of ``total``
        steps: the unit's progress and time so far are saved with it."""

        def report(done: int, total: int) -> None:
            self.progress[key] = [done, total]
            self._bank(key)
            self._save()

        return report

    def _bank(self, key: str) -> None:
        """Add the running unit's time since the last mark to its ``partial`` seconds."""
        now = running_clock()
        self.partial[key] = self.partial.get(key, 0.0) + now - self._mark
        self._mark = now

    def unit_over(
        self,
        key: str,
        total: int,
        step: int,
        compute: Callable[[int, int], list[Any]],
        combine: Callable[[list[Any], float], Any],
        progress: str | None = None,
    ) -> Any:
        """:meth:`unit` ``key`` computed over items ``[0, total)`` in parts of ``step``:
        ``compute(start, stop)`` gives the parts' items (a list of ``stop - start``), each part
        saved as it finishes, so an interrupted unit resumes at its first unfinished part;
        ``combine(items, seconds)`` makes the unit's value from all of them and the seconds
        spent on them (over every invocation). Under a budget, each part starts only if its
        estimate fits (the unit's parts so far, per item, else the unit's estimate's share),
        so a budget is used to its end; :meth:`estimate` gives the share of items left.
        ``progress``: a progress bar's label (None: no bar)."""

        def whole() -> Any:
            if self.shard is not None:  # a sharded run keeps whole units (experiment_shards)
                t0 = running_clock()
                items = [x for a in range(0, total, step) for x in compute(a, min(a + step, total))]
                return combine(items, running_clock() - t0)
            done = self.parts.get(key, {"total": total, "items": []})
            if done["total"] != total:
                raise GencraftError(
                    f"{self.results_path} holds {len(done['items'])} of {done['total']} items "
                    f"of unit {key!r}, which now has {total}; use another --output or --restart"
                )
            items = done["items"]
            with _items_bar(progress, total, len(items)) as bar:
                while len(items) < total:
                    start = len(items)
                    size = min(step, total - start)
                    self._part_fits(key, start, size, total)
                    part = compute(start, start + size)
                    if len(part) != size:
                        raise GencraftError(f"unit {key!r}: a part gave {len(part)} items")
                    items += json.loads(json.dumps(part, default=float))
                    self.parts[key] = done
                    self._bank(key)
                    self._save()
                    bar.update(size)
            self._bank(key)
            return combine(items, self.partial[key])

        return self.unit(key, whole, in_parts=True)

    def _part_fits(self, key: str, done: int, size: int, total: int) -> None:
        """Raise :class:`OutOfTime` unless the budget in force leaves time for the next
        ``size`` items of unit ``key`` (``done`` of ``total`` finished); on the invocation's
        first part, the unit counts as started under the clock."""
        clock = _CLOCK.get()
        if clock is None:
            return
        spent = self.partial.get(key, 0.0) + running_clock() - self._mark
        if done and spent > 0:
            need = spent / done * size
        else:
            need = unit_estimate(self.seconds, key, clock.default_seconds, clock.known)
            need *= size / total
        if need > clock.left():
            raise OutOfTime(key, need, clock.left(), done, total)
        name = f"{self.experiment.name}: {key}"
        if name not in clock.started:
            clock.started.append(name)

    def estimate(self, key: str, default: float, known: dict[str, float] | None = None) -> float:
        """Seconds unit ``key`` is expected to take (:func:`estimate_left`: the share of its
        work left when it has saved parts or steps)."""
        return estimate_left(
            self.seconds, key, default, known, self.parts, self.progress, self.partial
        )

    def _save(self) -> None:
        write_json(
            self.results_path,
            {
                "experiment": self.experiment.name,
                "scale": self.scale,
                "settings": self._settings,
                "machine": machine(),
                "units": self.units,
                "unit_seconds": self.seconds,
                **({"unit_partial_seconds": self.partial} if self.partial else {}),
                **({"unit_parts": self.parts} if self.parts else {}),
                **({"unit_progress": self.progress} if self.progress else {}),
                **({"units_earlier": self.earlier} if self.earlier else {}),
            },
        )

    # ---- the report
    def text(self, markdown: str) -> None:
        self.blocks.append(markdown.strip())

    def table(self, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
        """A Markdown table of ``rows`` (floats with 4 significant digits)."""
        if not rows:
            self.blocks.append("(no rows)")
            return
        # every row's columns, in order of first appearance (rows may differ)
        cols = list(columns or dict.fromkeys(k for r in rows for k in r))

        def fmt(v: Any) -> str:
            if isinstance(v, float):
                return f"{v:.4g}"
            return str(v)

        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
        self.blocks.append("\n".join(lines))

    def plot_path(self, name: str, caption: str = "") -> Path:
        """Where to save a PNG of the report (linked from report.md)."""
        path = self.directory / name
        self.blocks.append(f"![{caption or name}]({name})")
        return path

    def write_report(self, seconds: float) -> Path:
        s = dataclasses.asdict(self.settings)
        head = [
            f"# {self.experiment.name}: {self.experiment.title}",
            "",
            f"Scale `{self.scale}`; settings: "
            + ", ".join(f"`{k}={v}`" for k, v in s.items())
            + ".",
            f"Machine: {machine()['device']}, {machine()['threads']} threads, torch "
            f"{machine()['torch']}; {seconds:.0f} s this run"
            + (" (resumed)" if self.resumed else "")
            + ".",
            f"Rerun: `gencraft reproduce {self.experiment.name} --scale {self.scale} "
            f"--output {self.directory}`.",
        ]
        path = self.directory / "report.md"
        path.write_text("\n".join(head) + "\n\n" + "\n\n".join(self.blocks) + "\n")
        return path


def _items_bar(label: str | None, total: int, done: int) -> Any:
    """A unit's progress bar over its items, from those already done (none without a label)."""
    from gencraft.progress import tqdm

    return tqdm(total=total, initial=done, desc=label, disable=label is None)


def reproduce(
    name: str,
    *,
    scale: str = "cpu",
    output: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    restart: bool = False,
) -> Path:
    """Run experiment ``name`` at ``scale`` into ``output`` (default
    ``outputs/reproduce/NAME-SCALE``), resuming what an earlier run there finished; returns
    the path of ``report.md``. Another process working in ``output`` is refused
    (:class:`~gencraft.training.folder_lock.FolderInUse`) before anything is read or cleared."""
    from gencraft import distributed

    exp = get_experiment(name)
    settings = exp.settings_for(scale, overrides)
    processes = distributed.process_info()[1]
    if processes > 1 and not exp.shardable:  # each process would run every unit
        shardable = ", ".join(n for n, e in experiments().items() if e.shardable)
        raise GencraftError(
            f"gencraft reproduce {name} runs on one process: its units are not shared among "
            f"{processes} processes (those of {shardable} are); run it without accelerate "
            "launch/torchrun"
        )
    out = Path(output or f"outputs/reproduce/{name}-{scale}")
    if out.exists() and not out.is_dir():
        raise GencraftError(f"--output {out} is a file; an experiment writes a directory there")
    with _working_in(out, exp):  # before --restart clears it: another process may work there
        if restart and out.exists():
            _clear(out)
        run = ExperimentRun(out, exp, settings, scale)
        t0 = running_clock()
        if processes > 1:
            from gencraft.studies.shards import sharded_passes

            writes, _ = sharded_passes(exp, settings, run)
            if not writes:  # the main process writes the report
                return out / "report.md"
        exp.run(settings, run)
        _verdict_table(exp, settings, run)
        return run.write_report(running_clock() - t0)


def folder_verdicts(folders: Sequence[str | Path], data_dir: str | None = None) -> Pooled:
    """The verdicts of one experiment's claims pooled over the runs saved in ``folders``
    (each a ``gencraft reproduce`` output holding results.json; e.g. one per training seed),
    as the campaign pools a claim's runs: on the units each has finished, counted against
    those expected (:class:`Pooled`). Refuses, in one line, a folder without results, runs
    of different experiments, and an experiment that gives no verdict. ``data_dir``
    replaces the runs' own (the runs were made elsewhere)."""
    if not folders:
        raise GencraftError("give the folders of one experiment's runs")
    runs, names = [], {}
    for folder in map(Path, folders):
        saved = folder / "results.json"
        if not saved.is_file():
            raise GencraftError(f"{folder} holds no results.json: not a gencraft reproduce run")
        data = json.loads(saved.read_text())
        names.setdefault(data.get("experiment"), []).append(str(folder))
        exp = get_experiment(data.get("experiment"))
        known = {f.name for f in dataclasses.fields(exp.settings)}
        values = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in data.get("settings", {}).items()
            if k in known
        }
        if data_dir is not None and "data_dir" in known:
            values["data_dir"] = data_dir
        runs.append((exp.settings(**values), data.get("units", {})))
    if len(names) > 1:
        which = "; ".join(f"{n}: {', '.join(f)}" for n, f in names.items())
        raise GencraftError(f"the folders hold runs of different experiments ({which})")
    if exp.verdict is None:
        raise GencraftError(f"{exp.name} gives no verdict (its claims are not paired)")
    rows = exp.verdict(runs)
    if exp.units is None:
        return Pooled(exp, rows, sum(len(u) for _, u in runs), None)
    expected = [exp.units(s) for s, _ in runs]
    left = sum(len(units_left(e, u)) for e, (_, u) in zip(expected, runs, strict=True))
    total = sum(map(len, expected))
    return Pooled(exp, rows, total - left, total)


def _verdict_table(exp: Experiment, settings: Any, run: ExperimentRun) -> None:
    """The report's verdicts of the experiment's claims on this run's units (the campaign's,
    paired, with their 95% intervals), when the experiment gives any."""
    from gencraft.metrics.stats import verdict_cells

    if exp.verdict is None:
        return
    rows = exp.verdict([(settings, run.units)])
    if rows:
        run.text("Verdicts on this run (95% intervals; p two-sided):")
        run.table([verdict_cells(v) for v in rows])


@contextlib.contextmanager
def _working_in(out: Path, exp: Experiment) -> Iterator[None]:
    """Hold ``out`` while ``exp`` works there (:mod:`gencraft.training.folder_lock`): process 0
    holds it for a launch's processes, which share it; a coordinator (the campaign) does not."""
    from gencraft import distributed
    from gencraft.training.folder_lock import folder_lock

    if not exp.exclusive or not distributed.is_main():
        yield
        return
    with folder_lock(out):
        yield


def _clear(out: Path) -> None:
    """Remove what ``out`` holds but its lock (``--restart``)."""
    import shutil

    from gencraft.training.folder_lock import LOCK_NAME

    for path in out.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.name != LOCK_NAME:
            path.unlink()


#: a settings-dataclass field with its help text (the CLI flag's)
settings_field = option
