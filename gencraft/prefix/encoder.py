"""The prefixes of one stack, laid out as peft's ``PrefixEncoder`` (so a peft adapter loads by
copying): an embedding [P, L·2·n_kv·d], or with ``projection`` an embedding [P, n_kv·d] and an
MLP ``transform``."""

from __future__ import annotations

import torch
from torch import nn


class PrefixEncoder(nn.Module):
    """One stack's prefixes, laid out as peft's ``PrefixEncoder``.

    ``forward() -> [L·2, n_kv, P, d]``: per layer l, the keys at 2l and the values at 2l + 1.
    """

    def __init__(
        self,
        num_virtual_tokens: int,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        projection: bool = False,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.shape = (num_virtual_tokens, num_layers, kv_heads, head_dim)
        token_dim = kv_heads * head_dim
        self.projection = projection
        if projection:
            self.embedding = nn.Embedding(num_virtual_tokens, token_dim)
            self.transform = nn.Sequential(
                nn.Linear(token_dim, hidden or token_dim),
                nn.Tanh(),
                nn.Linear(hidden or token_dim, num_layers * 2 * token_dim),
            )
        else:
            self.embedding = nn.Embedding(num_virtual_tokens, num_layers * 2 * token_dim)

    def forward(self) -> torch.Tensor:
        p, layers, n, d = self.shape
        out = self.embedding.weight
        if self.projection:
            out = self.transform(out)
        return out.view(p, layers * 2, n, d).permute(1, 2, 0, 3)

    def layer_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (key, value), each [1, n_kv, P, d]."""
        kv = self()
        return [(kv[2 * i][None], kv[2 * i + 1][None]) for i in range(self.shape[1])]
