"""Dynamic evaluation (Krause et al. 2018), the baseline HSO is compared with (Yoshida 2023,
§3.7): the **weights** take an optimiser step on each window's summed loss, the hidden
states of the context are recomputed with the updated weights before the next window, and
the weights are restored at the start of every context and at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from tqdm.auto import tqdm

from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig
from gencraft.hso.optimize import TokenScores, check_causal_lm, contexts
from gencraft.models.introspect import hf_model


def _optimizer(params, cfg: DynamicEvalConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)


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
    params = list(hf.parameters())
    saved = [p.detach().clone() for p in params]
    flags = [p.requires_grad for p in params]
    was_training = hf.training
    hf.eval()
    try:
        for p in params:
            p.requires_grad_(True)
        opt = _optimizer(params, cfg)
        n = ids.numel() - 1
        for t in range(0, n, cfg.window):
            e = min(t + cfg.window, n)
            with torch.enable_grad():
                logits = hf(input_ids=ids[None, :e], use_cache=False).logits[0, t:].float()
                loss = nn.functional.cross_entropy(logits, ids[t + 1 : e + 1], reduction="sum")
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
        for p, f in zip(params, flags, strict=True):
            p.grad = None
            p.requires_grad_(f)
        yield model
    finally:
        with torch.no_grad():
            for p, s, f in zip(params, saved, flags, strict=True):
                p.copy_(s)
                p.grad = None
                p.requires_grad_(f)
        hf.train(was_training)


def dynamic_eval_nll(
    model: nn.Module,
    ids: torch.Tensor,
    config: DynamicEvalConfig | None = None,
    *,
    progress: bool = False,
) -> TokenScores:
    """Per-target NLL [N - 1] of ``ids`` [1, N] under dynamic evaluation; each window's
    predictions are recorded before the step that uses its targets. The model's weights are
    the same afterwards."""
    cfg = config or DynamicEvalConfig()
    ids = check_causal_lm(model, ids, what="dynamic evaluation")
    hf = hf_model(model)
    ranges = contexts(ids.numel() - 1, cfg.reset_every, model)
    params = [p for p in hf.parameters()]
    saved = [p.detach().clone() for p in params]
    flags = [p.requires_grad for p in params]
    out = torch.empty(ids.numel() - 1, dtype=torch.float32)
    windows = [
        (c0, t, min(t + cfg.window, c1)) for c0, c1 in ranges for t in range(c0, c1, cfg.window)
    ]
    was_training = hf.training
    hf.eval()
    t0 = time.perf_counter()
    opt = None
    try:
        for p in params:
            p.requires_grad_(True)
        for c0, t, e in tqdm(windows, desc="DE windows", disable=not progress):
            if t == c0:  # a new context: the original weights and a fresh optimiser
                with torch.no_grad():
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
                opt = _optimizer(params, cfg)
            with torch.enable_grad():
                logits = hf(input_ids=ids[None, c0:e], use_cache=False).logits[0, t - c0 :].float()
                nll = nn.functional.cross_entropy(logits, ids[t + 1 : e + 1], reduction="none")
                out[t:e] = nll.detach().cpu()
                loss = nll.sum()
                if not torch.isfinite(loss):
                    raise GencraftError(
                        f"dynamic evaluation: the loss of the window of tokens {t}..{e - 1} is "
                        f"{loss.item()}; lower lr (now {cfg.lr})"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
    finally:
        with torch.no_grad():
            for p, s, f in zip(params, saved, flags, strict=True):
                p.copy_(s)
                p.grad = None
                p.requires_grad_(f)
        hf.train(was_training)
    return TokenScores(out, len(windows), time.perf_counter() - t0)
