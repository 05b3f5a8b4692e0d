"""Chapter 5's toy distributions: closed forms against brute-force enumeration and against
``exact_mode`` / ``beam_search`` run on the toys as Steppers."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from gencraft.errors import GencraftError
from gencraft.search import beam_search, exact_mode
from gencraft.search.toy import BiasedCoin, BlandTemplate, LengthStrings, report


def _support(toy):
    """Every sequence with positive probability, with its log-probability (by enumeration)."""
    out = {}
    for n in range(toy.max_length + 1):
        for seq in itertools.product(range(1, toy.vocab_size), repeat=n):
            lp = toy.log_prob(seq)
            if lp > -math.inf:
                out[seq] = lp
    return out


SMALL = [
    BiasedCoin(7, 0.6),
    BiasedCoin(6, 0.3),
    BiasedCoin(5, 0.5),  # a fair coin: every sequence ties
    LengthStrings([0.1, 0.2, 0.3, 0.4]),
    LengthStrings([0.05, 0.05, 0.9], letters=3),
    BlandTemplate(slots=3, p_common=0.1, rare=3, p_rare=0.3),
    BlandTemplate(slots=3, p_common=0.4, rare=3, p_rare=0.2),
]


@pytest.mark.parametrize("toy", SMALL, ids=repr)
def test_closed_forms_match_enumeration(toy):
    support = _support(toy)
    assert sum(math.exp(lp) for lp in support.values()) == pytest.approx(1.0)
    best = max(support.values())
    mode = toy.mode()
    assert mode.log_prob == pytest.approx(best)
    assert support[mode.tokens] == pytest.approx(best)
    assert mode.ties == sum(1 for lp in support.values() if math.isclose(lp, best, abs_tol=1e-9))
    dist = {}
    for seq, lp in support.items():
        dist[toy.attribute(seq)] = dist.get(toy.attribute(seq), 0.0) + math.exp(lp)
    closed = toy.attribute_distribution()
    assert set(dist) == {a for a, p in closed.items() if p > 0}
    for a, p in dist.items():
        assert closed[a] == pytest.approx(p)
    assert toy.attribute_mode() == max(sorted(dist), key=dist.get)
    for a, p_a in dist.items():
        # the conditional toy's chain rule = P(x) / P(A = a) for every x with A(x) = a
        cond = toy.conditional(a)
        members = {s: lp for s, lp in support.items() if toy.attribute(s) == a}
        for seq, lp in members.items():
            assert cond.log_prob(seq) == pytest.approx(lp - math.log(p_a))
        assert sum(math.exp(cond.log_prob(s)) for s in members) == pytest.approx(1.0)
        cmode = toy.conditional_mode(a)
        assert toy.attribute(cmode.tokens) == a
        assert cmode.log_prob == pytest.approx(max(members.values()) - math.log(p_a))


@pytest.mark.parametrize("toy", SMALL, ids=repr)
def test_exact_mode_finds_the_closed_form_mode(toy):
    r = exact_mode(toy, eos_token_id=0, max_new_tokens=toy.max_length)
    assert r.exact and r.log_prob == pytest.approx(toy.mode().log_prob)
    a = toy.attribute_mode()
    rc = exact_mode(toy.conditional(a), eos_token_id=0, max_new_tokens=toy.max_length)
    assert rc.log_prob == pytest.approx(toy.conditional_mode(a).log_prob)
    assert toy.attribute(rc.tokens) == a


def test_the_thesis_numbers():
    coin = BiasedCoin(100, 0.6)
    dist = coin.attribute_distribution()
    assert coin.mode().tokens == (1,) * 100
    assert coin.mode().log_prob == pytest.approx(100 * math.log(0.6))
    assert coin.attribute_mode() == 60
    assert sum(dist[k] for k in range(50, 71)) == pytest.approx(0.97, abs=0.005)
    # beam search with one beam walks the greedy path, which here is the mode
    hyp = beam_search(coin, num_beams=1, max_new_tokens=101, eos_token_id=0)[0]
    assert hyp.score == pytest.approx(coin.mode().log_prob)

    bland = BlandTemplate()
    assert math.exp(bland.mode().log_prob) == pytest.approx(1e-4)
    assert bland.attribute_mode() == 4
    assert bland.attribute_distribution()[4] == pytest.approx(0.9**4)
    r = exact_mode(bland, eos_token_id=0, max_new_tokens=4)
    assert r.exact and tuple(r.tokens) == bland.mode().tokens and bland.attribute(r.tokens) == 0

    strings = LengthStrings([1.5**ell for ell in range(11)])
    assert strings.empty_is_mode() and strings.attribute_mode() == 10
    r = exact_mode(strings, eos_token_id=0, max_new_tokens=10)
    assert r.tokens == [] and r.log_prob == pytest.approx(strings.mode().log_prob)
    # length-conditional search (exact_mode's length=) finds a modal-length string
    r = exact_mode(strings, eos_token_id=0, max_new_tokens=10, length=10)
    p10 = strings.attribute_distribution()[10]
    assert r.log_prob - math.log(p10) == pytest.approx(strings.conditional_mode(10).log_prob)

    rows = report()
    assert [row["modal A"] for row in rows] == [60, 20, 4]


def test_empty_mode_condition_against_enumeration():
    rng = random.Random(0)
    for _ in range(40):
        k = rng.choice([2, 3])
        probs = [rng.random() ** rng.choice([1, 4]) for _ in range(5)]
        toy = LengthStrings(probs, letters=k)
        support = _support(toy)
        best = max(support.values())
        strict = support[()] > max(lp for s, lp in support.items() if s) + 1e-12
        assert toy.empty_is_mode() == strict, probs
        assert (toy.mode().tokens == ()) == math.isclose(support[()], best, abs_tol=1e-12)


def test_an_exact_tie_with_the_empty_string_is_not_an_empty_mode():
    """p_1 / p_0 = 2^1 exactly: "a" and "b" tie with the empty string, so the thesis's strict
    condition fails and the mode has 3 ties; a hair less on p_1 makes the empty string the
    mode alone."""
    tie = LengthStrings([0.2, 0.4, 0.4])
    assert 0.4 / 0.2 == 2.0 and not tie.empty_is_mode()
    assert tie.mode().ties == 3 and tie.mode().tokens == ()
    below = LengthStrings([0.2, 0.4 - 1e-9, 0.4 + 1e-9])
    assert below.empty_is_mode() and below.mode().ties == 1


def test_bad_input():
    with pytest.raises(GencraftError, match="p_heads"):
        BiasedCoin(10, 1.0)
    with pytest.raises(GencraftError, match="heads"):
        BiasedCoin(10, 0.6, heads=11)
    with pytest.raises(GencraftError, match="length_probs"):
        LengthStrings([0.0, -1.0])
    with pytest.raises(GencraftError, match="P\\(A = 3\\) is 0"):
        LengthStrings([0.5, 0.5]).conditional(3)
    with pytest.raises(GencraftError, match="p_common"):
        BlandTemplate(p_common=0.5, rare=90, p_rare=0.01)


@pytest.mark.parametrize(
    "step", [0, -1, 1], ids=["equal", "rare one ulp below", "rare one ulp above"]
)
def test_bland_template_ties_against_exact_enumeration(step):
    """The mode's tie count against enumeration in exact arithmetic (each string's probability
    the product of its steps' floats as fractions), with the rare words' probability equal
    to the common word's or one ulp from it: equal gives (rare + 1)^slots ties, one ulp below
    the all-common string alone, one ulp above rare^slots."""
    from fractions import Fraction

    p_rare = 0.25
    for _ in range(abs(step)):
        p_rare = math.nextafter(p_rare, math.inf if step > 0 else -math.inf)
    toy = BlandTemplate(slots=3, p_common=0.25, rare=3, p_rare=p_rare)
    probs = {}
    for seq in itertools.product(*[range(toy.vocab_size)] * toy.slots):
        p, prefix = Fraction(1), ()
        for t in seq:
            p *= Fraction(toy.next_probs(prefix)[t])
            prefix = (*prefix, t)
        if p > 0:
            probs[seq] = p
    best = max(probs.values())
    mode = toy.mode()
    assert mode.ties == sum(1 for p in probs.values() if p == best)
    assert probs[mode.tokens] == best
    assert mode.ties == {0: 64, -1: 1, 1: 27}[step]
    assert BlandTemplate(4, 0.25, 3).mode().ties == 256  # the example
