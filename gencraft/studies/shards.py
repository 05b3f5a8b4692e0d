"""An experiment's units shared among accelerate's processes (``gencraft reproduce`` under
``accelerate launch``/torchrun, for experiments registered ``shardable``).

An experiment is a function that asks for its units in order (:meth:`ExperimentRun.unit`) and
builds its report from them. Under N processes every process runs that function in *passes*:

* in a pass, the k-th unit not finished yet belongs to process k mod N. Its owner computes it;
  every other process gets a :class:`Pending` stand-in, and any use of one (arithmetic,
  indexing, formatting, JSON) ends that process's pass. Units are asked for in the same order
  on every process, because every process holds the same finished units when a pass starts;
* after each pass the new units are gathered (``gather_object``) into every process's results,
  and the main process saves ``results.json``; each process also keeps what it computed in
  ``units-<process>-of-<N>.json`` at once, so an interrupted run resumes without redoing it;
* the passes end when no process got a stand-in: every unit is finished. The main process then
  runs the function once more, on finished units only, and writes the report.

The first unfinished unit of a pass is always computed (its owner reaches it before any
stand-in), so the passes end; an error where no stand-in was handed out stops every process
with one line. A shardable experiment's units must not call collectives themselves (a unit runs
on one process), and its costly work must be in units (the rest runs in every pass).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gencraft.errors import GencraftError


class Blocked(Exception):
    """A pass used a unit another process computes in it."""


class Pending:
    """Stand-in for a unit another process computes in this pass: any use raises Blocked."""

    def __repr__(self) -> str:
        return "<unit computed by another process>"


def _blocked(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise Blocked


for _name in [
    "__getattr__",
    "__getitem__",
    "__setitem__",
    "__iter__",
    "__len__",
    "__contains__",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__str__",
    "__format__",
    "__round__",
    "__neg__",
    "__abs__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__floordiv__",
    "__mod__",
    "__pow__",
    "__call__",
]:
    setattr(Pending, _name, _blocked)


@dataclass
class Shard:
    """This process's state in one pass: its index and the process count, the unfinished
    units met so far, the stand-ins handed out, and what it computed (kept across passes)."""

    process: int
    processes: int
    met: int = 0
    handed: int = 0
    new: dict[str, Any] = field(default_factory=dict)
    new_seconds: dict[str, float] = field(default_factory=dict)


def unit_file(directory: Path, shard: Shard) -> Path:
    return directory / f"units-{shard.process}-of-{shard.processes}.json"


def shard_unit(run: Any, key: str, compute: Any) -> Any:
    """:meth:`ExperimentRun.unit` for an unfinished unit in a pass: computed and kept if this
    process owns it, else a :class:`Pending`."""
    from gencraft.studies.timing import running_clock
    from gencraft.training.state import write_json

    shard = run.shard
    owner = shard.met % shard.processes
    shard.met += 1
    if owner != shard.process:
        shard.handed += 1
        return Pending()
    t0 = running_clock()
    value = json.loads(json.dumps(compute(), default=float))
    run.units[key] = shard.new[key] = value
    run.seconds[key] = shard.new_seconds[key] = running_clock() - t0
    kept = {"settings": run._settings, "units": shard.new, "unit_seconds": shard.new_seconds}
    write_json(unit_file(run.directory, shard), kept)
    return value


def load_unit_files(run: Any, skip: set[str]) -> None:
    """Add the units an earlier sharded run's processes kept (same settings, ``skip`` aside)."""
    for path in sorted(run.directory.glob("units-*-of-*.json")):
        saved = json.loads(path.read_text())
        old = saved.get("settings", {})
        if any(old.get(k) != run._settings.get(k) for k in (set(old) | set(run._settings)) - skip):
            continue
        for key, value in saved.get("units", {}).items():
            run.units.setdefault(key, value)
            run.seconds.setdefault(key, saved.get("unit_seconds", {}).get(key, 0.0))


def _one_pass(exp: Any, settings: Any, run: Any) -> str | None:
    """One pass of ``exp`` on this process; an error message when it failed for a reason
    other than a stand-in."""
    run.blocks = []
    try:
        exp.run(settings, run)
    except Blocked:
        pass
    except Exception as err:  # after a stand-in, any error may come from it
        if not run.shard.handed:
            return f"{type(err).__name__}: {err}"
    return None


def sharded_passes(exp: Any, settings: Any, run: Any) -> tuple[bool, int]:
    """Run ``exp``'s passes until every unit is finished (see the module doc); returns whether
    this process writes the report (the main one) and the number of passes."""
    from accelerate.utils import gather_object

    from gencraft.distributed import process_info

    process, processes = process_info()
    run.shard = Shard(process, processes)
    passes = 0
    while True:
        passes += 1
        run.shard.met = run.shard.handed = 0
        error = _one_pass(exp, settings, run)
        every = gather_object([(run.shard.new, run.shard.new_seconds, run.shard.handed, error)])
        for new, seconds, _, _ in every:
            for key, value in new.items():
                run.units.setdefault(key, value)
                run.seconds.setdefault(key, seconds.get(key, 0.0))
        failed = [e for *_, e in every if e]
        if failed:
            raise GencraftError(f"{exp.name} failed on a process: {failed[0]}")
        if process == 0:
            run._save()
        if not any(handed for _, _, handed, _ in every):
            break
    run.shard, run.blocks = None, []
    return process == 0, passes
