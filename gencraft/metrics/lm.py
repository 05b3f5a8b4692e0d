"""Perplexity from summed NLL, and the one windowed log-loss (:func:`windowed_nll`) that every
method scores text with: windows of T tokens every T - o tokens, each target scored once."""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gencraft.config import check
from gencraft.progress import tqdm


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """``exp(nll_sum / n_tokens)``: perplexity from a summed negative log-likelihood (nats)."""
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    if nll_sum < 0 or math.isnan(nll_sum):
        raise ValueError(f"nll_sum must be a non-negative number, got {nll_sum}")
    return math.exp(nll_sum / n_tokens)


class Window(NamedTuple):
    """One window over token positions: inputs ``ids[start:end]`` predict ``ids[start + 1:
    end + 1]``, of which ``ids[first:end + 1]`` are scored (the ones no earlier window
    predicted)."""

    start: int
    first: int
    end: int


def window_schedule(n: int, window: int, overlap: int) -> list[Window]:
    """The windows that score targets 1..n-1 of ``n`` tokens (0-indexed): windows of
    ``window`` input tokens that start every ``window - overlap`` tokens, each target scored
    once, by the first window that predicts it (Yoshida 2023, §2.3).

    With window 10 and overlap 3 the input windows are t[1:10], t[8:17], t[15:24], ...
    (1-indexed) and they score t[2:11], t[12:18], t[19:25], ...: overlap 0 is disjoint
    execution (a prediction sees 1 to T tokens of context), overlap T - 1 the usual "best
    perplexity" sliding window."""
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


@runtime_checkable
class WindowedScorer(Protocol):
    """The hook of :func:`windowed_nll` for a model that carries state between windows (the
    recurrent LM): it scores the whole text itself, on the same window schedule."""

    def windowed_token_nll(self, ids: torch.Tensor, *, window: int, overlap: int) -> torch.Tensor:
        """Per-target NLL [N - 1] of ``ids`` [1, N] (or [N])."""
        ...


def check_positions(model: nn.Module, inputs: int, setting: str) -> None:
    """Refuse, before any forward pass, ``inputs`` tokens in one pass of a model with fewer
    positions (GPT-2's learned positions would fail deep inside with an IndexError)."""
    from gencraft.models.introspect import context_size, hf_model

    limit = context_size(model)
    check(
        limit is None or inputs <= limit,
        f"{type(hf_model(model)).__name__} has {limit} positions, fewer than the {inputs} "
        f"tokens one pass would take; set {setting} <= {limit}",
    )


def _window_nll(model: nn.Module, ids: torch.Tensor, chunk: list[Window]) -> list[torch.Tensor]:
    """The scored NLLs of each window of ``chunk`` (one forward per window length: only the
    last window can be shorter), each a CPU float tensor [end - first + 1]."""
    by_length: dict[int, list[int]] = {}
    for i, w in enumerate(chunk):
        by_length.setdefault(w.end - w.start, []).append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(chunk)
    for group in by_length.values():
        inputs = torch.stack([ids[chunk[i].start : chunk[i].end] for i in group])  # [n, T]
        with torch.no_grad():  # scoring only: no graph through the model's weights
            logits = model(input_ids=inputs).logits  # [n, T, V]
        for row, i in enumerate(group):
            w = chunk[i]
            rows = logits[row, w.first - 1 - w.start : w.end - w.start].float()
            nll = nn.functional.cross_entropy(rows, ids[w.first : w.end + 1], reduction="none")
            out[i] = nll.cpu()
    return out


