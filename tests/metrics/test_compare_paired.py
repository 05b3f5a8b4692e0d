"""compare_paired, equivalence and holm (gencraft.metrics.stats) against references: the exact
sign-flip test by enumerating every flip, Holm's procedure run step by step, the TOST's
interval; and the calibration the claims rely on: on data shaped like the studies' (an
example seen in 9 cells, correlated within the example), the clustered comparison rejects a
true null near α and its interval covers the true effect, where the row-level one does not."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.metrics.stats import Paired, compare_paired, equivalence, holm

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs)


def _exact_sign_flip_p(u: list[float]) -> float:
    """Two-sided p of the paired randomisation test by enumerating all 2^n sign flips."""
    obs = abs(sum(u) / len(u))
    flips = itertools.product((1, -1), repeat=len(u))
    means = [abs(sum(s * x for s, x in zip(f, u, strict=True)) / len(u)) for f in flips]
    return sum(m >= obs * (1 - 1e-12) for m in means) / len(means)


@SETTINGS
@given(st.lists(st.integers(-20, 20).map(lambda x: x / 4), min_size=2, max_size=9))
def test_one_level_p_is_the_exact_sign_flip_test(diffs):
    b = [0.0] * len(diffs)
    got = compare_paired(diffs, b, resamples=1000)
    assert got.units == got.rows == len(diffs) and got.mean == pytest.approx(np.mean(diffs))
    assert got.p == pytest.approx(_exact_sign_flip_p(diffs), rel=1e-9)
    if len(set(diffs)) == 1:  # no spread: the same test, an interval of zero width
        assert got.low == got.high == got.mean
        return
    assert got.resamples == 0 and "exact" in got.test  # 2^9 <= 1000 flips: exact
    assert got.low <= got.mean <= got.high


def test_one_unit_is_no_evidence():
    """One cluster (one article, one document) cannot reject: both sign flips are as extreme."""
    got = compare_paired([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], clusters=["a", "a", "a"])
    assert (got.units, got.rows, got.mean, got.p) == (1, 3, 2.0, 1.0)
    same = compare_paired([0.5] * 20, [0.0] * 20, clusters=range(20), resamples=199)
    assert same.p == pytest.approx(1 / 200) and same.low == same.high == 0.5


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.integers(0, 5), min_size=4, max_size=30),
    st.lists(st.integers(-30, 30), min_size=30, max_size=30),
    st.randoms(use_true_random=False),
)
def test_clusters_in_any_order_equal_the_comparison_of_their_means(ids, values, rnd):
    a = [v / 7 for v in values[: len(ids)]]
    b = [0.0] * len(ids)
    got = compare_paired(a, b, clusters=ids, resamples=300, seed=3)
    means = [_mean([x for x, i in zip(a, ids, strict=True) if i == k]) for k in sorted(set(ids))]
    want = compare_paired(means, [0.0] * len(means), resamples=300, seed=3)
    assert got.units == len(set(ids)) and got.rows == len(ids)
    assert (got.mean, got.low, got.high, got.p) == pytest.approx(
        (want.mean, want.low, want.high, want.p), abs=1e-12
    )
    order = list(range(len(ids)))
    rnd.shuffle(order)
    again = compare_paired(
        [a[i] for i in order], b, clusters=[ids[i] for i in order], resamples=300, seed=3
    )
    assert (again.mean, again.low, again.high, again.p) == pytest.approx(
        (got.mean, got.low, got.high, got.p), abs=1e-12
    )


def test_a_block_is_a_cluster_of_consecutive_rows():
    rng = np.random.default_rng(0)
    a = rng.normal(size=23)
    got = compare_paired(a, np.zeros(23), block=5, resamples=400)
    want = compare_paired(a, np.zeros(23), clusters=[i // 5 for i in range(23)], resamples=400)
    assert got.units == 5 and got == want


def _clustered(rng, clusters, per, effect, icc):
    """A difference per row: effect + a cluster's shared part + the row's own noise."""
    shared = rng.normal(0, math.sqrt(icc), clusters)
    own = rng.normal(0, math.sqrt(1 - icc), (clusters, per))
    d = effect + shared[:, None] + own
    return d.ravel(), np.repeat(np.arange(clusters), per)


def test_clustered_comparisons_keep_alpha_and_cover_the_truth_where_rows_do_not():
    rng = np.random.default_rng(2026)
    runs, clustered_fp, rows_fp, covered = 200, 0, 0, 0
    for _ in range(runs):  # a true null: 40 examples x 9 cells, within-example ICC 0.35
        d, ids = _clustered(rng, 40, 9, 0.0, 0.35)
        zero = np.zeros_like(d)
        clustered_fp += compare_paired(d, zero, clusters=ids, resamples=300, seed=1).p < 0.05
        rows_fp += compare_paired(d, zero, resamples=300, seed=1).p < 0.05
        d, ids = _clustered(rng, 40, 9, 0.3, 0.35)
        r = compare_paired(d, np.zeros_like(d), clusters=ids, resamples=300, seed=1)
        covered += r.low <= 0.3 <= r.high
    assert 0.02 <= clustered_fp / runs <= 0.09, clustered_fp
    assert rows_fp / runs > 0.15, rows_fp  # the pseudo-replicated analysis does not keep α
    assert covered / runs >= 0.9, covered


def test_two_levels_draw_seeds_and_units_and_widen_with_the_seeds_spread():
    rng = np.random.default_rng(7)
    seeds, units = 4, 30
    seed_effect = np.array([0.8, -0.6, 0.5, -0.7])
    d = seed_effect[:, None] + rng.normal(0, 0.3, (seeds, units))
    rows = [(s, u) for s in range(seeds) for u in range(units)]
    order = rng.permutation(len(rows))
    a = d.ravel()[order]
    s_ids, u_ids = [rows[i][0] for i in order], [rows[i][1] for i in order]
    got = compare_paired(a, np.zeros_like(a), clusters=u_ids, seeds=s_ids, resamples=2000)
    one = compare_paired(a, np.zeros_like(a), clusters=u_ids, resamples=2000)
    assert (got.units, got.seeds, got.rows) == (units, seeds, seeds * units)
    assert got.run_means == pytest.approx(tuple(d.mean(1)))
    assert got.mean == pytest.approx(d.mean()) and got.mean == pytest.approx(one.mean)
    assert got.high - got.low > 3 * (one.high - one.low)  # the seeds' spread counts
    assert got.p > 0.05 and got.resamples == 2000 and "two-level" in got.test


def test_a_p_at_the_resampling_floor_is_written_below_one_over_r():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 0.2, 60)
    got = compare_paired(a, np.zeros(60), resamples=1000)
    assert got.p == pytest.approx(1 / 1001) and got.p_text == "< 0.001"
    assert got["p"] == got.p and dict(got)["units"] == 60 and isinstance(got, Paired)
    two = compare_paired(
        a,
        np.zeros(60),
        seeds=[i % 2 for i in range(60)],
        clusters=[i // 2 for i in range(60)],
        resamples=1000,
    )
    assert two.p == pytest.approx(1 / 1001) and two.p_text == "< 0.001"
    half = compare_paired(a[:30] - 0.95, np.zeros(30), resamples=1000)
    assert half.p > 0.01 and half.p_text == f"{half.p:.3g}"


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "message"),
    [
        ([1, 2], [1], {}, "compare_paired needs two equal-length lists, got (2,), (1,)"),
        ([], [], {}, "compare_paired needs at least one pair"),
        ([1, math.nan], [0, 0], {}, "compare_paired needs finite values (a NaN or inf was given)"),
        (
            [1, 2],
            [0, 0],
            {"clusters": [1]},
            "compare_paired needs one cluster id per row: 1 for 2 rows",
        ),
        (
            [1, 2],
            [0, 0],
            {"seeds": [1, 2, 3]},
            "compare_paired needs one seed id per row: 3 for 2 rows",
        ),
        (
            [1, 2],
            [0, 0],
            {"block": 2, "clusters": [1, 2]},
            "compare_paired takes clusters or block, not both",
        ),
        ([1, 2], [0, 0], {"block": 0}, "compare_paired needs block >= 1, got 0"),
        ([1, 2], [0, 0], {"resamples": 0}, "compare_paired needs 0 < level < 1 and resamples >= 1"),
        ([1, 2], [0, 0], {"level": 1.0}, "compare_paired needs 0 < level < 1 and resamples >= 1"),
    ],
)
def test_compare_paired_refuses_bad_input_in_one_line(a, b, kwargs, message):
    with pytest.raises(GencraftError, match=f"^{re.escape(message)}$"):
        compare_paired(a, b, **kwargs)


@SETTINGS
@given(
    st.lists(st.integers(-40, 40).map(lambda x: x / 8), min_size=3, max_size=25),
    st.floats(0.1, 4.0),
)
def test_tost_passes_exactly_when_the_90_interval_lies_inside_the_margin(diffs, margin):
    if len(set(diffs)) == 1:
        return
    got = equivalence(diffs, [0.0] * len(diffs), margin)
    inside = -margin < got.low and got.high < margin
    assert (
        (got.p < 0.05) == inside
        or abs(abs(got.low) - margin) < 1e-9
        or abs(abs(got.high) - margin) < 1e-9
    )
    assert got.units == len(diffs) and got.mean == pytest.approx(np.mean(diffs))


def test_tost_refuses_a_margin_of_zero_and_a_single_unit():
    with pytest.raises(GencraftError, match=r"^an equivalence test needs a margin > 0, got 0$"):
        equivalence([1, 2], [0, 0], 0)
    with pytest.raises(GencraftError, match=r"^an equivalence test needs at least two units$"):
        equivalence([1, 2], [0, 0], 1.0, clusters=["x", "x"])


def _holm_rejects(ps: list[float], alpha: float) -> set[int]:
    """Holm's procedure as stated: walk the sorted p-values, stop at the first one above its
    threshold alpha / (m - i)."""
    out = set()
    for i, j in enumerate(sorted(range(len(ps)), key=lambda k: ps[k])):
        if ps[j] * (len(ps) - i) >= alpha:  # p >= alpha / (m - i), without a division
            break
        out.add(j)
    return out


@SETTINGS
# allow_subnormal=False: a library imported earlier in the suite flushes subnormals to zero
@given(
    st.lists(st.floats(0, 1, allow_subnormal=False), min_size=1, max_size=12),
    st.sampled_from([0.01, 0.05, 0.1]),
)
def test_holm_adjusted_p_values_reject_what_the_procedure_rejects(ps, alpha):
    adj = holm(ps)
    assert len(adj) == len(ps) and all(p <= q <= 1 for p, q in zip(ps, adj, strict=True))
    assert {i for i, q in enumerate(adj) if q < alpha} == _holm_rejects(ps, alpha)


def test_holm_on_a_worked_example_and_its_refusal():
    # m = 3: 0.01 * 3, max(0.03, 0.02 * 2), max(0.04, 0.04 * 1)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.043, 0.010]) == pytest.approx([0.043, 0.020])
    assert holm([]) == []
    with pytest.raises(GencraftError, match=r"^holm needs p-values in \[0, 1\], got \[1.5\]$"):
        holm([1.5])


def test_each_path_says_its_test_level_and_resamples():
    """What a result says of itself: the test that gave p, whether p was resampled (0: exact)
    and the interval's level, on every path; a lower level narrows the interval."""
    diffs = [1.0, -0.5, 2.0, 0.3, 1.2, -0.1]
    exact = compare_paired(diffs, [0.0] * 6, resamples=1000, level=0.9)
    assert (exact.test, exact.resamples, exact.level) == (
        "sign-flip randomisation (exact)",
        0,
        0.9,
    )
    assert exact.se > 0
    wide = compare_paired(diffs, [0.0] * 6, resamples=1000)
    assert wide.low < exact.low < exact.high < wide.high and wide.level == 0.95
    drawn = compare_paired([float(k) for k in range(1, 13)], [0.0] * 12, resamples=999)
    assert (drawn.test, drawn.resamples) == ("sign-flip randomisation", 999)
    flat = compare_paired([0.5] * 3, [0.0] * 3, resamples=1000, level=0.8)
    assert (flat.test, flat.resamples, flat.level) == (
        "sign-flip randomisation (exact); no spread",
        0,
        0.8,
    )
    flat = compare_paired([0.5] * 20, [0.0] * 20, resamples=199)
    assert (flat.test, flat.resamples) == ("sign-flip randomisation; no spread", 199)
    zero = compare_paired([0.0] * 5, [0.0] * 5, level=0.9)
    assert (zero.test, zero.p, zero.level, zero.low, zero.high) == ("no difference", 1.0, 0.9, 0, 0)


