"""The settings of :func:`gencraft.training.fit` (a plain dataclass, importable without torch:
the CLI builds every trainer's flags from it before it imports anything heavy)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gencraft.config import check, positive


@dataclass
class FitConfig:
    """Settings of :func:`fit` (each field is also a CLI flag of every trainer)."""

    epochs: int = field(default=1, metadata={"help": "passes over the training data"})
    max_steps: int | None = field(
        default=None, metadata={"help": "stop after this many optimizer steps"}
    )
    max_time: float | None = field(
        default=None,
        metadata={"help": "stop after this many seconds of training and validation"},
    )
    batch_size: int = field(default=8, metadata={"help": "examples per batch and process"})
    eval_batch_size: int | None = field(
        default=None, metadata={"help": "validation batch size (default: batch_size)"}
    )
    grad_accum: int = field(default=1, metadata={"help": "batches per optimizer step"})
    clip: float | None = field(
        default=1.0, metadata={"help": "global gradient-norm clip (none: no clipping)"}
    )
    warmup: float = field(
        default=0.0, metadata={"help": "warm-up steps (a value below 1: fraction of all steps)"}
    )
    decay: Literal["linear", "constant", "cosine"] = field(
        default="linear", metadata={"help": "learning-rate decay after warm-up"}
    )
    eval_every: int | None = field(
        default=None, metadata={"help": "validate every N steps (default: each epoch)"}
    )
    save_every: float = field(
        default=300.0, metadata={"help": "seconds between periodic checkpoints"}
    )
    metric: str = field(default="loss", metadata={"help": "validation value that picks best/"})
    patience: int | None = field(
        default=None,
        metadata={"help": "stop after this many validations without a new best (early stopping)"},
    )
    mode: Literal["min", "max"] = field(default="min", metadata={"help": "min or max of metric"})
    seed: int = field(default=0, metadata={"help": "seed of the shuffle order and of torch"})
    mixed_precision: Literal["no", "bf16", "fp16"] = field(
        default="no",
        metadata={"help": "autocast the forward and loss (accelerate): no, bf16 or fp16 (GPU)"},
    )
    device: str | None = field(
        default=None,
        metadata={
            "help": "cpu or cuda (default: cuda when there is one; several GPUs or processes: "
            "accelerate launch, docs/core.md)"
        },
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={
            "help": "dtype the model's weights load in (auto: float32); --mixed-precision "
            "autocasts float32 weights instead"
        },
    )

    def __post_init__(self) -> None:
        check_mixed_precision(self.mixed_precision)
        check(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}",
        )
        positive(self, "epochs", "batch_size", "grad_accum")
        positive(self, "max_steps", "eval_every", "eval_batch_size", "patience", allow_none=True)
        check(
            self.max_time is None or self.max_time > 0,
            f"max_time must be > 0 seconds (or unset), got {self.max_time}",
        )
        check(self.clip is None or self.clip > 0, f"clip must be > 0 (or unset), got {self.clip}")
        check(self.warmup >= 0, f"warmup must be >= 0, got {self.warmup}")
        check(self.save_every > 0, f"save_every must be > 0 seconds, got {self.save_every}")
        check(self.mode in ("min", "max"), f"mode must be 'min' or 'max', got {self.mode!r}")
        check(
            self.decay in ("linear", "constant", "cosine"),
            f"decay must be linear, constant or cosine, got {self.decay!r}",
        )


def fit_options(*, hide: tuple[str, ...] = (), **defaults: Any) -> Any:
    """The ``fit`` field of a method's training settings: a :class:`FitConfig` with this
    method's defaults. Its fields become flags of the method's ``train`` command (minus
    ``hide``: settings the method derives itself, e.g. the metric that picks ``best/``).

    >>> @dataclass
    ... class MyTrainConfig:
    ...     lr: float = 1e-3
    ...     fit: FitConfig = fit_options(epochs=3, batch_size=16)
    """
    FitConfig(**defaults)  # a wrong default fails where it is written
    return field(
        default_factory=lambda: FitConfig(**defaults),
        metadata={"help": "settings of the training loop", "hide": hide},
    )


def settings_of(config: Any) -> dict[str, Any]:
    """A method's training settings as the run records them (JSON-like), without the nested
    ``fit``: :func:`fit` adds its own config to the settings it compares on resume, with the
    budgets (epochs, max_steps, max_time) free to change."""
    return {k: v for k, v in asdict(config).items() if k != "fit"}


MIXED_PRECISION = ("no", "bf16", "fp16")


def check_mixed_precision(value: str) -> None:
    """``no``, ``bf16`` (CPU or GPU) or ``fp16`` (needs CUDA: accelerate's loss scaling)."""
    check(value in MIXED_PRECISION, f"mixed_precision must be no, bf16 or fp16, got {value!r}")
    if value != "fp16":
        return
    import torch  # here, not at the top: the CLI parses its flags without torch

    check(
        torch.cuda.is_available(),
        "mixed_precision fp16 needs a CUDA GPU (its gradient scaler); use bf16 on a CPU",
    )
