"""FAME's plug-in for the shared attention dispatcher (:mod:`gencraft.models.attention`):
read the final decoder layer's attention probabilities [B, n, T, S] during any forward pass.

The probabilities are those of the unmodified attention (softmax(q kᵀ · scaling + bias +
mask), float32); the model's outputs stay those of its own implementation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.attention import (
    READABLE,
    Observer,
    architecture,
    attach,
    attention_sites,
    original_implementation,
)


class FocusCapture(Observer):
    """The shared :class:`~gencraft.models.attention.Observer` under FAME's name: keeps the
    probabilities of every call of the module it is attached to in ``probs`` (the caller
    clears it)."""


def find_attention_module(model: nn.Module, kind: str) -> tuple[str, nn.Module]:
    """The final decoder layer's cross-attention (``kind="cross"``) or self-attention
    (``kind="self"``) module, with its qualified name. Raises for architectures we do not know."""
    sites = [(s, m) for s, m in attention_sites(model) if s.kind == kind and s.stack == "decoder"]
    if not sites:
        raise GencraftError(
            f"{architecture(model)} is not supported by FAME: no {kind}-attention module was "
            "found in its decoder"
        )
    # a sliding-window layer (Gemma-2/3) sees only the last keys: its attention is not over the
    # whole source, and its cache keeps only those keys, so FAME reads the last full layer
    full = [(s, m) for s, m in sites if not getattr(m, "sliding_window", None)]
    if not full:
        raise GencraftError(
            f"{architecture(model)} is not supported by FAME: every {kind}-attention layer of "
            "its decoder attends within a sliding window, and FAME needs one that sees the "
            "whole source"
        )
    site, module = full[-1]
    return site.name, module


def install_capture(model: nn.Module, module: nn.Module) -> tuple[list[torch.Tensor], Any]:
    """Attach a :class:`FocusCapture` to ``module`` of ``model``; return the list into which
    it appends its probabilities at each call, and the handle that detaches it."""
    capture = FocusCapture()
    handle = attach(model, capture, modules=[module])
    impl = original_implementation(module)
    if impl not in READABLE:
        raise GencraftError(
            f"attention implementation {impl!r} cannot be read by FAME; load the model "
            "with attn_implementation='sdpa' or 'eager'"
        )
    return capture.probs, handle
