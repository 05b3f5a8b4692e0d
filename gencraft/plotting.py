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


def heatmap(fig: Any, ax: Any, values: Any, label: str, cmap: str = "viridis") -> Any:
    """``values`` [rows, columns] drawn on ``ax`` with a colorbar labelled ``label``, on a
    scale that shows their variation: logarithmic when the positive values span more than two
    decades (attention and pointer probabilities; the floor four decades below the largest),
    else linear from the smallest to the largest value. A range too narrow to draw (constant
    values: a span under 1e-9 of max(1, |largest value|)) is widened about its middle m by
    max(0.1·|m|, 0.1) each way, set on the image so the colorbar and the cells agree. Returns
    the image."""
    import warnings

    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    v = np.asarray(values, dtype=float)
    positive = v[v > 0]
    log = positive.size > 0 and v.min() >= 0 and positive.max() > 100 * positive.min()
    if log:
        floor = max(float(positive.min()), float(positive.max()) * 1e-4)
        norm = LogNorm(vmin=floor, vmax=float(positive.max()))
        v = np.clip(v, floor, None)
    else:
        with warnings.catch_warnings():  # all missing: drawn about zero, below
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
        if not hi - lo > 1e-9 * max(1.0, abs(lo), abs(hi)):  # NaN too
            mid = (lo + hi) / 2 if np.isfinite(lo + hi) else 0.0
            lo, hi = mid - max(0.1 * abs(mid), 0.1), mid + max(0.1 * abs(mid), 0.1)
        norm = Normalize(vmin=lo, vmax=hi)
    image = ax.imshow(v, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    fig.colorbar(image, ax=ax, label=f"{label}{' (log scale)' if log else ''}", pad=0.01)
    return image


def integer_ticks(axis: Any) -> None:
    """Ticks at whole numbers only on ``axis`` (``ax.xaxis``): decoding steps, an index k."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))
