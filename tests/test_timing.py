"""gencraft.studies.timing: interleaved rounds, the median of per-round ratios, saved-tensor
bytes."""

from __future__ import annotations

import pytest
import torch

from gencraft.errors import GencraftError
from gencraft.studies import timing


class FakeClock:
    """perf_counter that advances only when a case 'runs', by the case's time this round."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pairs_alternate_and_the_ratio_is_the_median_of_per_pair_ratios(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    # A takes 1, 2, 3 s in rounds 0-2 and B 3, 2, 9 s: per-round ratios 3, 1, 3 -> median 3
    # (the ratio of the medians, 3 / 2 = 1.5, is what a burst of load would distort)
    plan = {"A": [0.5, 1.0, 2.0, 3.0], "B": [0.5, 3.0, 2.0, 9.0]}  # warm-up, then 3 rounds
    calls: list[str] = []

    def case(name: str):
        def run() -> None:
            clock.now += plan[name][sum(c == name for c in calls)]
            calls.append(name)

        return run

    out = timing.interleaved({"A": case("A"), "B": case("B")}, "A", rounds=3)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B"]  # warm-up, then AB, BA, AB
    assert out["B"].ratio == pytest.approx(3.0) and out["A"].ratio == 1.0
    assert out["B"].seconds == pytest.approx(3.0) and out["A"].seconds == pytest.approx(2.0)
    assert (out["B"].low, out["B"].high) == (pytest.approx(2.0), pytest.approx(3.0))
    assert out["B"].spread == pytest.approx(0.5 / 3)
    with pytest.raises(GencraftError, match="baseline 'C' is not one of the cases"):
        timing.interleaved({"A": case("A")}, "C", rounds=1)
    with pytest.raises(GencraftError, match="rounds must be >= 1"):
        timing.interleaved({"A": case("A")}, "A", rounds=0)


def test_saved_tensor_bytes_counts_what_backward_keeps():
    x = torch.randn(3, 4, requires_grad=True)
    # exp saves its output (48 bytes of float32); sum saves nothing
    assert timing.saved_tensor_bytes(lambda: torch.exp(x).sum()) == 3 * 4 * 4
    assert x.grad is not None  # the backward pass ran
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    # mul keeps both factors when both need a gradient: 48 + 96 bytes
    assert timing.saved_tensor_bytes(lambda: (x * w).sum()) == 48 + 96


def test_each_case_is_paired_with_its_own_baseline_run(monkeypatch):
    """Three cases: per round, B and C each run beside a baseline run of their own, in an
    order that rotates and alternates; a slow spell during one pair cancels in its ratio."""
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls: list[str] = []
    cost = {"A": 1.0, "B": 2.0, "C": 3.0}

    def case(name: str):
        def run() -> None:
            slow = 10.0 if len(calls) in (5, 6) else 1.0  # the load of one pair (round 0, A C)
            clock.now += cost[name] * slow
            calls.append(name)

        return run

    out = timing.interleaved({k: case(k) for k in "ABC"}, "A", rounds=2)
    assert calls[3:] == ["A", "B", "A", "C", "C", "A", "B", "A"]
    assert out["B"].ratio == pytest.approx(2.0) and out["C"].ratio == pytest.approx(3.0)
    assert out["C"].spread == pytest.approx(0.0)
