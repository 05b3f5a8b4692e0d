"""Paired comparisons on their independent unit, with the field's statistics (``scipy.stats``;
corpus BLEU through sacrebleu in :mod:`gencraft.metrics.tasks`).

- :func:`compare_paired`: A minus B on rows grouped into independent units (examples,
  documents, articles, prompts; seeds as a second level), a bootstrap interval and a
  randomisation p over those units.
- :func:`equivalence`: the two one-sided tests (TOST) of a "matches" claim, with its margin.
- :func:`holm`: Holm's step-down adjustment of a family of p-values.
- :func:`verdict`: the one rule that turns a claim's comparison into one of :data:`VERDICTS`.
- counts: :func:`wilson_interval`, :func:`sign_test`, :func:`paired_comparison`;
  :func:`paired_t` for per-item differences.

Needs the ``metrics`` extra (scipy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gencraft.errors import GencraftError
from gencraft.extras import require

#: the five verdicts of a claim, in the words every report uses
VERDICTS = ("reproduced", "contradicted", "excluded at this scale", "undecided", "not attempted")


def _scipy_stats() -> Any:
    return require("scipy.stats", "metrics", "paired tests and intervals")


def _np() -> Any:
    import numpy

    return numpy


def p_text(p: float, resamples: int | None = None) -> str:
    """``p`` as a report writes it: 3 significant digits, and "< 1/R" (as a number, e.g.
    "< 0.001") where a resampled p sits at its floor, where no resample was as extreme."""
    if resamples and p <= 1.0 / resamples * (1 + 1e-9):
        return f"< {1.0 / resamples:g}"
    return f"{p:.3g}"


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A minus B on independent units.

    ``mean``: the mean over units of each unit's mean difference (over seeds, then units, for
    two levels); ``low``/``high``: its ``level`` bootstrap interval; ``p``: two-sided;
    ``units``: the number of independent units (clusters); ``rows``: the rows they pooled;
    ``seeds``: the seeds of a two-level analysis (1 otherwise); ``se``: the bootstrap
    standard error of ``mean``; ``resamples``: R (0 for an exact or parametric p); ``test``:
    how ``p`` was computed. Reads as a mapping too (``r["p"]``, ``dict(r)``)."""

    mean: float
    low: float
    high: float
    p: float
    units: int
    rows: int
    seeds: int = 1
    se: float = math.nan
    resamples: int = 0
    level: float = 0.95
    test: str = ""
    run_means: tuple[float, ...] = field(default=())

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def keys(self) -> list[str]:
        return list(asdict(self))

    @property
    def p_text(self) -> str:
        return p_text(self.p, self.resamples)


def _unit_index(ids: Sequence[Any], n: int, what: str) -> tuple[Any, int]:
    """The position of each row's id among the distinct ids, sorted (numbers numerically,
    anything else by its text), as ``[n]`` ints, and their count."""
    np = _np()
    if len(ids) != n:
        raise GencraftError(f"compare_paired needs one {what} id per row: {len(ids)} for {n} rows")
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in ids)
    keys = np.asarray(ids if numeric else [str(x) for x in ids])
    _, inverse = np.unique(keys, return_inverse=True)
    return inverse.reshape(-1), int(inverse.max()) + 1 if n else 0


def _diffs(a: Sequence[float], b: Sequence[float]) -> Any:
    np = _np()
    x, y = np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64")
    if x.ndim != 1 or x.shape != y.shape:
        raise GencraftError(
            f"compare_paired needs two equal-length lists, got {x.shape}, {y.shape}"
        )
    if x.size == 0:
        raise GencraftError("compare_paired needs at least one pair")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise GencraftError("compare_paired needs finite values (a NaN or inf was given)")
    return x - y


