"""Pieces every gencraft trainer shares: RNG state capture for exact resumption, the
"halve the learning rate when validation gets worse, stop after N evaluations without
improvement" schedule, and atomic checkpoint files."""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gencraft.errors import GencraftError


def rng_state() -> dict[str, Any]:
    """Every generator a training step may draw from (Python, NumPy, torch CPU and CUDA)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a temporary file, so an interrupted save leaves the old file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_torch(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise GencraftError(f"checkpoint file {path} does not exist")
    return torch.load(path, map_location="cpu", weights_only=False)


def write_json(path: str | Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)
