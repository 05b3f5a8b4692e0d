"""Chapter 5 made runnable: toy distributions whose modes are known in closed form (Yoshida
2023, §5.3), as ``Stepper``s that :func:`~gencraft.search.exact_mode` and
:func:`~gencraft.search.beam_search` can search.

Each toy is a distribution over token sequences ended by EOS (id 0), with an attribute A (the
number of heads, the length, the number of rare words). Each gives, in closed form:

* ``mode()``: the most probable sequence (the exact mode) and its log-probability;
* ``attribute_distribution()`` / ``attribute_mode()``: P(A = a) and the modal value of A;
* ``conditional(a)``: the distribution given A = a, itself a toy (a ``Stepper`` whose
  next-token probabilities are the exact conditionals), and ``conditional_mode(a)``.

The three cases of the thesis:

* :class:`BiasedCoin`: n flips with P(H) = p. The modal sequence is all heads, but the modal
  count of heads is about n·p: an atypical mode that is harmless.
* :class:`LengthStrings`: strings over an alphabet of k letters, uniform given their length,
  whose length has the distribution p_ℓ. A string has probability p_ℓ / k^ℓ, so the empty
  string is the mode iff p_ℓ / p_0 < k^ℓ for every ℓ, however long the modal length.
* :class:`BlandTemplate`: slots each filled independently by one common word (10%) or one of
  90 rare words (1% each). The all-common string is the mode (1e-4) while outputs with only
  rare words have probability 0.9^4 = 66%.

A toy's cache is a one-layer ``DynamicCache`` whose keys hold the prefix's token ids (after a
start position of -1), so the searches' cache handling (slicing, rebuilding, reordering) runs
on it unchanged. ``python -m gencraft.search.toy`` prints the numbers of docs/theory.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.models.compat import DynamicCache
from gencraft.models.stepping import StepOutput

EOS = 0


@dataclass(frozen=True)
class ToyMode:
    """A mode: ``tokens`` (EOS excluded; one of the tied sequences when several are modal),
    its ``log_prob`` under the distribution it is the mode of, and ``ties``: how many
    sequences share that probability."""

    tokens: tuple[int, ...]
    log_prob: float
    ties: int = 1


def _log_binom(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _cache(prefixes: torch.Tensor) -> DynamicCache:
    """``prefixes`` [N, 1 + t] float64 (start position first) as a one-layer cache."""
    kv = prefixes[:, None, :, None]
    return DynamicCache([(kv, kv)])


class Toy:
    """Base of the toy distributions: the ``Stepper`` methods over :meth:`next_probs`."""

    vocab_size: int
    eos_token_id: int = EOS
    max_length: int  # no sequence is longer (tokens before EOS)

    def next_probs(self, prefix: tuple[int, ...]) -> list[float]:
        """P(next token | prefix) over the vocabulary (EOS = 0)."""
        raise NotImplementedError

    def attribute(self, tokens: Sequence[int]) -> int:
        raise NotImplementedError

    # -- Stepper
    def _output(self, rows: torch.Tensor) -> StepOutput:
        prefixes = [tuple(int(t) for t in row[1:]) for row in rows.tolist()]
        probs = torch.tensor([self.next_probs(p) for p in prefixes], dtype=torch.float64)
        return StepOutput(probs.log(), _cache(rows))

    def start(self) -> StepOutput:
        return self._output(torch.full((1, 1), -1.0, dtype=torch.float64))

    def step(self, tokens: torch.Tensor, cache: Any) -> StepOutput:
        rows = cache.layers[0].keys[:, 0, :, 0]
        return self._output(torch.cat([rows, tokens.view(-1, 1).to(rows)], dim=1))

    def reorder(self, cache: Any, index: torch.Tensor) -> Any:
        return _cache(cache.layers[0].keys[:, 0, :, 0].index_select(0, index.to(torch.long)))

    # -- closed forms shared by every toy
    def log_prob(self, tokens: Sequence[int]) -> float:
        """log P(tokens + EOS), by the chain rule over :meth:`next_probs`."""
        total, prefix = 0.0, ()
        for t in [*tokens, EOS]:
            p = self.next_probs(prefix)[int(t)]
            if p == 0:
                return -math.inf
            total += math.log(p)
            prefix = (*prefix, int(t))
        return total

    def attribute_distribution(self) -> dict[int, float]:
        raise NotImplementedError

    def attribute_mode(self) -> int:
        """argmax_a P(A = a) (the smallest a among ties, equal up to rounding: the closed
        forms give a fair coin's C(5, 2) and C(5, 3) one ulp apart)."""
        dist = self.attribute_distribution()
        best = max(dist.values())
        return min(a for a, p in dist.items() if math.isclose(p, best, rel_tol=1e-12))

    def _check_value(self, value: int) -> None:
        if self.attribute_distribution().get(value, 0.0) <= 0:
            raise GencraftError(f"P(A = {value}) is 0 under {self!r}: nothing to condition on")


def _normalised(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


class BiasedCoin(Toy):
    """``flips`` coin flips with P(H) = ``p_heads``; tokens 1 = H, 2 = T; A = number of heads.
    With ``heads`` given, the distribution conditioned on A = heads: every arrangement of that
    many heads is equally likely, so P(H next) = heads left / flips left."""

    def __init__(self, flips: int = 100, p_heads: float = 0.6, heads: int | None = None) -> None:
        if flips < 1:
            raise GencraftError(f"flips must be >= 1, got {flips}")
        if not 0 < p_heads < 1:
            raise GencraftError(f"p_heads must be in (0, 1), got {p_heads}")
        if heads is not None and not 0 <= heads <= flips:
            raise GencraftError(f"heads must be in [0, flips={flips}], got {heads}")
        self.flips, self.p, self.heads = flips, p_heads, heads
        self.vocab_size, self.max_length = 3, flips

    def __repr__(self) -> str:
        given = f", heads={self.heads}" if self.heads is not None else ""
        return f"BiasedCoin(flips={self.flips}, p_heads={self.p}{given})"

    def next_probs(self, prefix: tuple[int, ...]) -> list[float]:
        if len(prefix) >= self.flips:
            return [1.0, 0.0, 0.0]
        if self.heads is None:
            return [0.0, self.p, 1 - self.p]
        left = self.heads - sum(1 for t in prefix if t == 1)
        h = left / (self.flips - len(prefix))
        return [0.0, h, 1 - h]

    def attribute(self, tokens: Sequence[int]) -> int:
        return sum(1 for t in tokens if t == 1)

    def attribute_distribution(self) -> dict[int, float]:
        if self.heads is not None:
            return {self.heads: 1.0}
        n, p = self.flips, self.p
        return {
            k: math.exp(_log_binom(n, k) + k * math.log(p) + (n - k) * math.log(1 - p))
            for k in range(n + 1)
        }

    def mode(self) -> ToyMode:
        if self.heads is not None:
            return self.conditional_mode(self.heads)
        n, p = self.flips, self.p
        if p == 0.5:
            return ToyMode((1,) * n, n * math.log(0.5), 2**n)
        side = 1 if p > 0.5 else 2
        return ToyMode((side,) * n, n * math.log(max(p, 1 - p)))

    def conditional(self, heads: int) -> BiasedCoin:
        """The distribution given A = ``heads``."""
        self._check_value(heads)
        return BiasedCoin(self.flips, self.p, heads)

    def conditional_mode(self, heads: int) -> ToyMode:
        """Every sequence with ``heads`` heads is modal given A = heads (C(n, heads) ties)."""
        self._check_value(heads)
        n = self.flips
        return ToyMode(
            (1,) * heads + (2,) * (n - heads), -_log_binom(n, heads), math.comb(n, heads)
        )


class LengthStrings(Toy):
    """Strings over ``letters`` letters (ids 1..k), uniform given their length, whose length ℓ
    has probability ``length_probs[ℓ]``. A = the length. A string has probability
    p_ℓ / k^ℓ; P(EOS | ℓ tokens so far) = p_ℓ / Σ_{m≥ℓ} p_m. With ``length`` given: the
    distribution conditioned on A = length (uniform over the k^length strings)."""

    def __init__(
        self, length_probs: Sequence[float], letters: int = 2, length: int | None = None
    ) -> None:
        probs = [float(p) for p in length_probs]
        if not probs or any(p < 0 or math.isnan(p) for p in probs) or not sum(probs) > 0:
            raise GencraftError("length_probs must be non-negative weights with a positive sum")
        if letters < 1:
            raise GencraftError(f"letters must be >= 1, got {letters}")
        self.length_probs = _normalised(probs)
        self.letters, self.length = letters, length
        if length is not None and not (0 <= length < len(probs) and probs[length] > 0):
            raise GencraftError(
                f"P(A = {length}) is 0 under {len(probs)} lengths: nothing to condition on"
            )
        self.vocab_size, self.max_length = letters + 1, len(probs) - 1

    def __repr__(self) -> str:
        given = f", length={self.length}" if self.length is not None else ""
        return f"LengthStrings({len(self.length_probs)} lengths, letters={self.letters}{given})"

    def next_probs(self, prefix: tuple[int, ...]) -> list[float]:
        t = len(prefix)
        if self.length is not None:
            p_end = 1.0 if t == self.length else 0.0
        else:
            rest = sum(self.length_probs[t:])
            p_end = self.length_probs[t] / rest if rest > 0 else 1.0
        return [p_end] + [(1 - p_end) / self.letters] * self.letters

    def attribute(self, tokens: Sequence[int]) -> int:
        return len(tokens)

    def attribute_distribution(self) -> dict[int, float]:
        if self.length is not None:
            return {self.length: 1.0}
        return {ell: p for ell, p in enumerate(self.length_probs) if p > 0}

    def empty_is_mode(self) -> bool:
        """The thesis's condition: p_ℓ / p_0 < k^ℓ for every ℓ >= 1."""
        p0 = self.length_probs[0]
        return p0 > 0 and all(
            p / p0 < self.letters**ell for ell, p in enumerate(self.length_probs) if ell > 0
        )

    def mode(self) -> ToyMode:
        if self.length is not None:
            return self.conditional_mode(self.length)
        k = self.letters
        scores = {
            ell: math.log(p) - ell * math.log(k) for ell, p in enumerate(self.length_probs) if p > 0
        }
        best = max(scores.values())
        tied = [e for e, s in scores.items() if math.isclose(s, best, rel_tol=0, abs_tol=1e-12)]
        return ToyMode((1,) * min(tied), best, sum(k**e for e in tied))

    def conditional(self, length: int) -> LengthStrings:
        """The distribution given A = ``length``."""
        return LengthStrings(self.length_probs, self.letters, length)

    def conditional_mode(self, length: int) -> ToyMode:
        self._check_value(length)
        return ToyMode((1,) * length, -length * math.log(self.letters), self.letters**length)


class BlandTemplate(Toy):
    """``slots`` slots (the thesis: <name> <verb> <adj> <noun>), each filled independently by
    its common word (probability ``p_common``) or one of its ``rare`` rare words (``p_rare``
    each); A = the number of rare words. Slot s's words are ids 1 + s·(rare + 1) (common) and
    the ``rare`` ids after it. With ``rare_words`` given, the distribution conditioned on
    A = rare_words: the rare positions are uniform among the slots (P(rare here) = rare
    words left / slots left), each rare word 1 / ``rare``."""

    def __init__(
        self,
        slots: int = 4,
        p_common: float = 0.1,
        rare: int = 90,
        p_rare: float | None = None,
        rare_words: int | None = None,
    ) -> None:
        p_rare = (1 - p_common) / rare if p_rare is None else p_rare
        if slots < 1 or rare < 1:
            raise GencraftError(f"slots and rare must be >= 1, got {slots} and {rare}")
        if not (0 < p_common < 1 and p_rare > 0 and math.isclose(p_common + rare * p_rare, 1)):
            raise GencraftError(
                f"p_common + rare * p_rare must be 1 with both positive, got {p_common} + "
                f"{rare} * {p_rare}"
            )
        self.slots, self.p_common, self.rare, self.p_rare = slots, p_common, rare, p_rare
        self.rare_words = rare_words
        if rare_words is not None and not 0 <= rare_words <= slots:
            raise GencraftError(
                f"P(A = {rare_words}) is 0 with {slots} slots: nothing to condition on"
            )
        self.vocab_size, self.max_length = 1 + slots * (rare + 1), slots

    def __repr__(self) -> str:
        given = f", rare_words={self.rare_words}" if self.rare_words is not None else ""
        return (
            f"BlandTemplate(slots={self.slots}, p_common={self.p_common}, rare={self.rare}{given})"
        )

    def common_id(self, slot: int) -> int:
        return 1 + slot * (self.rare + 1)

    def next_probs(self, prefix: tuple[int, ...]) -> list[float]:
        probs = [0.0] * self.vocab_size
        s = len(prefix)
        if s >= self.slots:
            probs[EOS] = 1.0
            return probs
        if self.rare_words is None:
            common, each_rare = self.p_common, self.p_rare
        else:
            left = self.rare_words - self.attribute(prefix)
            p = left / (self.slots - s)
            common, each_rare = 1 - p, p / self.rare
        c = self.common_id(s)
        probs[c] = common
        probs[c + 1 : c + 1 + self.rare] = [each_rare] * self.rare
        return probs

    def attribute(self, tokens: Sequence[int]) -> int:
        return sum(1 for s, t in enumerate(tokens) if t != self.common_id(s))

    def attribute_distribution(self) -> dict[int, float]:
        if self.rare_words is not None:
            return {self.rare_words: 1.0}
        n, q = self.slots, 1 - self.p_common
        return {k: math.comb(n, k) * q**k * self.p_common ** (n - k) for k in range(n + 1)}

    def mode(self) -> ToyMode:
        if self.rare_words is not None:
            return self.conditional_mode(self.rare_words)
        n = self.slots
        if self.p_common >= self.p_rare:
            # equal probabilities: every slot's rare + 1 words tie, so every string does
            ties = (self.rare + 1) ** n if self.p_common == self.p_rare else 1
            tokens = tuple(self.common_id(s) for s in range(n))
            return ToyMode(tokens, n * math.log(self.p_common), ties)
        tokens = tuple(self.common_id(s) + 1 for s in range(n))
        return ToyMode(tokens, n * math.log(self.p_rare), self.rare**n)

    def conditional(self, rare_words: int) -> BlandTemplate:
        """The distribution given A = ``rare_words``."""
        return BlandTemplate(self.slots, self.p_common, self.rare, self.p_rare, rare_words)

    def conditional_mode(self, rare_words: int) -> ToyMode:
        """Given A = k every string with k rare words has probability 1 / (C(n, k) · rare^k)."""
        self._check_value(rare_words)
        n, k = self.slots, rare_words
        tokens = tuple(self.common_id(s) + (1 if s < k else 0) for s in range(n))
        ties = math.comb(n, k) * self.rare**k
        return ToyMode(tokens, -_log_binom(n, k) - k * math.log(self.rare), ties)


def report() -> list[dict[str, Any]]:
    """The numbers of docs/theory.md: for each thesis example, the mode, the attribute's mode
    and the attribute-conditional mode, with their probabilities."""
    rows = []
    coin = BiasedCoin(100, 0.6)
    dist = coin.attribute_distribution()
    a = coin.attribute_mode()
    rows.append(
        {
            "toy": "biased coin, 100 flips, P(H) = 0.6",
            "mode": "all heads (A = 100)",
            "P(mode)": math.exp(coin.mode().log_prob),
            "modal A": a,
            "P(modal A)": dist[a],
            "P(A of the mode)": dist[coin.attribute(coin.mode().tokens)],
            "note": f"P(50 <= A <= 70) = {sum(dist[k] for k in range(50, 71)):.4f}",
            "P(x | A = modal A)": math.exp(coin.conditional_mode(a).log_prob),
        }
    )
    strings = LengthStrings([1.5**ell for ell in range(21)])
    a = strings.attribute_mode()
    m = strings.mode()
    rows.append(
        {
            "toy": "strings over {a, b}, p_l proportional to 1.5^l, l <= 20",
            "mode": f"length {len(m.tokens)} (empty: {strings.empty_is_mode()})",
            "P(mode)": math.exp(m.log_prob),
            "modal A": a,
            "P(modal A)": strings.attribute_distribution()[a],
            "P(A of the mode)": strings.attribute_distribution()[len(m.tokens)],
            "note": "p_l / p_0 = 1.5^l < 2^l for every l",
            "P(x | A = modal A)": math.exp(strings.conditional_mode(a).log_prob),
        }
    )
    bland = BlandTemplate()
    dist = bland.attribute_distribution()
    a = bland.attribute_mode()
    rows.append(
        {
            "toy": "bland template, 4 slots, common 10%, 90 rare words at 1%",
            "mode": "all four common words (A = 0)",
            "P(mode)": math.exp(bland.mode().log_prob),
            "modal A": a,
            "P(modal A)": dist[a],
            "P(A of the mode)": dist[0],
            "note": "the mode maximises expected unigram overlap with a random reference",
            "P(x | A = modal A)": math.exp(bland.conditional_mode(a).log_prob),
        }
    )
    return rows


def main() -> None:
    for row in report():
        print(row.pop("toy"))
        for k, v in row.items():
            print(f"  {k:<20} {v:.6g}" if isinstance(v, float) else f"  {k:<20} {v}")


if __name__ == "__main__":
    main()
