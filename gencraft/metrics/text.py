"""Text metrics: plain functions on lists of strings.

ROUGE wraps Google's ``rouge-score`` (its tokenizer lower-cases and strips punctuation;
``use_stemmer=True`` matches pyrouge's ``-m``, the setting FAME reports with); BLEU wraps
``sacrebleu``. Word-level diversity and faithfulness proxies use :func:`words` (lower-cased
``\\w+`` and single punctuation tokens) unless a ``tokenize`` callable is given.
All rates are percentages, as the papers report them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from gencraft.extras import require

Tokenizer = Callable[[str], list[str]]
References = Sequence[str] | Sequence[Sequence[str]]
_WORD = re.compile(r"\w+|[^\w\s]")

# A compact English function-word list: repetition of these is not counted as repetition of
# "rare or content words" (FAME's Rep. column).
_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is
it its itself just me more most my myself no nor not now of off on once only or other our
ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself
yourselves also said says say one two new its 's s t
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens of ``text``."""
    return _WORD.findall(text.lower())


def _check_parallel(a: Sequence, b: Sequence, a_name: str, b_name: str) -> None:
    if len(a) != len(b):
        raise ValueError(f"{a_name} and {b_name} differ in length ({len(a)} vs {len(b)})")
    if not a:
        raise ValueError(f"{a_name} is empty")