def test_two_levels_give_the_bootstraps_p_interval_and_se_on_a_known_distribution():
    """Two seeds that measured the same, three units [-1, 1, 1]: a resample's mean is the mean
    of three draws, so P(mean <= 0) = 7/27, the p is twice that, the 2.5 and 97.5 % points
    are -1 and 1, the 20 and 80 % points -1/3 and 1, and the se is sqrt(8/27)."""
    a = [-1.0, 1.0, 1.0] * 2
    seeds, units = [0, 0, 0, 1, 1, 1], [0, 1, 2] * 2
    got = compare_paired(a, [0.0] * 6, clusters=units, seeds=seeds, resamples=20_000)
    assert got.p == pytest.approx(14 / 27, abs=0.03) and got.se == pytest.approx(0.5443, abs=0.01)
    assert (got.low, got.high, got.level) == (-1.0, 1.0, 0.95)
    assert got.test == "two-level bootstrap (seeds x units)" and got.resamples == 20_000
    narrow = compare_paired(a, [0.0] * 6, clusters=units, seeds=seeds, resamples=20_000, level=0.6)
    assert (narrow.low, narrow.high, narrow.level) == (pytest.approx(-1 / 3), 1.0, 0.6)
    even = compare_paired([-1.0, 1.0] * 2, [0.0] * 4, clusters=[0, 1] * 2, seeds=[0, 0, 1, 1])
    assert even.p == 1.0  # resampled means of exactly 0 count on both sides


