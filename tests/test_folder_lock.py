"""One process at a time in an output folder (:mod:`gencraft.training.folder_lock`): a live
holder is refused by name, a dead one's lock is taken over, contenders never both win, and
``reproduce`` and the campaign honour it (a held run is refused before any work; the campaign
skips it and goes on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.cli.main import main
from gencraft.studies.runner import get_experiment, reproduce
from gencraft.training.folder_lock import (
    LOCK_NAME,
    FolderInUse,
    Holder,
    _pid_start,
    acquire,
    folder_lock,
    read_holder,
    release,
    this_process,
)


@pytest.fixture
def other_process():
    """A live process other than this one, and its holder record."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield Holder(proc.pid, this_process().host, _pid_start(proc.pid), "2026-11-27 10:00:00")
    finally:
        proc.kill()
        proc.wait()


def _write(folder, holder: Holder | str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = holder if isinstance(holder, str) else json.dumps(asdict(holder))
    (folder / LOCK_NAME).write_text(text)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stale_lock(folder):
    _write(folder, Holder(_dead_pid(), this_process().host, None, "2026-11-27 10:00:00"))


def test_a_live_holder_is_refused_by_name_and_the_folder_is_free_once_it_lets_go(
    tmp_path, other_process
):
    _write(tmp_path, other_process)
    with pytest.raises(FolderInUse) as err:
        acquire(tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert f"process {other_process.pid} on {other_process.host}" in message
    assert "wait for it to finish or stop it" in message
    assert read_holder(tmp_path) == other_process  # not touched
    _write(tmp_path, replace(other_process, pid_start=None))  # written where /proc is absent
    with pytest.raises(FolderInUse):
        acquire(tmp_path)
    _write(tmp_path, other_process)
    release(tmp_path, this_process())  # not ours: stays
    assert read_holder(tmp_path) == other_process
    (tmp_path / LOCK_NAME).unlink()
    with folder_lock(tmp_path) as me:
        assert read_holder(tmp_path) == me and me.pid == this_process().pid
        with folder_lock(tmp_path) as inner:  # this process again (training inside a run)
            assert inner is None
        assert read_holder(tmp_path) == me  # the outer holder still holds it
    assert not (tmp_path / LOCK_NAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary file left


def test_a_lock_whose_process_is_gone_or_whose_pid_was_reused_is_taken_over(tmp_path):
    me = this_process()
    for stale in (
        Holder(_dead_pid(), me.host, None, "2026-11-27 10:00:00"),
        replace(me, pid_start="1"),  # this pid, but started at another time: reused
        "{not json",  # damaged
    ):
        _write(tmp_path, stale)
        assert acquire(tmp_path) == read_holder(tmp_path)
        assert read_holder(tmp_path).pid == me.pid
        (tmp_path / LOCK_NAME).unlink()


def test_another_hosts_lock_is_refused_and_names_the_file_to_remove(tmp_path):
    _write(tmp_path, Holder(1, "elsewhere.example", None, "2026-11-27 10:00:00"))
    with pytest.raises(FolderInUse, match=r"on elsewhere\.example") as err:
        acquire(tmp_path)
    assert f"if that process is gone, remove {tmp_path / LOCK_NAME}" in str(err.value)


def test_the_lock_is_given_back_when_the_work_fails(tmp_path):
    with pytest.raises(RuntimeError), folder_lock(tmp_path / "new" / "run"):  # parents made
        raise RuntimeError("a unit failed")
    assert not (tmp_path / "new" / "run" / LOCK_NAME).exists()


_CONTENDER = """
import os, sys, time
from gencraft.training.folder_lock import FolderInUse, folder_lock
folder, start, marks, others = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
while time.time() < start:  # all start together
    time.sleep(0.001)
try:
    with folder_lock(folder):
        print("held", flush=True)
        deadline = time.time() + 240  # a loaded machine starts the others late
        while len(os.listdir(marks)) < others and time.time() < deadline:
            time.sleep(0.01)  # held until every other process has tried, however late
except FolderInUse:
    open(os.path.join(marks, str(os.getpid())), "w").close()
    print("refused", flush=True)
"""


@settings(max_examples=4, deadline=None)
@given(contenders=st.integers(2, 5), stale=st.booleans())
def test_of_processes_started_together_exactly_one_holds_the_folder(
    tmp_path_factory, contenders, stale
):
    folder = tmp_path_factory.mktemp("contended")
    if stale:
        _stale_lock(folder)
    marks = tmp_path_factory.mktemp("marks")
    args = [str(folder), str(time.time() + 1.0), str(marks), str(contenders - 1)]
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONTENDER, *args], stdout=subprocess.PIPE)
        for _ in range(contenders)
    ]
    said = sorted(p.communicate(timeout=300)[0].decode().strip() for p in procs)
    assert said == ["held"] + ["refused"] * (contenders - 1)
    assert [p.name for p in folder.iterdir()] == []  # the holder gave it back, nothing left