def _as_multi(references: References) -> list[list[str]]:
    return [[r] if isinstance(r, str) else list(r) for r in references]


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """All contiguous ``n``-grams of ``tokens``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def rouge(
    predictions: Sequence[str],
    references: References,
    rouge_types: Sequence[str] = ("rouge1", "rouge2", "rougeL"),
    *,
    use_stemmer: bool = True,
    measure: str = "fmeasure",
) -> dict[str, float]:
    """Mean ROUGE (x100) per type. ``references[i]`` is a string or a list of strings (the
    best-scoring reference counts, as ``rouge-score``'s ``score_multi``). ``measure`` is
    ``fmeasure``, ``precision`` or ``recall``. ``rougeLsum`` expects newline-split sentences."""
    _check_parallel(predictions, references, "predictions", "references")
    scorer = require("rouge_score.rouge_scorer", "metrics", "ROUGE").RougeScorer(
        list(rouge_types), use_stemmer=use_stemmer
    )
    totals = dict.fromkeys(rouge_types, 0.0)
    for pred, refs in zip(predictions, _as_multi(references), strict=True):
        scores = scorer.score_multi(refs, pred)
        for t in rouge_types:
            totals[t] += getattr(scores[t], measure)
    return {t: 100.0 * v / len(predictions) for t, v in totals.items()}


def rouge_per_example(
    predictions: Sequence[str],
    references: References,
    rouge_type: str = "rougeL",
    measure: str = "fmeasure",
    *,
    use_stemmer: bool = True,
) -> list[float]:
    """ROUGE F1 (x100; ``measure`` "precision" or "recall" for the others) of each
    prediction; the mean F1 is :func:`rouge`'s."""
    if measure not in ("fmeasure", "precision", "recall"):
        raise ValueError(f"measure must be fmeasure, precision or recall, not {measure!r}")
    _check_parallel(predictions, references, "predictions", "references")
    scorer = require("rouge_score.rouge_scorer", "metrics", "ROUGE").RougeScorer(
        [rouge_type], use_stemmer=use_stemmer
    )
    return [
        100.0 * getattr(scorer.score_multi(refs, pred)[rouge_type], measure)
        for pred, refs in zip(predictions, _as_multi(references), strict=True)
    ]


def rouge_paired(
    outputs_a: Sequence[str],
    outputs_b: Sequence[str],
    references: References,
    rouge_type: str = "rougeL",
    measure: str = "fmeasure",
    *,
    resamples: int = 10_000,
    seed: int = 0,
) -> Any:
    """Corpus ROUGE (x100; the mean over documents, as ``rouge-score``'s aggregate) of A minus
    B, resampled by document: :func:`gencraft.metrics.stats.compare_paired` on the
    per-document scores (BCa bootstrap interval, sign-flip randomisation p, one unit per
    document)."""
    from gencraft.metrics.stats import compare_paired

    a = rouge_per_example(outputs_a, references, rouge_type, measure)
    b = rouge_per_example(outputs_b, references, rouge_type, measure)
    return compare_paired(a, b, resamples=resamples, seed=seed)


def bootstrap_mean(
    values: Sequence[float], resamples: int = 1000, seed: int = 12345
) -> tuple[float, float]:
    """(mean, half-width of the 95% percentile interval) of the mean of ``values`` over
    resamples with replacement (paired differences give a paired test)."""
    import torch

    x = torch.tensor(list(values), dtype=torch.float64)
    if x.numel() == 0:
        raise ValueError("bootstrap_mean needs at least one value")
    g = torch.Generator().manual_seed(seed)
    means = x[torch.randint(x.numel(), (resamples, x.numel()), generator=g)].mean(1)
    lo, hi = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return float(x.mean()), (hi - lo) / 2


def rouge1_precision_vs_source(
    predictions: Sequence[str], sources: Sequence[str], *, use_stemmer: bool = True
) -> float:
    """FAME's "R1 (P%) with doc.": mean ROUGE-1 precision (x100) of each prediction against
    its source document (how much of the summary's unigrams the document supports)."""
    return rouge(predictions, sources, ("rouge1",), use_stemmer=use_stemmer, measure="precision")[
        "rouge1"
    ]


def bleu(predictions: Sequence[str], references: References, **sacrebleu_kw) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenisation). ``references[i]`` may be a list of
    any length; shorter lists are padded with ``None``, which sacrebleu ignores."""
    _check_parallel(predictions, references, "predictions", "references")
    multi = _as_multi(references)
    width = max(len(r) for r in multi)
    streams = [[r[j] if j < len(r) else None for r in multi] for j in range(width)]
    sacrebleu = require("sacrebleu", "metrics", "BLEU")
    return sacrebleu.corpus_bleu(list(predictions), streams, **sacrebleu_kw).score


def distinct_n(texts: Sequence[str], n: int, tokenize: Tokenizer = words) -> float:
    """Distinct-n (Li et al. 2016), in %: distinct n-grams / all n-grams over all ``texts``."""
    grams = [g for t in texts for g in ngrams(tokenize(t), n)]
    return 100.0 * len(set(grams)) / len(grams) if grams else 0.0


def unique_count(samples: Sequence[str]) -> int:
    """Number of distinct outputs among the samples drawn for one input (FAME's "Unique")."""
    return len(set(samples))


def mean_unique(sample_groups: Sequence[Sequence[str]]) -> float:
    """:func:`unique_count` averaged over inputs; ``sample_groups[i]`` holds input i's samples."""
    if not sample_groups:
        raise ValueError("sample_groups is empty")
    return sum(unique_count(g) for g in sample_groups) / len(sample_groups)


def repetition_rate(
    texts: Sequence[str], tokenize: Tokenizer = words, stopwords: frozenset[str] = STOPWORDS
) -> float:
    """FAME's "Rep.", in %: share of texts in which some content word (alphanumeric, not a
    stopword) occurs more than once."""
    if not texts:
        raise ValueError("texts is empty")

    def repeats(text: str) -> bool:
        counts = Counter(w for w in tokenize(text) if w.isalnum() and w not in stopwords)
        return any(c > 1 for c in counts.values())

    return 100.0 * sum(map(repeats, texts)) / len(texts)


def novel_ngram_rate(
    predictions: Sequence[str], sources: Sequence[str], n: int, tokenize: Tokenizer = words
) -> float:
    """Novel n-grams, in %: per prediction, the share of its n-grams absent from its source;
    averaged over predictions that have at least one n-gram."""
    _check_parallel(predictions, sources, "predictions", "sources")
    rates = []
    for pred, src in zip(predictions, sources, strict=True):
        grams = ngrams(tokenize(pred), n)
        if grams:
            seen = set(ngrams(tokenize(src), n))
            rates.append(sum(g not in seen for g in grams) / len(grams))
    return 100.0 * sum(rates) / len(rates) if rates else 0.0


def mean_length(texts: Sequence[str], tokenize: Tokenizer = str.split) -> float:
    """Mean length in whitespace words (or ``tokenize`` tokens)."""
    if not texts:
        raise ValueError("texts is empty")
    return sum(len(tokenize(t)) for t in texts) / len(texts)
