"""The conditional study's statistics: paired sign tests, Wilson intervals and the
no-conflict control, on hand-built per-prompt results whose counts are known."""

from __future__ import annotations

import pytest

from gencraft.errors import GencraftError
from gencraft.metrics.stats import paired_comparison, sign_test, wilson_interval
from gencraft.studies.search_conditional import (
    _degenerate_lines,
    _pooled_length_lines,
    degenerate_tests,
    length_wins,
)

COND, BEAM, ASIDE = "conditional (on_beam)", "beam (on_beam)", "beam (aside)"


def _example(beam: bool, cond: bool, aside: bool = True) -> dict:
    return {BEAM: {"degenerate": beam}, COND: {"degenerate": cond}, ASIDE: {"degenerate": aside}}


def test_degenerate_tests_count_pairs_rates_and_the_no_conflict_control():
    # 6 fixed by conditional, 1 broken by it, 2 both bad, 3 both fine
    examples = (
        [_example(True, False)] * 6
        + [_example(False, True)]
        + [_example(True, True)] * 2
        + [_example(False, False, False)] * 3
    )
    out = degenerate_tests(examples)
    pc = out["paired"]
    assert (pc["wins"], pc["losses"], pc["ties"], pc["n"]) == (6, 1, 5, 12)
    assert pc["p"] == pytest.approx(sign_test(6, 1)) == pytest.approx(16 / 128)
    assert out["rate_intervals"][BEAM] == wilson_interval(8, 12)
    assert out["rate_intervals"][COND] == wilson_interval(3, 12)
    assert out["rate_intervals"][ASIDE] == wilson_interval(9, 12)
    nc = out["no_conflict"]  # beam fine on 4; conditional broke 1 of them
    assert (nc["beam_fine"], nc["made_worse"], nc["rate"]) == (4, 1, 0.25)
    assert nc["interval"] == wilson_interval(1, 4)
    lines = _degenerate_lines({**out})
    assert "6 better, 1 worse, 5 tied, p = 0.125" in lines[0]
    assert "of the 4 prompts whose beam output is fine, conditional search made 1" in lines[1]
    assert _degenerate_lines({"rates": {}}) == []  # runs from before these statistics


def test_no_conflict_rate_is_none_when_beam_is_never_fine():
    out = degenerate_tests([_example(True, False)] * 3)
    assert out["no_conflict"]["rate"] is None and out["no_conflict"]["beam_fine"] == 0
    assert "(-, 95% interval 0% to 100%)" in _degenerate_lines(out)[1]


def test_length_wins_carry_counts_and_the_sign_test_and_pool_over_ratios():
    rows = [
        {"beams": 5, "ratio": r, "cond_log_prob": c, "beam_log_prob": b}
        for r, c, b in [
            (0.8, -1.0, -2.0),
            (0.8, -1.0, -2.0),
            (0.8, -3.0, -2.0),
            (0.8, -2.0, -2.00001),  # a tie within tol
            (1.2, -1.0, -2.0),
            (1.2, -1.0, -2.0),
        ]
    ]
    w = length_wins(rows, 5, 0.8)
    assert (w["n"], w["wins"], w["losses"]) == (4, 2, 1)
    assert w["p"] == pytest.approx(1.0) and w["tie"] == 0.25
    summary = [{"beams": 5, "ratio": r, **length_wins(rows, 5, r)} for r in (0.8, 1.2)]
    (line,) = _pooled_length_lines(summary)
    assert "conditional higher on 4, beam on 1, tied 1 (prompt, length) pairs" in line
    assert f"p = {sign_test(4, 1):.3g}" in line and "share of the decided 80%" in line


def test_paired_comparison_refuses_counts_beyond_n_and_halves_an_undecided_share():
    assert paired_comparison(0, 0, 3)["share"] == 0.5
    assert paired_comparison(0, 0, 3)["p"] == 1.0
    with pytest.raises(GencraftError, match="wins \\+ losses <= n"):
        paired_comparison(3, 2, 4)
