"""The verdicts' statistics (gencraft.metrics.stats) against independent references: Student's
t tail by numerical integration of its density and the Wilson interval at 50 digits (mpmath),
the sign test by summing the binomial, and the verdict rule word for word. Fast, so that the
automatic mutation tool can run them per mutant; compare_paired's calibration is in
test_compare_paired.py."""

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
    # the interval is symmetric, and its half-width in standard errors leaves 5% in the tails
    assert got["high"] - got["mean"] == pytest.approx(got["mean"] - got["low"], rel=1e-9)
    assert _t_tail2((got["high"] - got["mean"]) / se, n - 1) == pytest.approx(0.05, rel=1e-7)
    assert got["p"] == pytest.approx(_t_tail2(float(mean) / se, n - 1), rel=1e-7, abs=1e-13)


def test_one_difference_gives_no_interval_and_none_is_refused():
    got = stats.paired_t([2.5])
    assert got["n"] == 1 and got["mean"] == 2.5 and got["p"] == 1.0 and math.isnan(got["sd"])
    assert (got["low"], got["high"]) == (-math.inf, math.inf)
    with pytest.raises(GencraftError, match=_whole("paired_t needs at least one difference")):
        stats.paired_t([])


def _c(mean, low, high, p):
    return {"mean": mean, "low": low, "high": high, "p": p}


@pytest.mark.parametrize(
    ("comparison", "kwargs", "word"),
    [
        (_c(0.3, 0.1, 0.5, 0.01), {}, "reproduced"),
        (_c(-0.3, -0.5, -0.1, 0.01), {"direction": -1}, "reproduced"),
        (_c(0.3, 0.1, 0.5, 0.05), {}, "undecided"),  # p must be below alpha
        (_c(0.3, 0.1, 0.5, 0.0499), {}, "reproduced"),
        (_c(0.0, 0.0, 0.0, 0.0), {}, "undecided"),  # no direction
        (_c(-0.3, -0.5, -0.1, 0.01), {"deciding": True}, "contradicted"),
        (_c(0.3, 0.1, 0.5, 0.01), {"direction": -1, "deciding": True}, "contradicted"),
        # against the paper at a scale that does not decide: excluded when the interval
        # leaves out the paper's effect, undecided without one
        (_c(-0.3, -0.5, -0.1, 0.01), {"paper_effect": 2.0}, "excluded at this scale"),
        (_c(-0.3, -0.5, -0.1, 0.01), {}, "undecided"),
        (_c(0.3, -0.5, 1.9, 0.3), {"paper_effect": 2.0}, "excluded at this scale"),
        (_c(0.3, -0.5, 2.0, 0.3), {"paper_effect": 2.0}, "undecided"),  # 2.0 inside
        (_c(0.3, -0.5, 1.9, 0.3), {"paper_effect": 2.0, "deciding": True}, "undecided"),
        (
            _c(-0.3, -1.9, 0.5, 0.3),
            {"paper_effect": -2.0, "direction": -1},
            "excluded at this scale",
        ),
        (_c(-0.3, -2.0, 0.5, 0.3), {"paper_effect": -2.0, "direction": -1}, "undecided"),
        (None, {}, "not attempted"),
        # "matches" claims: the equivalence test decides
        (_c(0.1, -0.2, 0.4, 0.6), {"margin": 1.0, "equivalence_p": 0.01}, "reproduced"),
        (_c(0.1, -0.2, 0.4, 0.6), {"margin": 1.0, "equivalence_p": 0.05}, "undecided"),
        (_c(-3.0, -4.0, -1.0, 0.01), {"margin": 1.0}, "excluded at this scale"),
        (_c(-3.0, -4.0, -1.0, 0.01), {"margin": 1.0, "deciding": True}, "contradicted"),
        (_c(3.0, 1.0, 4.0, 0.01), {"margin": 1.0, "deciding": True}, "contradicted"),
        (_c(-3.0, -4.0, -0.99, 0.01), {"margin": 1.0, "deciding": True}, "undecided"),
    ],
)
def test_the_verdict_rule_word_for_word(comparison, kwargs, word):
    assert stats.verdict(comparison, **kwargs) == word
    assert word in stats.VERDICTS


def test_the_five_verdict_words():
    assert stats.VERDICTS == (
        "reproduced",
        "contradicted",
        "excluded at this scale",
        "undecided",
        "not attempted",
    )


def test_the_verdict_refuses_a_direction_other_than_up_or_down():
    with pytest.raises(GencraftError, match=_whole("direction must be 1 or -1, got 0")):
        stats.verdict(_c(1.0, 0.5, 1.5, 0.01), direction=0)
    assert stats.verdict(_c(1.0, 0.5, 1.5, 0.08), alpha=0.1) == "reproduced"


@SETTINGS
@given(st.lists(st.integers(-60, 100).map(lambda x: x / 10), min_size=1, max_size=20))
def test_decide_adds_the_verdict_and_the_units_that_would_decide_it(diffs):
    got, t = stats.decide(diffs), stats.paired_t(diffs)
    assert {k: got[k] for k in t} == t
    assert got["verdict"] == stats.verdict(t)
    if got["verdict"] != "undecided" or t["mean"] == 0 or len(diffs) == 1 or t["sd"] == 0:
        assert got["needed"] is None
    else:
        want = max(len(diffs) + 1, math.ceil((2.8015852 * t["sd"] / abs(t["mean"])) ** 2))
        assert got["needed"] == want
    down = stats.decide([-d for d in diffs], expected=-1)
    assert down["verdict"] == got["verdict"] and down["needed"] == got["needed"]


