"""Overlap evaluation (Yoshida 2023, §2.3): a causal LM run on windows of T tokens that start
every T - o tokens, each target scored once, by the first window that predicts it.

With T = 10 and o = 3 the input windows are t[1:10], t[8:17], t[15:24], ... (1-indexed) and
they score t[2:11], t[12:18], t[19:25], ...: o = 0 is disjoint execution (a prediction sees 1
to T tokens of context), o = T - 1 the usual "best perplexity" sliding window.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from gencraft.config import check


class Window(NamedTuple):
    """One window over token positions: inputs ``ids[start:end]`` predict ``ids[start + 1:
    end + 1]``, of which ``ids[first:end + 1]`` are scored (the ones no earlier window
    predicted)."""

    start: int
    first: int
    end: int


def window_schedule(n: int, window: int, overlap: int) -> list[Window]:
    """The windows that score targets 1..n-1 of ``n`` tokens (0-indexed)."""
    check(window >= 1, f"window must be >= 1, got {window}")
    check(0 <= overlap < window, f"overlap must be in [0, window={window}), got {overlap}")
    check(n >= 2, f"need at least 2 tokens to score one, got {n}")
    out, start, done = [], 0, 0  # done: the last target scored so far
    while done < n - 1:
        end = min(start + window, n - 1)  # no input past the last target's predecessor
        out.append(Window(start, done + 1, end))
        done = end
        start += window - overlap
    return out


@torch.no_grad()
def windowed_nll(
    model: nn.Module,
    ids: torch.Tensor,
    *,
    window: int,
    overlap: int = 0,
    progress: bool = False,
) -> torch.Tensor:
    """Per-target NLL (nats) of ``ids`` [1, N] (or [N]) under overlap evaluation: a float
    tensor [N - 1] whose entry j - 1 is -log p(ids[j] | the window that scored it).

    ``model`` is any causal LM returning ``.logits`` [1, T, V]; each window is a fresh
    forward pass (no state carried between windows). A :class:`RecurrentLM` carries h_prev
    across its windows instead (``window`` must be its own)."""
    from gencraft.recurrence.model import RecurrentLM  # the model module imports this one

    if isinstance(model, RecurrentLM):
        check(
            window == model.config.window,
            f"this RecurrentLM runs windows of {model.config.window} tokens, not {window}",
        )
        window_schedule(ids.shape[-1], window, overlap)  # the same checks
        return model.token_nll(ids, overlap=overlap)
    if ids.dim() == 2:
        check(ids.shape[0] == 1, f"ids must be [1, N] or [N], got shape {tuple(ids.shape)}")
        ids = ids[0]
    check(ids.dim() == 1, f"ids must be [1, N] or [N], got shape {tuple(ids.shape)}")
    device = next(model.parameters()).device
    ids = ids.to(device)
    schedule = window_schedule(ids.numel(), window, overlap)  # checks N >= 2 first
    out = torch.empty(ids.numel() - 1, dtype=torch.float32)
    for w in tqdm(schedule, desc="windows", disable=not progress):
        logits = model(input_ids=ids[w.start : w.end].unsqueeze(0)).logits[0]  # [T, V]
        rows = logits[w.first - 1 - w.start : w.end - w.start].float()  # predict first..end
        nll = nn.functional.cross_entropy(rows, ids[w.first : w.end + 1], reduction="none")
        out[w.first - 1 : w.end] = nll.cpu()
    return out


def flops_per_token(model: nn.Module, window: int, overlap: int = 0) -> float:
    """Forward FLOPs per scored token of overlap evaluation, counted as the thesis's tables
    count them: F_window / (T - o), two FLOPs per non-embedding weight per position plus the
    causal attention products (2 T^2 H per layer); no embedding or output layer and no
    recurrence FFN. For GPT-2 small at T = 300 this gives 1.755e8 (o = 0) and 2.106e8
    (o = 50), the thesis's 1.75e8 and 2.10e8."""
    from gencraft.models.introspect import hf_model, model_shape

    hf = hf_model(model)
    shape = model_shape(hf)
    skip = {id(hf.get_input_embeddings().weight), id(hf.get_output_embeddings().weight)}
    skip |= {id(m.weight) for m in hf.modules() if isinstance(m, nn.Embedding)}  # positions
    weights = sum(p.numel() for p in hf.parameters() if id(p) not in skip and p.dim() > 1)
    per_window = 2 * weights * window + 2 * shape.layers * window**2 * shape.hidden
    return per_window / (window - overlap)
