"""Data-to-text metrics as the E2E/DART tables report them, from well-kept packages:

* BLEU and TER: ``sacrebleu`` (corpus level; TER as a fraction, as DART tables print it);
* NIST: ``nltk.translate.nist_score.corpus_nist`` (n = 5);
* METEOR: ``pycocoevalcap``'s wrapper of METEOR 1.5 (Java; the jar ships with the package),
  the METEOR version of the E2E challenge's scripts; reported as "n/a" when no ``java`` runs;
* ROUGE-L: ``rouge-score`` (F-measure, best reference per output);
* CIDEr: ``pycocoevalcap``'s CIDEr (the corpus-level tf-idf of the references given).

Every metric sees lower-cased text (the E2E scripts lower-case too); NIST and CIDEr see it
split into words and punctuation. Multiple references per output are used by every metric.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence

import sacrebleu

from gencraft.metrics.text import _check_parallel, rouge, words

METEOR_IMPL = "METEOR 1.5 (pycocoevalcap, Java)"


def _tok(text: str) -> str:
    return " ".join(words(text))


def _line(text: str) -> str:
    """One line without METEOR's field separator (its stdio protocol is line based)."""
    return " ".join(text.replace("|||", " ").split()).lower() or "."


def meteor(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """METEOR 1.5 (0-1) through pycocoevalcap; NaN when Java is missing."""
    if shutil.which("java") is None:
        return math.nan
    from pycocoevalcap.meteor.meteor import Meteor

    gts = {str(i): [_line(r) for r in refs] for i, refs in enumerate(references)}
    res = {str(i): [_line(p)] for i, p in enumerate(predictions)}
    score, _ = Meteor().compute_score(gts, res)
    return float(score)


def cider(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    from pycocoevalcap.cider.cider import Cider

    gts = {str(i): [_tok(r) for r in refs] for i, refs in enumerate(references)}
    res = {str(i): [_tok(p) or "."] for i, p in enumerate(predictions)}
    score, _ = Cider().compute_score(gts, res)
    return float(score)


def nist(predictions: Sequence[str], references: Sequence[Sequence[str]], n: int = 5) -> float:
    from nltk.translate.nist_score import corpus_nist

    hyps = [words(p) or ["."] for p in predictions]
    refs = [[words(r) for r in rs] for rs in references]
    # nltk divides by the count of each order's n-grams: no order beyond the longest output
    n = min(n, max(len(h) for h in hyps))
    try:
        return float(corpus_nist(refs, hyps, n=n))
    except ZeroDivisionError:
        return math.nan


def _lowered(
    predictions: Sequence[str], references: Sequence[Sequence[str]]
) -> tuple[list[str], list[list[str]], list[list[str | None]]]:
    """Lower-cased outputs, reference lists, and sacrebleu's reference streams (lists padded
    with ``None``, which sacrebleu skips)."""
    _check_parallel(predictions, references, "predictions", "references")
    if any(not refs for refs in references):
        raise ValueError("every output needs at least one reference")
    preds = [p.lower() for p in predictions]
    refs = [[r.lower() for r in rs] for rs in references]
    width = max(len(r) for r in refs)
    streams = [[r[j] if j < len(r) else None for r in refs] for j in range(width)]
    return preds, refs, streams


def bleu_interval(
    predictions: Sequence[str], references: Sequence[Sequence[str]], resamples: int = 1000
) -> tuple[float, float]:
    """(bootstrap mean, 95% half-width) of corpus BLEU over test inputs resampled with
    replacement: sacrebleu's own bootstrap (``n_bootstrap``, seeded by ``SACREBLEU_SEED``)."""
    preds, _, streams = _lowered(predictions, references)
    score = sacrebleu.BLEU().corpus_score(preds, streams, n_bootstrap=resamples)
    return float(score._mean), float(score._ci)


def data_to_text_scores(
    predictions: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    with_meteor: bool = True,
) -> dict[str, float]:
    """BLEU, NIST, METEOR, ROUGE-L, CIDEr (×1 as the tables print it) and TER for outputs and
    their reference lists (E2E: every reference of the meaning representation)."""
    preds, refs, streams = _lowered(predictions, references)
    out = {
        "BLEU": sacrebleu.corpus_bleu(preds, streams).score,
        "NIST": nist(preds, refs),
        "METEOR": meteor(preds, refs) if with_meteor else math.nan,
        "ROUGE-L": rouge(preds, refs, ("rougeL",), use_stemmer=False)["rougeL"],
        "CIDEr": cider(preds, refs),
        "TER": sacrebleu.corpus_ter(preds, streams).score / 100.0,
    }
    return out
