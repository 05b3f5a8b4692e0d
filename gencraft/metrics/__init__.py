"""Evaluation metrics: plain functions on lists of strings (and LM perplexity helpers).

A method scores a task only through :func:`score_task`, which fixes the task's case,
tokenisation and stemming, so that every method's numbers on a task are comparable."""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.metrics.bertscore": ("bertscore",),
        "gencraft.metrics.entailment": ("EntailmentScorer",),
        "gencraft.metrics.lm": (
            "Window",
            "WindowedScorer",
            "causal_lm_nll",
            "perplexity",
            "stream_perplexities",
            "text_perplexity",
            "window_schedule",
            "windowed_nll",
        ),
        "gencraft.metrics.stats": ("paired_comparison", "sign_test", "wilson_interval"),
        "gencraft.metrics.tasks": (
            "CONVENTIONS",
            "bleu_interval",
            "score_task",
        ),
        "gencraft.metrics.text": (
            "STOPWORDS",
            "bleu",
            "distinct_n",
            "mean_length",
            "mean_unique",
            "ngrams",
            "novel_ngram_rate",
            "repetition_rate",
            "rouge",
            "rouge1_precision_vs_source",
            "unique_count",
            "words",
        ),
    },
)
