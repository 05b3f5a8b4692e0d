"""The focus attention head (FAME, Aralikatte et al. 2021, §2).

Shapes: B batch, S source length, T target length, h hidden size, h' intermediate size,
V vocabulary, n heads.

    t_{x_i} = GELU(x_i W1) W2 Eᵀ                 token-level vocabulary scores, [B, S, V]
    T_X     = mean over non-padding i of t_{x_i}  topic logits, [B, V]
    f_t     = Σ_i a_{t,i} t_{x_i}                 focus bias, [B, T, V]
    logits  = y_t E + f_t                          (eq. 2)

Because t_{x_i} is linear in g_i = GELU(x_i W1) W2, we compute T_X = mean(g) Eᵀ and
f_t = (Σ_i a_{t,i} g_i) Eᵀ: the same numbers without a [B, S, V] tensor (t_x itself is
returned only on request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn


@dataclass
class FocusOutput:
    """``topic_logits`` T_X [B, V]; ``focus_bias`` f [B, T, V] (None without attention);
    ``token_logits`` t_x [B, S, V] (only when asked for)."""

    topic_logits: torch.Tensor
    focus_bias: torch.Tensor | None
    token_logits: torch.Tensor | None = None


class FocusHead(nn.Module):
    """W1 [h, h'], GELU, W2 [h', h]; the vocabulary projection is the model's own (tied) output
    embedding E [V, h], passed to :meth:`forward`, so the head adds 2·h·h' (+ biases)
    parameters.

    Args:
        hidden_size: h (the encoder's output size; must equal E's width).
        intermediate_size: h' (default 4h; the paper's is not stated, 4096 for h = 1024 fits
            its +8M parameters).
        bias: biases in W1, W2 (the paper does not mention them).
        heads: how the final layer's cross-attention heads become one distribution:
            ``"mean"`` (default) or the index of one head.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int | None = None,
        *,
        bias: bool = True,
        heads: Literal["mean"] | int = "mean",
    ) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be positive, got {hidden_size}")
        if heads != "mean" and not isinstance(heads, int):
            raise ValueError(f"heads must be 'mean' or a head index, got {heads!r}")
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.heads = heads
        self.w1 = nn.Linear(hidden_size, self.intermediate_size, bias=bias)
        self.w2 = nn.Linear(self.intermediate_size, hidden_size, bias=bias)
        self.act = nn.GELU()

    def project(self, encoder_states: torch.Tensor) -> torch.Tensor:
        """g = GELU(x W1) W2, [B, S, h]."""
        return self.w2(self.act(self.w1(encoder_states)))

    def reduce_heads(self, attention: torch.Tensor) -> torch.Tensor:
        """[B, n, T, S] (or already [B, T, S]) -> [B, T, S]."""
        if attention.dim() == 3:
            return attention
        if attention.dim() != 4:
            raise ValueError(
                f"attention must be [B, n, T, S] or [B, T, S], got {tuple(attention.shape)}"
            )
        if self.heads == "mean":
            return attention.mean(1)
        if not -attention.shape[1] <= self.heads < attention.shape[1]:
            raise ValueError(f"head {self.heads} does not exist ({attention.shape[1]} heads)")
        return attention[:, self.heads]

    def forward(
        self,
        encoder_states: torch.Tensor,
        source_mask: torch.Tensor | None,
        embedding_weight: torch.Tensor,
        attention: torch.Tensor | None = None,
        *,
        return_token_logits: bool = False,
        projected: torch.Tensor | None = None,
    ) -> FocusOutput:
        """Args:
        encoder_states: [B, S, h], the source representations x_i.
        source_mask: [B, S], 1/True = real token (None = all real).
        embedding_weight: [V, h], the (tied) output embedding E.
        attention: [B, n, T, S] or [B, T, S], the final decoder layer's attention over the
            source for each target position (None: no focus bias, e.g. topic loss only).
        projected: a precomputed :meth:`project` of ``encoder_states`` (generation reuses it).
        """
        if encoder_states.dim() != 3 or encoder_states.shape[2] != self.hidden_size:
            raise ValueError(
                f"encoder_states must be [B, S, {self.hidden_size}], got "
                f"{tuple(encoder_states.shape)}"
            )
        b, s, _ = encoder_states.shape
        if embedding_weight.dim() != 2 or embedding_weight.shape[1] != self.hidden_size:
            raise ValueError(
                f"embedding_weight must be [V, {self.hidden_size}], got "
                f"{tuple(embedding_weight.shape)}"
            )
        if source_mask is None:
            mask = torch.ones(b, s, dtype=torch.bool, device=encoder_states.device)
        else:
            if tuple(source_mask.shape) != (b, s):
                raise ValueError(
                    f"source_mask must be [B, S] = [{b}, {s}], got {tuple(source_mask.shape)}"
                )
            mask = source_mask.bool()
        n_real = mask.sum(1)
        if bool((n_real == 0).any()):
            rows = (n_real == 0).nonzero().flatten().tolist()
            raise ValueError(f"source rows {rows} have no non-padding token")
        g = self.project(encoder_states) if projected is None else projected
        g = g.masked_fill(~mask.unsqueeze(2), 0.0)
        e = embedding_weight.to(g.dtype)
        topic = self.pooled(g, mask) @ e.t()  # (B, V)
        bias = None
        if attention is not None:
            bias = self.focus_states(attention, g, mask) @ e.t()  # (B, T, V)
        token = g @ e.t() if return_token_logits else None
        return FocusOutput(topic, bias, token)

    @staticmethod
    def pooled(g: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean of ``g`` [B, S, h] over real positions (``mask`` [B, S] bool; ``g`` already zero
        under padding) -> [B, h]; T_X = pooled · Eᵀ."""
        return g.sum(1) / mask.sum(1, keepdim=True).to(g.dtype)

    def focus_states(
        self, attention: torch.Tensor, g: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Σ_i a_{t,i} g_i, [B, T, h] (f_t = this · Eᵀ), from ``attention`` [B, n, T, S] or
        [B, T, S], ``g`` [B, S, h] and ``mask`` [B, S] bool; padded positions get zero weight."""
        a = self.reduce_heads(attention)
        b, s = mask.shape
        if a.shape[0] != b or a.shape[2] != s:
            raise ValueError(f"attention must cover [B = {b}, T, S = {s}], got {tuple(a.shape)}")
        a = a.to(g.dtype).masked_fill(~mask.unsqueeze(1), 0.0)
        return torch.bmm(a, g)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
