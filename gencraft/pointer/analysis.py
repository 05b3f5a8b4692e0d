"""Analyses like Merity et al.'s: the log-perplexity gain of the pointer model over the plain
LSTM per word-frequency bucket (their Fig. 4), and which words a passage copies from how far
back (their Fig. 5 / 6)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gencraft.data.lm import LMCorpus
from gencraft.models.modes import scoring
from gencraft.plotting import heatmap, integer_ticks, pyplot
from gencraft.pointer.lstm import PointerSentinelLSTM


def frequency_buckets(counts: list[int], n_buckets: int = 10) -> torch.Tensor:
    """[V] bucket index per word id: words sorted by training frequency (most frequent first)
    and cut into ``n_buckets`` buckets of (as near as possible) equal numbers of word types."""
    order = torch.argsort(torch.tensor(counts), descending=True, stable=True)
    bucket = torch.empty(len(counts), dtype=torch.long)
    bucket[order] = torch.arange(len(counts)) * n_buckets // len(counts)
    return bucket


def bucket_gains(
    nll_base: torch.Tensor,
    nll_pointer: torch.Tensor,
    targets: torch.Tensor,
    buckets: torch.Tensor,
    n_buckets: int = 10,
) -> list[dict[str, Any]]:
    """Per bucket: tokens, mean NLL of each model and the mean gain ``nll_base - nll_pointer``
    (log-perplexity, nats). All tensors are per scored token, of one shape."""
    b = buckets[targets.flatten()]
    rows = []
    for i in range(n_buckets):
        sel = b == i
        n = int(sel.sum())
        base = float(nll_base.flatten()[sel].double().mean()) if n else float("nan")
        ptr = float(nll_pointer.flatten()[sel].double().mean()) if n else float("nan")
        rows.append(
            {"bucket": i + 1, "tokens": n, "nll_lstm": base, "nll_pointer": ptr, "gain": base - ptr}
        )
    return rows


def _save(fig: Any, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def plot_bucket_gains(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r["bucket"] for r in rows], [r["gain"] for r in rows], color="tab:blue")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks([r["bucket"] for r in rows])
    ax.set_xlabel("word frequency bucket (1 = most frequent)")
    ax.set_ylabel("mean log-perplexity gain (nats)")
    ax.set_title(title or "pointer sentinel-LSTM vs LSTM")
    return _save(fig, path)


@dataclass
class PassageView:
    """For each predicted word of a passage: the gate, the window attention by distance back
    (``attention[t, d]`` = mass on the word d positions back, d = 0 the current input), and the
    word receiving the most pointer mass."""

    inputs: list[str]
    targets: list[str]
    gate: torch.Tensor  # [T]
    attention: torch.Tensor  # [T, L]
    top: list[tuple[str, int, float]]  # (word, distance back, its attention) per position


def passage_view(
    model: PointerSentinelLSTM, corpus: LMCorpus, split: str, start: int, length: int
) -> PassageView:
    """Run the model from the start of ``split`` up to ``start + length`` (so the window and state
    are those of a real evaluation) and collect the pointer's behaviour on the last ``length``
    predictions. The model scores in eval mode and is left in the mode it came in."""
    if not model.config.pointer:
        raise ValueError("passage_view needs a pointer model")
    ids = corpus[split]
    if start < 0 or length < 1 or start + length + 1 > ids.numel():
        raise ValueError(f"passage [{start}, {start + length}) lies outside {split}")
    device = next(model.parameters()).device
    L = model.config.window
    ctx0 = max(0, start - L + 1)
    state = None
    x = ids[ctx0 : start + length].unsqueeze(0).to(device)
    y = ids[start + 1 : start + length + 1].unsqueeze(0).to(device)
    with scoring(model):
        if ctx0 > 0:  # state at the window's first position
            _, state, _ = model.encode(ids[:ctx0].unsqueeze(0).to(device))
        out = model(x, y, state, return_attention=True)
    attn = out.log_attn[0].exp().cpu()  # [T, S]
    s = x.shape[1]
    dist = torch.zeros(length, L)
    top = []
    words = corpus.vocab.decode(x[0].cpu())
    for t in range(length):
        pos = s - length + t
        lo = max(0, pos - L + 1)
        row = attn[t, lo : pos + 1].flip(0)  # distance 0, 1, ...
        dist[t, : row.numel()] = row
        d = int(row.argmax())
        top.append((words[pos - d], d, float(row[d])))
    return PassageView(
        inputs=words[s - length :],
        targets=corpus.vocab.decode(y[0].cpu()),
        gate=out.gate[0].cpu(),
        attention=dist,
        top=top,
    )


def passage_shares(
    view: PassageView, max_distance: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`plot_passage` draws, float64: the pointer's own distribution a_i / (1 − g)
    [T, D] over the first ``max_distance`` distances (all by default), each row renormalised
    (a row without mass stays zero), and the pointer's share 1 − g [T], floored at 1e-12 for
    a log axis."""
    att = view.attention if max_distance is None else view.attention[:, :max_distance]
    att = att.double()
    att = att / att.sum(1, keepdim=True).clamp_min(1e-300)  # = a_i / (1 - g), in the window
    return att, (1.0 - view.gate.double()).clamp_min(1e-12)


