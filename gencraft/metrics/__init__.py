"""Evaluation metrics: plain functions on lists of strings (and LM perplexity helpers).

A method scores a task only through :func:`score_task`, which fixes the task's case,
tokenisation and stemming, so that every method's numbers on a task are comparable."""

from gencraft.metrics.bertscore import bertscore
from gencraft.metrics.entailment import EntailmentScorer
from gencraft.metrics.lm import (
    Window,
    WindowedScorer,
    causal_lm_nll,
    perplexity,
    stream_perplexities,
    text_perplexity,
    window_schedule,
    windowed_nll,
)
from gencraft.metrics.tasks import CONVENTIONS, bleu_interval, score_task
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
    "CONVENTIONS",
    "STOPWORDS",
    "EntailmentScorer",
    "Window",
    "WindowedScorer",
    "bertscore",
    "bleu",
    "bleu_interval",
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
    "score_task",
    "stream_perplexities",
    "text_perplexity",
    "unique_count",
    "window_schedule",
    "windowed_nll",
    "words",
]
