"""One process at a time in an output folder (:mod:`gencraft.folder_lock`): a live holder is
refused by name, a dead one's lock is taken over, contenders never both win, and
``reproduce`` and the campaign honour it (a held run is refused before any work; the campaign
skips it and goes on)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import asdict, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.cli.main import main
from gencraft.experiments import get_experiment, reproduce
from gencraft.folder_lock import (
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
    release(tmp_path, this_process())  # not ours: stays
    assert read_holder(tmp_path) == other_process
    (tmp_path / LOCK_NAME).unlink()
    with folder_lock(tmp_path) as me:
        assert read_holder(tmp_path) == me and me.pid == this_process().pid
        with pytest.raises(FolderInUse):  # nor twice by the same process
            acquire(tmp_path)
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
    with pytest.raises(FolderInUse, match="on elsewhere.example") as err:
        acquire(tmp_path)
    assert f"if that process is gone, remove {tmp_path / LOCK_NAME}" in str(err.value)


def test_the_lock_is_given_back_when_the_work_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with folder_lock(tmp_path / "new"):
            raise RuntimeError("a unit failed")
    assert not (tmp_path / "new" / LOCK_NAME).exists()


@settings(max_examples=12, deadline=None)
@given(contenders=st.integers(2, 8), stale=st.booleans())
def test_of_contenders_started_together_exactly_one_wins(tmp_path_factory, contenders, stale):
    folder = tmp_path_factory.mktemp("contended")
    if stale:
        _write(folder, Holder(_dead_pid(), this_process().host, None, "2026-11-27 10:00:00"))
    start, outcomes = threading.Barrier(contenders), []

    def contend():
        start.wait()
        try:
            outcomes.append(acquire(folder))
        except FolderInUse as busy:
            outcomes.append(busy)

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [o for o in outcomes if isinstance(o, Holder)]
    assert len(outcomes) == contenders and len(won) == 1
    assert read_holder(folder) == won[0]
    assert [p.name for p in folder.iterdir()] == [LOCK_NAME]


def test_processes_started_together_never_both_hold_a_folder(tmp_path):
    script = (
        "import sys, time\n"
        "from gencraft.folder_lock import acquire, FolderInUse\n"
        "try:\n"
        "    acquire(sys.argv[1])\n"
        "    print('held', flush=True)\n"
        "    time.sleep(3)\n"
        "except FolderInUse:\n"
        "    print('refused', flush=True)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    said = sorted(p.communicate(timeout=60)[0].decode().strip() for p in procs)
    assert said == ["held", "refused", "refused", "refused"]


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


def test_a_run_holds_its_folder_while_it_works_and_a_restart_keeps_the_lock(
    tmp_path, monkeypatch
):
    (tmp_path / "old").mkdir()
    (tmp_path / "results.json").write_text("{}")
    seen = []
    exp = get_experiment("hso-fewshot")
    monkeypatch.setattr(exp, "run", lambda s, run: seen.append(read_holder(tmp_path)))
    reproduce("hso-fewshot", scale="tiny", output=tmp_path, restart=True)
    assert seen[0] is not None and seen[0].pid == this_process().pid
    assert not (tmp_path / "old").exists() and not (tmp_path / LOCK_NAME).exists()


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
    assert f"| 0 done, 6 left | 0.3 | 0 | - | process {other_process.pid} on" in plan
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"| recurrence | seed0 | skipped: in use by process {other_process.pid} on" in out
    assert "| recurrence | seed1 | done | 6 |" in out
    assert not (held / "results.json").exists()
    assert not (tmp_path / "recurrence" / "seed1" / LOCK_NAME).exists()
    assert read_holder(tmp_path) == other_process  # the campaign's own folder is not held
