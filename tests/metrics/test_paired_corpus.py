"""Paired tests of corpus metrics: approximate randomisation for corpus BLEU against the exact
test over every swap of A's and B's outputs (sacreBLEU scoring each swapped corpus), and
corpus ROUGE resampled by document."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import ConfigError
from gencraft.metrics.stats import compare_paired
from gencraft.metrics.tasks import bleu_paired, bleu_paired_runs
from gencraft.metrics.text import rouge_paired, rouge_per_example

sacrebleu = pytest.importorskip("sacrebleu")

WORDS = ("the", "cat", "sat", "on", "a", "mat", "near", "red", "door", "by", "blue", "house")


def _corpus(rng: random.Random, n: int) -> tuple[list[str], list[str], list[list[str]]]:
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))) for _ in range(n)]

    def noisy(r: str, keep: float) -> str:
        return " ".join(w if rng.random() < keep else rng.choice(WORDS) for w in r.split())

    return [noisy(r, 0.9) for r in refs], [noisy(r, 0.6) for r in refs], [[r] for r in refs]


def _exact_ar_p(a: list[str], b: list[str], refs: list[list[str]]) -> float:
    """Two-sided p over all 2^n swaps, each swapped corpus scored by sacreBLEU from text."""
    streams = [[r[0] for r in refs]]
    obs = sacrebleu.corpus_bleu(a, streams).score - sacrebleu.corpus_bleu(b, streams).score
    hits = 0
    for mask in itertools.product((False, True), repeat=len(a)):
        x = [q if m else p for p, q, m in zip(a, b, mask, strict=True)]
        y = [p if m else q for p, q, m in zip(a, b, mask, strict=True)]
        d = sacrebleu.corpus_bleu(x, streams).score - sacrebleu.corpus_bleu(y, streams).score
        hits += abs(d) >= abs(obs) * (1 - 1e-12)
    return hits / 2 ** len(a)


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 10_000))
def test_approximate_randomisation_matches_the_exact_swap_test(seed):
    a, b, refs = _corpus(random.Random(seed), 7)
    exact = _exact_ar_p(a, b, refs)
    r = 3000
    got = bleu_paired("e2e", a, b, refs, resamples=r, test="randomisation", seed=seed)
    assert got["test"] == "randomisation" and got["n"] == 7
    assert abs(got["p"] - exact) <= 4 * math.sqrt(exact * (1 - exact) / r) + 2 / r
    boot = bleu_paired("e2e", a, b, refs, resamples=r, seed=seed)
    # the same observed difference and interval: only p changes with the test
    assert (boot["mean"], boot["low"], boot["high"]) == (got["mean"], got["low"], got["high"])


def test_randomisation_of_two_runs_swaps_the_same_inputs_in_both():
    rng = random.Random(3)
    a, b, refs = _corpus(rng, 30)
    got = bleu_paired_runs("e2e", [a, a], [b, b], refs, resamples=999, test="randomisation")
    one = bleu_paired("e2e", a, b, refs, resamples=999, test="randomisation")
    assert got["p"] == pytest.approx(one["p"]) and got["runs"] == 2
    perfect = [r[0] for r in refs]  # no swap is as far apart: p sits at its floor 1/(R+1)
    floor = bleu_paired("e2e", perfect, b, refs, resamples=999, test="randomisation")
    assert floor["p"] == 1 / 1000
    same = bleu_paired("e2e", a, a, refs, resamples=999, test="randomisation")
    assert same["mean"] == 0 and same["p"] == 1.0
    with pytest.raises(
        ConfigError, match=r"^paired BLEU's test is bootstrap or randomisation, not 'permutation'$"
    ):
        bleu_paired("e2e", a, b, refs, test="permutation")


def test_corpus_rouge_is_resampled_by_document():
    a, b, refs = _corpus(random.Random(5), 25)
    got = rouge_paired(a, b, refs, resamples=999)
    want = compare_paired(rouge_per_example(a, refs), rouge_per_example(b, refs), resamples=999)
    assert (got.mean, got.low, got.high, got.p, got.units) == (
        want.mean,
        want.low,
        want.high,
        want.p,
        25,
    )
    assert got.mean > 0 and got.p < 0.05  # the less noisy system wins
    prec = rouge_paired(a, b, refs, "rouge1", "precision", resamples=999)
    pa = rouge_per_example(a, refs, "rouge1", "precision")
    pb = rouge_per_example(b, refs, "rouge1", "precision")
    assert prec.mean == pytest.approx((sum(pa) - sum(pb)) / 25)