def test_reproduce_refuses_a_held_folder_before_reading_or_clearing_it(
    tmp_path, other_process, capsys
):
    _write(tmp_path, other_process)
    (tmp_path / "results.json").write_text('{"units": {"kept": 1}}')
    args = ["reproduce", "hso-fewshot", "--scale", "tiny", "--output", str(tmp_path)]
    assert main([*args, "--restart"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"in use by process {other_process.pid}" in err
    assert json.loads((tmp_path / "results.json").read_text()) == {"units": {"kept": 1}}
    with pytest.raises(FolderInUse):
        reproduce("hso-fewshot", scale="tiny", output=tmp_path)


def test_a_run_holds_its_folder_while_it_works_and_a_restart_keeps_the_lock(tmp_path, monkeypatch):
    (tmp_path / "old").mkdir()
    (tmp_path / "results.json").write_text("{}")
    seen = []
    exp = get_experiment("hso-fewshot")
    monkeypatch.setattr(exp, "run", lambda s, run: seen.append(read_holder(tmp_path)))
    reproduce("hso-fewshot", scale="tiny", output=tmp_path, restart=True)
    assert seen[0] is not None and seen[0].pid == this_process().pid
    assert not (tmp_path / "old").exists() and not (tmp_path / LOCK_NAME).exists()


def test_a_training_refuses_a_folder_another_process_holds_and_holds_its_own(
    tmp_path, other_process, capsys
):
    import torch

    from gencraft.training import FitConfig, fit

    def train(out):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        data = [(torch.randn(2), torch.randn(())) for _ in range(4)]
        seen = []
        fit(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            data,
            loss_fn=lambda m, b: ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean(),
            config=FitConfig(epochs=1, batch_size=2),
            output_dir=out,
            progress=False,
            on_step=lambda step, batch: seen.append(read_holder(out)),
        )
        return seen

    _write(tmp_path / "held", other_process)
    with pytest.raises(FolderInUse, match=f"in use by process {other_process.pid}"):
        train(tmp_path / "held")
    assert not (tmp_path / "held" / "checkpoint").exists()  # refused before any work
    seen = train(tmp_path / "free")
    assert len(seen) == 2 and all(h.same_process(this_process()) for h in seen)
    assert not (tmp_path / "free" / LOCK_NAME).exists()
    with folder_lock(tmp_path / "mine"):  # a folder this process holds: trains inside it
        assert len(train(tmp_path / "mine")) == 2
        assert read_holder(tmp_path / "mine").same_process(this_process())


def test_the_campaign_skips_a_run_another_process_holds_and_runs_the_rest(
    shared_data, tmp_path, other_process, capsys
):
    held = tmp_path / "recurrence" / "seed0"
    _write(held, other_process)
    _write(tmp_path, other_process)  # another campaign process: it shares the campaign
    args = ["reproduce", "campaign", "--scale", "tiny", "--output", str(tmp_path)]
    args += ["--data-dir", str(shared_data), "--claims", "recurrence"]
    assert main([*args, "--plan"]) == 0
    plan = capsys.readouterr().out
    assert "| minutes left (est.) | starts by minute | in budget | in use by |" in plan
    assert f"| 0 done, 8 left | 0.4 | 0 | - | process {other_process.pid} on" in plan
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"| recurrence | seed0 | skipped: in use by process {other_process.pid} on" in out
    assert "| recurrence | seed1 | done | 8 |" in out
    assert not (held / "results.json").exists()
    assert not (tmp_path / "recurrence" / "seed1" / LOCK_NAME).exists()
    assert read_holder(tmp_path) == other_process  # the campaign's own folder is not held


def test_this_process_names_its_pid_its_start_and_when(tmp_path):
    import os
    import time as clock

    me = this_process()
    assert me.pid == os.getpid() and me.pid_start == _pid_start(os.getpid())
    assert me.pid_start is not None and me.pid_start.isdigit()  # Linux: /proc is there
    when = clock.mktime(clock.strptime(me.since, "%Y-%m-%d %H:%M:%S"))
    assert abs(when - clock.time()) < 60


def test_the_pid_start_is_the_field_after_the_last_parenthesis(monkeypatch):
    """A command's name may hold ") ": the fields are counted after the last one."""
    import gencraft.training.folder_lock as fl

    fields = " ".join(str(k) for k in range(3, 53))  # fields 3.. (state onwards); 22 is '22'
    line = f"4242 (odd) 1 2) name) {fields}\n"

    class FakePath:
        def __init__(self, where):
            self.where = where

        def read_text(self):
            assert self.where == "/proc/4242/stat"
            return line

    monkeypatch.setattr(fl, "Path", FakePath)
    assert fl._pid_start(4242) == "22"


def test_a_lock_that_keeps_changing_hands_is_one_line(tmp_path, monkeypatch):
    import gencraft.training.folder_lock as fl

    monkeypatch.setattr(fl, "_try_create", lambda path, me: False)
    monkeypatch.setattr(fl, "read_holder", lambda folder: None)  # gone each time it is read
    monkeypatch.setattr(fl, "_TAKE_WITHIN", 0.2)
    with pytest.raises(fl.GencraftError, match=r"could not take .*: it kept changing hands"):
        acquire(tmp_path)


def test_a_breaker_that_finishes_between_open_and_stat_is_not_an_error(tmp_path, monkeypatch):
    """CI once saw this race: another process's break mark was there at ``open`` and gone at
    ``stat``. The taker tries again and takes the stale lock."""
    import gencraft.training.folder_lock as fl

    _stale_lock(tmp_path)
    mark = str(tmp_path / (LOCK_NAME + ".break"))
    real_open, raised = os.open, []

    def open_(path, flags, *args):
        if str(path) == mark and not raised:  # the other breaker had it, and is done by stat
            raised.append(path)
            raise FileExistsError(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(fl.os, "open", open_)
    me = acquire(tmp_path)
    assert raised and me is not None and read_holder(tmp_path) == me
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def test_a_taker_waits_for_a_slow_breaker_however_many_tries_that_takes(tmp_path, monkeypatch):
    """Another process breaks the stale lock slowly (a loaded machine): the taker waits for its
    mark to go, not for a count of tries, then takes the folder."""
    import gencraft.training.folder_lock as fl

    _stale_lock(tmp_path)
    mark = tmp_path / (LOCK_NAME + ".break")
    mark.touch()  # fresh: that breaker is at work
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 500:  # the other breaker finishes, leaving the stale lock in place
            mark.unlink()

    monkeypatch.setattr(fl.time, "sleep", sleep)
    me = acquire(tmp_path)
    assert len(waits) == 500 and set(waits) == {fl._RETRY_WAIT}
    assert me is not None and read_holder(tmp_path) == me
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]
