"""Verdicts pooled over training seeds: the two-level paired bootstrap of BLEU
(:func:`gencraft.metrics.tasks.bleu_paired_runs`), the nar-tasks verdict that pools runs
differing only in ``seed``, and ``gencraft verdict`` on saved run folders."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.cli.main import main
from gencraft.metrics.tasks import bleu_paired, bleu_paired_runs, score_task

WORDS = ("the", "pub", "is", "cheap", "near", "river", "a", "family", "cafe", "in")
REFS = [
    "the pub is cheap near the river",
    "a family cafe in the river",
    "the cafe is near a pub",
    "a cheap pub in the family river",
    "the river cafe is cheap",
    "near the pub is a family cafe",
]


sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=7).map(" ".join)
runs_st = st.lists(st.lists(sentences, min_size=6, max_size=6), min_size=2, max_size=6)


def _bleu(outs, rows):
    picked, wanted = [outs[i] for i in rows], [REFS[i] for i in rows]
    return score_task("e2e", picked, wanted, metrics=("BLEU",))["BLEU"]


@given(runs_st, st.integers(0, 3))
@settings(max_examples=15, deadline=None, derandomize=True, database=None)
def test_pooled_bleu_is_the_two_level_bootstrap_recomputed_by_brute_force(outs, seed):
    """Against corpus BLEU recomputed on every resample's inputs for every drawn run, with
    the same draws: inputs from ``seed``, runs from ``seed + 1``."""
    k = len(outs) // 2
    runs_a, runs_b = outs[:k], outs[k : 2 * k]
    got = bleu_paired_runs("e2e", runs_a, runs_b, REFS, resamples=60, seed=seed)
    idx = np.random.default_rng(seed).choice(6, size=(60, 6), replace=True)
    drawn = np.random.default_rng(seed + 1).integers(k, size=(60, k))
    diffs = np.array(
        [
            np.mean([_bleu(runs_a[j], rows) - _bleu(runs_b[j], rows) for j in pick])
            for rows, pick in zip(idx, drawn, strict=True)
        ]
    )
    each = [_bleu(a, range(6)) - _bleu(b, range(6)) for a, b in zip(runs_a, runs_b, strict=True)]
    assert got["runs"] == k and got["n"] == 6
    assert got["run_means"] == pytest.approx(each, abs=1e-9)
    assert got["mean"] == pytest.approx(np.mean(each), abs=1e-9)
    assert [got["low"], got["high"]] == pytest.approx(list(np.percentile(diffs, [2.5, 97.5])))
    far = min((diffs <= 0).mean(), (diffs >= 0).mean())
    assert got["p"] == pytest.approx(min(1.0, max(2 * far, 1 / 60)))


@given(
    st.lists(sentences, min_size=6, max_size=6),
    st.lists(sentences, min_size=6, max_size=6),
    st.integers(2, 4),
)
@settings(max_examples=20, deadline=None, derandomize=True, database=None)
def test_one_run_is_bleu_paired_and_copies_of_it_change_nothing(a, b, copies):
    one = bleu_paired_runs("e2e", [a], [b], REFS, resamples=100)
    assert {k: one[k] for k in ("n", "mean", "low", "high", "p", "test")} == bleu_paired(
        "e2e", a, b, REFS, resamples=100
    )
    same = bleu_paired_runs("e2e", [a] * copies, [b] * copies, REFS, resamples=100)
    for key in ("mean", "low", "high", "p"):
        assert same[key] == pytest.approx(one[key], abs=1e-9)
    assert same["runs"] == copies and same["run_means"] == [one["mean"]] * copies


def test_seeds_that_disagree_widen_the_interval_past_each_run():
    good = list(REFS)
    half = [" ".join(r.split()[:3]) for r in REFS]
    runs_a, runs_b = [good, half], [half, half]  # seed 0: a large gain; seed 1: none
    pooled = bleu_paired_runs("e2e", runs_a, runs_b, REFS, resamples=400)
    alone = [
        bleu_paired("e2e", a, b, REFS, resamples=400) for a, b in zip(runs_a, runs_b, strict=True)
    ]
    assert alone[1]["low"] == alone[1]["high"] == 0  # identical outputs: no spread
    assert pooled["mean"] == pytest.approx((alone[0]["mean"] + 0) / 2)
    assert pooled["low"] <= 0 < alone[0]["low"]  # the seed that gained nothing is drawn
    assert pooled["high"] - pooled["low"] > alone[0]["high"] - alone[0]["low"]


def test_pooled_bleu_refuses_unpaired_runs_in_one_line():
    from gencraft.errors import ConfigError

    with pytest.raises(ConfigError, match="as many runs"):
        bleu_paired_runs("e2e", [REFS, REFS], [REFS], REFS)
    with pytest.raises(ConfigError, match="as many outputs in every run"):
        bleu_paired_runs("e2e", [REFS, REFS[:5]], [REFS, REFS], REFS)
    with pytest.raises(ConfigError, match="data-to-text"):
        bleu_paired_runs("xsum", [REFS], [REFS], REFS)


def test_runs_group_by_their_settings_but_the_named_fields():
    from gencraft.studies.nar import NARTasksSettings
    from gencraft.studies.runner import runs_by_settings

    a = (NARTasksSettings(seed=None, temperatures=(0.1, 0.4)), {"x": 1})
    b = (NARTasksSettings(seed=1, temperatures=[0.1, 0.4]), {"x": 2})  # as read from json
    c = (NARTasksSettings(seed=2, steps=7), {"x": 3})
    assert runs_by_settings([a, b, c], but=("seed",)) == [[a, b], [c]]
    assert runs_by_settings([a, b, c]) == [[a], [b], [c]]


def _nar_units(refs, gain):
    good = [r[0].lower() for r in refs]
    bad = [" ".join(x.split()[:gain]) for x in good]
    return {"test rum-sundae": {"predictions": good}, "test sundae-scratch": {"predictions": bad}}


def _refs(data_dir):
    from gencraft.data.tasks import pick_examples, references_of, task_examples

    examples = pick_examples(task_examples("e2e", "test", data_dir), 12, spread=True)
    return [references_of(e) for e in examples]


def test_the_nar_verdict_pools_seeds_of_one_setup_and_keeps_others_apart(shared_data):
    from gencraft.metrics.stats import verdict_cells
    from gencraft.metrics.tasks import bleu_paired_runs as pooled
    from gencraft.studies.nar import NARTasksSettings, tasks_verdict

    base = NARTasksSettings(test_limit=12, data_dir=str(shared_data))
    refs = _refs(base.data_dir)
    units = [_nar_units(refs, g) for g in (3, 5)]
    runs = [(base, units[0]), (dataclasses.replace(base, seed=1), units[1])]
    (v,) = tasks_verdict([*runs, (base, {"test rum-sundae": {}})])  # unfinished: left out
    outs = [
        [u[f"test {m}"]["predictions"] for u in units] for m in ("rum-sundae", "sundae-scratch")
    ]
    want = pooled("e2e", *outs, refs, lowercase=True)

    def bleu(o):
        return score_task("e2e", o, refs, lowercase=True, metrics=("BLEU",))["BLEU"]

    gains = [bleu(a) - bleu(b) for a, b in zip(*outs, strict=True)]
    assert gains[0] > gains[1] > 0 and v["mean"] == pytest.approx(sum(gains) / 2)
    assert v["runs"] == 2 and v["run_means"] == pytest.approx(gains)
    assert (v["low"], v["high"]) == (want["low"], want["high"])
    assert v["pairs"] == "test inputs × 2 training seeds (paired bootstrap)"
    apart = tasks_verdict([runs[0], (dataclasses.replace(base, seed=1, steps=7), units[1])])
    assert [r["runs"] for r in apart] == [1, 1]
    assert apart[0]["pairs"] == "test inputs (paired bootstrap)"
    # a pooled row names each seed's effect; a run alone has no such cell
    assert verdict_cells(v)["each run"] == ", ".join(f"{g:+.3g}" for g in gains)
    assert "each run" not in verdict_cells(apart[0])


def _save_run(folder, experiment, s, units):
    folder.mkdir(parents=True)
    data = {
        "experiment": experiment,
        "scale": "cpu",
        "units": units,
        "settings": json.loads(json.dumps(dataclasses.asdict(s), default=str)),
    }
    (folder / "results.json").write_text(json.dumps(data))


def test_gencraft_verdict_pools_saved_runs_and_refuses_mixed_folders(shared_data, tmp_path, capsys):
    from gencraft.studies.hso import FewShotSettings
    from gencraft.studies.nar import (
        NARSpeedSettings,
        NARTasksSettings,
        _tasks_units,
        tasks_verdict,
    )
    from gencraft.studies.runner import get_experiment

    base = NARTasksSettings(test_limit=12, data_dir="/moved/away")
    refs = _refs(str(shared_data))
    runs = [(dataclasses.replace(base, seed=k), _nar_units(refs, 3 + k)) for k in (0, 1)]
    for k, (s, units) in enumerate(runs):
        _save_run(tmp_path / f"seed{k}", "nar-tasks", s, units)
    folders = [str(tmp_path / f"seed{k}") for k in (0, 1)]
    assert main(["verdict", *folders, "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    moved = [(dataclasses.replace(s, data_dir=str(shared_data)), u) for s, u in runs]
    (v,) = tasks_verdict(moved)
    expected = 2 * len(_tasks_units(base))  # each run finished its two test units
    head = f"nar-tasks, 2 runs, 4 of {expected} units finished (interim) (95% intervals;"
    assert out.startswith(head)
    assert "160" not in out and f"{v['mean']:+.3g} [{v['low']:+.3g}, {v['high']:+.3g}]" in out
    assert "12 test inputs × 2 training seeds" in out
    each = ", ".join(f"{m:+.3g}" for m in v["run_means"])
    assert v["run_means"][0] != v["run_means"][1] and each in out
    _save_run(tmp_path / "hso", "hso-fewshot", FewShotSettings(), {})
    _save_run(tmp_path / "speed", "nar-speed", NARSpeedSettings(), {})
    for args, why in (
        ([], "give the folders"),
        ([str(tmp_path)], "holds no results.json"),
        ([folders[0], str(tmp_path / "hso")], "runs of different experiments (nar-tasks: "),
        ([str(tmp_path / "speed")], "nar-speed gives no verdict"),
    ):
        assert main(["verdict", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gencraft: error: ") and why in err and err.count("\n") == 1
    assert main(["verdict", str(tmp_path / "hso")]) == 0
    n = len(get_experiment("hso-fewshot").units(FewShotSettings()))
    out = capsys.readouterr().out
    assert (
        out
        == f"hso-fewshot, 1 run, 0 of {n} units finished (interim): no comparison finished yet\n"
    )


def test_the_recurrence_verdict_names_each_seed_and_pools_their_blocks():
    from gencraft.metrics.stats import decide, verdict_cells
    from gencraft.studies.recurrence import RecurrenceLMSettings, lm_verdict

    def run(seed, base, rec):
        rows = {"baseline": base, "recurrent": rec}
        units = {f"eval {m} test": [{"overlap": 0, "block_nll": b}] for m, b in rows.items()}
        return RecurrenceLMSettings(seed=seed), units

    runs = [run(0, [3.0, 3.2, 2.9], [2.9, 3.1, 2.9]), run(1, [3.1, 3.0], [3.1, 2.95])]
    (one,) = lm_verdict(runs[:1])
    (v,) = lm_verdict([*runs, (RecurrenceLMSettings(seed=2), {})])  # unfinished: left out
    assert v["run_means"] == pytest.approx([-0.2 / 3, -0.025])
    assert v["mean"] == pytest.approx(decide([-0.1, -0.1, 0.0, 0.0, -0.05])["mean"])
    assert v["n"] == 5 and one["run_means"] == pytest.approx([-0.2 / 3])
    assert verdict_cells(v)["each run"] == "-0.0667, -0.025"
    assert "each run" not in verdict_cells(one)
