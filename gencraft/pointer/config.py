"""The pointer sentinel-LSTM's settings: the model (:class:`PointerSentinelConfig`) and its
truncated-BPTT training (:class:`TrainConfig`); each training field is a flag of
``gencraft pointer train``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from gencraft.config import check, option
from gencraft.errors import GencraftError


@dataclass
class PointerSentinelConfig:
    """Hyperparameters of :class:`~gencraft.pointer.lstm.PointerSentinelLSTM`.

    ``dropout`` is the locked dropout on every LSTM layer's input and ``output_dropout`` on the
    last layer's output; ``zoneout_c``/``zoneout_h`` the zoneout rates of cells and hidden
    states. ``pointer=False`` gives the plain (zoneout + variational) LSTM baseline.
    """

    vocab_size: int
    hidden_size: int = option(650, "LSTM width (paper's medium model: 650)")
    embedding_size: int | None = option(None, "embedding width (none: hidden_size)")
    num_layers: int = option(2, "LSTM layers")
    window: int = option(100, "pointer window L (paper: 100)")
    pointer: bool = option(True, "the pointer sentinel mixture (off: the plain LSTM)")
    dropout: float = option(0.5, "locked dropout on every layer's input")
    output_dropout: float = option(0.5, "locked dropout on the last layer's output")
    zoneout_c: float = option(0.5, "zoneout rate of the cells")
    zoneout_h: float = option(0.5, "zoneout rate of the hidden states")
    zoneout_mask: Literal["per_step", "locked"] = option("per_step", "zoneout mask sampling")
    zoneout_eval: Literal["expectation", "none"] = option(
        "expectation", "zoneout at evaluation: its expectation, or none"
    )
    tie_weights: bool = option(False, "tie input and output embeddings")
    init_range: float = option(0.05, "uniform initialisation range")
    extra: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "free-form, e.g. the corpus name"}
    )

    def __post_init__(self) -> None:
        check(self.vocab_size >= 1, f"vocab_size must be positive, got {self.vocab_size}")
        check(
            self.window >= 1,
            f"window must be at least 1 position (the paper uses L = 100), got {self.window}",
        )
        check(
            self.hidden_size >= 1 and self.num_layers >= 1,
            "hidden_size and num_layers must be positive",
        )
        check(
            not (
                self.tie_weights and (self.embedding_size or self.hidden_size) != self.hidden_size
            ),
            "tie_weights needs embedding_size == hidden_size",
        )

    @property
    def emb_size(self) -> int:
        return self.embedding_size or self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PointerSentinelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise GencraftError(f"unknown pointer config keys: {', '.join(unknown)}")
        return cls(**d)


@dataclass
class TrainConfig:
    """The paper's recipe by default: batch 32, BPTT 100, clip 1, halve the LR when validation
    perplexity gets worse, stop after 3 evaluations without improvement or 64 epochs.
    The paper does not name its optimiser or learning rate; SGD with lr 20 is our default."""

    batch_size: int = option(32, "streams per step (paper: 32)")
    bptt: int = option(100, "k2: tokens backpropagated through (paper: 100)")
    k1: int | None = option(None, "tokens per step (none: k1 = k2; the paper's schedule: 1)")
    window_refresh: Literal["regenerate", "stale"] = option(
        "regenerate", "re-run the window with the current parameters, or reuse stale outputs"
    )
    optimizer: Literal["sgd", "adam"] = option("sgd", "optimizer")
    lr: float = option(20.0, "learning rate (default for SGD)")
    weight_decay: float = option(0.0, "weight decay")
    clip: float = option(1.0, "global gradient-norm clip")
    lr_decay: float = option(0.5, "learning-rate factor when validation gets worse")
    patience: int = option(3, "stop after this many evaluations without improvement")
    max_epochs: int = option(64, "passes over the training stream at most")
    max_steps: int | None = option(None, "stop after this many steps")
    max_time: float | None = option(None, "stop after this many seconds of training and validation")
    eval_every: int | None = option(None, "validate every N steps (default: each epoch)")
    eval_batch_size: int = option(10, "validation streams")
    pointer_loss_weight: float = option(0.0, "weight of eq. 9 added to the cross-entropy")
    mixed_precision: Literal["no", "bf16", "fp16"] = option(
        "no", "autocast the forward and loss (accelerate): no, bf16 or fp16 (GPU)"
    )
    device: str | None = option(
        None, "cpu or cuda (default: cuda when there is one; more: accelerate launch)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto",
        "dtype of the weights (auto: float32); the LSTM stays float32 (docs/pointer.md)",
    )
    save_every: float = option(
        300.0,
        "seconds between periodic checkpoints (as on every trainer)",
        aliases=("--checkpoint-every",),
    )
    revert_on_worse: bool = option(
        False, "on a worse validation, also reload the best weights (fresh optimizer state)"
    )
    seed: int = option(0, "seed")

    def __post_init__(self) -> None:
        from gencraft.training.config import check_mixed_precision

        check_mixed_precision(self.mixed_precision)
        check(self.batch_size >= 1 and self.bptt >= 1, "batch_size and bptt must be positive")
        check(
            self.k1 is None or 1 <= self.k1 <= self.bptt,
            f"k1 must lie in [1, bptt = {self.bptt}], got {self.k1}",
        )
        check(
            self.window_refresh in ("regenerate", "stale"),
            f"window_refresh must be 'regenerate' or 'stale', got {self.window_refresh!r}",
        )
        check(
            not (self.window_refresh == "stale" and self.k1 not in (None, self.bptt)),
            "window_refresh='stale' needs k1 = k2 (= bptt)",
        )
        check(
            self.optimizer in ("sgd", "adam"),
            f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}",
        )
        check(
            self.max_time is None or self.max_time > 0,
            f"max_time must be > 0 seconds (or unset), got {self.max_time}",
        )
        check(self.save_every > 0, f"save_every must be > 0 seconds, got {self.save_every}")
        for name in ("max_steps", "max_epochs", "eval_every"):
            v = getattr(self, name)
            check(v is None or v >= 1, f"{name} must be >= 1 (or unset), got {v}")

    @property
    def k2(self) -> int:
        return self.bptt

    def fit_config(self) -> Any:
        """These settings as :func:`~gencraft.training.fit` reads them (a ``FitConfig``): the
        budgets, validation interval, clipping and precision under the recipe's own flag names;
        no warm-up or decay (the plateau rule sets the learning rate)."""
        from gencraft.training.config import FitConfig

        return FitConfig(
            epochs=self.max_epochs,
            max_steps=self.max_steps,
            max_time=self.max_time,
            batch_size=self.batch_size,
            eval_batch_size=self.eval_batch_size,
            clip=self.clip or None,
            eval_every=self.eval_every,
            save_every=self.save_every,
            seed=self.seed,
            mixed_precision=self.mixed_precision,
            device=self.device,
            dtype=self.dtype,
            decay="constant",
        )

    @property
    def step_tokens(self) -> int:
        return self.k1 or self.bptt

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