def plot_passage(
    view: PassageView, path: str | Path, max_distance: int | None = None, title: str = ""
) -> Path:
    """Heat map of the pointer's own distribution a_i / (1 − g) (rows: predicted words;
    columns: distance back; each row renormalised, so it shows whatever the gate), with a
    colorbar, beside the pointer's share 1 − g of each prediction on a log axis (a gate near 1
    leaves shares like 1e-4 that a linear bar would show as nothing)."""
    plt = pyplot()
    att, share = passage_shares(view, max_distance)
    n = att.shape[0]
    fig, (ax, axg) = plt.subplots(
        1, 2, figsize=(11, 0.28 * n + 1.8), gridspec_kw={"width_ratios": [6, 1.4]}, sharey=True
    )
    heatmap(fig, ax, att.numpy(), "pointer probability", cmap="Blues")
    integer_ticks(ax.xaxis)
    labels = [f"{i} -> {t}" for i, t in zip(view.inputs, view.targets, strict=True)]
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("distance back in the window (0 = current word)")
    ax.set_ylabel("input -> predicted word")
    ax.set_title(f"{title + ': ' if title else ''}pointer distribution a_i / (1 - g)")
    share = share.numpy()
    axg.barh(range(n), share, color="tab:orange")
    axg.set_xscale("log")
    axg.set_xlim(max(1e-12, float(share.min()) / 2), 1)
    axg.set_xlabel("pointer share 1 - g (log)")
    axg.set_title("gate")
    return _save(fig, path)


def head_passage_view(head: Any, tokenizer: Any, text: str, max_tokens: int = 40) -> PassageView:
    """A :class:`PassageView` of a :class:`~gencraft.pointer.head.PointerSentinelHead` on
    ``text`` (its first ``max_tokens`` tokens): gate and window attention by distance back,
    for each predicted token. The head scores in eval mode and is left in the mode it came in."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens]
    ids = ids.to(next(head.parameters()).device)
    with scoring(head):
        out = head(ids, return_attention=True)
    attn = out.log_attn[0].exp().cpu()  # [T, T], absolute positions
    t = ids.shape[1] - 1  # positions that predict a next token
    window = head.window
    by_distance = torch.zeros(t, window)
    for i in range(t):
        for d in range(min(window, i + 1)):
            by_distance[i, d] = attn[i, i - d]
    pieces = [tokenizer.decode([x]) for x in ids[0].tolist()]
    top = []
    for i in range(t):
        d = int(by_distance[i].argmax())
        top.append((pieces[i - d], d, float(by_distance[i, d])))
    return PassageView(pieces[:-1], pieces[1:], out.gate[0, :t].cpu(), by_distance, top)
