"""The verdicts' statistics (gencraft.metrics.stats) against independent references: Student's
t tail by numerical integration of its density, the incomplete beta function and the Wilson
interval at 50 digits (mpmath), the sign test by summing the binomial, and the verdict rules
word for word. Fast, so that the automatic mutation tool can run them per mutant."""

from __future__ import annotations

import math
import re

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.metrics import stats

# allow_subnormal=False: a library imported earlier in the suite flushes subnormals to zero
FLOAT = {"allow_subnormal": False}
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


@pytest.fixture(autouse=True)
def _fifty_digits():
    """mpmath at 50 digits for these tests only (its precision is global)."""
    with mpmath.workdps(50):
        yield


def _whole(message: str) -> str:
    """A pattern that matches ``message`` and nothing around it."""
    return f"^{re.escape(message)}$"


def _t_tail2(t: float, dof: float) -> float:
    """P(|T| >= |t|) by integrating Student's t density from |t| to infinity."""
    nu = mpmath.mpf(dof)
    norm = mpmath.gamma((nu + 1) / 2) / (mpmath.sqrt(nu * mpmath.pi) * mpmath.gamma(nu / 2))
    tail = mpmath.quad(lambda x: (1 + x * x / nu) ** (-(nu + 1) / 2), [abs(t), mpmath.inf])
    return float(2 * norm * tail)


@SETTINGS
@given(st.floats(-40, 40, **FLOAT), st.floats(0.5, 300, **FLOAT))
def test_the_t_tail_equals_the_integral_of_the_density(t, dof):
    assert stats.student_t_sf2(t, dof) == pytest.approx(_t_tail2(t, dof), rel=1e-8, abs=1e-13)


@SETTINGS
@given(st.floats(0.05, 80, **FLOAT), st.floats(0.05, 80, **FLOAT), st.floats(0, 1, **FLOAT))
def test_the_incomplete_beta_equals_mpmaths_on_both_sides_of_its_switch(a, b, x):
    want = float(mpmath.betainc(a, b, 0, x, regularized=True))
    assert stats._betainc(a, b, x) == pytest.approx(want, rel=1e-9, abs=1e-14)


@SETTINGS
@given(st.floats(0.8, 200, **FLOAT), st.floats(0.5, 0.999, **FLOAT))
def test_the_t_quantile_leaves_one_minus_the_level_in_the_tails(dof, level):
    q = stats.t_quantile(dof, level)
    assert q > 0 and _t_tail2(q, dof) == pytest.approx(1 - level, rel=1e-7)


def test_the_t_refuses_a_dof_of_zero_or_less():
    for dof in (0, -1.5):
        with pytest.raises(GencraftError, match=_whole(f"Student's t needs dof > 0, got {dof}")):
            stats.student_t_sf2(1.0, dof)


@SETTINGS
@given(st.lists(st.integers(-400, 400).map(lambda x: x / 16), min_size=2, max_size=25))
def test_paired_t_is_the_textbook_interval_and_test(diffs):
    n = len(diffs)
    mean = mpmath.fsum(diffs) / n
    sd = mpmath.sqrt(mpmath.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    got = stats.paired_t(diffs)
    assert got["n"] == n and got["mean"] == pytest.approx(float(mean), abs=1e-12)
    assert got["sd"] == pytest.approx(float(sd), rel=1e-9, abs=1e-12)
    if sd == 0:  # every difference equal: no spread, an interval of zero width
        assert got["low"] == got["high"] == got["mean"] and got["p"] == float(mean == 0)
        return
    se = float(sd / mpmath.sqrt(n))
    half = stats.t_quantile(n - 1) * se
    assert got["low"] == pytest.approx(float(mean) - half, rel=1e-9, abs=1e-12)
    assert got["high"] == pytest.approx(float(mean) + half, rel=1e-9, abs=1e-12)
    assert got["p"] == pytest.approx(_t_tail2(float(mean) / se, n - 1), rel=1e-7, abs=1e-13)


def test_one_difference_gives_no_interval_and_none_is_refused():
    got = stats.paired_t([2.5])
    assert got["n"] == 1 and got["mean"] == 2.5 and got["p"] == 1.0 and math.isnan(got["sd"])
    assert (got["low"], got["high"]) == (-math.inf, math.inf)
    with pytest.raises(GencraftError, match=_whole("paired_t needs at least one difference")):
        stats.paired_t([])


@pytest.mark.parametrize(
    ("mean", "p", "expected", "verdict"),
    [
        (0.3, 0.01, 1, "reproduced"),
        (-0.3, 0.01, 1, "contradicted"),
        (-0.3, 0.01, -1, "reproduced"),
        (0.3, 0.01, -1, "contradicted"),
        (0.3, 0.05, 1, "not reproduced at this size"),  # p must be below alpha
        (0.3, 0.0499, 1, "reproduced"),
        (0.0, 0.0, 1, "not reproduced at this size"),  # no direction
    ],
)
def test_the_verdict_follows_p_and_the_claimed_direction(mean, p, expected, verdict):
    assert stats.verdict_of(mean, p, expected) == verdict


def test_the_verdict_refuses_a_direction_other_than_up_or_down():
    with pytest.raises(GencraftError, match=_whole("expected must be 1 or -1, got 0")):
        stats.verdict_of(1.0, 0.01, 0)
    assert stats.verdict_of(1.0, 0.08, 1, alpha=0.1) == "reproduced"


@SETTINGS
@given(st.lists(st.integers(-60, 100).map(lambda x: x / 10), min_size=1, max_size=20))
def test_decide_adds_the_verdict_and_the_pairs_that_would_decide_it(diffs):
    got, t = stats.decide(diffs), stats.paired_t(diffs)
    assert {k: got[k] for k in t} == t
    assert got["verdict"] == stats.verdict_of(t["mean"], t["p"])
    undecided = got["verdict"] == "not reproduced at this size"
    if not undecided or t["mean"] == 0 or len(diffs) == 1:
        assert got["needed"] is None
    else:
        want = max(len(diffs) + 1, math.ceil((2.80 * t["sd"] / abs(t["mean"])) ** 2))
        assert got["needed"] == want
    assert stats.decide(diffs, alpha=1.01)["verdict"] == stats.verdict_of(t["mean"], 0, 1, 0.5)
    down = stats.decide([-d for d in diffs], expected=-1)
    assert down["verdict"] == got["verdict"] and down["needed"] == got["needed"]


def test_a_large_t_left_undecided_by_two_pairs_asks_for_one_pair_more():
    # t = 21 with one degree of freedom: p = 0.03 > 0.01; (2.80 sd / mean)^2 rounds up to 1
    got = stats.decide([1.0, 1.1], alpha=0.01)
    assert got["verdict"] == "not reproduced at this size" and got["needed"] == 3


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p, z2, n = mpmath.mpf(k) / n, mpmath.mpf(z) ** 2, mpmath.mpf(n)
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = mpmath.mpf(z) * mpmath.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return float(centre - half), float(centre + half)


@SETTINGS
@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
       st.sampled_from([1.0, 1.644854, 1.959964, 2.575829]))  # fmt: skip
