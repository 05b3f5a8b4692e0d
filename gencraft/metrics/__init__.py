"""Evaluation metrics: plain functions on lists of strings (and LM perplexity helpers)."""

from gencraft.metrics.bertscore import bertscore
from gencraft.metrics.entailment import EntailmentScorer
from gencraft.metrics.lm import causal_lm_nll, perplexity, stream_perplexities, text_perplexity
from gencraft.metrics.text import (
    STOPWORDS,
    bleu,
    distinct_n,
    mean_length,
    mean_unique,
    ngrams,
    novel_ngram_rate,
    repetition_rate,
    rouge,
    rouge1_precision_vs_source,
    unique_count,
    words,
)

__all__ = [
    "STOPWORDS",
    "EntailmentScorer",
    "bertscore",
    "bleu",
    "causal_lm_nll",
    "distinct_n",
    "mean_length",
    "mean_unique",
    "ngrams",
    "novel_ngram_rate",
    "perplexity",
    "repetition_rate",
    "rouge",
    "rouge1_precision_vs_source",
    "stream_perplexities",
    "text_perplexity",
    "unique_count",
    "words",
]
