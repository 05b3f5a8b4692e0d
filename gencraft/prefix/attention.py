"""DASP's plug-ins on gencraft's attention dispatcher (:mod:`gencraft.models.attention`).

* :class:`PrefixKeyValues` adds a stack's prefix key/value columns to the encoder's
  self-attention and (optionally) the decoder's cross-attention. The decoder's self-attention
  prefixes live in the KV cache instead (peft's convention), so that ``generate`` and the
  positions of the real tokens are exactly those of prefix-tuning with ``past_key_values``.
* :class:`PrefixAttention` replaces the softmax of chosen layers: it blocks the prefix
  columns a query's segment does not own (UniBlock/HierBlock) and applies the normaliser
  (softmax, TruncSA, SoftSA, sparsemax, entmax-1.5).

In both cases the prefix columns are the first P key columns of the attention call. The
per-call state (the prefix tensors, the block tables, a record store) travels in
:func:`~gencraft.models.attention.attention_context` as its ``prefix`` field, so the
plug-ins are inert outside a ``PrefixModel`` call and the base model is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gencraft.errors import ConfigError
from gencraft.models.attention import (
    AttentionCall,
    AttentionPlugin,
    ExtraKeyValues,
    current_context,
)
from gencraft.models.caches import current_row_state
from gencraft.prefix.config import require_entmax
from gencraft.prefix.functional import column_mass, nucleus_rows, soft_sparse_attention


@dataclass
class PrefixCall:
    """State of one ``PrefixModel`` call.

    ``owner``: the id of the PrefixModel; ``kv[(stack, kind)]``: per layer (key, value)
    [1, n_kv, P, d] of the stacks that extend keys; ``tables[stack]``: bool [B, Tq, P], which
    prefix columns the query at each position (after the prefix) may see, None when nothing is
    blocked; ``record``: when a dict, the probabilities [B, n, T, K] of every layer the
    plug-ins act on are kept under ``(stack, kind, layer)``.
    """

    owner: int
    kv: dict[tuple[str, str], list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    tables: dict[str, torch.Tensor | None] = field(default_factory=dict)
    record: dict[tuple[str, str, int], torch.Tensor] | None = None


def _state(owner: int) -> PrefixCall | None:
    state = current_context().prefix
    return state if state is not None and state.owner == owner else None


def _rows(table: torch.Tensor, n: int) -> torch.Tensor:
    """``table`` [B, ...] for a call over ``n`` rows (generate's beams/samples are B·k rows,
    each example's k copies contiguous)."""
    b = table.shape[0]
    if b == n:
        return table
    if n % b:
        raise RuntimeError(f"attention call over {n} rows cannot come from {b} examples")
    return table.repeat_interleave(n // b, dim=0)


class PrefixKeyValues(AttentionPlugin):
    """Prefix key/value columns from the current :class:`PrefixCall` (``kv[(stack, kind)]``)."""

    def __init__(self, owner: int) -> None:
        self.owner = owner

    def active(self, call: AttentionCall) -> bool:
        state = _state(self.owner)
        return state is not None and (call.site.stack, call.site.kind) in state.kv

    def extend(self, call: AttentionCall) -> ExtraKeyValues | None:
        state = _state(self.owner)
        k, v = state.kv[(call.site.stack, call.site.kind)][call.site.layer]
        n = call.query.shape[0]
        return ExtraKeyValues(
            k.expand(n, *k.shape[1:]).to(call.key.dtype),
            v.expand(n, *v.shape[1:]).to(call.value.dtype),
        )


def normalize_rows(
    name: str,
    scores: torch.Tensor,
    allowed: torch.Tensor,
    *,
    top_p: float,
    tau: float,
    trunc_renormalize: bool,
    noise: bool,
    query_mask: torch.Tensor | None = None,
    causal: bool = False,
    past_mass: torch.Tensor | None = None,
    mass_out: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One of DASP's normalisers over the last axis of ``scores`` [B, n, T, K] (disallowed
    entries already at the dtype's minimum; ``allowed`` bool, broadcastable). Disallowed
    entries and fully masked rows come out exactly 0. TruncSA: ``query_mask`` [B, 1, T] the
    queries that count in the column sums; ``causal``/``past_mass`` [B, n, K0] as in
    :func:`~gencraft.prefix.functional.column_mass`; ``mass_out["last"]`` receives the column
    mass [B, n, K] after the last query (causal)."""
    if name == "softmax":
        probs = torch.softmax(scores, dim=-1)
    elif name == "truncsa":
        probs = torch.softmax(scores, dim=-1) * allowed
        mass = column_mass(probs, query_mask, causal=causal, past=past_mass)
        if mass_out is not None:
            mass_out["last"] = mass[..., -1, :]
        probs = nucleus_rows(probs, mass, top_p, trunc_renormalize)
    elif name == "softsa":
        probs = soft_sparse_attention(scores, tau, noise=noise)
    elif name in ("sparsemax", "entmax15"):
        entmax = require_entmax()
        fn = entmax.sparsemax if name == "sparsemax" else entmax.entmax15
        probs = fn(scores, dim=-1)
    else:  # PrefixConfig validates the name
        raise ValueError(name)
    probs = probs * allowed
    return probs * allowed.any(dim=-1, keepdim=True)


def _site_key(call: AttentionCall) -> tuple[str, str, str, int]:
    return ("truncsa", call.site.stack, call.site.kind, call.site.layer)


class PrefixAttention(AttentionPlugin):
    """Blocking of prefix columns plus a normaliser, on one stack/kind's layers.

    Args:
        owner: the PrefixModel's id (None: always active, for full fine-tuning controls).
        num_prefix: P, the prefix columns at the front of this module's keys (0: none).
        blocked: layer indices where the segment tables apply.
        sparse: layer indices where ``config.normalizer`` replaces the softmax.
        config: the :class:`~gencraft.prefix.PrefixConfig` (normaliser settings).
    """

    normalizes = True

    def __init__(
        self,
        owner: int | None,
        num_prefix: int,
        blocked: set[int],
        sparse: set[int],
        config: Any,
    ) -> None:
        self.owner, self.num_prefix = owner, num_prefix
        self.blocked, self.sparse, self.config = blocked, sparse, config

    def _table(self, call: AttentionCall) -> torch.Tensor | None:
        state = _state(self.owner) if self.owner is not None else None
        if state is None or call.site.kind != "self" or call.site.layer not in self.blocked:
            return None
        return state.tables.get(call.site.stack)

    def active(self, call: AttentionCall) -> bool:
        if self.owner is not None:
            state = _state(self.owner)
            if state is None:
                return False
            if state.record is not None:
                return True
        return call.site.layer in self.sparse or self._table(call) is not None

    def _trunc_inputs(
        self, scores: torch.Tensor, allowed: torch.Tensor, call: AttentionCall
    ) -> dict[str, Any]:
        """TruncSA's query mask and, on a causal stack, the column mass of earlier steps."""
        t, k = scores.shape[-2:]
        p = self.num_prefix
        query_mask = None
        if call.site.kind == "self" and t <= k - p:
            # a query counts when it may see itself (padding may not: its column is masked)
            own = torch.arange(t, device=scores.device) + (k - t)
            a = allowed.expand(torch.broadcast_shapes(allowed.shape, scores.shape))
            query_mask = a[:, :1, torch.arange(t, device=scores.device), own]  # [B, 1, T]
        if not call.autoregressive:
            return {"query_mask": query_mask}
        # a causal stack: each query's key importance comes from the queries up to itself
        store = current_row_state()
        past = store.get(_site_key(call)) if store is not None else None
        earlier = k - p - t  # cached queries before these (self-attention)
        if past is None and call.site.kind == "self" and earlier > 0:
            raise ConfigError(
                "TruncSA on a causal stack needs the column mass of the earlier queries, which "
                "a RowStateCache carries: decode through PrefixModel.generate or, for a model "
                "under sparse_attention(), RowStateGeneration(model).generate, or with "
                "use_cache=False"
            )
        if past is not None and past.shape[0] != scores.shape[0]:
            raise RuntimeError(
                f"TruncSA's running column mass has {past.shape[0]} rows, the call "
                f"{scores.shape[0]}"
            )
        return {"query_mask": query_mask, "causal": True, "past_mass": past, "mass_out": {}}

    def normalize(
        self, scores: torch.Tensor, allowed: torch.Tensor, call: AttentionCall
    ) -> torch.Tensor:
        t, k = scores.shape[-2:]
        p = self.num_prefix
        table = self._table(call)
        if table is not None and p:
            # query i sits at position k - p - t + i after the prefix (cache or extended keys)
            start = k - p - t
            rows = _rows(table, scores.shape[0])[:, start : start + t]  # [B, T, P]
            shape = torch.broadcast_shapes(allowed.shape, scores.shape)
            allowed = allowed.expand(shape).clone()
            allowed[..., :p] &= rows[:, None]
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        name = self.config.normalizer if call.site.layer in self.sparse else "softmax"
        state = _state(self.owner) if self.owner is not None else None
        trunc: dict[str, Any] = {}
        if name == "truncsa":
            trunc = self._trunc_inputs(scores, allowed, call)
        probs = normalize_rows(
            name,
            scores,
            allowed,
            top_p=self.config.top_p,
            tau=self.config.tau,
            trunc_renormalize=self.config.trunc_renormalize,
            noise=call.module.training or self.config.softsa_eval_noise,
            **trunc,
        )
        store = current_row_state()
        if trunc.get("causal") and store is not None:
            store[_site_key(call)] = trunc["mass_out"]["last"]
        if state is not None and state.record is not None:
            state.record[(call.site.stack, call.site.kind, call.site.layer)] = probs.detach()
        return probs
