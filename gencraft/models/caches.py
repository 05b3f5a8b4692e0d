"""The cache algebra of gencraft, in one place: what stepping, exact search and HSO do to a
key/value cache.

* Per-layer ``(key, value)`` lists and back: :func:`kv_pairs` reads a cache (an
  encoder-decoder's self-attention part, with its cross part beside it), :func:`build_cache`
  builds one, :func:`flat_states` and :func:`layer_pairs` turn the pairs into one flat list of
  2L tensors (what an optimiser updates) and back.
* Rows and positions: :func:`select_row` and :func:`cat_rows` (one row out, rows together),
  :func:`left_pad` (a row's states padded to a width), :func:`concat_positions` (parts of a
  path joined along the sequence), :func:`last_position` and :func:`state_bytes`.
* Caches with state of their own: :class:`KVStates` (HSO's optimised states, with the shifts
  whose gradient is the present states') and :class:`RowStateCache` (per-row tensors that
  ``generate`` reorders with the keys and values: TruncSA's running column mass), with
  :func:`carrying_row_state`, :func:`current_row_state` and :class:`RowStateGeneration` (a
  model whose ``generate`` decodes over one, the model itself untouched).

Shapes: ``(key, value)`` [N, h, S, d] per layer (N rows, h key/value heads, S positions).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.attention import attention_context, current_context
from gencraft.models.compat import (
    CACHE_ARG,
    Cache,
    DynamicCache,
    DynamicLayer,
    EncoderDecoderCache,
    given_cache,
)
from gencraft.models.introspect import hf_model

KV = list[tuple[torch.Tensor, torch.Tensor]]


def self_attention_layers(cache: Any) -> list[Any]:
    """The self-attention layers of a cache (an encoder-decoder's cross part never changes)."""
    return list(getattr(cache, "self_attention_cache", cache).layers)


def kv_pairs(cache: Any) -> tuple[KV, Any]:
    """(per layer the self-attention ``(key, value)`` [N, h, S, d], the cross-attention cache or
    None) of a cache."""
    kv = [(ly.keys, ly.values) for ly in self_attention_layers(cache)]
    return kv, getattr(cache, "cross_attention_cache", None)


def build_cache(kv: Sequence[tuple[torch.Tensor, torch.Tensor]], cross: Any) -> Any:
    """A fresh cache of the given self-attention states (and an encoder-decoder's cross part)."""
    self_cache = DynamicCache([tuple(x) for x in kv])
    return EncoderDecoderCache(self_cache, cross) if cross is not None else self_cache


def select_row(cross: Any, i: int) -> Any:
    """Row i of a (cross-attention) cache's layers, as a cache of its own."""
    return DynamicCache(
        [(ly.keys[i : i + 1].clone(), ly.values[i : i + 1].clone()) for ly in cross.layers]
    )


def cat_rows(crosses: Sequence[Any]) -> Any:
    """(Cross-attention) caches of one row each (equal widths), as one of N rows."""
    layers = range(len(crosses[0].layers))
    return DynamicCache(
        [
            (
                torch.cat([c.layers[i].keys for c in crosses]),
                torch.cat([c.layers[i].values for c in crosses]),
            )
            for i in layers
        ]
    )


def left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` [1, h, S, d] with zeros before it along S, to ``width``."""
    if x.shape[-2] == width:
        return x
    pad = x.new_zeros(*x.shape[:-2], width - x.shape[-2], x.shape[-1])
    return torch.cat([pad, x], dim=-2)


def concat_positions(parts: Sequence[KV]) -> KV:
    """Per layer the ``(key, value)`` of ``parts`` (a path's pieces, root first) joined along
    the sequence axis."""
    return [
        (torch.cat([p[i][0] for p in parts], dim=-2), torch.cat([p[i][1] for p in parts], dim=-2))
        for i in range(len(parts[0]))
    ]


def last_position(cache: Any) -> KV:
    """Per layer the ``(key, value)`` [N, h, 1, d] of a cache's last position (cloned: a view
    would keep the whole cache alive)."""
    return [
        (ly.keys[..., -1:, :].clone(), ly.values[..., -1:, :].clone())
        for ly in self_attention_layers(cache)
    ]


def state_bytes(kv: KV) -> int:
    """The bytes the ``(key, value)`` pairs hold."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def flat_states(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Per-layer ``(key, value)`` pairs as one flat list of 2L tensors (layer i's key at 2i,
    its value at 2i + 1)."""
    return [t for pair in pairs for t in pair]


def layer_pairs(flat: Sequence[torch.Tensor]) -> KV:
    """2L tensors (layer i's key at 2i, its value at 2i + 1) as per-layer ``(key, value)``."""
    return list(zip(flat[0::2], flat[1::2], strict=True))


class _StateLayer(DynamicLayer):
    """A ``DynamicLayer`` that starts from given keys/values and adds ``shift`` to the next
    states it receives. With no shift given, the shift is a zero leaf that requires grad, so
    the gradient of a loss with respect to it is the gradient with respect to those new
    (present) states."""

    def __init__(self, key=None, value=None, shift=None) -> None:
        super().__init__()
        self.shift = shift
        if key is not None:
            DynamicLayer.update(self, key, value)

    def update(self, key_states, value_states, *args, **kwargs):
        if self.shift is None:
            self.shift = tuple(
                torch.zeros_like(t, dtype=t.dtype).requires_grad_(True)
                for t in (key_states, value_states)
            )
        dk, dv = self.shift
        return super().update(key_states + dk, value_states + dv, *args, **kwargs)


class KVStates(DynamicCache):
    """A KV cache built from per-layer states, for methods that optimise them (HSO).

    Args:
        states: per layer ``(key, value)`` [B, n_kv, S, d] (S may be 0 / None for an empty
            cache); gradients flow back to these tensors.
        shifts: per layer ``(dk, dv)`` [B, n_kv, t, d] added to the t new states of the next
            forward; None gives zero leaves that require grad (read them from :attr:`shifts`
            after the forward).
        num_layers: the number of layers when ``states`` is None.
    """

    def __init__(
        self,
        states: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
        shifts: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
        *,
        num_layers: int | None = None,
    ) -> None:
        n = len(states) if states is not None else num_layers
        if n is None:
            raise GencraftError("KVStates needs states or num_layers")
        layers = []
        for i in range(n):
            k, v = states[i] if states is not None else (None, None)
            if k is not None and k.shape[-2] == 0:
                k = v = None
            layers.append(_StateLayer(k, v, shifts[i] if shifts is not None else None))
        Cache.__init__(self, layers=layers)

    @property
    def shifts(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the ``(dk, dv)`` added to the last forward's new states."""
        return [layer.shift for layer in self.layers]

    def states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(key, value)`` [B, n_kv, S, d], cached and new."""
        return [(layer.keys, layer.values) for layer in self.layers]


class RowStateCache(DynamicCache):
    """A ``DynamicCache`` that also carries per-row tensors (dim 0: the cache's rows) for
    attention plug-ins whose rows depend on earlier queries' attention (e.g. causal TruncSA's
    running column mass). ``generate`` reorders, repeats and selects them with the keys and
    values, so beam search keeps each hypothesis's own state. Plug-ins reach the store through
    :func:`current_row_state` inside :func:`carrying_row_state`.

    Args:
        layers: per layer ``(key, value)`` [B, n_kv, S, d] to start from (None: empty).
    """

    def __init__(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        super().__init__(layers)
        self.row_state: dict[Any, torch.Tensor] = {}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        for k, v in self.row_state.items():
            self.row_state[k] = v.index_select(0, beam_idx.to(v.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        for k, v in self.row_state.items():
            self.row_state[k] = v.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        for k, v in self.row_state.items():
            self.row_state[k] = v[indices]


def row_state_cache(model: nn.Module) -> Cache:
    """An empty cache for ``model`` whose self-attention part is a :class:`RowStateCache`."""
    if getattr(hf_model(model).config, "is_encoder_decoder", False):
        return EncoderDecoderCache(RowStateCache(), DynamicCache())
    return RowStateCache()


@contextmanager
def carrying_row_state(cache: Cache) -> Iterator[dict[Any, torch.Tensor]]:
    """Within the block, :func:`current_row_state` is ``cache``'s row store (the
    :class:`RowStateCache` itself, or an ``EncoderDecoderCache``'s self-attention part)."""
    rows = getattr(cache, "self_attention_cache", cache)
    if not isinstance(rows, RowStateCache):
        raise GencraftError(f"expected a RowStateCache, got {type(rows).__name__}")
    with attention_context(row_state=rows.row_state):
        yield rows.row_state


def current_row_state() -> dict[Any, torch.Tensor] | None:
    """The row store of the enclosing :func:`carrying_row_state` (None outside one)."""
    return current_context().row_state


class RowStateGeneration(nn.Module):
    """``base`` whose ``generate`` decodes over a :class:`RowStateCache` inside
    :func:`carrying_row_state` (for attention plug-ins that keep per-row state: causal
    TruncSA's running column mass), without touching ``base``: the forward pass and every
    other attribute are ``base``'s. A cache given to ``generate`` is used as it is;
    ``use_cache=False`` decodes without one."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base":  # not set yet
                raise
            return getattr(self.base, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.base(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_cache") is False:
            return self.base.generate(*args, **kwargs)
        if given_cache(kwargs) is None:
            kwargs.pop("past_key_values", None)
            kwargs[CACHE_ARG] = row_state_cache(self.base)
        with carrying_row_state(given_cache(kwargs)):
            return self.base.generate(*args, **kwargs)
