"""Tensor records: state that moves together, as one dataclass of tensors sharing their leading
dimensions (a batched search's ``[B, K, ...]``: B rows, K beams or slots). A record is gathered,
selected and concatenated as a whole, never field by field::

    @dataclass
    class Beams(TensorRecord):
        tokens: torch.Tensor  # [B, K, T]
        score: torch.Tensor  # [B, K]

    kept = beams.gather(index)  # index [B, J]: every field [B, J, ...]
    beams = new.where(changed, beams)  # changed [B] or [B, K]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Self

import torch


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x`` [B, C, *rest] at ``index`` [B, J] along dim 1: [B, J, *rest]."""
    shape = (*index.shape, *x.shape[2:])
    return x.gather(1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand(shape))


class TensorRecord:
    """Base of dataclasses whose fields are tensors with the same leading dims [B, C]."""

    def map(self, fn: Callable[..., torch.Tensor], *others: Self) -> Self:
        """A record of ``fn(field, *the same field of others)`` for every field."""
        values = {
            f.name: fn(getattr(self, f.name), *(getattr(o, f.name) for o in others))
            for f in fields(self)  # type: ignore[arg-type]
        }
        return type(self)(**values)

    def gather(self, index: torch.Tensor) -> Self:
        """Entries ``index`` [B, J] of every row: every field [B, J, ...]."""
        return self.map(lambda x: take(x, index))

    def where(self, mask: torch.Tensor, other: Self) -> Self:
        """This record where ``mask`` ([B] or [B, C], broadcast over the rest), else ``other``."""

        def pick(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.where(mask.view(*mask.shape, *([1] * (x.dim() - mask.dim()))), x, y)

        return self.map(pick, other)

    def cat(self, other: Self) -> Self:
        """This record's entries, then ``other``'s, along dim 1: [B, C + C', ...]."""
        return self.map(lambda x, y: torch.cat([x, y], dim=1), other)
