"""``gencraft reproduce`` of a shardable experiment on 2 and 3 gloo processes: the
units are shared out (each computed exactly once, by one process), the report and results
equal one process's, a unit that depends on others waits for them, a stand-in for another
process's unit cannot be read, and the units a process kept resume an interrupted run."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from gencraft.errors import GencraftError
from gencraft.studies.runner import _REGISTRY, register, reproduce
from gencraft.studies.shards import Blocked, Pending
from tests.test_distributed import _free_port

NAME = "toy-sharded"


@dataclass
class ToySettings:
    n: int = 7
    log: str = ""  # a folder: each computed unit appends its key to <process>.txt


def _computed(s: ToySettings, key: str, value: object) -> object:
    with Path(s.log, f"{os.environ.get('RANK', '0')}.txt").open("a") as f:
        f.write(key + "\n")
    return value


def _toy(s: ToySettings, run) -> None:
    squares = [
        run.unit(f"square {i}", lambda i=i: _computed(s, f"square {i}", i * i)) for i in range(s.n)
    ]
    run.text(json.dumps(squares))  # a stand-in met by json (TypeError): the pass stops here
    total = sum(squares)  # needs every square: a pass stops here until they are all done
    plus = run.unit("total + 1", lambda: _computed(s, "total + 1", total + 1))
    if total > 50:  # which units are asked for depends on finished ones
        run.unit("half", lambda: _computed(s, "half", {"half": total / 2}))
    run.table([{"i": i, "square": q} for i, q in enumerate(squares)])
    run.text(f"total {total}, plus one {plus}")


@pytest.fixture
def toy():
    register(
        NAME, title="toy", settings=ToySettings, scales={"tiny": {}}, cpu_minutes=0, shardable=True
    )(_toy)
    yield
    _REGISTRY.pop(NAME, None)


def _body(report: Path) -> str:
    """The report without its timing line."""
    return "\n".join(
        line for line in report.read_text().splitlines() if not line.startswith("Machine:")
    )


def _worker(rank: int, world: int, port: int, out: str, log: str) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
    env.update(WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(env)
    register(
        NAME, title="toy", settings=ToySettings, scales={"tiny": {}}, cpu_minutes=0, shardable=True
    )(_toy)
    from gencraft.studies.runner import ExperimentRun, get_experiment
    from gencraft.studies.shards import sharded_passes

    exp = get_experiment(NAME)
    run = ExperimentRun(out, exp, ToySettings(log=log), "tiny")
    writes, passes = sharded_passes(exp, ToySettings(log=log), run)
    Path(log, f"passes-{rank}.json").write_text(json.dumps([writes, passes]))
    reproduce(NAME, scale="tiny", output=out, overrides={"log": log})
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 3])
def test_each_unit_runs_once_on_one_process_and_the_report_is_one_process(world, tmp_path, toy):
    alone, log = tmp_path / "alone", tmp_path / "log-alone"
    log.mkdir()
    want = _body(reproduce(NAME, scale="tiny", output=alone, overrides={"log": str(log)}))
    shared, log = tmp_path / "shared", tmp_path / "log"
    log.mkdir()
    args = (world, _free_port(), str(shared), str(log))
    mp.start_processes(_worker, args=args, nprocs=world, start_method="spawn")
    assert _body(shared / "report.md") == want.replace(str(alone), str(shared)).replace(
        str(tmp_path / "log-alone"), str(log)
    )
    # once each across the processes (the second reproduce computed nothing more)
    computed = sorted(k for r in range(world) for k in (log / f"{r}.txt").read_text().splitlines())
    assert computed == sorted([f"square {i}" for i in range(7)] + ["total + 1", "half"])
    # the squares were shared out: every process computed some in the first pass
    assert all((log / f"{r}.txt").read_text().count("square") >= 7 // world for r in range(world))
    passes = [json.loads((log / f"passes-{r}.json").read_text()) for r in range(world)]
    assert passes == [[r == 0, 3] for r in range(world)]  # squares; the sum's units; none left
    units = json.loads((shared / "results.json").read_text())["units"]
    assert units == json.loads((alone / "results.json").read_text())["units"]


def test_a_stand_in_cannot_be_read():
    p = Pending()
    uses = [lambda: p + 1, lambda: 1 + p, lambda: list(p), lambda: p["x"], lambda: p.x]
    uses += [
        lambda: f"{p}",
        lambda: bool(p),
        lambda: float(p),
        lambda: json.dumps(p, default=float),
    ]
    for use in uses:
        with pytest.raises(Blocked):
            use()


def test_an_error_where_no_stand_in_was_handed_out_is_one_line_naming_the_experiment(
    monkeypatch, tmp_path, toy
):
    from gencraft import distributed

    monkeypatch.setattr(distributed, "process_info", lambda: (0, 2))
    with pytest.raises(GencraftError) as err:  # n = "x": range() refuses it before any unit
        reproduce(NAME, scale="tiny", output=tmp_path / "r", overrides={"n": "x"})
    assert str(err.value) == (
        "toy-sharded failed on a process: "
        "TypeError: 'str' object cannot be interpreted as an integer"
    )


def test_units_kept_by_the_processes_of_an_interrupted_run_are_not_redone(tmp_path, toy):
    log = tmp_path / "log"
    log.mkdir()
    out = tmp_path / "r"
    out.mkdir()
    settings = {"n": 7, "log": str(log)}
    kept = {"settings": settings, "units": {"square 3": 9, "square 5": 25}, "unit_seconds": {}}
    (out / "units-1-of-2.json").write_text(json.dumps(kept))
    other = {**kept, "settings": {**settings, "n": 8}, "units": {"square 4": 16}}
    (out / "units-0-of-2.json").write_text(json.dumps(other))  # another run's: not taken
    reproduce(NAME, scale="tiny", output=out, overrides={"log": str(log)})
    done = (log / "0.txt").read_text().splitlines()
    assert "square 3" not in done and "square 5" not in done and "square 4" in done


def test_an_experiment_not_declared_shardable_is_refused_on_several_processes(
    monkeypatch, tmp_path
):
    from gencraft import distributed

    monkeypatch.setattr(distributed, "process_info", lambda: (0, 2))
    with pytest.raises(
        GencraftError, match="not shared among 2 processes \\(those of search-empty"
    ):
        reproduce("hso-fewshot", scale="tiny", output=tmp_path / "r")
    assert not (tmp_path / "r").exists()  # refused before any work
