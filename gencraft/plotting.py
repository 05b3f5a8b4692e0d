"""The one way gencraft draws: PNG files only, with matplotlib's file backend (no display)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the ``Agg`` backend (files only; no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
