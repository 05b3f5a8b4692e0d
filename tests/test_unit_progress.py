"""A unit that resumes from its own checkpoint (a training: ``ExperimentRun.unit(...,
resumes=True)``) keeps the steps its checkpoint holds as its progress, so that an estimate (a
budget's, the campaign plan's) counts only the steps left; the shared training loop reports
each checkpoint it saves (its callback's ``on_save``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.studies.campaign import CLAIMS, CampaignSettings, plan_rows, run_states
from gencraft.studies.runner import (
    Clock,
    OutOfTime,
    estimate_left,
    reproduce,
    time_budget,
)
from gencraft.training import FitConfig, Interrupted, StepState, TrainerCallback, fit
from tests.test_unit_parts import _run, _saved


@settings(max_examples=60, deadline=None)
@given(
    whole=st.floats(1.0, 1e5),
    total=st.integers(0, 40),
    data=st.data(),
    has_parts=st.booleans(),
    has_steps=st.booleans(),
)
def test_the_estimate_left_is_the_share_of_the_work_not_saved(
    whole, total, data, has_parts, has_steps
):
    """Items saved in parts count first, then a checkpoint's steps; other units (another
    seed's, whose time is the estimate) count whole."""
    items, steps = data.draw(st.integers(0, total)), data.draw(st.integers(0, total))
    seconds = {"train a seed=0": whole}
    parts = {"train a seed=1": {"total": total, "items": list(range(items))}} if has_parts else {}
    progress = {"train a seed=1": [steps, total]} if has_steps else {}
    got = estimate_left(seconds, "train a seed=1", 7.0, None, parts, progress)
    if total and has_parts:
        want = whole * (1 - items / total)
    elif total and has_steps:
        want = whole * (1 - steps / total)
    else:
        want = whole
    assert got == pytest.approx(want)
    assert estimate_left(seconds, "train a seed=2", 7.0, None, parts, progress) == whole
    assert estimate_left({}, "train a seed=2", 7.0, None, parts, progress) == 7.0


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(1, 40),
    data=st.data(),
    spent=st.floats(0.0, 1e4, allow_subnormal=False),
    measured=st.booleans(),
    in_parts=st.booleans(),
)
def test_a_unit_no_finished_unit_measures_is_estimated_at_its_own_pace(
    total, data, spent, measured, in_parts
):
    """With only the claim's guess to go on, a unit with saved work takes its seconds so far
    per step (or item) saved, times those left; a measured unit of its kind, or no saved work
    or time, keeps the share of the measurement or the guess."""
    done = data.draw(st.integers(0, total))
    seconds = {"train b": 500.0} if measured else {"eval a": 3.0}
    parts = {"train a": {"total": total, "items": list(range(done))}} if in_parts else {}
    progress = {} if in_parts else {"train a": [done, total]}
    got = estimate_left(seconds, "train a", 7.0, None, parts, progress, {"train a": spent})
    if measured:
        want = 500.0 * (1 - done / total)
    elif done and spent > 0:
        want = spent / done * (total - done)
    else:
        want = 7.0 * (1 - done / total)
    assert got == pytest.approx(want)
    assert estimate_left(seconds, "train a", 7.0, None, parts, progress) == pytest.approx(
        (500.0 if measured else 7.0) * (1 - done / total)
    )