def test_the_wilson_interval_is_the_closed_form_and_exact_at_the_ends(kn, z):
    k, n = kn
    low, high = stats.wilson_interval(k, n, z)
    want = _wilson(k, n, z)
    assert low == (0.0 if k == 0 else pytest.approx(want[0], rel=1e-12, abs=1e-15))
    assert high == (1.0 if k == n else pytest.approx(want[1], rel=1e-12, abs=1e-15))


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (0, -1), (1, 0)])
def test_the_wilson_interval_refuses_counts_outside_zero_to_n(k, n):
    message = f"wilson_interval needs 0 <= k <= n, got k={k}, n={n}"
    with pytest.raises(GencraftError, match=_whole(message)):
        stats.wilson_interval(k, n)


def test_no_success_gives_a_lower_end_of_exactly_zero():
    # the closed form's lower end at k = 0 rounds to a few 1e-19 above 0 for many (n, z)
    for z in (1.0, 1.959964, 3.1):
        assert all(stats.wilson_interval(0, n, z)[0] == 0.0 for n in range(1, 2000))


@SETTINGS
@given(st.integers(0, 60), st.integers(0, 60))
def test_the_sign_test_is_twice_the_smaller_binomial_tail(wins, losses):
    n = wins + losses
    tail = sum(mpmath.binomial(n, i) for i in range(min(wins, losses) + 1)) / mpmath.mpf(2) ** n
    want = 1.0 if n == 0 else min(1.0, float(2 * tail))
    assert stats.sign_test(wins, losses) == pytest.approx(want, rel=1e-12)
    assert stats.sign_test(losses, wins) == stats.sign_test(wins, losses)


@SETTINGS
@given(st.integers(0, 30), st.integers(0, 30), st.integers(0, 10))
def test_a_paired_comparison_counts_ties_and_gives_the_share_of_decided_items(w, lo, ties):
    got = stats.paired_comparison(w, lo, w + lo + ties)
    assert (got["n"], got["wins"], got["losses"], got["ties"]) == (w + lo + ties, w, lo, ties)
    assert got["p"] == stats.sign_test(w, lo)
    assert got["share"] == (w / (w + lo) if w + lo else 0.5)
    assert (got["share_low"], got["share_high"]) == stats.wilson_interval(w, w + lo)


@pytest.mark.parametrize(("w", "lo", "n"), [(-1, 2, 3), (2, -1, 3), (3, 2, 4)])
def test_a_paired_comparison_refuses_negative_counts_and_more_than_n(w, lo, n):
    message = f"paired_comparison needs wins + losses <= n, got {w}, {lo}, {n}"
    with pytest.raises(GencraftError, match=_whole(message)):
        stats.paired_comparison(w, lo, n)


def test_the_report_cells_of_a_verdict():
    v = {"comparison": "A − B", "n": 12, "pairs": "seeds", "mean": 1.23456, "low": -0.5,
         "high": 2.96, "unit": "points", "p": 0.1234, "verdict": "not reproduced at this size",
         "needed": 40, "run_means": [1.0]}  # fmt: skip
    cells = stats.verdict_cells(v)
    assert cells == {
        "comparison": "A − B",
        "pairs": "12 seeds",
        "effect [95% interval]": "+1.23 [-0.5, +2.96] points",
        "p": "0.123",
        "verdict": "not reproduced at this size (about 40 seeds would decide it)",
    }
    both = stats.verdict_cells({**v, "needed": None, "run_means": [0.5, -0.25]})
    assert both["verdict"] == "not reproduced at this size" and both["each run"] == "+0.5, -0.25"
