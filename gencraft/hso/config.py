"""HSO's settings (Yoshida 2023, §3.3–3.5) and those of its dynamic-evaluation baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gencraft.config import check, option, positive

OPTIMIZERS = ("adam", "sgd")


def _betas(betas: tuple[float, float] | list[float]) -> tuple[float, float]:
    check(len(betas) == 2, f"betas must be two numbers, got {betas!r}")
    b = (float(betas[0]), float(betas[1]))
    check(all(0.0 <= x < 1.0 for x in b), f"betas must lie in [0, 1), got {b}")
    return b


@dataclass
class HSOConfig:
    """Hidden-state optimisation: one forward and one backward per window of ``window``
    tokens; the thesis's LM setting is the default."""

    window: int = option(25, "k: tokens per window (one update per window)")
    lr: float = option(0.003, "learning rate η of the hidden-state updates (0: the plain model)")
    betas: tuple[float, float] = option((0.65, 0.9), "Adam's (β1, β2)")
    eps: float = option(1e-8, "Adam's ε")
    steps: int = option(1, "updates per window (2: HSO-2)")
    present_only: bool = option(False, "update only the window's own (present) states")
    optimizer: Literal["adam", "sgd"] = option("adam", "per-state Adam, or plain SGD")
    max_context: int | None = option(
        None, "states kept; older ones are dropped with their moments (None: all)"
    )
    reset_every: int | None = option(
        None,
        "inputs per context: the state is reset between contexts (the thesis's GPT-2 "
        "runs reset every 1024 tokens; None: one context)",
    )

    def __post_init__(self) -> None:
        positive(self, "window", "steps")
        positive(self, "max_context", "reset_every", allow_none=True)
        check(math.isfinite(self.lr) and self.lr >= 0, f"lr must be >= 0, got {self.lr}")
        check(self.eps > 0, f"eps must be > 0, got {self.eps}")
        check(
            self.optimizer in OPTIMIZERS,
            f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}",
        )
        self.betas = _betas(self.betas)


@dataclass
class DynamicEvalConfig:
    """Dynamic evaluation (Krause et al. 2018) as the thesis runs it for its baseline: the
    weights take a step on every ``window`` tokens' loss, the hidden states are recomputed
    after each update, and the weights are reset at each context."""

    window: int = option(25, "tokens per update")
    lr: float = option(1e-4, "learning rate of the weight updates (the thesis's few-shot DE)")
    optimizer: Literal["adam", "sgd"] = option("sgd", "SGD (Krause et al.) or Adam")
    betas: tuple[float, float] = option((0.9, 0.999), "Adam's (β1, β2)")
    reset_every: int | None = option(None, "inputs per context (weights reset between them)")

    def __post_init__(self) -> None:
        positive(self, "window")
        positive(self, "reset_every", allow_none=True)
        check(math.isfinite(self.lr) and self.lr >= 0, f"lr must be >= 0, got {self.lr}")
        check(
            self.optimizer in OPTIMIZERS,
            f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}",
        )
        self.betas = _betas(self.betas)