def test_a_drawn_sign_flip_p_approximates_the_enumeration_and_follows_its_seed():
    rng = np.random.default_rng(3)
    diffs = list(rng.normal(0.3, 1.0, 12))
    exact = _exact_sign_flip_p(diffs)
    runs = [compare_paired(diffs, [0.0] * 12, resamples=1999, seed=s) for s in (1, 1, 2)]
    assert 0.05 < exact < 0.95 and all(abs(r.p - exact) < 0.04 for r in runs)
    assert (
        runs[0] == runs[1] and runs[0].p != runs[2].p and runs[0].test == "sign-flip randomisation"
    )
    edge = compare_paired(diffs[:10], [0.0] * 10, resamples=1024)  # 2^10 flips: every one
    assert edge.test.endswith("(exact)") and edge.p == pytest.approx(_exact_sign_flip_p(diffs[:10]))
    assert not compare_paired(diffs[:10], [0.0] * 10, resamples=1023).test.endswith("(exact)")
    one = compare_paired([1.0, 2.0], [0.0, 0.0], clusters=["a", "a"])
    assert one.test == "sign-flip randomisation (exact); no spread" and one.resamples == 0


def test_tost_on_units_without_spread_and_at_the_edge_of_its_size():
    """Zero spread: the mean is inside the margin or not; on the margin it is not inside."""
    assert equivalence([0.5] * 3, [0.0] * 3, 1.0).p == 0.0
    assert equivalence([0.5] * 3, [0.0] * 3, 0.4).p == 1.0
    assert equivalence([0.5] * 3, [0.0] * 3, 0.5).p == 1.0
    two = equivalence([1.0, 2.0], [0.0, 0.0], 3.0)
    assert two.units == 2 and two.p == pytest.approx(0.1024, abs=1e-4)
    with pytest.raises(
        GencraftError, match=r"^compare_paired needs one cluster id per row: 1 for 2"
    ):
        equivalence([1, 2], [0, 0], 1.0, clusters=[1])


