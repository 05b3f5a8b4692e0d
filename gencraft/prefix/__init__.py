"""Discourse-aware soft prompting (DASP): prefix-tuning with per-segment prefix blocking and
sparse prefix attention. So far the functional core (:mod:`gencraft.prefix.functional`); the
``PrefixModel`` on the shared attention dispatcher follows (issue 14)."""

from gencraft.prefix.functional import (
    prefix_block_mask,
    soft_sparse_attention,
    trunc_sparse_attention,
)

__all__ = ["prefix_block_mask", "soft_sparse_attention", "trunc_sparse_attention"]
