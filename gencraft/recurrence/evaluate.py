"""Overlap evaluation (Yoshida 2023, §2.3): the windowed log-loss itself is the shared
:func:`gencraft.metrics.windowed_nll` (a :class:`RecurrentLM` implements its hook and
carries h_prev between windows); the FLOPs accounting of the thesis's tables is here.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from gencraft.data import stream_articles, subword_stream
from gencraft.metrics import windowed_nll
from gencraft.metrics.lm import stream_perplexities


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


def _overlap_row(
    model: nn.Module, ids: torch.Tensor, words: int, window: int, o: int, **kw: Any
) -> dict[str, Any]:
    """One overlap's row: perplexities, seconds, FLOPs/token and the block NLLs."""
    t0 = time.perf_counter()
    nll = windowed_nll(model, ids, window=window, overlap=o, **kw)
    return {
        "overlap": o,
        **stream_perplexities(nll, words, time.perf_counter() - t0),
        "flops/token": flops_per_token(model, window, o),
        "block_nll": block_means(nll, BLOCK),
    }


def evaluate(
    model: torch.nn.Module,
    tok: Any,
    *,
    corpus: str,
    split: str,
    window: int,
    overlaps: tuple[int, ...],
    max_words: int | None = None,
    data_dir: str | None = None,
    progress: bool = False,
    batch_size: int = 1,
    shard: bool = False,
) -> list[dict[str, Any]]:
    """Per-token and per-word perplexity and FLOPs/token of ``model`` (a :class:`RecurrentLM`
    carries its state, window after window; a plain LM runs each window alone, ``batch_size``
    windows per forward) at each overlap. With ``shard`` (accelerate's processes), a plain
    LM's batches of windows are shared out; a recurrent model's windows cannot be (each needs
    the state of the one before), so its overlaps are, one per process at a time."""
    ids, words = subword_stream(corpus, split, tok, data_dir=data_dir, max_words=max_words)
    kw = {"progress": progress, "batch_size": batch_size, "shard": shard}
    rows = score_overlaps(model, ids, words, window=window, overlaps=overlaps, **kw)
    if corpus in ("wikitext-2", "wikitext-103"):  # the blocks' articles: the unit to pair on
        arts = stream_articles(corpus, split, tok, data_dir=data_dir, max_words=max_words)
        found = block_articles(arts, BLOCK)
        for r in rows:
            r["block_article"] = found
    return rows


def score_overlaps(
    model: torch.nn.Module,
    ids: torch.Tensor,
    words: int,
    *,
    window: int,
    overlaps: tuple[int, ...],
    **kw: Any,
) -> list[dict[str, Any]]:
    """:func:`evaluate`'s rows for the stream ``ids`` [N] of ``words`` words (``kw``:
    ``progress``, ``batch_size``, ``shard``)."""
    from gencraft.metrics.lm import WindowedScorer

    if kw.get("shard") and isinstance(model, WindowedScorer):
        from gencraft.distributed import map_sharded

        def one(idx: list[int]) -> list[dict[str, Any]]:
            return [_overlap_row(model, ids, words, window, overlaps[i]) for i in idx]

        return map_sharded(one, len(overlaps), 1)
    return [_overlap_row(model, ids, words, window, o, **kw) for o in overlaps]


#: tokens per block of ``block_nll``: the unit two models' losses are paired on
BLOCK = 1024


def block_articles(articles: torch.Tensor, block: int) -> list[int]:
    """The article of each block of :func:`block_means` over a stream whose tokens lie in
    ``articles`` [N] (:func:`gencraft.data.stream_articles`): the one most of the block's
    targets (tokens 1..N-1) lie in, the earlier on a tie."""
    return [int(torch.bincount(x).argmax()) for x in articles[1:].split(block)]


def block_means(nll: torch.Tensor, block: int) -> list[float]:
    """Mean NLL [N] over consecutive blocks of ``block`` tokens (the last may be shorter): the
    same token positions for any model on the same stream, so two models pair block by block."""
    return [round(float(x.mean()), 6) for x in nll.double().split(block)]
