"""Intervals and tests for counts, with no scipy dependency: the Wilson score interval of a
proportion and the exact two-sided sign test of paired wins and losses."""

from __future__ import annotations

import math
from typing import Any

from gencraft.errors import GencraftError


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a proportion k / n; (0, 1) for n = 0.

    Unlike the normal approximation it stays inside [0, 1] and is not empty at k = 0 or k = n."""
    if n < 0 or not 0 <= k <= max(n, 0):
        raise GencraftError(f"wilson_interval needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # exact at the ends (k = 0: low 0, k = n: high 1), where rounding would leave them off
    low = 0.0 if k == 0 else max(0.0, centre - half)
    return low, 1.0 if k == n else min(1.0, centre + half)


def sign_test(wins: int, losses: int) -> float:
    """The exact two-sided p-value of ``wins`` against ``losses`` under P(win) = 1/2 (ties
    dropped before the call): 2 * P(X <= min) for X ~ Binomial(wins + losses, 1/2), capped at 1."""
    if wins < 0 or losses < 0:
        raise GencraftError(f"sign_test needs counts >= 0, got {wins} wins, {losses} losses")
    n, low = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)


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


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz's method)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def student_t_sf2(t: float, dof: float) -> float:
    """The two-sided tail P(|T| >= |t|) of Student's t with ``dof`` degrees of freedom."""
    if dof <= 0:
        raise GencraftError(f"Student's t needs dof > 0, got {dof}")
    return _betainc(dof / 2, 0.5, dof / (dof + t * t))


def t_quantile(dof: float, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t (12.706 for dof 1, 1.960 in the limit),
    by bisection on :func:`student_t_sf2`."""
    low, high = 0.0, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if student_t_sf2(mid, dof) > 1 - level else (low, mid)
    return (low + high) / 2


def paired_t(diffs: list[float] | tuple[float, ...]) -> dict[str, float | int]:
    """The paired t statistics of differences ``diffs`` (system A minus system B per item):
    ``n``, ``mean``, ``sd``, the 95% interval ``low``/``high`` and the two-sided ``p``. One
    difference gives no interval (``low``/``high`` = -inf/inf, p = 1); all-equal differences
    give a zero-width interval (p = 0 unless they are all 0)."""
    n = len(diffs)
    if n == 0:
        raise GencraftError("paired_t needs at least one difference")
    mean = math.fsum(diffs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": math.nan, "low": -math.inf, "high": math.inf, "p": 1.0}
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    if se == 0:
        return {"n": n, "mean": mean, "sd": 0.0, "low": mean, "high": mean, "p": float(mean == 0)}
    half = t_quantile(n - 1) * se
    p = student_t_sf2(mean / se, n - 1)
    return {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half, "p": p}


#: what :func:`decide` may conclude
VERDICTS = ("reproduced", "contradicted", "not reproduced at this size")


def decide(
    diffs: list[float] | tuple[float, ...], expected: int = 1, alpha: float = 0.05
) -> dict[str, float | int | str]:
    """A claim's verdict from paired differences (the claimed-better system minus the other,
    per item or per seed; ``expected`` = -1 when the claim is that they go down).

    ``reproduced``: p < ``alpha`` in the claimed direction; ``contradicted``: p < ``alpha``
    against it; otherwise ``not reproduced at this size``, with ``needed``: about how many pairs
    would give 80% power at the observed mean and spread (two-sided ``alpha`` = 0.05 normal
    approximation, (2.80 · sd / mean)²; None when the mean is 0 or there is one pair). Returns
    :func:`paired_t`'s fields with ``verdict`` and ``needed``."""
    t = paired_t(diffs)
    mean, sd = float(t["mean"]), float(t["sd"])
    verdict = verdict_of(mean, float(t["p"]), expected, alpha)
    needed = None
    if verdict == VERDICTS[2] and mean != 0 and math.isfinite(sd):
        needed = max(int(t["n"]) + 1, math.ceil((2.80 * sd / abs(mean)) ** 2))
    return {**t, "verdict": verdict, "needed": needed}


def verdict_of(mean: float, p: float, expected: int = 1, alpha: float = 0.05) -> str:
    """One of :data:`VERDICTS`: significant (p < ``alpha``) in the claimed direction
    (``expected`` = 1: up, -1: down), significant against it, or neither."""
    if expected not in (1, -1):
        raise GencraftError(f"expected must be 1 or -1, got {expected}")
    if p < alpha and mean != 0:
        return VERDICTS[0] if mean * expected > 0 else VERDICTS[1]
    return VERDICTS[2]


def verdict_cells(v: dict[str, Any]) -> dict[str, Any]:
    """A verdict record as report cells: the effect with its 95% interval, p, the pairs
    that would decide it when it is not decided, and each run's effect when it pools runs."""
    cells = {
        "comparison": v["comparison"],
        "pairs": f"{v['n']} {v['pairs']}",
        "effect [95% interval]": f"{v['mean']:+.3g} [{v['low']:+.3g}, {v['high']:+.3g}] "
        + v["unit"],
        "p": f"{v['p']:.3g}",
        "verdict": v["verdict"],
    }
    if v.get("needed"):
        cells["verdict"] += f" (about {v['needed']} {v['pairs']} would decide it)"
    if len(v.get("run_means", ())) > 1:  # pooled over runs (seeds): each run's effect
        cells["each run"] = ", ".join(f"{m:+.3g}" for m in v["run_means"])
    return cells