def test_units_are_ordered_by_their_ids_value_and_results_read_by_name():
    """Numeric cluster ids are units in numeric order (10 after 9), so a relabelling that keeps
    the order keeps every resampled number; results read as mappings, with defaults."""
    rng = np.random.default_rng(5)
    d = rng.normal(0.2, 1.0, 30)
    ids = [9, 10, 100] * 10
    ranks = [{9: 0, 10: 1, 100: 2}[i] for i in ids]
    a = compare_paired(d, np.zeros(30), clusters=ids, resamples=999, seed=3)
    b = compare_paired(d, np.zeros(30), clusters=ranks, resamples=999, seed=3)
    assert (a.low, a.high, a.p) == (b.low, b.high, b.p) and a.units == 3
    two = compare_paired(d, np.zeros(30), clusters=ids, seeds=[i % 2 for i in range(30)], seed=4)
    assert two == compare_paired(
        d, np.zeros(30), clusters=ids, seeds=[i % 2 for i in range(30)], seed=4
    )
    assert a.get("p") == a.p and a.get("nothing", 5) == 5 and a.get("nothing") is None
    eq = equivalence(d, np.zeros(30), 2.0)
    assert eq["p"] == eq.p and eq["margin"] == eq.margin == 2.0


def test_the_smallest_legal_settings_run_and_the_edges_are_refused():
    diffs = [1.0, -0.5, 2.0, 0.3]
    one = compare_paired(diffs, [0.0] * 4, resamples=1)  # one draw: p is at least 1/2
    assert one.p >= 0.5 and one.units == 4
    assert compare_paired(diffs, [0.0] * 4, block=1) == compare_paired(diffs, [0.0] * 4)
    with pytest.raises(GencraftError, match="0 < level < 1"):
        compare_paired(diffs, [0.0] * 4, level=0.0)


