"""Perplexity: from summed NLL, and sliding-window scoring of text with a causal LM."""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """``exp(nll_sum / n_tokens)``: perplexity from a summed negative log-likelihood (nats)."""
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    if nll_sum < 0 or math.isnan(nll_sum):
        raise ValueError(f"nll_sum must be a non-negative number, got {nll_sum}")
    return math.exp(nll_sum / n_tokens)


@torch.no_grad()
def causal_lm_nll(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_length: int = 1024,
    stride: int = 512,
    progress: bool = True,
) -> tuple[float, int]:
    """Summed NLL (nats) of ``input_ids`` [N] under a causal LM, and the number of scored tokens.

    Tokens 1..N-1 are each scored exactly once (token 0 has no context). Each forward pass
    scores the next ``stride`` tokens in a window of at most ``max_length`` tokens that ends
    with them, so every scored token sees at least ``max_length - stride`` tokens of context
    (fewer only at the start of the text).
    """
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D [N], got shape {tuple(input_ids.shape)}")
    if not 0 < stride < max_length:
        raise ValueError(
            f"need 0 < stride < max_length, got stride={stride}, max_length={max_length}"
        )
    device = next(model.parameters()).device
    n = input_ids.numel()
    nll, count, done = 0.0, 0, 1  # done: first position not yet scored
    bar = tqdm(
        total=max(n - 1, 0), desc="perplexity", unit="tok", disable=not progress, leave=False
    )
    while done < n:
        end = min(done + stride, n)
        begin = max(0, end - max_length)
        ids = input_ids[begin:end].unsqueeze(0).to(device)  # (1, T)
        logits = model(input_ids=ids).logits[0]  # (T, V); row i predicts ids[i + 1]
        rows = logits[done - 1 - begin : end - 1 - begin].float()  # positions done..end-1
        targets = input_ids[done:end].to(device)
        nll += float(torch.nn.functional.cross_entropy(rows, targets, reduction="sum"))
        count += end - done
        bar.update(end - done)
        done = end
    bar.close()
    return nll, count


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
