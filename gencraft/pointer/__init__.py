"""Pointer sentinel mixture models (Merity et al. 2016): the functional mixture core."""

from gencraft.pointer.mixture import pointer_attention, pointer_sentinel_log_probs

__all__ = ["pointer_attention", "pointer_sentinel_log_probs"]
