"""`hso-fewshot-confirm`, the confirmatory few-shot run: its fresh examples (held out and never
drawn before, as balanced as the pool allows), its registered analysis against a hand
computation on the example means, and a run end to end on a tiny model and a small E2E whose
committed-style results.json the claims reader decides from."""

from __future__ import annotations

import csv
import json
import math
import random
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.hso.fewshot import FewShotTask, build_task, task_rows
from gencraft.metrics.stats import compare_paired, holm
from gencraft.studies.hso import (
    CONFIRM_COMPARISONS,
    _test_examples,
    answer_rates,
    balanced_counts,
    confirm_analysis,
    fresh_examples,
)
from gencraft.studies.rereads import HSO_FEWSHOT_CONFIRM, hso_fewshot
from gencraft.studies.runner import reproduce

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


@SETTINGS
@given(st.lists(st.integers(0, 12), min_size=1, max_size=5), st.integers(0, 40))
def test_balanced_counts_are_as_equal_as_the_classes_allow(sizes, n):
    take = balanced_counts(sizes, n)
    assert sum(take) == min(n, sum(sizes))
    assert all(0 <= t <= z for t, z in zip(take, sizes, strict=True))
    open_classes = [t for t, z in zip(take, sizes, strict=True) if t < z]
    # a class with some left holds at least as many as any other, less one
    assert all(t >= max(take) - 1 for t in open_classes)


def _task(n_test: int, seed: int) -> FewShotTask:
    rng = random.Random(seed)
    test = [(f"test {i}", rng.randrange(2)) for i in range(n_test)]
    return FewShotTask("e2e-family", "Review", "Family friendly", ("yes", "no"), [], test)


@SETTINGS
@given(st.integers(6, 40), st.integers(0, 12), st.integers(0, 30), st.integers(0, 99))
def test_fresh_examples_are_held_out_or_never_drawn_and_balanced(n_test, n_held, n, seed):
    task = _task(n_test, seed)
    held = [(f"held {i}", i % 2) for i in range(n_held)]
    used_draws = (2, 4)
    used = set().union(*(_test_examples(task, k, None, None) for k in used_draws))
    fresh = [t for t in task.test if t not in used] + held
    sizes = [sum(y == c for _, y in fresh) for c in (0, 1)]
    if n > len(fresh):
        msg = f"^e2e-family has {len(fresh)} fresh examples; {n} were asked for$"
        with pytest.raises(GencraftError, match=msg):
            fresh_examples(task, held, n, used_draws)
        return
    got = fresh_examples(task, held, n, used_draws)
    assert len(got) == len(set(got)) == n and not set(got) & used
    assert set(got) <= set(fresh)
    assert [sum(y == c for _, y in got) for c in (0, 1)] == balanced_counts(sizes, n)
    assert fresh_examples(task, held, n, used_draws) == got  # seeded


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1)), min_size=1, max_size=30))
def test_answer_rates_count_each_class_and_each_answer(rows):
    correct = [int(c) for c, _ in rows]
    labels = [y for _, y in rows]
    got = answer_rates(correct, labels)
    for y in (0, 1):
        mine = [c for c, lab in zip(correct, labels, strict=True) if lab == y]
        acc = 100.0 * sum(mine) / len(mine) if mine else 0.0
        assert got["class accuracy"][y] == pytest.approx(acc)
        says = sum((lab == y) == bool(c) for c, lab in zip(correct, labels, strict=True))
        assert got["answer share"][y] == pytest.approx(100.0 * says / len(rows))


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(st.integers(3, 14), st.integers(1, 3), st.integers(0, 999))
def test_the_registered_analysis_is_by_example_over_the_seeds_with_holm(n_ex, n_seeds, seed):
    rng = random.Random(seed)
    seeds = list(range(n_seeds))
    labels = [rng.randrange(2) for _ in range(n_ex)]
    units = {
        f"n={n} seed={sd} {m}": {"correct": [rng.randrange(2) for _ in range(n_ex)]}
        for n in (2, 4)
        for sd in seeds
        for m in ("baseline", "hso", "hso2")
    }
    got = confirm_analysis(units, labels, seeds, resamples=300)
    want = []
    for (m, n), c in zip(CONFIRM_COMPARISONS, got["comparisons"], strict=True):
        means = [
            statistics_mean(
                units[f"n={n} seed={sd} {m}"]["correct"][i]
                - units[f"n={n} seed={sd} baseline"]["correct"][i]
                for sd in seeds
            )
            * 100
            for i in range(n_ex)
        ]
        ref = compare_paired(means, [0.0] * n_ex, resamples=300)
        assert (c["method"], c["n"], c["result"].units) == (m, n, n_ex)
        assert c["result"].mean == pytest.approx(ref.mean, abs=1e-9)
        assert c["result"].p == pytest.approx(ref.p)
        want.append(ref.p)
    assert [c["p_holm"] for c in got["comparisons"]] == pytest.approx(holm(want))
    assert len(got["answers"]) == 6 * n_seeds
    # an unfinished cell leaves its comparison out of the analysis, not at a wrong value
    del units["n=4 seed=0 hso"]
    part = confirm_analysis(units, labels, seeds, resamples=300)["comparisons"]
    assert part[3] is None and part[0] is not None


