"""MBR selection: the utilities equal their reference implementations pair by
pair, and the choice is the brute-force argmax of the mean utility against the others."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sacrebleu.metrics import BLEU, CHRF

from gencraft.errors import GencraftError
from gencraft.metrics.mbr import mbr_select, utility_matrices
from gencraft.metrics.text import rouge_per_example

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "barked", "."]
sentence = st.lists(st.sampled_from(WORDS), min_size=0, max_size=7).map(" ".join)


def _reference(utility: str, h: str, r: str) -> float:
    if utility == "chrf":
        return CHRF().sentence_score(h, [r]).score
    if utility == "bleu":
        return BLEU(effective_order=True).sentence_score(h, [r]).score
    return rouge_per_example([h], [r], "rougeL")[0]


@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(1, 3).flatmap(
        lambda b: st.integers(1, 5).flatmap(
            lambda n: st.lists(st.lists(sentence, min_size=n, max_size=n), min_size=b, max_size=b)
        )
    ),
    utility=st.sampled_from(["chrf", "bleu", "rouge"]),
)
def test_mbr_picks_the_brute_force_argmax(rows, utility):
    u = utility_matrices(rows, utility)
    choice = mbr_select(rows, utility)
    for b, cands in enumerate(rows):
        n = len(cands)
        for i in range(n):
            for j in range(n):
                assert float(u[b, i, j]) == pytest.approx(
                    _reference(utility, cands[i], cands[j]), abs=1e-3
                )
        means = [
            sum(_reference(utility, cands[i], cands[j]) for j in range(n) if j != i) / max(n - 1, 1)
            for i in range(n)
        ]
        assert choice.expected[b] == pytest.approx(means, abs=1e-3)
        top = max(means)
        assert choice.index[b] == next(i for i, m in enumerate(means) if m >= top - 1e-3)


def test_the_consensus_candidate_wins_and_bad_input_is_named():
    cands = [["the cat sat on the mat", "a dog barked", "the cat sat on a mat", "the cat sat"]]
    assert mbr_select(cands, "chrf").index == [0]
    assert mbr_select([["only one"]], "bleu").index == [0]
    with pytest.raises(GencraftError, match="mbr utility must be one of"):
        mbr_select(cands, "meteor")
    with pytest.raises(GencraftError, match="the same number"):
        mbr_select([["a", "b"], ["c"]], "chrf")
