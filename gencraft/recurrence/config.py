"""The recurrent model's settings (Yoshida 2023, ch. 2). Defaults are the thesis's (GPT-2
small, 300-token windows, 20 windows of BPTT, FFN 3 × 200, insertion at ℓ_ins = 2, which
counts layers from 1: index 1); the choices it leaves open are fields, documented in
docs/recurrence.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gencraft.config import check, option, positive
from gencraft.training.config import FitConfig, fit_options

ACTIVATIONS = ("gelu", "relu", "tanh")


@dataclass
class RecurrenceConfig:
    window: int = option(300, "T: tokens per window")
    overlap: int = option(0, "o: tokens a window repeats from the one before (train = test)")
    insert_layer: int = option(
        1,
        "0-based layer whose self-attention gets h_prev as key/value (1: the thesis's "
        "ℓ_ins = 2, which counts layers from 1)",
    )
    ffn_hidden: tuple[int, ...] = option((200, 200, 200), "hidden widths of the recurrence FFN")
    activation: Literal["gelu", "relu", "tanh"] = option("gelu", "the FFN's activation")
    pooling: Literal["mean", "sum"] = option("mean", "eq. 2.1 over positions: mean or sum")
    pool_positions: Literal["new", "all"] = option(
        "new", "positions pooled: the T - o the next window does not repeat, or all T"
    )
    hprev_norm: bool = option(True, "pass h_prev through the layer's input norm first")
    bptt_windows: int = option(20, "windows per training sequence (backprop through all)")
    checkpoint: bool = option(True, "keep only pooled vectors and h_prev per window in training")
    train_base: bool = option(True, "fine-tune the base model too (the thesis); False: freeze it")
    recurrent: bool = option(True, "carry h_prev across windows (False: the baseline)")

    def __post_init__(self) -> None:
        positive(self, "window", "bptt_windows")
        check(
            0 <= self.overlap < self.window,
            f"overlap must be in [0, window={self.window}), got {self.overlap}",
        )
        self.ffn_hidden = tuple(int(h) for h in self.ffn_hidden)
        check(
            all(h >= 1 for h in self.ffn_hidden),
            f"ffn_hidden widths must be >= 1, got {self.ffn_hidden}",
        )
        check(
            self.activation in ACTIVATIONS,
            f"activation must be one of {ACTIVATIONS}, got {self.activation!r}",
        )
        check(
            self.pooling in ("mean", "sum"),
            f"pooling must be 'mean' or 'sum', got {self.pooling!r}",
        )
        check(
            self.pool_positions in ("new", "all"),
            f"pool_positions must be 'new' or 'all', got {self.pool_positions!r}",
        )
        check(self.insert_layer >= 0, f"insert_layer must be >= 0, got {self.insert_layer}")

    @property
    def stride(self) -> int:
        return self.window - self.overlap

    def sequence_tokens(self) -> int:
        """Tokens in one training sequence of ``bptt_windows`` windows (inputs and the last
        target)."""
        return self.window + (self.bptt_windows - 1) * self.stride + 1


@dataclass
class RecurrenceTrainConfig:
    """What ``gencraft recurrence train`` trains on and how (with the
    :class:`RecurrenceConfig` flags); ``fit.eval_every`` follows from ``eval_every_tokens``,
    and ``fit.seed`` seeds the shuffle and the recurrence's initialisation."""

    model: str = option("smollm2-135m", "base model (registered name or local path)")
    corpus: str = option(
        "wikitext-2",
        "word-level corpus: wikitext-2, wikitext-103, ptb, or a path to your own (a text file, "
        "or a folder with train.txt, valid.txt and test.txt)",
    )
    lr: float = option(5e-5, "Adam learning rate (after 100 warm-up steps, then constant)")
    recurrence_lr: float | None = option(
        1e-3, "learning rate of the new parameters (α and the FFN; None: lr)"
    )
    eval_every_tokens: int = option(2_000_000, "validate every this many training tokens")
    train_words: int | None = option(None, "first N words of the training split")
    valid_words: int | None = option(20000, "first N words of the validation split")
    # the thesis: 100 warm-up steps, then constant; 2 epochs; early stopping after 3
    fit: FitConfig = fit_options(
        epochs=2, batch_size=1, warmup=100, decay="constant", patience=3, hide=("eval_every",)
    )

    def __post_init__(self) -> None:
        from gencraft.data.lm import LM_CORPORA
        from gencraft.data.own import own_task  # on use: the CLI's startup loads no data

        self.corpus = own_task(self.corpus, LM_CORPORA, "corpus")
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.eval_every_tokens >= 1, "eval_every_tokens must be >= 1")
