"""FAME's settings: the model (:class:`FocusConfig`) and its training
(:class:`FocusTrainConfig`); each field is a flag of ``gencraft focus train``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from gencraft.config import check, check_cad_alpha, option, positive
from gencraft.training.config import FitConfig, fit_options


@dataclass
class FocusConfig:
    """Settings of a FAME model (see the field help)."""

    intermediate_size: int | None = option(None, "h' of W1/W2 (none: 4h)")
    bias: bool = option(True, "biases in W1, W2")
    heads: Literal["mean"] | int = option(
        "mean", "'mean' over the final layer's attention heads, or one head's index"
    )
    mle_weight: float = option(0.5, "λ in λ·MLE + (1 − λ)·topic (paper: 0.5)")
    frequent: Literal["negative", "ignore"] = option(
        "negative", "the |F| frequent tokens: negatives of the topic loss (paper) or left out"
    )
    source_attention: Literal["raw", "renormalized"] = option(
        "raw",
        "causal LMs: the self-attention mass on the prompt as is (raw), or rescaled to sum to "
        "1 over the prompt like cross-attention",
    )
    base_name_or_path: str | None = option(
        None, "how to reload the base when it is not saved beside the head"
    )
    freeze_base: bool = option(False, "training leaves the base untouched")
    extra: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "free-form notes saved with the model"}
    )

    def __post_init__(self) -> None:
        check(
            0.0 <= self.mle_weight <= 1.0,
            f"mle_weight (λ) must lie in [0, 1], got {self.mle_weight}",
        )
        check(
            self.frequent in ("negative", "ignore"),
            f"frequent must be 'negative' or 'ignore', got {self.frequent!r}",
        )
        check(
            self.source_attention in ("raw", "renormalized"),
            f"source_attention must be 'raw' or 'renormalized', got {self.source_attention!r}",
        )


@dataclass
class FocusTrainConfig:
    """Fine-tuning for summarization with or without FAME (``gencraft focus train``)."""

    focus: bool = option(True, "train FAME (--no-focus: the plain base, the baseline)")
    freeze_base: bool = option(False, "train only the FAME head (the base runs once per example)")
    precompute: bool | None = option(
        None, "with a frozen base, train on stored base states (default: when frozen)"
    )
    lr: float = option(5e-5, "AdamW learning rate")
    weight_decay: float = option(0.0, "AdamW weight decay")
    frequent_size: int = option(500, "|F| (paper: 500 for XSum, 1000 for CNN/DM)")
    select_by: Literal["loss", "rougeL"] = option(
        "loss",
        "what picks best/: validation loss, or ROUGE-L of beam-searched validation summaries "
        "(the paper's Appendix A)",
    )
    select_docs: int = option(50, "validation documents summarised for --select-by rougeL")
    select_beams: int = option(4, "beam size of those summaries")
    mle_weight: float = option(0.5, "λ in λ·MLE + (1 − λ)·topic")
    frequent: Literal["negative", "ignore"] = option(
        "negative", "F as negatives of the topic loss (paper) or ignored"
    )
    max_source: int = option(512, "source tokens (paper: 512 for XSum)")
    max_target: int = option(64, "summary tokens (paper: 64 for XSum)")
    fit: FitConfig = fit_options(epochs=3, batch_size=8, warmup=0.1, hide=("metric", "mode"))

    def __post_init__(self) -> None:
        check(
            not (self.freeze_base and not self.focus),
            "--freeze-base trains only the FAME head; it needs focus=True",
        )
        positive(self, "frequent_size")
        positive(self, "select_docs", "select_beams")
        check(
            self.select_by in ("loss", "rougeL"),
            f"select_by must be 'loss' or 'rougeL', got {self.select_by!r}",
        )
        check(
            not (self.precompute and not self.freeze_base),
            "precompute needs a frozen base (freeze_base=True)",
        )
        if self.precompute is None:
            self.precompute = self.freeze_base
        mode = "min" if self.select_by == "loss" else "max"
        self.fit = replace(self.fit, metric=self.select_by, mode=mode)
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")


#: the decodings of ``summarize`` (Table 2's, and beam search)
Decoding = Literal[
    "beam",
    "top_k",
    "nucleus",
    "focus_sample",
    "focus_sample+top_k",
    "focus_sample+nucleus",
    "focus_top",
]
DECODINGS: tuple[str, ...] = get_args(Decoding)


@dataclass
class FocusDecodeConfig:
    """How ``gencraft focus generate|eval`` summarises (beam size, lengths and the seed are
    the shared decode and run options)."""

    decoding: Decoding = option("beam", "beam search, or one of the decodings of Table 2")
    samples: int = option(1, "summaries per document")
    focus_k: int | None = option(
        None, "|V_k| (default 10,000, or the whole vocabulary when it is smaller)"
    )
    max_source: int = option(512, "source tokens read")
    cad_alpha: float | None = option(
        None,
        "context-aware decoding (CAD) with this alpha: beam search against the same model given "
        "an empty source (FAME + CAD with a FAME model; docs/focus.md)",
    )
    mbr_utility: str | None = option(
        None,
        "minimum Bayes risk: put first (the prediction) the one of the --samples summaries "
        "with the highest mean utility against the others: chrf, bleu, rouge or bertscore",
    )

    def __post_init__(self) -> None:
        positive(self, "samples", "max_source")
        positive(self, "focus_k", allow_none=True)
        check(
            self.mbr_utility is None or (self.samples > 1 and self.cad_alpha is None),
            "--mbr-utility selects among the --samples summaries: give --samples N > 1 "
            "(and no --cad-alpha)",
        )
        if self.mbr_utility is not None:
            from gencraft.metrics.mbr import check_utility

            check_utility(self.mbr_utility)
        check_cad_alpha(self.cad_alpha)
        check(
            self.cad_alpha is None or (self.decoding == "beam" and self.samples == 1),
            "--cad-alpha decodes with beam search: one summary per document",
        )
