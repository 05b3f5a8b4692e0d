"""Plots a reader can read: every heat map has a colorbar and a scale that
shows its variation (the pointer gate plot when g is nearly 1, the attention maps), integer
axes get integer ticks, titles name the run."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting functions draw, captured before they are closed."""
    import matplotlib.pyplot as plt

    drawn = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig) or close(fig))
    return drawn


def _spread(image) -> float:
    """How much of the colour scale the bulk of the cells uses (10th to 90th percentile):
    near 0 when nearly every cell has the same colour, e.g. a peaked distribution drawn on a
    linear scale."""
    import numpy as np

    shown = np.asarray(image.norm(image.get_array()))
    return float(np.percentile(shown, 90) - np.percentile(shown, 10))


def test_the_pointer_gate_plot_is_not_blank_when_g_is_nearly_one(tmp_path, figures):
    from gencraft.pointer.analysis import PassageView, plot_passage

    torch.manual_seed(0)
    t, window = 12, 16
    logits = torch.randn(t, window) * 3  # peaked, as a trained pointer's
    share = torch.rand(t, 1) * 1e-9 + 1e-10  # the pointer all but off: 1 - g tiny
    gate = 1 - share[:, 0]  # == 1.0 in float32, as the model's gate after brief training
    attention = torch.softmax(logits, -1) * share  # a_i, summing to 1 - g
    words = [f"w{i}" for i in range(t + 1)]
    view = PassageView(words[:-1], words[1:], gate, attention, [("w0", 0, 0.0)] * t)
    plot_passage(view, tmp_path / "gate.png", title="run-a")
    fig = figures[-1]
    heat, gates = fig.axes[0], fig.axes[1]
    assert _spread(heat.images[0]) > 0.3  # the pointer's distribution shows, whatever g
    rows = heat.images[0].get_array().sum(1).tolist()  # a_i / (1 - g): a distribution each
    assert rows == pytest.approx([1.0] * t, rel=2e-2)
    assert any(a.get_ylabel().startswith("pointer probability") for a in fig.axes)  # colorbar
    widths = [p.get_width() for p in gates.patches]
    low, high = gates.get_xlim()
    assert gates.get_xscale() == "log" and low <= min(widths) and max(widths) <= high
    assert heat.get_title().startswith("run-a: pointer distribution")
    assert all(float(x).is_integer() for x in heat.get_xticks())


def test_attention_maps_have_colorbars_and_show_their_variation(tmp_path, figures):
    from gencraft.prefix.analysis import plot_attention_maps

    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(2, 6, 10) * 6, -1)  # [heads, T, P + T], peaked
    attention = {layer: [probs] for layer in range(3)}
    plot_attention_maps(attention, 4, tmp_path / "maps.png", title="dense/best")
    fig = figures[-1]
    maps = [a for a in fig.axes if a.images]
    colorbars = [a for a in fig.axes if a.get_ylabel().startswith("attention probability")]
    assert len(maps) == 3 and len(colorbars) == 3
    assert all(_spread(a.images[0]) > 0.3 for a in maps)
    assert fig._suptitle.get_text() == "dense/best"


def test_integer_axes_get_integer_ticks(tmp_path, figures):
    from gencraft.prefix.analysis import plot_spectrum

    curve = torch.tensor([0.5, 0.8, 0.95])  # k = 1, 2, 3: ticks 1.5 would mean nothing
    plot_spectrum({"run": {"lower": curve}}, tmp_path / "s.png", "spectrum")
    ax = figures[-1].axes[0]
    assert all(float(x).is_integer() for x in ax.get_xticks())


def test_a_run_is_named_by_its_directory_not_its_path(tmp_path):
    from gencraft.cli.prefix import run_label

    assert run_label(str(tmp_path / "runs" / "dense" / "best")) == "dense/best"
    assert run_label(str(tmp_path / "runs" / "dense")) == "dense"
