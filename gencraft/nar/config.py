"""Settings of RUM-SUNDAE and its peers (Yoshida 2023, ch. 4 and Appendix A; Savinov et al.
2022; Ghazvininejad et al. 2019). Each field is also a CLI flag of ``gencraft nar``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from gencraft.config import check, field_options, option, positive
from gencraft.training.config import FitConfig, fit_options

OBJECTIVES = ("sundae", "mask-predict", "autoregressive")
CROSS_ATTENTION = ("random", "copy")
RERANK = ("mean-logprob", "sum-logprob", "mean-logprob+length")


@dataclass
class ConvertConfig:
    """How a masked LM becomes an encoder-decoder (:func:`~gencraft.nar.mlm_to_seq2seq`)."""

    cross_attention: Literal["random", "copy"] = option(
        "random",
        "initialisation of the decoder's new cross-attention: random (BERT's init) or copied "
        "from the same layer's self-attention",
    )
    pretrained: bool = option(
        True, "start from the MLM's weights (--no-pretrained: the same shapes, random: SUNDAE)"
    )
    bidirectional: bool = option(
        True, "decoder without a causal mask (non-autoregressive); off: an autoregressive decoder"
    )
    max_target_length: int = option(
        128, "longest target the length predictor can predict (tokens, special tokens excluded)"
    )

    def __post_init__(self) -> None:
        check(
            self.cross_attention in CROSS_ATTENTION,
            f"cross_attention must be one of {CROSS_ATTENTION}, got {self.cross_attention!r}",
        )
        positive(self, "max_target_length")


@dataclass
class ObjectiveConfig:
    """The training objective. Appendix A: no label smoothing for a pretrained start."""

    objective: Literal["sundae", "mask-predict", "autoregressive"] = option(
        "sundae", "sundae (unrolled denoising), mask-predict (CMLM), or autoregressive"
    )
    unroll_steps: int = option(2, "SUNDAE's unrolled denoising steps in training")
    length_loss_weight: float = option(
        0.1, "weight of the target-length cross-entropy (Mask-Predict's 0.1)"
    )
    label_smoothing: float | None = option(
        None, "label smoothing of the token loss (default: the preset's; Appendix A: 0)"
    )

    def __post_init__(self) -> None:
        check(
            self.objective in OBJECTIVES,
            f"objective must be one of {OBJECTIVES}, got {self.objective!r}",
        )
        positive(self, "unroll_steps")
        check(self.length_loss_weight >= 0, "length_loss_weight must be >= 0")
        ls = self.label_smoothing
        check(ls is None or 0 <= ls < 1, f"label_smoothing must lie in [0, 1), got {ls}")


@dataclass
class SamplingConfig:
    """Non-autoregressive decoding. SUNDAE (Appendix A): 15 steps, best of 16 samples, the
    temperature tuned in [0.1, 1.1] on validation. Mask-Predict: ``steps`` iterations with
    ``length_candidates`` lengths, one (deterministic) decode each."""

    steps: int = option(15, "refinement steps at most (SUNDAE stops early when nothing changes)")
    samples: int = option(16, "SUNDAE samples per input, spread over the length candidates")
    temperature: float = option(0.5, "SUNDAE's sampling temperature")
    proportion: float = option(
        1.0, "share of the positions whose sample is kept at each SUNDAE step, in (0, 1]"
    )
    length_candidates: int = option(3, "the top-ℓ predicted lengths decoded")
    argmax_unrolled: bool = option(
        False, "SUNDAE: take the argmax at each step instead of sampling (from random starts)"
    )
    rerank: Literal["mean-logprob", "sum-logprob", "mean-logprob+length"] = option(
        "mean-logprob",
        "how the best sample is chosen: the mean (or sum) of the model's log-probabilities "
        "of its tokens given the sample itself (+length: plus the length's log-probability)",
    )
    seed: int = option(0, "seed of the random starts and samples")
    threshold: float | None = option(
        None,
        "confidence-threshold decoding (Fast-dLLM): at each step decide (Mask-Predict: unmask; "
        "SUNDAE: freeze) every undecided position whose probability is >= this, and at least "
        "the most confident one; --steps caps the calls (the last decides the rest)",
    )

    def __post_init__(self) -> None:
        positive(self, "steps", "samples", "length_candidates")
        check(
            self.threshold is None or 0 <= self.threshold <= 1,
            f"threshold must lie in [0, 1], got {self.threshold}",
        )
        check(
            self.threshold is None or self.proportion == 1,
            "proportion does not apply with threshold: every undecided position is redrawn at "
            "each step; leave --proportion out",
        )
        check(
            math.isfinite(self.temperature) and self.temperature > 0,
            f"temperature must be > 0, got {self.temperature}",
        )
        check(
            0 < self.proportion <= 1,
            f"proportion must lie in (0, 1] (the share of positions updated per step), "
            f"got {self.proportion}",
        )
        check(self.rerank in RERANK, f"rerank must be one of {RERANK}, got {self.rerank!r}")


NAR_TASKS = ("e2e", "webnlg", "dart")
PRESETS: dict[str, dict[str, float]] = {
    "pretrained": {"lr": 1e-4, "weight_decay": 0.0, "label_smoothing": 0.0},
    "scratch": {"lr": 5e-4, "weight_decay": 0.01, "label_smoothing": 0.1},
}


@dataclass
class NARTrainConfig:
    """``gencraft nar train``: the data and the optimisation (with the
    :class:`ConvertConfig` and :class:`ObjectiveConfig` flags). ``fit.seed`` seeds the
    initialisation, the shuffle and the corruption.

    Presets (``--preset``) follow Appendix A of the thesis. A pretrained start uses no weight
    decay and no label smoothing, so as not to damage what the MLM learned. A random start
    (``scratch``) uses weight decay 0.01 and label smoothing 0.1, a common transformer recipe;
    the thesis follows Savinov et al. there, and their values are not in the thesis text. Both
    use AdamW with linear warm-up and decay."""

    model: str = option("minilm-l6", "the masked LM (registered name or local path)")
    task: str = option(
        "e2e",
        "seq2seq task: e2e, webnlg, dart, or your own data as a path (a .jsonl, .csv or .tsv "
        "file, or a folder of train/valid/test files: docs/datasets.md)",
    )
    source_field: str
    target_field: str
    source_field, target_field = field_options()
    preset: Literal["auto", "pretrained", "scratch"] = option(
        "auto", "Appendix A's settings: auto picks pretrained or scratch by --pretrained"
    )
    lr: float | None = option(None, "AdamW learning rate (default: the preset's)")
    weight_decay: float | None = option(None, "AdamW weight decay (default: the preset's)")
    train_examples: int | None = option(None, "the first N training pairs")
    valid_examples: int = option(256, "validation pairs for the loss")
    max_source_tokens: int = option(128, "source tokens kept")
    fit: FitConfig = fit_options(batch_size=32, warmup=0.05)

    def __post_init__(self) -> None:
        from gencraft.data.own import own_task  # on use: the CLI's startup loads no data

        self.task = own_task(self.task, NAR_TASKS)
        check(self.preset in ("auto", *PRESETS), f"unknown preset {self.preset!r}")
        check(self.lr is None or self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.weight_decay is None or self.weight_decay >= 0, "weight_decay must be >= 0")
        positive(self, "max_source_tokens", "valid_examples")

    def resolved(self, convert: ConvertConfig, objective: ObjectiveConfig):
        """(lr, weight decay, objective with its label smoothing) after the preset."""
        name = (
            self.preset
            if self.preset != "auto"
            else ("pretrained" if convert.pretrained else "scratch")
        )
        p = PRESETS[name]
        ls = objective.label_smoothing
        objective = replace(objective, label_smoothing=p["label_smoothing"] if ls is None else ls)
        lr = self.lr if self.lr is not None else p["lr"]
        wd = self.weight_decay if self.weight_decay is not None else p["weight_decay"]
        return lr, wd, objective