def test_the_units_for_power_are_the_normal_approximation():
    # (1.959964 + 0.841621)^2 = 7.8489: sd 1, effect 0.5 -> 31.4 -> 32
    assert stats.units_for_power(1.0, 0.5) == 32
    assert stats.units_for_power(1.0, -0.5) == 32
    assert stats.units_for_power(2.0, 0.5) == 126
    assert stats.units_for_power(1.0, 0.5, alpha=0.01) == 47
    assert stats.units_for_power(1.0, 0.0) is None and stats.units_for_power(0.0, 1.0) is None
    assert stats.units_for_power(1.0, 100.0) == 2


def test_an_undecided_claim_asks_for_units_at_the_papers_effect():
    diffs = [0.1, -0.1, 0.3, 0.0, 0.2, -0.2, 0.1]
    got, sd = stats.decide(diffs, paper_effect=0.1), stats.paired_t(diffs)["sd"]
    assert got["verdict"] == "undecided" and got["needed"] == stats.units_for_power(sd, 0.1) > 8
    # an interval without the paper's effect, at a scale that does not decide
    assert stats.decide(diffs, paper_effect=1.0)["verdict"] == "excluded at this scale"


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p, z2, n = mpmath.mpf(k) / n, mpmath.mpf(z) ** 2, mpmath.mpf(n)
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = mpmath.mpf(z) * mpmath.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return float(centre - half), float(centre + half)


LEVELS = {0.6826895: 1.0, 0.9: 1.6448536, 0.95: 1.9599640, 0.99: 2.5758293}


@SETTINGS
@given(
    st.integers(1, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.sampled_from(sorted(LEVELS)),
)
def test_the_wilson_interval_is_the_closed_form_and_exact_at_the_ends(kn, level):
    k, n = kn
    low, high = stats.wilson_interval(k, n, level)
    z = LEVELS[level]
    want = _wilson(k, n, z)
    assert low == (0.0 if k == 0 else pytest.approx(want[0], rel=1e-6, abs=1e-9))
    assert high == (1.0 if k == n else pytest.approx(want[1], rel=1e-6, abs=1e-9))


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (0, -1), (1, 0)])
def test_the_wilson_interval_refuses_counts_outside_zero_to_n(k, n):
    message = f"wilson_interval needs 0 <= k <= n, got k={k}, n={n}"
    with pytest.raises(GencraftError, match=_whole(message)):
        stats.wilson_interval(k, n)


def test_no_success_gives_a_lower_end_of_exactly_zero():
    # the closed form's lower end at k = 0 rounds to a few 1e-19 above 0 for many (n, z)
    for level in (0.68, 0.95, 0.998):
        assert all(stats.wilson_interval(0, n, level)[0] == 0.0 for n in range(1, 400))


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
    v = {
        "comparison": "A − B",
        "n": 12,
        "pairs": "seeds",
        "mean": 1.23456,
        "low": -0.5,
        "high": 2.96,
        "unit": "points",
        "p": 0.1234,
        "verdict": "undecided",
        "needed": 40,
        "run_means": [1.0],
    }
    cells = stats.verdict_cells(v)
    assert cells == {
        "comparison": "A − B",
        "pairs": "12 seeds",
        "effect [95% interval]": "+1.23 [-0.5, +2.96] points",
        "p": "0.123",
        "verdict": "undecided (about 40 seeds would decide it)",
    }
    both = stats.verdict_cells({**v, "needed": None, "run_means": [0.5, -0.25]})
    assert both["verdict"] == "undecided" and both["each run"] == "+0.5, -0.25"
    floor = stats.verdict_cells({**v, "p": 0.001, "resamples": 1000})
    assert floor["p"] == "< 0.001"
    assert stats.verdict_cells({**v, "p": 0.0011, "resamples": 1000})["p"] == "0.0011"


def test_the_verdict_edges_of_p_and_of_a_zero_mean():
    from gencraft.metrics.stats import verdict

    at_alpha = {"mean": -1.0, "low": -2.0, "high": -0.5, "p": 0.05}
    assert verdict(at_alpha, deciding=True) == "undecided"  # p = alpha is not below it
    zero = {"mean": 0.0, "low": -1.0, "high": 1.0, "p": 0.01}
    assert verdict(zero, deciding=True) == "undecided"  # neither direction


def test_paired_t_with_a_standard_deviation_of_exactly_one_and_power_without_a_finite_sd():
    from gencraft.metrics.stats import paired_t, units_for_power

    r = paired_t([1.0, 2.0, 3.0])  # sd exactly 1: a real interval, not the no-spread case
    assert r["sd"] == 1.0 and r["low"] < 2.0 < r["high"] and 0 < r["p"] < 1
    assert units_for_power(math.inf, 1.0) is None and units_for_power(1.0, math.inf) is None