def statistics_mean(xs) -> float:
    xs = list(xs)
    return math.fsum(xs) / len(xs)


def _e2e(root) -> None:
    """A small E2E: short texts (the tiny tokenizer spells them), labels alternating."""

    def rows(prefix: str, n: int) -> list[tuple[str, str]]:
        out = []
        for i in range(n):
            yes = i % 2 == 0
            mr = f"name[{prefix}{i}], familyFriendly[{'yes' if yes else 'no'}]"
            out.append((mr, f"{prefix}{i} {'has' if yes else 'bars'} kids."))
        return out

    (root / "e2e").mkdir(parents=True)
    for name, rs in (
        ("trainset", rows("T", 8)),
        ("devset", rows("D", 4)),
        ("testset_w_refs", rows("X", 8)),
    ):
        with open(root / "e2e" / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["mr", "ref"])
            w.writerows(rs)


def test_the_run_scores_fresh_examples_and_the_claim_is_read_from_it(tmp_path):
    _e2e(tmp_path / "data")
    d = str(tmp_path / "data")
    out = tmp_path / "runs" / "hso-fewshot-confirm-cpu"
    over = {
        "data_dir": d,
        "shots": (2, 4),
        "seeds": (0, 1),
        "examples": 6,
        "used_draws": (2,),
        "hso_window": 64,
    }  # few HSO steps: the test is of the run, not of HSO
    reproduce("hso-fewshot-confirm", scale="tiny", output=out, overrides=over)
    res = json.loads((out / "results.json").read_text())
    task = build_task("e2e-family", d)
    fresh = fresh_examples(task, task_rows("e2e-family", "validation", d), 6, (2,))
    assert res["units"]["examples"]["label"] == [y for _, y in fresh]
    cells = [k for k in res["units"] if k.startswith("n=")]
    assert len(cells) == 2 * 2 * 3 and all(len(res["units"][k]["correct"]) == 6 for k in cells)
    report = (out / "report.md").read_text()
    assert report.index("**Planned analysis**") < report.index("**Exploratory**")
    assert "hso2 − plain, n = 2" in report.split("**Exploratory**")[0]
    # the claim's reader decides from the pre-registered run once it has finished
    got = hso_fewshot(tmp_path / "runs", d)
    assert got.primary.name == "hso2 − plain, n = 2" and got.primary.result.units == 6
    assert got.files == (HSO_FEWSHOT_CONFIRM,) and len(got.secondary) == 3
    shutil.rmtree(tmp_path / "runs")
    assert hso_fewshot(tmp_path / "runs", d) is None
