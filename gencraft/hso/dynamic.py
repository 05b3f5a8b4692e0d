"""Dynamic evaluation (Krause et al. 2018), the baseline HSO is compared with (Yoshida 2023,
§3.7): the **weights** take an optimiser step on each window's summed loss, the hidden
states of the context are recomputed with the updated weights before the next window, and
the weights are restored at the start of every context and at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig
from gencraft.hso.functional import TokenScores, check_causal_lm, contexts
from gencraft.models.introspect import hf_model
from gencraft.progress import tqdm


def _optimizer(params, cfg: DynamicEvalConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)


@contextmanager
def _weights_restored(
    hf: nn.Module,
) -> Iterator[tuple[list[nn.Parameter], list[torch.Tensor]]]:
    """(parameters, their saved values): all parameters made trainable (eval mode: no
    dropout) for the block; on exit their values, gradients, ``requires_grad`` and the
    train/eval mode are as before."""
    params = list(hf.parameters())
    saved = [p.detach().clone() for p in params]
    flags = [p.requires_grad for p in params]
    was_training = hf.training
    hf.eval()
    try:
        for p in params:
            p.requires_grad_(True)
        yield params, saved
    finally:
        with torch.no_grad():
            for p, s, f in zip(params, saved, flags, strict=True):
                p.copy_(s)
                p.grad = None
                p.requires_grad_(f)
        hf.train(was_training)


def _window_step(hf, opt, ids: torch.Tensor, c0: int, t: int, e: int) -> torch.Tensor:
    """Score targets ids[t+1:e+1] from a fresh forward over ids[c0:e] (the context's hidden
    states recomputed with the current weights), then one step on their summed loss; returns
    the NLL [e - t] recorded before the step."""
    with torch.enable_grad():
        logits = hf(input_ids=ids[None, c0:e], use_cache=False).logits[0, t - c0 :].float()
        nll = nn.functional.cross_entropy(logits, ids[t + 1 : e + 1], reduction="none")
        loss = nll.sum()
        if not torch.isfinite(loss.detach()):
            raise GencraftError(
                f"dynamic evaluation: the loss of the window of tokens {t}..{e - 1} is "
                f"{loss.item()}; lower the learning rate"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
    opt.step()
    return nll.detach()


@contextmanager
def dynamically_evaluated(
    model: nn.Module, ids: torch.Tensor, config: DynamicEvalConfig | None = None
) -> Iterator[nn.Module]:
    """The model with its weights adapted to ``ids`` [1, N] by dynamic evaluation (a step per
    window of inputs ids[:N-1], targets within ids), restored on exit: the thesis's few-shot
    use, reading the label after a prompt with the adapted weights."""
    cfg = config or DynamicEvalConfig()
    ids = check_causal_lm(model, ids, what="dynamic evaluation")
    hf = hf_model(model)
    with _weights_restored(hf) as (params, _):
        opt = _optimizer(params, cfg)
        n = ids.numel() - 1
        for t in range(0, n, cfg.window):
            _window_step(hf, opt, ids, 0, t, min(t + cfg.window, n))
        yield model


def _context_nll(
    hf: nn.Module, ids: torch.Tensor, c0: int, c1: int, cfg: DynamicEvalConfig, bar: Any
) -> tuple[torch.Tensor, int]:
    """Dynamic evaluation of context [c0, c1) from the original weights and a fresh
    optimiser (``hf``'s weights are left adapted; the caller restores them): its NLL
    [c1 - c0] and its window count."""
    opt = _optimizer(list(hf.parameters()), cfg)
    out = []
    for t in range(c0, c1, cfg.window):
        out.append(_window_step(hf, opt, ids, c0, t, min(t + cfg.window, c1)).cpu())
        bar.update(1)
    return torch.cat(out), len(out)


def dynamic_eval_nll(
    model: nn.Module,
    ids: torch.Tensor,
    config: DynamicEvalConfig | None = None,
    *,
    progress: bool = False,
    shard: bool = False,
) -> TokenScores:
    """Per-target NLL [N - 1] of ``ids`` [1, N] under dynamic evaluation; each window's
    predictions are recorded before the step that uses its targets. The model's weights are
    the same afterwards. With ``shard``, the contexts (independent with ``reset_every``: each
    starts from the original weights) are shared out among accelerate's processes, one
    context at a time, and every process gets the whole result."""
    cfg = config or DynamicEvalConfig()
    ids = check_causal_lm(model, ids, what="dynamic evaluation")
    hf = hf_model(model)
    ranges = contexts(ids.numel() - 1, cfg.reset_every, model)
    windows = sum(len(range(c0, c1, cfg.window)) for c0, c1 in ranges)
    t0 = time.perf_counter()
    bar = tqdm(total=windows, desc="DE windows", disable=not progress)
    with _weights_restored(hf) as (params, saved):

        def one(idx: list[int]) -> list[tuple[torch.Tensor, int]]:
            with torch.no_grad():  # every context starts from the original weights
                for p, s in zip(params, saved, strict=True):
                    p.copy_(s)
            return [_context_nll(hf, ids, *ranges[i], cfg, bar) for i in idx]

        from gencraft.distributed import map_batches

        parts = map_batches(one, len(ranges), 1, shard=shard)
    bar.close()
    return TokenScores(
        torch.cat([p[0] for p in parts]), sum(p[1] for p in parts), time.perf_counter() - t0
    )
