"""Old name of :mod:`gencraft.models.persistence` (kept so existing imports work)."""

from gencraft.models.persistence import load_base, read_head, save_head

__all__ = ["load_base", "read_head", "save_head"]
