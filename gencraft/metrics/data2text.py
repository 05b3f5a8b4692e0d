"""Data-to-text metrics from well-kept packages, on text as given (no case folding here:
:func:`gencraft.metrics.score_task` fixes each task's convention and calls these):

* NIST: ``nltk.translate.nist_score.corpus_nist`` (n = 5);
* METEOR: ``pycocoevalcap``'s wrapper of METEOR 1.5 (Java; the jar ships with the package),
  the METEOR version of the E2E challenge's scripts; NaN when no ``java`` runs;
* CIDEr: ``pycocoevalcap``'s CIDEr (the corpus-level tf-idf of the references given);
* ROUGE-L: ``pycocoevalcap``'s (the E2E scripts' ROUGE-L: LCS, β = 1.2).

NIST, CIDEr and ROUGE-L see text split into words and punctuation. Every reference of an
output is used.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Sequence

from gencraft.extras import require

METEOR_IMPL = "METEOR 1.5 (pycocoevalcap, Java)"
_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokens(text: str) -> list[str]:
    """Word and single-punctuation tokens of ``text``, case kept."""
    return _TOKEN.findall(text)


def _tok(text: str) -> str:
    return " ".join(tokens(text))


def _line(text: str) -> str:
    """One line without METEOR's field separator (its stdio protocol is line based)."""
    return " ".join(text.replace("|||", " ").split()) or "."


def meteor(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """METEOR 1.5 (0-1) through pycocoevalcap; NaN when Java is missing."""
    if shutil.which("java") is None:
        return math.nan
    Meteor = require("pycocoevalcap.meteor.meteor", "metrics", "METEOR").Meteor

    gts = {str(i): [_line(r) for r in refs] for i, refs in enumerate(references)}
    res = {str(i): [_line(p)] for i, p in enumerate(predictions)}
    score, _ = Meteor().compute_score(gts, res)
    return float(score)


def cider(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    Cider = require("pycocoevalcap.cider.cider", "metrics", "CIDEr").Cider

    gts = {str(i): [_tok(r) for r in refs] for i, refs in enumerate(references)}
    res = {str(i): [_tok(p) or "."] for i, p in enumerate(predictions)}
    score, _ = Cider().compute_score(gts, res)
    return float(score)


def nist(predictions: Sequence[str], references: Sequence[Sequence[str]], n: int = 5) -> float:
    corpus_nist = require("nltk.translate.nist_score", "metrics", "NIST").corpus_nist

    hyps = [tokens(p) or ["."] for p in predictions]
    refs = [[tokens(r) for r in rs] for rs in references]
    # nltk divides by the count of each order's n-grams: no order beyond the longest output
    n = min(n, max(len(h) for h in hyps))
    try:
        return float(corpus_nist(refs, hyps, n=n))
    except ZeroDivisionError:
        return math.nan


def coco_rouge_l(
    predictions: Sequence[str], references: Sequence[Sequence[str]], beta: float = 1.2
) -> float:
    """ROUGE-L (x100) as ``pycocoevalcap`` (the E2E and COCO scripts) computes it: per output,
    the best LCS precision and the best LCS recall over its references, combined with
    β = 1.2; the mean over outputs. Text is split into word/punctuation tokens first."""
    Rouge = require("pycocoevalcap.rouge.rouge", "metrics", "ROUGE-L").Rouge

    scorer = Rouge()
    scorer.beta = beta
    total = 0.0
    for pred, refs in zip(predictions, references, strict=True):
        total += scorer.calc_score([" ".join(tokens(pred))], [" ".join(tokens(r)) for r in refs])
    return 100.0 * total / len(predictions)
