"""The clock the studies' durations use (``gencraft.studies.timing.running_clock``) stands still
while the process is stopped (SIGSTOP until SIGCONT, as Ctrl-Z or a suspended cluster job does), so
a paused run's unit seconds and plan estimates are those of its work; where nothing stops the
process it is ``time.perf_counter``, which the library itself reads (it starts no thread)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from gencraft.errors import GencraftError
from gencraft.studies import timing
from gencraft.studies.campaign import CampaignSettings
from gencraft.studies.runner import ExperimentRun, get_experiment
from gencraft.training import FitConfig, fit

# a child that reads both clocks across a sleep and prints "<perf s> <running s>"
CHILD = textwrap.dedent(
    """
    import sys, time
    from gencraft.studies import timing
    timing.HEARTBEAT, timing.STOP_GAP = 0.05, 1.0
    r0, p0 = timing.running_clock(), time.perf_counter()
    time.sleep(float(sys.argv[1]))
    print(time.perf_counter() - p0, timing.running_clock() - r0, flush=True)
    """
)


# stops process argv[1] twice for 1.5 s; prints each stop's length
HELPER = textwrap.dedent(
    """
    import os, signal, sys, time
    me = int(sys.argv[1])
    for _ in range(2):
        time.sleep(0.2)
        t0 = time.perf_counter()
        os.kill(me, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(me, signal.SIGCONT)
        print(time.perf_counter() - t0, flush=True)
    """
)


def _child(sleep: float) -> tuple[float, float]:
    """(perf seconds, running seconds) of a fresh process across a sleep."""
    # the parent's own gencraft (a mutation run's copy included)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", CHILD, str(sleep)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=True)
    perf, running = map(float, out.stdout.split())
    return perf, running


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX job control")
def test_a_stopped_process_s_clock_leaves_out_the_stop(monkeypatch):
    """This very process is stopped twice for 1.5 s by a helper that then continues it: a
    fresh watch and the process's own clock each leave out both stops."""
    monkeypatch.setattr(timing, "HEARTBEAT", 0.05)
    monkeypatch.setattr(timing, "STOP_GAP", 1.0)
    r0, p0 = timing.running_clock(), time.perf_counter()
    time.sleep(1.1)  # a beat already asleep at the old pace wakes and takes the new one
    watch = timing._Stops()
    watch.start()
    me = os.getpid()
    # the helper prints each stop's length, from just before STOP to just after CONT
    out = subprocess.run(
        [sys.executable, "-c", HELPER, str(me)], capture_output=True, text=True, timeout=60
    )
    time.sleep(0.3)  # the late beats land
    perf, running = time.perf_counter() - p0, timing.running_clock() - r0
    held = sum(float(x) for x in out.stdout.split())
    assert held >= 3.0 and perf >= 1.1 + held + 0.3
    # a beat counts its lateness: the stop less the part of a beat (0.05 s) it fell in, plus
    # how late the beat woke after the CONT (the upper bound's room for a loaded machine)
    assert held - 0.2 < perf - running < held + 0.5, (perf, running, held)
    assert held - 0.2 < watch.total < held + 0.5, (watch.total, held)
    beats = [t for t in threading.enumerate() if t.name == "gencraft-stops"]
    assert len(beats) == 2 and all(t.daemon for t in beats)  # the process's and the fresh one


def test_a_beat_counts_only_its_lateness_beyond_the_gap(monkeypatch):
    monkeypatch.setattr(timing, "HEARTBEAT", 1.0)
    monkeypatch.setattr(timing, "STOP_GAP", 4.0)
    watch = timing._Stops()
    assert watch.total == 0.0
    for now, total in [(1.0, 0.0), (2.5, 0.0), (7.5, 0.0), (13.0, 4.5), (14.0, 4.5), (30.0, 19.5)]:
        watch.see(now)  # 7.5 is exactly STOP_GAP late: not a stop
        assert watch.total == total, now


def test_a_process_never_stopped_reads_perf_counter():
    perf, running = _child(1.5)
    assert perf >= 1.5
    assert running == pytest.approx(perf, abs=0.05)


def _stopped_inside(monkeypatch, seconds: float, stop: float):
    """A callable that takes ``seconds`` of which the stop watch saw ``stop`` stopped."""

    def work():
        time.sleep(seconds)
        monkeypatch.setattr(timing._STOPS, "total", timing._STOPS.total + stop)

    return work


def test_a_unit_s_seconds_leave_out_a_stop_inside_it(tmp_path, monkeypatch):
    run = ExperimentRun(tmp_path, get_experiment("campaign"), CampaignSettings(), "tiny")
    work = _stopped_inside(monkeypatch, 0.3, 0.25)
    t0 = time.perf_counter()
    run.unit("u", lambda: work() or 1)
    outer = time.perf_counter() - t0
    seconds = json.loads((tmp_path / "results.json").read_text())["unit_seconds"]["u"]
    assert 0.0 <= seconds <= outer - 0.25 + 1e-6


def test_a_unit_in_parts_counts_its_parts_without_the_stop(tmp_path, monkeypatch):
    run = ExperimentRun(tmp_path, get_experiment("campaign"), CampaignSettings(), "tiny")
    work = _stopped_inside(monkeypatch, 0.3, 0.25)

    def parts(a, b):
        work()
        return list(range(a, b))

    t0 = time.perf_counter()
    value = run.unit_over("u", 4, 2, parts, lambda items, s: {"seconds": s})
    outer = time.perf_counter() - t0
    assert 0.0 <= value["seconds"] <= outer - 2 * 0.25 + 1e-6


def _fit_linear(model, data, loss_fn, output_dir=None):
    """One epoch of batch 2 with SGD."""
    return fit(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        loss_fn=loss_fn,
        config=FitConfig(epochs=1, batch_size=2, clip=None),
        output_dir=output_dir,
        progress=False,
    )


def test_a_library_training_starts_no_thread():
    """``fit`` and the trainers read ``time.perf_counter``: only a study's unit starts the
    watch's thread. A fresh process trains, and no thread of gencraft's runs (tqdm's own
    monitor may)."""
    code = (
        "import threading, torch\n"
        "from gencraft.training import FitConfig, fit\n"
        "from gencraft.studies import timing\n"
        "m = torch.nn.Linear(2, 1)\n"
        "data = [(torch.randn(2), torch.randn(())) for _ in range(4)]\n"
        "fit(m, torch.optim.SGD(m.parameters(), lr=0.1), data, progress=False,\n"
        "    loss_fn=lambda m, b: ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean(),\n"
        "    config=FitConfig(epochs=1, batch_size=2))\n"
        "names = [t.name for t in threading.enumerate()]\n"
        "print('gencraft-stops' in names, timing._STOPS._pid)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False None"


def test_a_summary_refuses_an_epoch_start(tmp_path):
    model = torch.nn.Linear(2, 1)
    data = [(torch.randn(2), torch.randn(())) for _ in range(2)]
    result = _fit_linear(model, data, lambda m, b: ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean())
    with pytest.raises(GencraftError, match=r"is not a time.perf_counter\(\) reading"):
        result.write_summary(tmp_path, time.time())
