"""Small shared helpers: cache location, offline detection, seeding, the default device."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

_TRUE = {"1", "true", "yes", "on"}


def cache_dir(*parts: str) -> Path:
    """The gencraft cache (``$GENCRAFT_CACHE``, else ``$XDG_CACHE_HOME/gencraft``,
    else ``~/.cache/gencraft``), joined with ``parts``. Not created here."""
    root = os.environ.get("GENCRAFT_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "gencraft")
    return Path(root).expanduser().joinpath(*parts)


def is_offline() -> bool:
    """True when the user asked for no network (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``
    or ``GENCRAFT_OFFLINE`` set to a true value)."""
    return any(
        os.environ.get(k, "").strip().lower() in _TRUE
        for k in ("GENCRAFT_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_device() -> str:
    """``"cuda"`` when a GPU is there (``"cuda:<local rank>"`` under a launcher: one GPU per
    process, not all on GPU 0), else ``"cpu"`` (where experiments run by default)."""
    if not torch.cuda.is_available():
        return "cpu"
    return "cuda" if world_size() == 1 else f"cuda:{local_gpu()}"


def local_gpu() -> int:
    """This process's GPU under ``accelerate launch``/torchrun: ``LOCAL_RANK`` modulo the
    visible GPUs (0 alone)."""
    try:
        rank = int(os.environ.get("LOCAL_RANK") or 0)
    except ValueError:
        rank = 0
    return rank % max(1, torch.cuda.device_count())


def world_size() -> int:
    """Processes of this run (``accelerate launch``/torchrun set ``WORLD_SIZE``; 1 alone)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE") or 1))
    except ValueError:
        return 1


def world_rank() -> int:
    """This process's rank (torchrun sets ``RANK``; 0 alone): only rank 0 prints and writes."""
    try:
        return int(os.environ.get("RANK") or 0)
    except ValueError:
        return 0
