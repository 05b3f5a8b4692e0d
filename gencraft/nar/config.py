"""Settings of RUM-SUNDAE and its peers (Yoshida 2023, ch. 4 and Appendix A; Savinov et al.
2022; Ghazvininejad et al. 2019). Each field is also a CLI flag of ``gencraft nar``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gencraft.config import check, option, positive

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

    def __post_init__(self) -> None:
        positive(self, "steps", "samples", "length_candidates")
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
