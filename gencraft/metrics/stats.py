"""Intervals and tests for counts, with no scipy dependency: the Wilson score interval of a
proportion and the exact two-sided sign test of paired wins and losses."""

from __future__ import annotations

import math

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