def windowed_nll(
    model: nn.Module,
    ids: torch.Tensor,
    *,
    window: int,
    overlap: int = 0,
    progress: bool = False,
    batch_size: int = 1,
    shard: bool = False,
) -> torch.Tensor:
    """Per-target NLL (nats) of ``ids`` [1, N] (or [N]) under windowed evaluation
    (:func:`window_schedule`): a float tensor [N - 1] whose entry j - 1 is
    -log p(ids[j] | the window that scored it).

    ``model`` is a causal LM returning ``.logits`` [1, T, V], each window a fresh forward
    pass (``batch_size`` windows of one length per forward: they are independent), or a
    :class:`WindowedScorer` that carries its own state across the windows (one at a time:
    each window needs the state the previous one left). With ``shard``, a plain LM's batches
    of windows are shared out among accelerate's processes
    (:func:`gencraft.distributed.map_sharded`) and every process gets the whole result: the
    same batches as one process, so the same numbers."""
    if isinstance(model, WindowedScorer):
        window_schedule(ids.shape[-1], window, overlap)  # the same checks
        return model.windowed_token_nll(ids, window=window, overlap=overlap)
    check(batch_size >= 1, f"batch_size must be >= 1, got {batch_size}")
    if ids.dim() == 2:
        check(ids.shape[0] == 1, f"ids must be [1, N] or [N], got shape {tuple(ids.shape)}")
        ids = ids[0]
    check(ids.dim() == 1, f"ids must be [1, N] or [N], got shape {tuple(ids.shape)}")
    ids = ids.to(next(model.parameters()).device)
    schedule = window_schedule(ids.numel(), window, overlap)  # checks N >= 2 first
    check_positions(model, min(window, ids.numel() - 1), "window")
    bar = tqdm(total=len(schedule), desc="windows", disable=not progress, leave=False)
    score = lambda idx: _window_nll(model, ids, [schedule[i] for i in idx])  # noqa: E731
    from gencraft.distributed import map_batches

    parts = map_batches(score, len(schedule), batch_size, shard=shard, on_batch=bar.update)
    bar.close()
    return torch.cat(parts)  # the windows score consecutive, disjoint runs of targets


def causal_lm_nll(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_length: int = 1024,
    stride: int = 512,
    progress: bool = True,
) -> tuple[float, int]:
    """Summed NLL (nats) of ``input_ids`` [N] under a causal LM, and the number of scored tokens.

    Tokens 1..N-1 are each scored exactly once (token 0 has no context), by
    :func:`windowed_nll` with windows of ``max_length`` tokens (target included) that start
    every ``stride`` tokens: every scored token sees at least ``max_length - stride`` tokens
    of context (fewer only at the start of the text).
    """
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D [N], got shape {tuple(input_ids.shape)}")
    if not 0 < stride < max_length:
        raise ValueError(
            f"need 0 < stride < max_length, got stride={stride}, max_length={max_length}"
        )
    # a window of max_length tokens holds max_length - 1 inputs and the last target
    window = max_length - 1
    nll = windowed_nll(model, input_ids, window=window, overlap=window - stride, progress=progress)
    return float(nll.double().sum()), nll.numel()


def text_perplexity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    *,
    add_bos: bool = True,
    **kw,
) -> dict[str, float]:
    """Token-level perplexity of ``text`` (keywords ``kw`` go to :func:`causal_lm_nll`).

    With ``add_bos`` the tokenizer's BOS token (when it has one) is prepended, so the first
    text token is scored too; without it the first token only serves as context.
    Returns ``{"nll": summed NLL, "tokens": scored tokens, "perplexity": exp(nll/tokens)}``.
    """
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    if add_bos and tokenizer.bos_token_id is not None:
        ids = torch.cat([torch.tensor([tokenizer.bos_token_id]), ids])
    nll, count = causal_lm_nll(model, ids, **kw)
    return {"nll": nll, "tokens": count, "perplexity": perplexity(nll, count)}


def stream_perplexities(
    nll: torch.Tensor, words: int, seconds: float | None = None
) -> dict[str, float | int]:
    """Per-target NLL [N] of a word-level corpus read as subwords (see
    :func:`gencraft.data.subword_stream`) -> ``tokens``, ``words``, per-token and per-word
    perplexity (the summed NLL over ``words``), and ``seconds``/``ms/token`` when timed."""
    if nll.numel() == 0 or words <= 0:
        raise ValueError(f"need scored tokens and words > 0, got {nll.numel()} and {words}")
    total = float(nll.sum())
    out: dict[str, float | int] = {
        "tokens": int(nll.numel()),
        "words": words,
        "token ppl": math.exp(total / nll.numel()),
        "word ppl": math.exp(total / words),
    }
    if seconds is not None:
        out.update({"seconds": seconds, "ms/token": 1000 * seconds / nll.numel()})
    return out
