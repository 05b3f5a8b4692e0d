"""Discourse-aware soft prompting (DASP): prefix-tuning with per-segment prefix blocking
(UniBlock, HierBlock) and sparse prefix attention (TruncSA, SoftSA and their hierarchical
variants), on any Hugging Face causal LM or encoder-decoder (docs/prefix.md).

* :class:`PrefixConfig` and :class:`PrefixModel` (``forward``, ``generate``,
  ``prefix_cache``, ``save_pretrained``/``from_pretrained``, ``from_peft``);
* :func:`sparse_attention`: the same normalisers on a model without prefixes (the paper's
  full fine-tuning control rows);
* the functional core: :func:`prefix_block_mask`, :func:`trunc_sparse_attention`,
  :func:`soft_sparse_attention`.
"""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.prefix.config": ("PrefixConfig",),
        "gencraft.prefix.functional": (
            "prefix_block_mask",
            "soft_sparse_attention",
            "trunc_sparse_attention",
        ),
        "gencraft.prefix.model": (
            "PrefixModel",
            "sparse_attention",
        ),
    },
)
