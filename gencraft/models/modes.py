"""The one way a scorer, an analysis or a decoder runs a model it did not train: in eval
mode (no dropout), without a graph, and back in the mode it came in afterwards, also when
the work inside fails."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def scoring(module: nn.Module) -> Iterator[nn.Module]:
    """Inside the block ``module`` is in eval mode and gradients are off; on leaving, the
    module's ``training`` flag is what it was (the flags of its submodules follow it)."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield module
    finally:
        module.train(was_training)
