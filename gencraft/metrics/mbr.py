"""Minimum Bayes risk (MBR) selection: of N candidates for an input, the one with the highest
expected utility against the others (the candidates as pseudo-references; Kumar & Byrne
2004, Eikema & Aziz 2020).

The expected utility of candidate i is the mean of u(i, j) over the other candidates j ≠ i:
a sample drawn twice counts twice (a Monte-Carlo estimate of the expectation under the
model), and candidate i never scores itself. Ties go to the earlier candidate. Utilities
(sentence level, x100):

* ``chrf``: chrF (character 6-grams, β = 2) by ``fastchrf``'s ``pairwise_chrf``, the Rust
  implementation made for MBR (``pip install 'gencraft[mbr]'``: no dependencies, one wheel);
  equal to sacrebleu's sentence chrF with its defaults (tested);
* ``bleu``: sacrebleu's ``sentence_bleu`` (its default exponential smoothing);
* ``rouge``: ROUGE-L F1 (``rouge-score``, stemmed);
* ``bertscore``: BERTScore F1 with the local MiniLM (``gencraft[bertscore]``).

``mbrs`` (0.1.8) does the same selection with more utilities, but pulls ``unbabel-comet`` and
``bleurt-pytorch`` (and their torch pins) into the install; see docs/search.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gencraft.errors import GencraftError
from gencraft.extras import require

UTILITIES = ("chrf", "bleu", "rouge", "bertscore")


@dataclass
class MBRChoice:
    """Per input: ``index`` the chosen candidate, ``expected`` [N] each candidate's expected
    utility (x100)."""

    index: list[int]
    expected: list[list[float]]


def check_utility(utility: str) -> None:
    """Refuse an unknown utility, naming the choices (before any candidate is drawn)."""
    if utility not in UTILITIES:
        raise GencraftError(f"mbr utility must be one of {', '.join(UTILITIES)}, got {utility!r}")


def utility_matrices(candidates: Sequence[Sequence[str]], utility: str = "chrf") -> torch.Tensor:
    """[B, N, N]: u(candidate i, pseudo-reference j) for each input's N candidates (every input
    has the same N)."""
    check_utility(utility)
    sizes = {len(c) for c in candidates}
    if len(sizes) != 1 or 0 in sizes:
        raise GencraftError(f"each input needs the same number (>= 1) of candidates, got {sizes}")
    n = sizes.pop()
    if utility == "chrf":
        rows = [list(c) for c in candidates]
        return torch.tensor(require("fastchrf", "mbr", "chrF").pairwise_chrf(rows, rows))
    hyps = [c[i] for c in candidates for i in range(n) for _ in range(n)]
    refs = [c[j] for c in candidates for _ in range(n) for j in range(n)]
    return torch.tensor(_pair_scores(hyps, refs, utility)).view(len(candidates), n, n)


def _pair_scores(hyps: list[str], refs: list[str], utility: str) -> list[float]:
    """The utility of each (hypothesis, reference) pair, x100."""
    if utility == "bleu":
        sacrebleu = require("sacrebleu", "metrics", "BLEU")
        return [sacrebleu.sentence_bleu(h, [r]).score for h, r in zip(hyps, refs, strict=True)]
    if utility == "rouge":
        from gencraft.metrics.text import rouge_per_example

        return rouge_per_example(hyps, refs, "rougeL")
    from gencraft.metrics.bertscore import bertscore_pairs

    return [100 * f for f in bertscore_pairs(hyps, refs)[2]]


def mbr_select(candidates: Sequence[Sequence[str]], utility: str = "chrf") -> MBRChoice:
    """The MBR choice among each input's candidates (``candidates[b]``: N strings, the same N
    for every input): the highest mean utility against the other N - 1."""
    u = utility_matrices(candidates, utility).double()
    n = u.shape[1]
    others = ~torch.eye(n, dtype=torch.bool)
    expected = (u * others).sum(2) / max(n - 1, 1)  # [B, N]
    best = torch.stack([(row == row.max()).nonzero()[0, 0] for row in expected])
    return MBRChoice(best.tolist(), expected.tolist())
