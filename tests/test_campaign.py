"""``gencraft reproduce campaign``: every claim's units on tiny models, a time
budget that stops between units, resumption after an interrupted unit, the plan's counts, and
each experiment's verdict against the statistic computed by hand."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.cli.main import main
from gencraft.metrics.stats import decide
from gencraft.studies.campaign import (
    CLAIM_ORDER,
    CLAIMS,
    E2E_TRAIN_PAIRS,
    CampaignSettings,
    _other_runs,
    plan_rows,
    run_states,
)
from gencraft.studies.runner import (
    Clock,
    ExperimentRun,
    OutOfTime,
    get_experiment,
    reproduce,
    time_budget,
)


def _results(folder) -> dict:
    return json.loads((folder / "results.json").read_text())


def _report(path) -> str:
    return path.read_text()


def test_tiny_campaign_runs_every_unit_and_resumes_after_an_interrupted_unit(
    shared_data, tmp_path, monkeypatch
):
    import gencraft.studies.nar as nar

    real, calls = nar._tune, []

    def interrupted(*a, **kw):  # the second SUNDAE model's temperature search is cut
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(nar, "_tune", interrupted)
    kw = dict(scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)})
    with pytest.raises(KeyboardInterrupt):
        reproduce("campaign", **kw)
    sundae = tmp_path / "rum-sundae" / "run"
    before = _results(sundae)["unit_seconds"]
    curve = ["curve rum-sundae 1", "curve rum-sundae 2", "curve rum-sundae tau=0.5"]
    assert list(before) == [
        "train rum-sundae",
        "tune rum-sundae",
        "test rum-sundae",
        *curve,
        "train rum-sundae-copy",
    ]
    earlier = {p: _results(p)["unit_seconds"] for p in (tmp_path / "fame").iterdir()}
    monkeypatch.setattr(nar, "_tune", real)
    report = _report(reproduce("campaign", **kw))
    after = _results(sundae)["unit_seconds"]
    assert {k: after[k] for k in before} == before  # the finished units are not redone
    assert {p: _results(p)["unit_seconds"] for p in earlier} == earlier
    s = CampaignSettings(data_dir=str(shared_data))
    for name in CLAIM_ORDER:  # every run computed exactly the units its experiment declares
        for state in run_states(CLAIMS[name], "tiny", tmp_path, s.data_dir):
            assert sorted(state.units) == sorted(state.expected) and state.left == []
    assert "| hso-fewshot | run | done | 0 |" in report  # finished in the first invocation
    assert "| rum-sundae | run | done | 5 |" in report  # 12 units, 7 kept
    for comparison in (
        "HSO − plain model, accuracy",
        "HSO-2 − plain model, accuracy",
        "recurrent − baseline, test NLL",
        "FAME − baseline, ROUGE-L",
        "FAME − baseline, R1 precision vs document",
        "rum-sundae − sundae-scratch, BLEU",
        "hierblock − dense, BLEU",
    ):
        assert f"| {comparison} |" in report


def test_a_time_budget_stops_before_a_unit_that_would_not_fit(shared_data, tmp_path, capsys):
    args = ["reproduce", "campaign", "--scale", "tiny", "--output", str(tmp_path)]
    args += ["--data-dir", str(shared_data), "--claims", "hso-fewshot"]
    assert main([*args, "dasp", "--minutes", "0"]) == 0
    out = capsys.readouterr().out
    assert (
        "| hso-fewshot | run | stopped before 'n=2 seed=0 baseline' (needs ~0.1 min) | 0 |" in out
    )
    assert "| dasp | run | not started |" in out  # nothing starts after a stop
    assert not (tmp_path / "hso-fewshot" / "run" / "results.json").exists()
    assert main([*args, "--plan"]) == 0  # the plan reads what is done: nothing yet
    assert "| hso-fewshot | run | 0 done, 8 left | 0.4 | 0 | - |" in capsys.readouterr().out
    assert main(args) == 0  # no budget: runs to the end, in the same folder
    seconds = _results(tmp_path / "hso-fewshot" / "run")["unit_seconds"]
    assert len(seconds) == 8 and all(t > 0 for t in seconds.values())
    assert main([*args, "--plan", "--minutes", "5"]) == 0
    assert "| hso-fewshot | run | 8 done, 0 left | 0 | 0 | yes |" in capsys.readouterr().out


def test_the_slot_plan_lists_every_run_with_its_units_and_the_budget(tmp_path, capsys):
    args = ["reproduce", "campaign", "--scale", "slot", "--output", str(tmp_path), "--plan"]
    assert main([*args, "--minutes", "15"]) == 0
    plan, verdicts = capsys.readouterr().out.split("Verdicts on what is finished")
    lines = [x for x in plan.splitlines() if x.startswith("| ")]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines[1:]]
    assert verdicts.count("| no unit finished yet |") == len(CLAIM_ORDER)
    assert [r[:2] for r in rows] == [
        ["hso-fewshot", "run"],
        *[["recurrence", f"overlap0-seed{k}"] for k in range(3)],
        ["recurrence", "overlap5-seed0"],
        ["recurrence", "overlap10-seed0"],
        *[["fame", f"seed{k}"] for k in range(10)],
        ["rum-sundae", "run"],
        ["dasp", "run"],
    ]
    assert rows[0][2:4] == ["0 done, 36 left", "54"]  # 3 n x 3 seeds x 4 methods, 1.5 min each
    assert rows[-1][2] == "0 done, 9 left"  # dense, uniblock, hierblock x 3 seeds
    starts = [float(r[4]) for r in rows]
    assert starts == sorted(starts) and starts[:2] == [0, 54]
    assert [r[5] for r in rows] == ["yes" if t < 15 else "no" for t in starts]
    # the CPU campaign leaves FAME and DASP to a GPU
    assert (
        main(["reproduce", "campaign", "--scale", "cpu", "--output", str(tmp_path / "c"), "--plan"])
        == 0
    )
    out = capsys.readouterr().out
    assert "| fame | - | not at this scale |" in out and "| dasp | - | not at this scale |" in out
    assert main(["reproduce", "campaign", "--scale", "gpu", "--output", str(tmp_path)]) == 2
    assert "has no 'gpu' scale; it has tiny, cpu, slot" in capsys.readouterr().err
    assert main([*args, "--claims", "fame", "nope"]) == 2
    assert "unknown claims ['nope']" in capsys.readouterr().err
    assert main([*args, "--minutes", "-1"]) == 2
    assert "--minutes must be >= 0, got -1" in capsys.readouterr().err


def test_a_run_resumes_with_its_data_read_from_another_folder(shared_data, tmp_path):
    """Where the data lie (an offline GPU machine's copy) is no setting of the results."""
    elsewhere = tmp_path / "data"
    elsewhere.symlink_to(shared_data)
    first = reproduce(
        "hso-fewshot", scale="tiny", output=tmp_path / "r", overrides={"data_dir": str(shared_data)}
    )
    seconds = _results(tmp_path / "r")["unit_seconds"]
    reproduce(
        "hso-fewshot", scale="tiny", output=tmp_path / "r", overrides={"data_dir": str(elsewhere)}
    )
    assert _results(tmp_path / "r")["unit_seconds"] == seconds and first.is_file()


def test_a_clock_estimates_a_unit_by_the_longest_of_its_kind(tmp_path):
    exp = get_experiment("campaign")
    run = ExperimentRun(tmp_path, exp, CampaignSettings(), "tiny")
    run.units = {"train a": 1, "train b": 2, "eval a": 0}
    run.seconds = {"train a": 500.0, "train b": 900.0, "eval a": 1.0}
    assert run.estimate("train c", 7.0) == 900.0 and run.estimate("eval b", 7.0) == 1.0
    assert run.estimate("test a", 7.0) == 7.0
    import time

    clock = Clock(time.monotonic() + 600, default_seconds=0.0)
    with time_budget(clock):
        assert run.unit("eval b", lambda: 3) == 3  # 1 s fits in 600
        with pytest.raises(OutOfTime, match="unit 'train c' needs about 900 s"):
            run.unit("train c", lambda: 4)
        assert run.unit("train a", lambda: 5) == 1  # finished before: kept, no estimate
    assert clock.started == ["campaign: eval b"]
    assert run.unit("train c", lambda: 4) == 4  # no budget outside


def test_an_interrupted_units_time_counts_when_it_finishes(tmp_path, monkeypatch):
    """A training cut by Ctrl-C (or a lease's end) resumes from its checkpoint: its seconds are
    those of every invocation that worked on it, kept across processes."""

    import gencraft.studies.runner as ex

    ticks = iter([0.0, 100.0, 1000.0, 1030.0])  # start, interrupted; start again, finished
    monkeypatch.setattr(ex, "running_clock", lambda: next(ticks))

    def cut():
        raise KeyboardInterrupt

    run = ExperimentRun(tmp_path, get_experiment("campaign"), CampaignSettings(), "tiny")
    with pytest.raises(KeyboardInterrupt):
        run.unit("train a", cut)
    assert _results(tmp_path)["unit_partial_seconds"] == {"train a": 100.0}
    again = ExperimentRun(tmp_path, get_experiment("campaign"), CampaignSettings(), "tiny")
    assert again.unit("train a", lambda: 7) == 7 and again.seconds == {"train a": 130.0}
    assert "unit_partial_seconds" not in _results(tmp_path)


def test_a_unit_is_estimated_by_its_own_work_under_another_seed_first(tmp_path):
    """hso-fewshot's units share their first word (``n=4``) across methods of very different
    costs: the same method's unit under another seed estimates it, the kind only otherwise."""
    run = ExperimentRun(tmp_path, get_experiment("campaign"), CampaignSettings(), "tiny")
    run.seconds = {
        "n=4 seed=0 baseline": 2.0,
        "n=4 seed=0 dynamic eval": 240.0,
        "n=4 seed=1 dynamic eval": 200.0,
        "n=4 seed=1 hso": 36.0,
    }
    assert run.estimate("n=4 seed=2 baseline", 7.0) == 2.0
    assert run.estimate("n=4 seed=2 dynamic eval", 7.0) == 240.0
    assert run.estimate("n=4 seed=2 hso", 7.0) == 36.0
    assert run.estimate("n=4 seed=2 hso2", 7.0) == 240.0  # none of its own: the kind's longest
    assert run.estimate("n=8 seed=0 hso", 7.0) == 7.0
    assert run.estimate("n=4 seed=0 hso", 7.0) == 36.0  # seed 0 from seed 1


def test_the_claims_other_runs_estimate_a_unit_before_its_kind(tmp_path, capsys):
    """FAME's ten slot seeds are ten runs: seed 0's measured units estimate seeds 1-9."""
    run = ExperimentRun(tmp_path / "r", get_experiment("campaign"), CampaignSettings(), "tiny")
    run.seconds = {"train a": 500.0, "n=2 seed=0 hso": 9.0}
    known = {"train b": 40.0, "eval a": 3.0, "n=2 seed=1 hso": 30.0, "n=2 seed=1 hso2": 60.0}
    assert run.estimate("n=2 seed=2 hso", 7.0, known) == 9.0  # its own run first
    assert run.estimate("n=2 seed=2 hso2", 7.0, known) == 60.0  # then the same unit elsewhere
    assert run.estimate("train b", 7.0, known) == 40.0  # the same unit before its run's kind
    assert run.estimate("train c", 7.0, known) == 500.0  # then the kind in its run
    assert run.estimate("eval b", 7.0, known) == 3.0  # then the kind elsewhere
    assert run.estimate("test a", 7.0, known) == 7.0
    args = ["reproduce", "campaign", "--scale", "slot", "--output", str(tmp_path), "--plan"]
    fame = CLAIMS["fame"]
    (seed0,) = [st for st in run_states(fame, "slot", tmp_path, None) if st.name == "seed0"]
    (tmp_path / "fame" / "seed0").mkdir(parents=True)
    seconds = {k: 90.0 for k in seed0.expected}  # seed 0 finished, 1.5 min a unit
    table = {m: {"RL": 30.0, "R1_precision_doc": 70.0} for m in ("fame", "baseline")}
    (tmp_path / "fame" / "seed0" / "results.json").write_text(
        json.dumps({"units": {k: {"table1": table} for k in seconds}, "unit_seconds": seconds})
    )
    assert main([*args, "--claims", "fame"]) == 0
    rows = [x.split("|")[1:5] for x in capsys.readouterr().out.split("Verdicts")[0].splitlines()]
    rows = [[c.strip() for c in r] for r in rows if len(r) == 4 and r[0].strip() == "fame"]
    n = len(seed0.expected)
    assert rows[0] == ["fame", "seed0", f"{n} done, 0 left", "0"]
    want = ["fame", "seed1", f"0 done, {n} left", f"{1.5 * n:g}"]
    assert rows[1] == want and len(rows) == 10  # not the claim's 7-minute guess


def test_the_other_runs_estimate_each_unit_by_its_longest_and_skip_what_they_lack(tmp_path):
    """FAME's slot seeds: seed 0's units are estimated by seeds 1-9, each by its longest time
    (not the last run read, not rounded up to a second); a run with no times is passed over."""
    fame = tmp_path / "fame"
    times = {"seed1": {"a": 120.0, "b": 0.25}, "seed2": {"a": 60.0, "c": 3.0}}
    for name, seconds in times.items():
        (fame / name).mkdir(parents=True)
        (fame / name / "results.json").write_text(json.dumps({"unit_seconds": seconds}))
    (fame / "seed3").mkdir()
    (fame / "seed3" / "results.json").write_text(json.dumps({"units": {}}))
    (fame / "seed0").mkdir()
    (fame / "seed0" / "results.json").write_text(json.dumps({"unit_seconds": {"a": 999.0}}))
    claim = CLAIMS["fame"]
    assert _other_runs(claim, "slot", tmp_path, "seed0") == {"a": 120.0, "b": 0.25, "c": 3.0}
    assert _other_runs(claim, "slot", tmp_path, "seed1") == {"a": 999.0, "c": 3.0}
    assert _other_runs(claim, "cpu", tmp_path, "seed0") == {}  # FAME has no cpu runs


@pytest.mark.parametrize("minutes", [5.0, None])
def test_every_run_shares_the_invocations_deadline_with_its_claims_guess(
    tmp_path, monkeypatch, minutes
):
    """One deadline for the whole invocation (its --minutes from its start, none without), each
    run's clock guessing an unmeasured unit at its claim's minutes and reading the claim's
    other runs; every run of every claim asked for runs, in order, and reports its units and
    minutes of work."""
    import time
    from typing import NamedTuple

    import gencraft.studies.campaign as campaign
    import gencraft.studies.runner as ex

    class Call(NamedTuple):
        name: str
        output: object
        clock: Clock
        at: float  # time.monotonic() when the run started

    calls = []

    def records(name, **kw):
        clock = ex._CLOCK.get()
        clock.started.append(f"{name}: a unit")
        calls.append(Call(name, kw["output"], clock, time.monotonic()))

    monkeypatch.setattr(campaign, "reproduce", records)
    ticks = iter([0.0, 90.0, 100.0, 130.0, 200.0, 201.3])  # each run's start and end
    monkeypatch.setattr(campaign, "running_clock", lambda: next(ticks))
    (tmp_path / "recurrence" / "seed0").mkdir(parents=True)
    (tmp_path / "recurrence" / "seed0" / "results.json").write_text(
        json.dumps({"unit_seconds": {"train baseline": 42.0}})
    )
    t0 = time.monotonic()
    s = CampaignSettings(claims=("recurrence", "hso-fewshot"), minutes=minutes)
    rows = campaign.run_claims(s, "tiny", tmp_path)
    assert [(r["run"], r["ended"], r["units this call"], r["minutes this call"]) for r in rows] == [
        ("seed0", "done", 1, 1.5),
        ("seed1", "done", 1, 0.5),
        ("run", "done", 1, 0.02),
    ]
    assert [(c.name, c.output) for c in calls] == [
        ("recurrence-lm", tmp_path / "recurrence" / "seed0"),
        ("recurrence-lm", tmp_path / "recurrence" / "seed1"),
        ("hso-fewshot", tmp_path / "hso-fewshot" / "run"),
    ]
    deadlines = {c.clock.deadline for c in calls}
    if minutes is None:
        assert deadlines == {math.inf}
    else:
        (deadline,) = deadlines
        assert t0 + 60 * minutes <= deadline <= calls[0].at + 60 * minutes
    claims = ("recurrence", "recurrence", "hso-fewshot")
    guesses = [60 * CLAIMS[n].unit_minutes["tiny"] for n in claims]
    assert [c.clock.default_seconds for c in calls] == guesses
    assert [c.clock.known for c in calls] == [{}, {"train baseline": 42.0}, {}]


def test_the_verdict_table_says_for_every_claim_what_ran_and_why_there_is_no_verdict(tmp_path):
    """At cpu scale with one recurrence training finished: every claim gets a row, in order,
    with its runs, units and minutes, and the reason it has no verdict yet."""
    from gencraft.studies.campaign import verdict_rows

    seed0 = tmp_path / "recurrence" / "seed0"
    (seed0 / "baseline" / "best").mkdir(parents=True)
    saved = {"units": {"train baseline": {"steps": 3}}, "unit_seconds": {"train baseline": 94.0}}
    (seed0 / "results.json").write_text(json.dumps(saved))
    n = sum(len(st.expected) for st in run_states(CLAIMS["recurrence"], "cpu", tmp_path, None))

    def row(claim, runs, verdict, units=0, minutes=0.0):
        return {
            "claim": claim,
            "runs done": runs,
            "units": units,
            "minutes": minutes,
            "verdict": verdict,
        }

    assert verdict_rows(CampaignSettings(), "cpu", tmp_path) == [
        row("hso-fewshot", "0 of 1", "no unit finished yet"),
        row(
            "recurrence", "0 of 2", f"interim (1 of {n} units): no comparison finished yet", 1, 1.6
        ),
        row("fame", "0 of 0", "not run at this scale"),
        row("rum-sundae", "0 of 1", "no unit finished yet"),
        row("dasp", "0 of 0", "not run at this scale"),
    ]


@pytest.mark.parametrize("scale", ["tiny", "cpu", "slot"])
def test_every_run_reads_the_data_asked_for_and_writes_inside_its_own_folder(scale, tmp_path):
    """Two runs (seeds, claims) never share a work or runs folder, nor use one in the working
    directory: each location setting a run's experiment has points inside the run's folder."""
    seen = set()
    for name in CLAIM_ORDER:
        for state in run_states(CLAIMS[name], scale, tmp_path, "/data/here"):
            fields = state.settings.__dataclass_fields__
            # the names the saved campaigns' folders already use
            for where, inside in (("runs_dir", state.folder / "runs"), ("work_dir", state.folder)):
                if where in fields:
                    seen.add(where)
                    assert getattr(state.settings, where) == str(inside)
            if "data_dir" in fields:
                assert state.settings.data_dir == "/data/here"
    assert seen == (set() if scale == "cpu" else {"runs_dir", "work_dir"})  # DASP's, FAME's


@pytest.mark.parametrize("scale", ["cpu", "slot"])
def test_every_nar_model_trains_one_epoch_of_e2e(scale, tmp_path):
    """One full epoch of E2E's 42,061 training pairs (tests/data checks the count),
    the same steps for the models from scratch as for the pretrained starts."""
    for state in run_states(CLAIMS["rum-sundae"], scale, tmp_path, None):
        s = state.settings
        assert s.steps == s.scratch_steps
        assert (s.steps - 1) * s.batch_size < E2E_TRAIN_PAIRS <= s.steps * s.batch_size


def test_a_budget_reads_the_claims_other_runs(shared_data, tmp_path, capsys):
    """Recurrence seed 1's training is estimated by seed 0's, measured in an earlier call."""
    args = ["reproduce", "campaign", "--scale", "tiny", "--output", str(tmp_path)]
    args += ["--data-dir", str(shared_data), "--claims", "recurrence"]
    assert main(args) == 0
    seed0 = tmp_path / "recurrence" / "seed0" / "results.json"
    saved = json.loads(seed0.read_text())
    saved["unit_seconds"]["train baseline"] = 1200.0
    seed0.write_text(json.dumps(saved))
    (tmp_path / "recurrence" / "seed1" / "results.json").unlink()
    capsys.readouterr()
    assert main([*args, "--minutes", "5"]) == 0
    out = capsys.readouterr().out
    assert "| recurrence | seed1 | stopped before 'train baseline' (needs ~20.0 min) | 0 |" in out


def _correct(pattern: list[int]) -> dict:
    return {"correct": pattern, "seconds": 1.0, "mean prompt tokens": 9.0}


def test_the_fewshot_verdict_pools_examples_over_n_and_seeds():
    from gencraft.studies.hso import FewShotSettings, fewshot_verdict

    s = FewShotSettings(shots=(2, 4), seeds=(0,))
    units = {
        "n=2 seed=0 baseline": _correct([0, 1, 0, 1]),
        "n=2 seed=0 hso": _correct([1, 1, 1, 1]),
        "n=2 seed=0 hso2": _correct([1, 0, 0, 1]),
        # a whole (n, seed) unit as saved before units were kept per method
        "n=4 seed=0": {"correct": {"baseline": [1, 0], "hso": [1, 1], "hso2": [0, 0]}},
    }
    hso, hso2 = fewshot_verdict([(s, units)])
    assert hso["comparison"] == "HSO − plain model, accuracy" and hso["n"] == 6
    want = decide([100.0, 0, 100, 0, 0, 100])
    assert {k: hso[k] for k in want} == want
    assert hso2["mean"] == pytest.approx(100 * (1 - 1 - 1) / 6)
    # an unfinished method leaves its (n, seed) out
    del units["n=2 seed=0 hso2"]
    assert fewshot_verdict([(s, units)])[1]["n"] == 2


def test_the_recurrence_verdict_pairs_blocks_at_the_trained_overlap():
    from gencraft.studies.recurrence import RecurrenceLMSettings, lm_verdict

    def rows(blocks, other):
        return [{"overlap": 0, "block_nll": other}, {"overlap": 5, "block_nll": blocks}]

    s = RecurrenceLMSettings(train_overlap=5, splits=("valid", "test"))
    units = {
        "eval baseline test": rows([3.0, 3.5, 2.0], [9.0, 9.0, 9.0]),
        "eval recurrent test": rows([2.5, 3.4, 2.1], [0.0, 0.0, 0.0]),
        "eval baseline valid": rows([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    }
    (v,) = lm_verdict([(s, units), (RecurrenceLMSettings(splits=("test",)), {})])
    want = decide([-0.5, -0.1, 0.1], expected=-1)
    for k in ("n", "mean", "sd", "low", "high", "p"):
        assert v[k] == pytest.approx(want[k])
    assert v["verdict"] == want["verdict"] and v["needed"] == want["needed"]
    assert v["mean"] == pytest.approx(-0.5 / 3) and v["unit"] == "nats/token"
    assert lm_verdict([(s, {"eval baseline test": units["eval baseline test"]})]) == []
    lower = {
        "eval baseline test": rows([3.0] * 3, [0.0] * 3),
        "eval recurrent test": rows([2.7, 2.71, 2.72], [0.0] * 3),
    }
    (down,) = lm_verdict([(s, lower)])
    assert down["mean"] < 0 and down["verdict"] == "reproduced"  # lower NLL is the claim


def test_the_recurrence_verdict_prefers_its_own_test_evaluation():
    """With ``verdict_words``, both models' ``eval NAME verdict`` units are the pairs; a run
    where only one model has it falls back to the test split."""
    from gencraft.studies.recurrence import RecurrenceLMSettings, lm_verdict

    def rows(blocks):
        return [{"overlap": 0, "block_nll": blocks}]

    s = RecurrenceLMSettings(verdict_words=None)
    test = {"eval baseline test": rows([3.0, 3.0]), "eval recurrent test": rows([2.0, 2.5])}
    verdict = {"eval baseline verdict": rows([3.0] * 4), "eval recurrent verdict": rows([3.1] * 4)}
    (v,) = lm_verdict([(s, {**test, **verdict})])
    assert v["n"] == 4 and v["mean"] == pytest.approx(0.1)
    del verdict["eval recurrent verdict"]
    (v,) = lm_verdict([(s, {**test, **verdict})])
    assert v["n"] == 2 and v["mean"] == pytest.approx(-0.75)


def test_a_started_recurrence_run_takes_on_the_verdict_evaluation(shared_data, tmp_path):
    """``verdict_words`` adds one test evaluation per model at the trained overlap alone, and
    a run finished without it resumes with it: the trainings and the other evaluations are
    kept, the two new units run, and the verdict pairs their blocks."""
    from gencraft.studies.recurrence import RecurrenceLMSettings, lm_verdict
    from gencraft.studies.runner import get_experiment

    over = {"data_dir": str(shared_data), "train_overlap": 4}
    reproduce("recurrence-lm", scale="tiny", output=tmp_path, overrides=over)
    before = json.loads((tmp_path / "results.json").read_text())
    assert not any(k.endswith(" verdict") for k in before["units"])
    over["verdict_words"] = 600
    reproduce("recurrence-lm", scale="tiny", output=tmp_path, overrides=over)
    after = json.loads((tmp_path / "results.json").read_text())
    new = sorted(set(after["units"]) - set(before["units"]))
    assert new == ["eval baseline verdict", "eval recurrent verdict"]
    assert {k: after["unit_seconds"][k] for k in before["unit_seconds"]} == before["unit_seconds"]
    base, rec = (after["units"][k] for k in new)
    assert [r["overlap"] for r in base] == [4] == [r["overlap"] for r in rec]
    assert base[0]["words"] == 600 and before["units"]["eval baseline test"][0]["words"] == 200
    expected = get_experiment("recurrence-lm").units(RecurrenceLMSettings(**over))
    assert sorted(expected) == sorted(after["units"])  # the plan counts the new units too
    (v,) = lm_verdict([(RecurrenceLMSettings(**over), after["units"])])
    diffs = [r - b for r, b in zip(rec[0]["block_nll"], base[0]["block_nll"], strict=True)]
    assert v["n"] == len(diffs) and v["mean"] == pytest.approx(sum(diffs) / len(diffs))
    report = (tmp_path / "report.md").read_text()
    assert "| recurrent | test, verdict |" in report and "first 600 test words" in report
    # the run's own report carries the verdict, as the campaign's does
    cells = f"| recurrent − baseline, test NLL | {v['n']} {v['pairs']} | {v['mean']:+.3g} ["
    assert "Verdicts on this run" in report and cells in report


def test_the_fame_and_dasp_verdicts_pair_seeds():
    from gencraft.studies.focus import FocusQualitySettings, quality_verdict
    from gencraft.studies.prefix import PrefixTaskSettings, tasks_verdict

    def table(rl, p):
        base = {"RL": 30.0, "R1_precision_doc": 70.0}
        fame = {"RL": 30.0 + rl, "R1_precision_doc": 70.0 + p}
        return {"quality": {"table1": {"baseline": base, "fame": fame}}}

    runs = [(FocusQualitySettings(seed=k), table(d, -d)) for k, d in enumerate((1.0, 2.0, 1.5))]
    rl, prec = quality_verdict([*runs, (FocusQualitySettings(seed=9), {})])
    assert rl["n"] == 3 and rl["mean"] == pytest.approx(1.5) and rl["pairs"] == "seeds"
    # against the claim, p < 0.05; a run's report does not know the scale: undecided (only
    # the claims registry, which knows whether the scale decides, says "contradicted")
    assert rl["verdict"] == "reproduced" and prec["verdict"] == "undecided"
    s = PrefixTaskSettings(variants="dense,hierblock", seeds="0,1,2")

    def unit(bleu):
        return {"scores": {"BLEU": bleu}}

    units = {f"dense/seed{k}": unit(60.0) for k in range(3)}
    units |= {"hierblock/seed0": unit(61.0), "hierblock/seed1": unit(59.0)}
    (v,) = tasks_verdict([(s, units)])
    assert v["comparison"] == "hierblock − dense, BLEU" and v["n"] == 2 and v["mean"] == 0
    assert v["verdict"] == "undecided" and v["needed"] is None


def _nar_outputs(shared_data):
    """nar-tasks settings scoring 20 E2E test inputs, their references, and two sets of outputs:
    the first reference of each (good) and its first four words (bad)."""
    from gencraft.data.tasks import pick_examples, references_of, task_examples
    from gencraft.studies.nar import NARTasksSettings

    s = NARTasksSettings(test_limit=20, data_dir=str(shared_data))
    examples = pick_examples(task_examples("e2e", "test", s.data_dir), 20, spread=True)
    refs = [references_of(e) for e in examples]
    good = [r[0].lower() for r in refs]
    return s, refs, good, [" ".join(x.split()[:4]) for x in good]


def test_the_nar_verdict_is_the_paired_bootstrap_of_test_bleu(shared_data):
    from gencraft.metrics.tasks import bleu_paired, score_task
    from gencraft.studies.nar import tasks_verdict

    s, refs, good, bad = _nar_outputs(shared_data)
    units = {"test rum-sundae": {"predictions": good}, "test sundae-scratch": {"predictions": bad}}
    (v,) = tasks_verdict([(s, units)])
    low = [
        score_task("e2e", o, refs, lowercase=True, metrics=("BLEU",))["BLEU"] for o in (good, bad)
    ]
    assert v["mean"] == pytest.approx(low[0] - low[1]) and v["n"] == 20
    assert v["low"] <= v["mean"] <= v["high"] and v["verdict"] == "reproduced" and v["p"] < 0.01
    # against corpus BLEU recomputed on each resample (the same draws)
    import numpy as np

    worse, other = good[:18] + bad[18:], bad[:1] + good[1:]  # close: p far from its floor
    got = bleu_paired("e2e", worse, other, refs, lowercase=True, resamples=200, seed=7)
    idx = np.random.default_rng(7).choice(20, size=(200, 20), replace=True)

    def score(outs, rows):
        picked, wanted = [outs[i] for i in rows], [refs[i] for i in rows]
        return score_task("e2e", picked, wanted, lowercase=True, metrics=("BLEU",))["BLEU"]

    diffs = np.array([score(worse, i) - score(other, i) for i in idx])
    far = min((diffs <= 0).mean(), (diffs >= 0).mean())
    assert got["p"] == pytest.approx(min(1.0, max(2 * far, 1 / 200))) and 0.1 < got["p"] < 0.9
    assert [got["low"], got["high"]] == pytest.approx(list(np.percentile(diffs, [2.5, 97.5])))
    swapped = bleu_paired("e2e", bad, good, refs, lowercase=True)
    assert swapped["mean"] == pytest.approx(-v["mean"]) and swapped["p"] == v["p"]
    assert math.isclose(swapped["low"], -v["high"], abs_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    mean=st.floats(-5, 5, allow_subnormal=False),
    p=st.floats(0.0, 1.0, allow_subnormal=False),
    alpha=st.sampled_from([0.01, 0.05]),
)
def test_a_peer_verdict_names_the_higher_model_where_a_claim_would_be_decided(mean, p, alpha):
    from gencraft.studies.nar import peer_verdict

    want = (
        "not distinguishable at this size (peer, no claim)"
        if not (p < alpha and mean != 0)
        else f"{'a' if mean > 0 else 'b'} higher (peer, no claim)"
    )
    assert peer_verdict("a", "b", mean, p, alpha) == want


def test_the_nar_verdict_compares_rum_sundae_with_its_peers_after_the_claims(shared_data):
    from gencraft.metrics.tasks import bleu_paired
    from gencraft.studies.nar import tasks_verdict

    s, refs, good, bad = _nar_outputs(shared_data)
    outs = {"rum-sundae": bad, "sundae-scratch": bad, "mask-predict": good, "autoregressive": bad}
    units = {f"test {m}": {"predictions": o} for m, o in outs.items()}
    rows = tasks_verdict([(s, units)])
    assert [r["comparison"] for r in rows] == [
        "rum-sundae − sundae-scratch, BLEU",
        "rum-sundae − mask-predict, BLEU",
        "rum-sundae − autoregressive, BLEU",
    ]  # the copied model did not run: its claim has no row
    want = bleu_paired("e2e", bad, good, refs, lowercase=True)
    assert (rows[1]["mean"], rows[1]["low"], rows[1]["p"]) == pytest.approx(
        (want["mean"], want["low"], want["p"])
    )
    assert rows[1]["verdict"] == "mask-predict higher (peer, no claim)" and rows[1]["p"] < 0.01
    assert rows[2]["verdict"] == "not distinguishable at this size (peer, no claim)"
    assert rows[0]["verdict"] == "undecided" and rows[2]["mean"] == 0
    units["test autoregressive"]["predictions"] = [" ".join(x.split()[:2]) for x in good]
    assert tasks_verdict([(s, units)])[2]["verdict"] == "rum-sundae higher (peer, no claim)"


def test_every_claim_names_a_registered_experiment_with_units_and_a_verdict():
    for name in CLAIM_ORDER:
        claim = CLAIMS[name]
        exp = get_experiment(claim.experiment)
        assert exp.units is not None and exp.verdict is not None
        assert set(claim.runs) == set(claim.unit_minutes) == {"tiny", "cpu", "slot"}
    rows = plan_rows(CampaignSettings(), "cpu", __import__("pathlib").Path("/nonexistent"))
    assert [r["claim"] for r in rows] == [
        "hso-fewshot",
        "recurrence",
        "recurrence",
        "fame",
        "rum-sundae",
        "dasp",
    ]


def test_student_t_matches_published_quantiles_and_tails():
    from gencraft.metrics.stats import paired_t

    # t tables: two pairs give dof 1 (12.706), five give dof 4 (2.776), ten give dof 9 (2.262)
    for diffs, q in (([1.0, 3.0], 12.706), ([1, 2, 3, 4, 5], 2.776), (list(range(10)), 2.262)):
        t = paired_t([float(x) for x in diffs])
        se = t["sd"] / math.sqrt(len(diffs))
        assert (t["high"] - t["mean"]) / se == pytest.approx(q, abs=1e-3)
    # [0, 2, 1, 1]: t = sqrt(6) with dof 3, two-sided p 0.0917 (t tables: 2.353 at 0.10)
    t = paired_t([0.0, 2.0, 1.0, 1.0])
    tt = t["mean"] / (t["sd"] / 2)
    assert tt == pytest.approx(2.449489742783178) and t["p"] == pytest.approx(0.09172, abs=1e-5)


@given(st.lists(st.integers(-500, 500).map(lambda x: x / 100), min_size=2, max_size=30))
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
def test_the_paired_t_interval_excludes_zero_exactly_when_p_is_below_005(diffs):
    from scipy.stats import t as student_t

    from gencraft.metrics.stats import paired_t

    t = paired_t(diffs)
    n, mean = len(diffs), sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    assert t["mean"] == pytest.approx(mean) and t["sd"] == pytest.approx(sd, abs=1e-9)
    assert t["low"] <= t["mean"] <= t["high"]
    if sd > 1e-6 and abs(t["low"]) > 1e-6 and abs(t["high"]) > 1e-6:
        assert t["p"] == pytest.approx(2 * student_t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
        assert (t["p"] < 0.05) == (not t["low"] <= 0 <= t["high"])
        v = decide(diffs)
        assert v["verdict"] == ("reproduced" if t["p"] < 0.05 and mean > 0 else "undecided")
        assert decide([-d for d in diffs], expected=-1)["verdict"] == v["verdict"]
        if v["needed"] is not None:
            assert v["needed"] == max(n + 1, math.ceil((2.8015852 * sd / abs(mean)) ** 2))


def test_a_whole_unit_saved_before_a_split_covers_its_parts(tmp_path):
    from gencraft.studies.campaign import RunState

    state = RunState(CLAIMS["hso-fewshot"], "run", tmp_path, None, {})
    state.expected = ["n=2 seed=0 baseline", "n=2 seed=0 hso", "n=2 seed=1 baseline"]
    state.units = {"n=2 seed=0": {}, "n=2 seed=1 hso": {}}
    assert state.left == ["n=2 seed=1 baseline"]


def test_the_verdict_on_unfinished_runs_is_computed_so_far_and_marked_interim(tmp_path, capsys):
    from gencraft.metrics.stats import verdict_cells
    from gencraft.studies.hso import FewShotSettings, fewshot_verdict

    folder = tmp_path / "hso-fewshot" / "run"
    folder.mkdir(parents=True)
    units = {  # the tiny run: n = 2, seeds 0 and 1, four methods; seed 1 has its baseline only
        "n=2 seed=0 baseline": _correct([0, 1, 0, 1]),
        "n=2 seed=0 dynamic eval": _correct([1, 1, 0, 1]),
        "n=2 seed=0 hso": _correct([1, 1, 1, 1]),
        "n=2 seed=0 hso2": _correct([1, 0, 1, 1]),
        "n=2 seed=1 baseline": _correct([1, 1, 1, 1]),
    }

    def plan() -> list[list[str]]:
        (folder / "results.json").write_text(json.dumps({"units": units}))
        args = ["reproduce", "campaign", "--scale", "tiny", "--output", str(tmp_path), "--plan"]
        assert main([*args, "--claims", "hso-fewshot", "recurrence"]) == 0
        table = capsys.readouterr().out.split("Verdicts on what is finished")[1]
        lines = [x for x in table.splitlines() if x.startswith("| ")][1:]
        return [[c.strip() for c in x.strip("|").split("|")] for x in lines]

    s = FewShotSettings(shots=(2,), seeds=(0, 1))
    hso, hso2, rec = plan()
    for row, want in zip((hso, hso2), fewshot_verdict([(s, units)]), strict=True):
        cells = verdict_cells(want)
        assert want["n"] == 4 and row[:4] == ["hso-fewshot", "0 of 1", "5", "0"]
        assert row[4:] == [
            *list(cells.values())[:-1],
            "interim (5 of 8 units): " + cells["verdict"],
        ]
    assert rec == ["recurrence", "0 of 2", "0", "0", "", "", "", "", "no unit finished yet"]
    units.update({f"n=2 seed=1 {m}": _correct([0, 0, 0, 1]) for m in ("dynamic eval", "hso")})
    units["n=2 seed=1 hso2"] = _correct([1, 1, 1, 1])
    hso, hso2, _ = plan()  # whole: the verdict is final, over both seeds
    assert hso[1:3] == ["1 of 1", "8"] and hso[5] == "8 (example, n, seed) pairs"
    assert hso[-1] == verdict_cells(fewshot_verdict([(s, units)])[0])["verdict"]
    assert not any("interim" in c for c in hso + hso2)


def test_dasp_scores_only_the_metrics_asked_for_and_rescores_a_narrower_cache(
    shared_data, tmp_path
):
    runs = str(tmp_path / "runs")
    kw = {"data_dir": str(shared_data), "variants": "dense", "seeds": "0", "runs_dir": runs}
    reproduce(
        "prefix-tasks", scale="tiny", output=tmp_path / "a", overrides={**kw, "metrics": ("BLEU",)}
    )
    unit = _results(tmp_path / "a")["units"]["dense/seed0"]
    assert set(unit["scores"]) == {"BLEU"}
    # the same trained run, asked for one metric more: its cached test scores are redone
    reproduce(
        "prefix-tasks",
        scale="tiny",
        output=tmp_path / "b",
        overrides={**kw, "metrics": ("BLEU", "ROUGE-L")},
    )
    again = _results(tmp_path / "b")["units"]["dense/seed0"]
    assert (
        set(again["scores"]) == {"BLEU", "ROUGE-L"}
        and again["scores"]["BLEU"] == unit["scores"]["BLEU"]
    )


def test_the_nar_training_seed_changes_the_models_and_none_is_the_earlier_zero(
    shared_data, tmp_path
):
    """``seed`` seeds every model's training; None is the 0 every run used before the
    setting, so a run saved without it resumes as it was, and another seed is refused there."""
    from gencraft.errors import GencraftError

    over = {"data_dir": str(shared_data), "variants": ("mask-predict",), "test_limit": 2}
    over |= {"decode_batch": 2, "curve_steps": (), "curve_thresholds": ()}
    loss = {}
    for seed in (None, 0, 1):
        out = tmp_path / str(seed)
        reproduce("nar-tasks", scale="tiny", output=out, overrides={**over, "seed": seed})
        loss[seed] = _results(out)["units"]["train mask-predict"]["best_valid_loss"]
    assert loss[None] == loss[0] != loss[1]
    old = tmp_path / "None"
    data = _results(old)
    del data["settings"]["seed"]  # as saved before the setting existed
    (old / "results.json").write_text(json.dumps(data))
    reproduce("nar-tasks", scale="tiny", output=old, overrides=over)
    assert _results(old)["unit_seconds"] == data["unit_seconds"]  # nothing computed again
    with pytest.raises(GencraftError, match="seed"):
        reproduce("nar-tasks", scale="tiny", output=old, overrides={**over, "seed": 1})
