"""A unit computed in parts (``ExperimentRun.unit_over``): each part saved as it finishes, so
a unit cut anywhere resumes at its first unfinished part with the value an uninterrupted run
gives; its time counts every invocation; a budget sees only the share left. hso-fewshot's
units are saved batch by batch this way."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.studies.campaign import CampaignSettings
from gencraft.studies.runner import (
    Clock,
    ExperimentRun,
    OutOfTime,
    get_experiment,
    reproduce,
    time_budget,
)


def _run(folder) -> ExperimentRun:
    return ExperimentRun(folder, get_experiment("campaign"), CampaignSettings(), "tiny")


def _saved(folder) -> dict:
    return json.loads((folder / "results.json").read_text())


def _items(start: int, stop: int) -> list[int]:
    return [i * i + 1 for i in range(start, stop)]


def _combine(items: list[int], seconds: float) -> dict:
    return {"items": items, "sum": sum(items)}


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(0, 30),
    step=st.integers(1, 7),
    cuts=st.lists(st.integers(0, 6), max_size=3),
)
def test_a_unit_cut_in_any_part_resumes_there_and_equals_the_uncut_unit(
    tmp_path_factory, total, step, cuts
):
    """``cuts``: at which part (counted within each invocation) each invocation is cut."""
    folder = tmp_path_factory.mktemp("parts")
    asked: list[tuple[int, int]] = []
    for cut in cuts:
        calls = []

        def compute(a, b, cut=cut, calls=calls):
            calls.append(1)
            if a:  # what a process killed now (no Ctrl-C, nothing saved on the way out) keeps
                assert len(_saved(folder)["unit_parts"]["test u"]["items"]) == a
            if len(calls) == cut + 1:
                raise KeyboardInterrupt
            asked.append((a, b))
            return _items(a, b)

        run = _run(folder)
        try:
            run.unit_over("test u", total, step, compute, _combine)
        except KeyboardInterrupt:
            none = {"total": total, "items": []}  # cut in its first part: no part saved
            saved = _saved(folder).get("unit_parts", {}).get("test u", none)
            assert saved == {"total": total, "items": _items(0, len(saved["items"]))}
            assert "test u" in _saved(folder)["unit_partial_seconds"]
    value = _run(folder).unit_over("test u", total, step, lambda a, b: _items(a, b), _combine)
    assert value == _combine(_items(0, total), 0.0)
    # no part was computed twice, and the finished ones were not computed again
    starts = [a for a, _ in asked]
    assert starts == sorted(set(starts)) and all(a % step == 0 for a in starts)
    saved = _saved(folder)
    assert "unit_parts" not in saved and "unit_partial_seconds" not in saved
    assert saved["units"]["test u"] == value


def test_the_seconds_count_every_invocation_and_reach_combine(tmp_path, monkeypatch):

    import gencraft.studies.runner as ex

    # mark; part 1 saved; (cut) banked | mark; part 2 saved; banked at the end; unit's bank
    ticks = iter([0.0, 10.0, 25.0, 100.0, 140.0, 141.0, 142.0])
    monkeypatch.setattr(ex, "running_clock", lambda: next(ticks))
    seen = []

    def cut(a, b):
        if a == 2:
            raise KeyboardInterrupt
        return _items(a, b)

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path).unit_over("u", 4, 2, cut, _combine)
    assert _saved(tmp_path)["unit_partial_seconds"] == {"u": 25.0}

    def combine(items, seconds):
        seen.append(seconds)
        return sum(items)

    run = _run(tmp_path)
    assert run.unit_over("u", 4, 2, _items, combine) == sum(_items(0, 4))
    assert seen == [25.0 + 41.0] and run.seconds == {"u": 25.0 + 42.0}


def test_a_budget_runs_parts_while_they_fit_and_stops_inside_the_unit(tmp_path, monkeypatch):
    """Each part starts only if its estimate fits: the unit's own parts per item once it has
    some, else its whole estimate's share; the parts done are kept when the budget ends."""
    import types

    import gencraft.studies.runner as ex

    now = [0.0]
    monkeypatch.setattr(ex, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(ex, "running_clock", lambda: now[0])
    run = _run(tmp_path)
    run.seconds = {"u seed=0": 1000.0}  # the whole unit, under another seed: 100 s an item
    run.parts = {"u seed=1": {"total": 10, "items": list(range(8))}}
    assert run.estimate("u seed=1", 0.0) == pytest.approx(200.0)  # the share left
    assert run.estimate("u seed=2", 0.0) == 1000.0

    def slow(a, b):  # 75 s an item
        now[0] += 75.0 * (b - a)
        return _items(a, b)

    clock = Clock(500.0)
    with time_budget(clock), pytest.raises(OutOfTime) as stop:
        run.unit_over("u seed=2", 10, 2, slow, _combine)
    # parts at 0 (200 s estimated), 150 (150 s measured), 300 (150): three fit; at 450 not
    assert (stop.value.done, stop.value.total, stop.value.estimate) == (6, 10, 150.0)
    assert stop.value.where() == "inside 'u seed=2' (6 of 10 items done)"
    assert _saved(tmp_path)["unit_parts"]["u seed=2"]["items"] == _items(0, 6)
    assert _saved(tmp_path)["unit_partial_seconds"]["u seed=2"] == 450.0
    assert clock.started == ["campaign: u seed=2"]
    second = Clock(now[0] + 100.0)  # 100 s: no part of 150 fits
    with time_budget(second), pytest.raises(OutOfTime) as stop:
        run.unit_over("u seed=2", 10, 2, slow, _combine)
    assert stop.value.where().startswith("inside") and second.started == []
    third = Clock(now[0] + 1.0)  # a unit with no part done: stopped before it, nothing saved
    with time_budget(third), pytest.raises(OutOfTime) as stop:
        run.unit_over("u seed=3", 10, 2, slow, _combine)
    assert stop.value.where() == "before 'u seed=3'" and stop.value.estimate == 200.0
    assert third.started == [] and "u seed=3" not in _saved(tmp_path)["unit_partial_seconds"]
    assert "u seed=3" not in _saved(tmp_path)["unit_parts"]
    value = run.unit_over("u seed=2", 10, 2, slow, _combine)  # no budget: the rest
    assert value == _combine(_items(0, 10), 0.0) and run.seconds["u seed=2"] == 750.0


def test_a_unit_whose_size_changed_or_whose_part_is_short_is_refused(tmp_path):
    run = _run(tmp_path)
    run.parts = {"u": {"total": 10, "items": [1, 2]}}
    with pytest.raises(GencraftError, match="holds 2 of 10 items of unit 'u', which now has 12"):
        run.unit_over("u", 12, 2, _items, _combine)
    with pytest.raises(GencraftError, match="unit 'v': a part gave 1 items"):
        run.unit_over("v", 4, 2, lambda a, b: [0], _combine)


def test_a_fewshot_run_cut_inside_a_unit_resumes_at_its_batch_and_equals_an_uncut_run(
    shared_data, tmp_path, monkeypatch
):
    import gencraft.studies.hso as hx

    over = {"data_dir": str(shared_data), "batch_size": 2, "de_batch_size": 1, "seeds": (0,)}
    reproduce("hso-fewshot", scale="tiny", output=tmp_path / "whole", overrides=over)
    real, calls = hx.classify_batch, []

    def cut(model, prompts, label_ids, method, *a, **kw):
        calls.append((method, len(prompts)))
        if method == "hso2" and len(calls) > 1 and calls[-2][0] == "hso2":
            raise KeyboardInterrupt  # the second batch of HSO-2
        return real(model, prompts, label_ids, method, *a, **kw)

    monkeypatch.setattr(hx, "classify_batch", cut)
    with pytest.raises(KeyboardInterrupt):
        reproduce("hso-fewshot", scale="tiny", output=tmp_path / "cut", overrides=over)
    parts = _saved(tmp_path / "cut")["unit_parts"]
    assert list(parts) == ["n=2 seed=0 hso2"] and parts["n=2 seed=0 hso2"]["total"] == 4
    assert len(parts["n=2 seed=0 hso2"]["items"]) == 2
    calls.clear()
    reproduce("hso-fewshot", scale="tiny", output=tmp_path / "cut", overrides=over)
    assert calls == [("hso2", 2)]  # only the batch left
    whole, cut_run = _saved(tmp_path / "whole")["units"], _saved(tmp_path / "cut")["units"]
    assert {k: v["correct"] for k, v in cut_run.items()} == {
        k: v["correct"] for k, v in whole.items()
    }
    assert [len(v["correct"]) for v in cut_run.values()] == [4, 2, 4, 4]


def test_the_plan_estimates_a_unit_in_parts_by_the_share_left(tmp_path, monkeypatch):
    """A few-shot unit cut after 2 of its 4 batches: the plan counts it under way and needs half
    the claim's guess for it, or, with the seconds its 2 batches took, 2 batches at that pace."""
    from gencraft.studies.campaign import CLAIMS, plan_rows, run_states

    monkeypatch.setitem(CLAIMS["hso-fewshot"].unit_minutes, "tiny", 10.0)  # 600 s a unit
    s = CampaignSettings(claims=("hso-fewshot",))
    (state,) = run_states(CLAIMS["hso-fewshot"], "tiny", tmp_path, None)
    key, n = state.expected[0], len(state.expected)
    state.folder.mkdir(parents=True)
    saved = {"units": {}, "unit_parts": {key: {"total": 4, "items": [[1], [2]]}}}
    (state.folder / "results.json").write_text(json.dumps(saved))
    (row,) = plan_rows(s, "tiny", tmp_path)
    assert row["units"] == f"0 done, {n} left (1 under way)"
    assert row["minutes left (est.)"] == round((600 * (n - 1) + 300) / 60, 1)
    saved["unit_partial_seconds"] = {key: 40.0}
    (state.folder / "results.json").write_text(json.dumps(saved))
    need = (600 * (n - 1) + 40) / 60
    both = CampaignSettings(claims=("hso-fewshot", "recurrence"), minutes=need - 0.01)
    rows = plan_rows(both, "tiny", tmp_path)
    assert rows[0]["minutes left (est.)"] == round(need, 1) and rows[0]["starts by minute"] == 0
    assert [r["starts by minute"] for r in rows[1:]] == [round(need, 1), round(need + 0.4, 1)]
    assert [r["in budget"] for r in rows] == ["yes", "no", "no"]  # seed 0: 8 units of 3 s
    none = CampaignSettings(claims=("hso-fewshot",), minutes=0.0)
    assert plan_rows(none, "tiny", tmp_path)[0]["in budget"] == "no"  # nothing starts in 0


def test_the_campaign_says_inside_which_unit_and_how_far_it_stopped(tmp_path, monkeypatch):
    import gencraft.studies.campaign as campaign

    def stops(name, **kw):
        raise OutOfTime("n=8 seed=1 hso2", 90.0, 30.0, 48, 200)

    monkeypatch.setattr(campaign, "reproduce", stops)
    s = CampaignSettings(claims=("hso-fewshot", "recurrence", "dasp"), minutes=5)
    rows = campaign.run_claims(s, "tiny", tmp_path)
    assert rows[0]["ended"] == (
        "stopped inside 'n=8 seed=1 hso2' (48 of 200 items done) (needs ~1.5 min)"
    )
    assert rows[1:] == [
        {"claim": "recurrence", "run": "seed0", "ended": "not started"},
        {"claim": "recurrence", "run": "seed1", "ended": "not started"},
        {"claim": "dasp", "run": "run", "ended": "not started"},
    ]


def test_a_nar_test_unit_cut_in_its_second_batch_resumes_there_and_equals_an_uncut_one(
    shared_data, tmp_path, monkeypatch
):
    import gencraft.studies.nar as nx

    over = {"data_dir": str(shared_data), "variants": ("mask-predict",), "test_limit": 5}
    over |= {"decode_batch": 2, "curve_steps": (), "curve_thresholds": ()}
    reproduce("nar-tasks", scale="tiny", output=tmp_path / "whole", overrides=over)
    real, calls, cut_at = nx.decode_rows, [], [2]

    def cut(model, tok, sources, *a, **kw):
        calls.append(len(sources))
        if len(calls) == cut_at[0]:
            raise KeyboardInterrupt
        return real(model, tok, sources, *a, **kw)

    monkeypatch.setattr(nx, "decode_rows", cut)
    with pytest.raises(KeyboardInterrupt):
        reproduce("nar-tasks", scale="tiny", output=tmp_path / "cut", overrides=over)
    parts = _saved(tmp_path / "cut")["unit_parts"]["test mask-predict"]
    assert (
        parts["total"] == 5
        and [r["text"] for r in parts["items"]]
        == (_saved(tmp_path / "whole")["units"]["test mask-predict"]["predictions"][:2])
    )
    calls.clear()
    cut_at[0] = 0  # no more cuts
    reproduce("nar-tasks", scale="tiny", output=tmp_path / "cut", overrides=over)
    assert calls == [2, 1]  # the two batches left
    whole = _saved(tmp_path / "whole")["units"]["test mask-predict"]
    again = _saved(tmp_path / "cut")["units"]["test mask-predict"]
    for k in ("predictions", "BLEU", "ROUGE-L", "outputs", "calls/output", "steps/output"):
        assert again[k] == whole[k], k
    assert again["lower-cased"] == whole["lower-cased"]