def _grid(d: Any, units: Any, n_units: int, seeds: Any, n_seeds: int) -> Any:
    """The mean difference of each (seed, unit) cell, ``[S, U]``; NaN where a cell is empty.
    Correctly rounded sums (``math.fsum``), so that the rows' order cannot change a mean."""
    np = _np()
    grid = np.full((n_seeds, n_units), np.nan)
    cells: dict[tuple[int, int], list[float]] = {}
    for s, u, x in zip(seeds.tolist(), units.tolist(), d.tolist(), strict=True):
        cells.setdefault((s, u), []).append(x)
    for (s, u), xs in cells.items():
        grid[s, u] = math.fsum(xs) / len(xs)
    return grid


def compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    *,
    clusters: Sequence[Any] | None = None,
    seeds: Sequence[Any] | None = None,
    block: int | None = None,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> Paired:
    """A minus B, row by row (``a[i]`` and ``b[i]`` measured on the same row), analysed on the
    independent unit.

    - ``clusters``: one id per row (example, document, article, prompt), rows in any order.
      Each cluster's rows are averaged into one unit; without it every row is a unit.
    - ``block``: rows in order, autocorrelated (consecutive LM blocks): units of ``block``
      consecutive rows (a non-overlapping block bootstrap). Not with ``clusters``.
    - ``seeds``: one seed id per row, for a crossed two-level design (every seed measures the
      same units): the mean is over seeds and units, the bootstrap draws seeds and units
      independently, and ``p`` is the bootstrap's two-sided p.

    One level: the interval is ``scipy.stats.bootstrap`` (BCa) over the units' mean
    differences and ``p`` the paired randomisation test (``scipy.stats.permutation_test``,
    signs flipped per unit; exact when 2^units <= ``resamples``). A resampled p is at least
    1/(R+1); :attr:`Paired.p_text` writes it "< 1/R" there."""
    np = _np()
    d = _diffs(a, b)
    if not 0 < level < 1 or resamples < 1:
        raise GencraftError("compare_paired needs 0 < level < 1 and resamples >= 1")
    if block is not None and clusters is not None:
        raise GencraftError("compare_paired takes clusters or block, not both")
    if block is not None and block < 1:
        raise GencraftError(f"compare_paired needs block >= 1, got {block}")
    n = d.size
    units, n_units = (
        _unit_index(clusters, n, "cluster")
        if clusters is not None
        else (np.arange(n) // (block or 1), (n + (block or 1) - 1) // (block or 1))
    )
    if seeds is not None:
        seed_of, n_seeds = _unit_index(seeds, n, "seed")
        return _two_level(_grid(d, units, n_units, seed_of, n_seeds), n, resamples, seed, level)
    unit_means = _grid(d, units, n_units, np.zeros(n, dtype=int), 1)[0]
    return _one_level(unit_means, n, resamples, seed, level)


def _one_level(u: Any, rows: int, resamples: int, seed: int, level: float) -> Paired:
    """Bootstrap interval and sign-flip randomisation p over the unit means ``u`` ``[U]``."""
    np = _np()
    mean = float(u.mean())
    if np.all(u == 0):
        return Paired(mean, mean, mean, 1.0, int(u.size), rows, test="no difference", level=level)
    rng = np.random.default_rng(seed)
    p, exact = _sign_flip_p(u, mean, resamples, rng)
    test = "sign-flip randomisation (exact)" if exact else "sign-flip randomisation"
    if np.all(u == u[0]):  # no spread: the p stands, the interval has zero width
        return Paired(
            mean,
            mean,
            mean,
            p,
            int(u.size),
            rows,
            test=f"{test}; no spread",
            resamples=0 if exact else resamples,
            level=level,
        )
    boot = _scipy_stats().bootstrap(
        (u,),
        np.mean,
        n_resamples=resamples,
        method="BCa",
        rng=rng,
        confidence_level=level,
        vectorized=True,
        axis=-1,
    )
    low, high = boot.confidence_interval
    if not (np.isfinite(low) and np.isfinite(high)):  # BCa degenerate: the percentile interval
        dist = boot.bootstrap_distribution
        low, high = np.percentile(dist, [50 * (1 - level), 50 * (1 + level)])
    return Paired(
        mean,
        float(low),
        float(high),
        p,
        int(u.size),
        rows,
        se=float(boot.standard_error),
        resamples=0 if exact else resamples,
        level=level,
        test=test,
    )


def _sign_flip_p(u: Any, mean: float, resamples: int, rng: Any) -> tuple[float, bool]:
    """The two-sided sign-flip p of the unit means ``u`` ``[U]`` (by |mean|, as sacrebleu's
    approximate randomisation), and whether it is exact (2^U <= ``resamples``: every flip);
    a resampled p is at least 1/(R+1). One unit: p = 1 (both flips are as extreme)."""
    np = _np()
    if u.size == 1:
        return 1.0, True
    perm = _scipy_stats().permutation_test(
        (u,),
        np.mean,
        permutation_type="samples",
        n_resamples=resamples,
        rng=rng,
        vectorized=True,
        axis=-1,
    )
    exact = 2**u.size <= resamples
    beyond = (np.abs(perm.null_distribution) >= abs(mean) * (1 - 1e-12)).sum()
    p = beyond / perm.null_distribution.size if exact else (beyond + 1) / (resamples + 1)
    return float(min(1.0, p)), exact


def _two_level(grid: Any, rows: int, resamples: int, seed: int, level: float) -> Paired:
    """The crossed bootstrap over seeds x units of the cell means ``grid`` ``[S, U]``."""
    np = _np()
    n_seeds, n_units = grid.shape
    run_means = tuple(float(x) for x in np.nanmean(grid, axis=1))
    mean = float(np.mean(run_means))
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for start in range(0, resamples, 256):  # chunks bound the memory: [chunk, S, U]
        k = min(256, resamples - start)
        s = rng.integers(n_seeds, size=(k, n_seeds))
        u = rng.integers(n_units, size=(k, n_units))
        drawn = grid[s[:, :, None], u[:, None, :]]
        stats[start : start + k] = np.nanmean(np.nanmean(drawn, axis=2), axis=1)
    low, high = np.percentile(stats, [50 * (1 - level), 50 * (1 + level)])
    far = min((stats <= 0).sum(), (stats >= 0).sum())
    p = min(1.0, (2 * far + 1) / (resamples + 1))  # at least 1/(R+1), as one level
    return Paired(
        mean,
        float(low),
        float(high),
        float(p),
        n_units,
        rows,
        seeds=n_seeds,
        se=float(stats.std(ddof=1)),
        resamples=resamples,
        level=level,
        test="two-level bootstrap (seeds x units)",
        run_means=run_means,
    )


@dataclass(frozen=True)
class Equivalence:
    """TOST of "A matches B within ``margin``": ``p`` the larger of the two one-sided t tests'
    p-values over the units' mean differences; ``low``/``high`` the 1 - 2α interval (inside
    (-margin, margin) exactly when p < α)."""

    mean: float
    low: float
    high: float
    p: float
    units: int
    margin: float

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


def equivalence(
    a: Sequence[float],
    b: Sequence[float],
    margin: float,
    *,
    clusters: Sequence[Any] | None = None,
    alpha: float = 0.05,
) -> Equivalence:
    """The two one-sided tests (Schuirmann 1987) that the mean difference A - B lies within
    ``(-margin, margin)``, on the units of ``clusters`` (rows otherwise), with
    ``scipy.stats.ttest_1samp``."""
    np, ss = _np(), _scipy_stats()
    if not margin > 0:
        raise GencraftError(f"an equivalence test needs a margin > 0, got {margin}")
    d = _diffs(a, b)
    units, n_units = (
        _unit_index(clusters, d.size, "cluster")
        if clusters is not None
        else (np.arange(d.size), d.size)
    )
    u = _grid(d, units, n_units, np.zeros(d.size, dtype=int), 1)[0]
    if u.size < 2:
        raise GencraftError("an equivalence test needs at least two units")
    up = ss.ttest_1samp(u, -margin, alternative="greater")
    down = ss.ttest_1samp(u, margin, alternative="less")
    ci = ss.ttest_1samp(u, 0.0).confidence_interval(1 - 2 * alpha)
    tails = (float(up.pvalue), float(down.pvalue))  # NaN where a mean sits on a bound, sd 0
    p = max(tails) if all(map(math.isfinite, tails)) else float(not abs(u.mean()) < margin)
    return Equivalence(float(u.mean()), float(ci.low), float(ci.high), p, int(u.size), margin)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the order given: the i-th smallest p is
    multiplied by (m - i + 1), made non-decreasing along that order, and capped at 1. A
    hypothesis is rejected at family-wise level α exactly when its adjusted p < α."""
    ps = [float(p) for p in pvalues]
    if any(not 0 <= p <= 1 for p in ps):
        raise GencraftError(f"holm needs p-values in [0, 1], got {ps}")
    m, out, running = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def units_for_power(
    sd: float, effect: float, *, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """About how many independent units give ``power`` to detect ``effect`` with a two-sided
    test at ``alpha``, when one unit's difference has standard deviation ``sd``: the normal
    approximation ((z_{1-α/2} + z_power) · sd / effect)². None when it cannot be said."""
    if not (math.isfinite(sd) and math.isfinite(effect)) or effect == 0 or sd <= 0:
        return None
    norm = _scipy_stats().norm
    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return max(2, math.ceil((z * sd / abs(effect)) ** 2))


def verdict(
    comparison: Any | None,
    *,
    direction: int = 1,
    alpha: float = 0.05,
    deciding: bool = False,
    paper_effect: float | None = None,
    margin: float | None = None,
    equivalence_p: float | None = None,
) -> str:
    """The one verdict rule: one of :data:`VERDICTS` for a claim's primary comparison
    (``mean``, ``low``, ``high`` and its Holm-adjusted ``p``; None: not attempted).

    - ``reproduced``: p < ``alpha`` with the mean in the paper's ``direction`` (1 up, -1
      down); for a "matches" claim (``margin`` given) the equivalence test's p < ``alpha``.
    - ``contradicted``: p < ``alpha`` against the paper (for "matches": the interval wholly
      outside the margin), at a scale that decides the claim (``deciding``).
    - ``excluded at this scale``: the interval excludes the paper's effect (``paper_effect``,
      in the comparison's units; for "matches" the margin), at a scale that does not decide.
    - ``undecided``: none of these."""
    if direction not in (1, -1):
        raise GencraftError(f"direction must be 1 or -1, got {direction}")
    if comparison is None:
        return VERDICTS[4]
    mean, low, high, p = (float(comparison[k]) for k in ("mean", "low", "high", "p"))
    if margin is not None:
        if equivalence_p is not None and equivalence_p < alpha:
            return VERDICTS[0]
        outside = low >= margin or high <= -margin
        return VERDICTS[1 if deciding else 2] if outside else VERDICTS[3]
    if p < alpha and mean * direction > 0:
        return VERDICTS[0]
    if p < alpha and mean * direction < 0 and deciding:
        return VERDICTS[1]
    excluded = paper_effect is not None and not low <= paper_effect <= high
    if excluded and not deciding:
        return VERDICTS[2]
    return VERDICTS[3]


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion k / n (``scipy.stats.binomtest``); (0, 1)
    for n = 0. Unlike the normal approximation it stays inside [0, 1] and is not empty at
    k = 0 or k = n."""
    if n < 0 or not 0 <= k <= max(n, 0):
        raise GencraftError(f"wilson_interval needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    ci = _scipy_stats().binomtest(k, n).proportion_ci(level, method="wilson")
    return (0.0 if k == 0 else float(ci.low)), (1.0 if k == n else float(ci.high))


def sign_test(wins: int, losses: int) -> float:
    """The exact two-sided p-value of ``wins`` against ``losses`` under P(win) = 1/2 (ties
    dropped before the call; ``scipy.stats.binomtest``)."""
    if wins < 0 or losses < 0:
        raise GencraftError(f"sign_test needs counts >= 0, got {wins} wins, {losses} losses")
    if wins + losses == 0:
        return 1.0
    return float(_scipy_stats().binomtest(wins, wins + losses, 0.5).pvalue)


def paired_comparison(wins: int, losses: int, n: int) -> dict[str, float | int]:
    """A paired comparison of two systems on ``n`` items: ``wins`` items where the first is
    better, ``losses`` where the second is, the rest tied. Returns the counts, the exact sign
    test's two-sided ``p``, and the first system's share of the decided items with its 95%
    Wilson interval (``share``, ``share_low``, ``share_high``; 0.5 and (0, 1) when none is
    decided)."""
    if wins < 0 or losses < 0 or wins + losses > n:
        raise GencraftError(
            f"paired_comparison needs wins + losses <= n, got {wins}, {losses}, {n}"
        )
    decided = wins + losses
    low, high = wilson_interval(wins, decided)
    return {
        "n": n,
        "wins": wins,
        "losses": losses,
        "ties": n - decided,
        "p": sign_test(wins, losses),
        "share": wins / decided if decided else 0.5,
        "share_low": low,
        "share_high": high,
    }


def paired_t(diffs: Sequence[float]) -> dict[str, float | int]:
    """The paired t statistics of differences ``diffs`` (A minus B per independent unit;
    ``scipy.stats.ttest_1samp``): ``n``, ``mean``, ``sd``, the 95% interval ``low``/``high``
    and the two-sided ``p``. One difference gives no interval (-inf/inf, p = 1); all-equal
    differences give a zero-width interval (p = 0 unless they are all 0)."""
    np = _np()
    n = len(diffs)
    if n == 0:
        raise GencraftError("paired_t needs at least one difference")
    d = np.asarray(diffs, dtype="float64")
    mean = math.fsum(diffs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": math.nan, "low": -math.inf, "high": math.inf, "p": 1.0}
    sd = float(d.std(ddof=1))
    if sd == 0 or np.all(d == d[0]):
        return {"n": n, "mean": mean, "sd": 0.0, "low": mean, "high": mean, "p": float(mean == 0)}
    t = _scipy_stats().ttest_1samp(d, 0.0)
    ci = t.confidence_interval(0.95)
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "low": float(ci.low),
        "high": float(ci.high),
        "p": float(t.pvalue),
    }


def decide(
    diffs: Sequence[float],
    expected: int = 1,
    alpha: float = 0.05,
    *,
    paper_effect: float | None = None,
    deciding: bool = False,
) -> dict[str, Any]:
    """:func:`paired_t` of per-unit differences (the claimed-better system minus the other;
    ``expected`` = -1 when the claim is that they go down) with :func:`verdict`'s word and
    ``needed``: about how many units would give 80% power at ``paper_effect`` (at the
    observed mean when none is given), when the verdict is ``undecided``."""
    t = paired_t(diffs)
    word = verdict(t, direction=expected, alpha=alpha, deciding=deciding, paper_effect=paper_effect)
    effect = paper_effect if paper_effect is not None else float(t["mean"])
    needed = None
    if word == VERDICTS[3] and int(t["n"]) > 1:
        needed = units_for_power(float(t["sd"]), effect, alpha=alpha)
        needed = max(int(t["n"]) + 1, needed) if needed is not None else None
    return {**t, "verdict": word, "needed": needed}


def verdict_cells(v: dict[str, Any]) -> dict[str, Any]:
    """A verdict record as report cells: the effect with its 95% interval, p, the units
    that would decide it when it is undecided, and each run's effect when it pools runs."""
    cells = {
        "comparison": v["comparison"],
        "pairs": f"{v['n']} {v['pairs']}",
        "effect [95% interval]": f"{v['mean']:+.3g} [{v['low']:+.3g}, {v['high']:+.3g}] "
        + v["unit"],
        "p": p_text(v["p"], v.get("resamples")),
        "verdict": v["verdict"],
    }
    if v.get("needed"):
        cells["verdict"] += f" (about {v['needed']} {v['pairs']} would decide it)"
    if len(v.get("run_means", ())) > 1:  # pooled over runs (seeds): each run's effect
        cells["each run"] = ", ".join(f"{m:+.3g}" for m in v["run_means"])
    return cells