def test_a_drawn_p_counts_flips_exactly_as_extreme_as_the_observed_mean():
    """Differences of ±1: many flips give exactly the observed |mean|; the drawn p counts them,
    as the enumeration does."""
    diffs = [1.0] * 8 + [-1.0] * 4
    exact = _exact_sign_flip_p(diffs)
    drawn = compare_paired(diffs, [0.0] * 12, resamples=1999, seed=2)
    assert drawn.test == "sign-flip randomisation" and abs(drawn.p - exact) < 0.04
    balanced = [1.0, -1.0] * 6  # a mean of exactly 0: every flip is as extreme
    assert compare_paired(balanced, [0.0] * 12, resamples=1999).p == 1.0
    assert compare_paired(balanced[:8], [0.0] * 8, resamples=1999).p == 1.0  # exact


def test_a_degenerate_bca_interval_falls_back_to_the_percentile_interval():
    """Two resamples leave BCa undefined for most seeds (scipy returns NaN): the interval is
    then the bootstrap means' percentile interval, finite, ordered, and narrower at a lower
    level."""
    diffs, rows = [1.0, -0.5, 2.0, 0.3, 1.1], []
    for seed in range(10):
        wide = compare_paired(diffs, [0.0] * 5, resamples=2, seed=seed)
        narrow = compare_paired(diffs, [0.0] * 5, resamples=2, seed=seed, level=0.5)
        assert all(map(math.isfinite, (wide.low, wide.high, narrow.low, narrow.high)))
        assert wide.low <= narrow.low <= narrow.high <= wide.high
        rows.append(wide.high - wide.low)
    assert sum(w > 0 for w in rows) >= 3
