"""Schedules every trainer shares: learning-rate warm-up/decay, "halve the learning rate when
validation gets worse" (Merity et al. 2016), truncated-BPTT windows and stream batching."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from gencraft.errors import GencraftError


def warmup_schedule(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup: float | int = 0,
    decay: Literal["linear", "constant", "cosine"] = "linear",
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup`` steps (a float in [0, 1) is a fraction of
    ``total_steps``), then ``decay`` to 0 at ``total_steps`` (linear, cosine) or constant."""
    if total_steps < 1:
        raise GencraftError(f"total_steps must be >= 1, got {total_steps}")
    n_warm = int(warmup * total_steps) if isinstance(warmup, float) and warmup < 1 else int(warmup)
    if n_warm < 0:
        raise GencraftError(f"warmup must be >= 0, got {warmup}")
    if decay not in ("linear", "constant", "cosine"):
        raise GencraftError(f"decay must be linear, constant or cosine, got {decay!r}")

    # the same factors as transformers' get_{linear,cosine,constant}_schedule_with_warmup
    def factor(step: int) -> float:
        if step < n_warm:
            return step / max(1, n_warm)
        if decay == "constant":
            return 1.0
        done = min(1.0, (step - n_warm) / max(1, total_steps - n_warm))
        return 1.0 - done if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class PlateauSchedule:
    """Multiply the learning rate by ``decay`` when the validation loss is worse than at the
    previous evaluation; stop after ``patience`` evaluations without a new best (Merity et al.
    2016 / Zaremba et al. 2014 style)."""

    decay: float = 0.5
    patience: int = 3
    best: float = float("inf")
    previous: float = float("inf")
    bad_evals: int = 0
    history: list[float] = field(default_factory=list)

    def step(self, value: float) -> tuple[bool, bool, bool]:
        """Record a validation value: ``(improved, decay_lr, stop)``."""
        self.history.append(value)
        improved = value < self.best
        decay_lr = value > self.previous
        self.previous = value
        if improved:
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        return improved, decay_lr, self.bad_evals >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for k, v in d.items():
            setattr(self, k, v)


@dataclass(frozen=True)
class Step:
    """One truncated-BPTT step over stream positions (inputs; target = next position).

    ``[start, grad_start)`` re-run without gradient (window regeneration),
    ``[grad_start, end)`` backpropagated, ``[loss_start, end)`` scored,
    ``keep``: carry the state after ``start + keep`` positions to the next step.
    """

    start: int
    grad_start: int
    loss_start: int
    end: int
    keep: int


def tbptt_schedule(n: int, k1: int, k2: int, prefix: int) -> Iterator[Step]:
    """Steps covering inputs ``0 .. n - 1`` (n = stream length - 1). ``prefix``: how many states
    before a scored position its window reaches (L - 1 for the pointer with regeneration, else
    0); those outside the backpropagated span are re-run without gradient."""

    def span(t: int) -> tuple[int, int, int]:
        end = min(t + k1, n)
        grad_start = max(0, end - k2)
        start = min(grad_start, max(0, t - prefix))
        return start, grad_start, end

    t = 0
    while t < n:
        start, grad_start, end = span(t)
        nxt = span(end)[0] if end < n else end
        yield Step(start, grad_start, t, end, nxt - start)
        t = end


def batchify(
    ids: torch.Tensor, batch_size: int, what: str = "the corpus", flag: str = "--batch-size"
) -> torch.Tensor:
    """[N] -> [B, N // B]: B contiguous streams (the tail that does not fill a row is dropped).
    ``what`` and ``flag`` name the split and the flag that set B in the error."""
    n = ids.numel() // batch_size
    if n < 2:
        raise GencraftError(
            f"{what}: {ids.numel()} tokens are too few for {batch_size} streams of at least 2 "
            f"tokens; lower {flag}"
        )
    return ids[: n * batch_size].view(batch_size, n)