def test_a_resumable_unit_keeps_its_saved_steps_until_it_is_whole(tmp_path, monkeypatch):
    import types

    import gencraft.studies.runner as ex

    now = [0.0]
    monkeypatch.setattr(ex, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(ex, "running_clock", lambda: now[0])

    def cut(callbacks):
        for step in (2, 4):
            now[0] += 30.0
            callbacks[0].on_save(step, 10)
            # what a process killed now (no Ctrl-C, nothing saved on the way out) keeps
            assert _saved(tmp_path)["unit_progress"] == {"t seed=1": [step, 10]}
            assert _saved(tmp_path)["unit_partial_seconds"] == {"t seed=1": now[0]}
        now[0] += 5.0
        raise KeyboardInterrupt

    run = _run(tmp_path)
    run.seconds = {"t seed=0": 100.0}
    with pytest.raises(KeyboardInterrupt):
        run.unit("t seed=1", cut, resumes=True)
    assert _saved(tmp_path)["unit_partial_seconds"] == {"t seed=1": 65.0}
    run = _run(tmp_path)
    assert run.estimate("t seed=1", 0.0) == pytest.approx(60.0)  # 6 of 10 steps left
    alone = _run(tmp_path)
    alone.seconds = {}  # no other seed measures it: its own 65 s for 4 steps, 6 steps left
    assert alone.estimate("t seed=1", 0.0) == pytest.approx(65.0 / 4 * 6)
    with time_budget(Clock(now[0] + 50.0)), pytest.raises(OutOfTime) as stop:  # 60 s: no
        run.unit("t seed=1", lambda callbacks: 1, resumes=True)
    assert stop.value.estimate == pytest.approx(60.0)
    with time_budget(Clock(now[0] + 61.0)):  # started, although the whole unit would not fit
        assert run.unit("t seed=1", lambda cb: cb[0].on_save(10, 10) or 1, resumes=True) == 1
    saved = _saved(tmp_path)
    assert "unit_progress" not in saved and saved["unit_seconds"]["t seed=1"] == 65.0


class _Record(TrainerCallback):
    """What a callback saw: each checkpoint's (step, total) and each step's state; it stops
    the run after step ``stop_after``."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.saved: list[tuple[int, int]] = []
        self.states: list[StepState] = []
        self.stop_after = stop_after

    def on_step_end(self, state: StepState) -> bool:
        self.states.append(state)
        return self.stop_after is not None and state.step >= self.stop_after

    def on_save(self, step: int, total: int) -> None:
        self.saved.append((step, total))


def _fit(
    out, stop_at: int | None = None, steps: list[int] | None = None, callbacks=()
) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = [torch.randn(3) for _ in range(6)]

    def on_step(step, batch):
        if steps is not None:
            steps.append(step)
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, handled between steps

    fit(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        loss_fn=lambda m, batch: m(batch).pow(2).mean(),
        config=FitConfig(max_steps=6, batch_size=1, eval_every=2),
        valid=data[:2],
        collate_fn=torch.stack,
        output_dir=out,
        progress=False,
        on_step=on_step,
        callbacks=callbacks,
    )
    return model


def test_the_training_loop_reports_each_checkpoint_it_saves(tmp_path):
    rec = _Record()
    with pytest.raises(Interrupted):
        _fit(tmp_path / "run", stop_at=3, callbacks=[rec])
    assert rec.saved == [(0, 6), (2, 6), (3, 6)]  # the start, step 2's evaluation, the Ctrl-C
    assert [(s.step, s.total, s.first_step, s.checkpointed) for s in rec.states] == [
        (k, 6, 0, True) for k in (1, 2, 3)
    ]
    rec = _Record()
    _fit(tmp_path / "run", callbacks=[rec])  # resumed: where it starts, then as it saves
    assert rec.saved[:2] == [(3, 6), (4, 6)] and rec.saved[-1] == (6, 6)
    assert [s.first_step for s in rec.states] == [3, 3, 3] and rec.states[0].seconds > 0
    shutil.rmtree(tmp_path / "run" / "checkpoint")  # a checkpoint lost: from nothing
    rec = _Record()
    with pytest.raises(Interrupted):
        _fit(tmp_path / "run", stop_at=1, callbacks=[rec])
    assert rec.saved == [(0, 6), (1, 6)]
    rec = _Record()
    _fit(None, callbacks=[rec])  # no checkpoint kept: nothing saved to resume from
    assert rec.saved == [] and not any(s.checkpointed for s in rec.states)


def _cut_at(step: int, monkeypatch) -> None:
    """The next training in this process gets a Ctrl-C after its optimizer step ``step``."""
    import importlib

    fit_module = importlib.import_module("gencraft.training.fit")
    real, cut = fit_module._Loop.after_step, []

    def after_step(loop, *a):
        real(loop, *a)
        if loop.st.step == step and not cut:
            cut.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(fit_module._Loop, "after_step", after_step)


def test_a_cut_training_shows_under_way_in_the_plan_and_resumes(shared_data, tmp_path, monkeypatch):
    """The campaign's recurrence run, its baseline's training cut at step 2 of 4: the plan
    counts that unit's steps left at its own pace, and the next invocation finishes it."""
    s = CampaignSettings(claims=("recurrence",), data_dir=str(shared_data))
    over = {"data_dir": str(shared_data), "claims": ("recurrence",)}
    root = tmp_path / "campaign"
    _cut_at(2, monkeypatch)
    with pytest.raises(Interrupted):
        reproduce("campaign", scale="tiny", output=root, overrides=over)
    seed0 = root / "recurrence" / "seed0"
    assert _saved(seed0)["unit_progress"] == {"train baseline": [2, 4]}
    state = run_states(CLAIMS["recurrence"], "tiny", root, s.data_dir)[0]
    monkeypatch.setitem(CLAIMS["recurrence"].unit_minutes, "tiny", 10.0)  # no rounding to hide
    default, spent = 600.0, _saved(seed0)["unit_partial_seconds"]["train baseline"]
    row = plan_rows(s, "tiny", root)[0]
    assert row["units"] == f"0 done, {len(state.left)} left (1 under way)"
    # no finished unit measures the training: its own pace, 2 steps left at its 2 steps' time
    want = default * (len(state.left) - 1) + spent / 2 * 2
    assert row["minutes left (est.)"] == round(want / 60, 1)
    reproduce("recurrence-lm", scale="tiny", output=seed0, overrides=state.overrides)  # seed 0
    saved = _saved(seed0)
    assert "unit_progress" not in saved and "train baseline" in saved["unit_seconds"]
    assert plan_rows(s, "tiny", root)[0]["units"] == f"{len(state.expected)} done, 0 left"
    history = json.loads((seed0 / "baseline" / "history.json").read_text())
    assert history[-1]["step"] == 4  # trained on from its checkpoint to the end


def test_a_nar_training_unit_keeps_its_saved_steps(shared_data, tmp_path, monkeypatch):
    over = {"data_dir": str(shared_data), "variants": ("mask-predict",), "test_limit": 2}
    over |= {"curve_steps": (), "curve_thresholds": ()}
    _cut_at(1, monkeypatch)
    with pytest.raises(Interrupted):
        reproduce("nar-tasks", scale="tiny", output=tmp_path, overrides=over)
    (key, (done, total)), *more = _saved(tmp_path)["unit_progress"].items()
    assert (key, done, more) == ("train mask-predict", 1, []) and total > 1


def test_a_callback_stops_the_training_saved_and_it_resumes_to_the_uncut_weights(tmp_path):
    ref = _fit(tmp_path / "ref")
    rec, other = _Record(stop_after=1), _Record()
    with pytest.raises(Interrupted) as stop:
        _fit(tmp_path / "run", callbacks=[rec, other])  # one step, then saved
    assert (stop.value.step, stop.value.total, stop.value.why) == (1, 6, "stopped by a callback")
    assert str(stop.value).startswith(f"stopped by a callback: saved {tmp_path / 'run'}")
    assert rec.saved == other.saved == [(0, 6), (1, 6)] and len(other.states) == 1
    steps: list[int] = []
    resumed = _fit(tmp_path / "run", steps=steps, callbacks=[_Record()])
    assert steps == [2, 3, 4, 5, 6]
    assert torch.equal(resumed.weight, ref.weight) and torch.equal(resumed.bias, ref.bias)


def test_the_deadline_callback_stops_before_a_late_step_unless_nothing_would_keep_it(tmp_path):
    from gencraft.studies.runner import _Deadline

    got: list[tuple[int, int]] = []
    past = _Deadline(Clock(time.monotonic() - 1), lambda done, total: got.append((done, total)))
    with pytest.raises(Interrupted) as stop:
        _fit(tmp_path / "run", callbacks=[past])  # past already: one step, then saved
    assert past.fired and stop.value.step == 1 and got == [(0, 6), (1, 6)]
    hour = _Deadline(Clock(time.monotonic() + 3600), lambda *_: None)
    steps: list[int] = []
    _fit(tmp_path / "run", steps=steps, callbacks=[hour])  # an hour: it ends on its own
    assert steps == [2, 3, 4, 5, 6] and not hour.fired
    steps.clear()
    late = _Deadline(Clock(time.monotonic() - 1), lambda *_: None)
    _fit(None, steps=steps, callbacks=[late])  # no checkpoint kept: it trains on
    assert steps == [1, 2, 3, 4, 5, 6] and not late.fired
    none = _Deadline(None, lambda *_: None)  # no budget: it reports, and never stops
    _fit(tmp_path / "free", callbacks=[none])
    assert not none.fired


def test_a_ctrl_c_or_the_trainings_own_end_comes_before_a_callbacks_stop(tmp_path):
    with pytest.raises(Interrupted) as stop:
        _fit(tmp_path / "run", stop_at=1, callbacks=[_Record(stop_after=1)])
    assert stop.value.why == "interrupted"  # the Ctrl-C and the stop at step 1: the Ctrl-C
    with pytest.raises(Interrupted):
        _fit(tmp_path / "run", stop_at=5)
    steps: list[int] = []
    _fit(tmp_path / "run", steps=steps, callbacks=[_Record(stop_after=0)])  # its last step:
    assert steps == [6]  # it finishes (no checkpoint left to resume from)


def test_a_resumable_unit_stops_inside_at_the_deadline_with_its_steps_saved(tmp_path, monkeypatch):
    import types
    from pathlib import Path

    import gencraft.studies.runner as ex

    now = [0.0]
    monkeypatch.setattr(ex, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(ex, "running_clock", lambda: now[0])
    run, seen = _run(tmp_path), []
    run.seconds = {"t seed=0": 100.0}

    def job(callbacks, ctrl_c=False):
        (deadline,) = callbacks
        seen.append(deadline.clock.deadline)
        now[0] += 30.0
        deadline.on_save(3, 10)
        now[0] += 5.0  # after the checkpoint, before the stop: counted too
        if not ctrl_c:  # 165 s left, a step takes 35 / 3: not late yet
            assert deadline.on_step_end(StepState(3, 10, 0, 35.0, True)) is False
            assert deadline.on_step_end(StepState(3, 10, 0, 600.0, True)) is True
        why = "interrupted" if ctrl_c else "stopped by a callback"
        raise Interrupted(Path("c"), None, 3, 10, why)

    clock = Clock(200.0)
    with time_budget(clock), pytest.raises(OutOfTime) as stop:
        run.unit("t seed=1", job, resumes=True)
    assert seen == [200.0] and stop.value.where() == "inside 't seed=1' (3 of 10 steps done)"
    assert stop.value.estimate == pytest.approx(70.0) and stop.value.left == 165.0
    saved = _saved(tmp_path)
    assert saved["unit_progress"] == {"t seed=1": [3, 10]}
    assert saved["unit_partial_seconds"] == {"t seed=1": 35.0}
    with time_budget(clock), pytest.raises(Interrupted):  # a Ctrl-C is not the deadline
        run.unit("t seed=1", lambda cb: job(cb, ctrl_c=True), resumes=True)
    with time_budget(clock):  # a unit that does not resume gets no callback
        assert run.unit("u", lambda *a: len(a)) == 0


def test_the_campaign_says_how_far_a_training_got_when_its_budget_ended(
    shared_data, tmp_path, monkeypatch
):

    import gencraft.studies.runner as ex

    real = ex._Deadline.on_step_end

    def late_after_step_2(deadline, state):  # (the real test of lateness is above)
        if state.step >= 2 and state.checkpointed:
            deadline.fired = True
        return deadline.fired or real(deadline, state)

    monkeypatch.setattr(ex._Deadline, "on_step_end", late_after_step_2)
    over = {"data_dir": str(shared_data), "claims": ("recurrence",), "minutes": 60}
    report = reproduce("campaign", scale="tiny", output=tmp_path, overrides=over).read_text()
    assert "| recurrence | seed0 | stopped inside 'train baseline' (2 of 4 steps done)" in report
    assert "| recurrence | seed1 | not started |" in report
    saved = _saved(tmp_path / "recurrence" / "seed0")
    assert saved["unit_progress"] == {"train baseline": [2, 4]} and not saved["units"]
