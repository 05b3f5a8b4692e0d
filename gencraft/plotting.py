"""The one way gencraft draws: PNG files only, with matplotlib's file backend (no display)."""

from __future__ import annotations

from typing import Any

from gencraft.extras import require


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the ``Agg`` backend (files only; no display needed)."""
    matplotlib = require("matplotlib", "plots", "drawing PNGs")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plots", "drawing PNGs")

    return plt
