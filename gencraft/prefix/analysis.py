"""DASP's analyses: attention maps over the prefix columns (the paper's Figures 1 and 7) and
the spectrum plot (§3.7: the normalised cumulative singular values of the prefix columns of the
attention matrix, averaged over heads and inputs, lower vs upper layers).

Both read the probabilities a ``PrefixModel`` actually uses (after blocking and the
normaliser) through :meth:`PrefixModel.recording`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gencraft.models.modes import scoring
from gencraft.prefix.config import lower_layer_count


def prefix_spectrum(probs: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Normalised cumulative singular values of the prefix columns.

    Args:
        probs: [n, T, K] one input's attention (heads n, queries T, keys K = P + T).
        num_prefix: P.

    Returns:
        [n, min(T, P)]: per head, cumsum(σ) / sum(σ) of ``probs[..., :P]`` (1 at the end; a
        curve that rises fast means a low-rank, "skewed" spectrum). A head whose prefix
        columns are all zero gives a row of NaN.
    """
    sv = torch.linalg.svdvals(probs[..., :num_prefix].double())
    return (sv.cumsum(-1) / sv.sum(-1, keepdim=True)).float()


def _real_queries(
    model: Any, batch: dict[str, torch.Tensor], stack: str, probs: torch.Tensor
) -> torch.Tensor:
    """[B, T] bool: the real query positions of ``probs`` [B, n, T, K] of ``stack``."""
    if model.is_encoder_decoder and stack == "decoder":
        m = batch.get("decoder_attention_mask")
        return (
            torch.ones(probs.shape[0], probs.shape[2], dtype=torch.bool) if m is None else m.bool()
        )
    return batch["attention_mask"].bool()


def collect_attention(
    model: Any, batches: Sequence[dict[str, torch.Tensor]], stack: str = "auto"
) -> dict[int, list[torch.Tensor]]:
    """Per layer of the analysed stack (auto: the encoder of an encoder-decoder, as the paper;
    the decoder of a causal LM), the attention [n, T, K] of every real (unpadded) input. The
    model runs in eval mode and is left in the mode it came in. A causal LM's batches are
    right-padded (as ``pad_batch`` pads by default) or carry the ``position_ids`` each row has
    alone (P + 0, P + 1, ...: the prefix takes the first P); otherwise a left-padded row's
    attention is that of shifted positions. An encoder-decoder's decoder reads
    ``decoder_attention_mask`` (all positions real without one)."""
    stack = ("encoder" if model.is_encoder_decoder else "decoder") if stack == "auto" else stack
    out: dict[int, list[torch.Tensor]] = {}
    for batch in batches:
        with model.recording() as rec, scoring(model):
            model(**batch)
        for (st, kind, layer), probs in rec.items():
            if st != stack or kind != "self":
                continue
            mask = _real_queries(model, batch, stack, probs)
            p = model.num_virtual_tokens
            for b in range(probs.shape[0]):
                keep = mask[b].nonzero().squeeze(-1)
                cols = torch.cat([torch.arange(p), keep + p])
                out.setdefault(layer, []).append(probs[b][:, keep][:, :, cols].float())
    return out


def spectrum_by_depth(
    attention: dict[int, list[torch.Tensor]], num_prefix: int, lower_layers: int | None = None
) -> dict[str, torch.Tensor]:
    """Mean curves [min(T, P)] for the lower and the upper layers (the paper's 7 of 12 split
    unless ``lower_layers``), over heads and inputs; inputs are cut to the shortest curve."""
    n_low = lower_layer_count(len(attention), lower_layers)
    curves: dict[str, list[torch.Tensor]] = {"lower": [], "upper": []}
    for layer, items in attention.items():
        group = "lower" if layer < n_low else "upper"
        for probs in items:
            curves[group].append(prefix_spectrum(probs, num_prefix))
    out = {}
    for group, rows in curves.items():
        if rows:
            width = min(r.shape[-1] for r in rows)
            stacked = torch.cat([r[:, :width] for r in rows])
            out[group] = stacked.nanmean(0)
    return out


def plot_spectrum(curves: dict[str, dict[str, torch.Tensor]], path: str | Path, title: str) -> Path:
    """``curves[label][group]``: one line per model label and layer group -> PNG."""
    from gencraft.plotting import integer_ticks, pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5.5, 4))
    styles = {"lower": "-", "upper": "--"}
    for i, (label, groups) in enumerate(curves.items()):
        for group, curve in groups.items():  # one colour per model, one line style per group
            x = torch.arange(1, curve.numel() + 1)
            ax.plot(
                x.numpy(), curve.numpy(), styles[group], color=f"C{i}", label=f"{label}, {group}"
            )
    ax.set_xlabel("number of singular values k")
    integer_ticks(ax.xaxis)
    ax.set_ylabel("normalised cumulative singular value")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_attention_maps(
    attention: dict[int, list[torch.Tensor]],
    num_prefix: int,
    path: str | Path,
    *,
    example: int = 0,
    layers: Sequence[int] | None = None,
    title: str = "",
) -> Path:
    """Head-averaged attention [T, P + T] of one input at a few layers (first, middle, last by
    default), the prefix columns left of the white line, each with a colorbar -> PNG."""
    from gencraft.plotting import heatmap, pyplot

    plt = pyplot()

    n = len(attention)
    layers = list(layers) if layers is not None else sorted({0, n // 2, n - 1})
    fig, axes = plt.subplots(1, len(layers), figsize=(5.0 * len(layers), 3.6), squeeze=False)
    for ax, layer in zip(axes[0], layers, strict=True):
        a = attention[layer][example].mean(0)
        heatmap(fig, ax, a.numpy(), "attention probability")
        ax.axvline(num_prefix - 0.5, color="white", linewidth=1)
        ax.set_title(f"layer {layer + 1}: prefix | tokens")
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
