"""Dynamic evaluation (Krause et al. 2018), the baseline HSO is compared with (Yoshida 2023,
§3.7): the **weights** take an optimiser step on each window's summed loss, the hidden
states of the context are recomputed with the updated weights before the next window, and
the weights are restored at the start of every context and at the end.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig
from gencraft.hso.functional import TokenScores, check_batch, check_causal_lm, contexts
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


# ------------------------------------------------------------------------------ batched
@dataclass
class _RowWeights:
    """Each row's own copy of the weights and optimiser state, stacked on a first axis [B]."""

    params: dict[str, torch.Tensor]
    m: dict[str, torch.Tensor]  # Adam's moments (empty under SGD)
    v: dict[str, torch.Tensor]
    steps: torch.Tensor  # [B] the steps each row took (Adam's bias correction)


def _row_weights(hf: nn.Module, rows: int, adam: bool) -> _RowWeights:
    params = {k: p.detach()[None].repeat(rows, *[1] * p.dim()) for k, p in hf.named_parameters()}

    def zeros() -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(p) for k, p in params.items()} if adam else {}

    dev = next(iter(params.values())).device
    return _RowWeights(params, zeros(), zeros(), torch.zeros(rows, device=dev))


def _row_step(w: _RowWeights, grads: dict, active: torch.Tensor, cfg: DynamicEvalConfig) -> None:
    """One optimiser step for each ``active`` row [B] (bool), by torch.optim's SGD / Adam
    formulas; the other rows' weights and state stay as they are."""
    w.steps += active.to(w.steps.dtype)
    b1, b2 = cfg.betas
    t = w.steps.clamp_min(1).double()  # the bias corrections in float64, as torch.optim's
    size, root = cfg.lr / (1 - b1**t), (1 - b2**t).sqrt()
    for k, p in w.params.items():
        shape = (-1, *[1] * (p.dim() - 1))
        on = active.view(shape).to(p.dtype)
        g = grads[k].to(p.dtype)
        if cfg.optimizer == "sgd":
            p.sub_(cfg.lr * g * on)
            continue
        m = torch.where(on.bool(), w.m[k].lerp(g, 1 - b1), w.m[k])
        v = torch.where(on.bool(), w.v[k] * b2 + (1 - b2) * g * g, w.v[k])
        w.m[k], w.v[k] = m, v
        denom = (v.sqrt() / root.view(shape).to(p.dtype)).add_(1e-8)
        p.sub_(on * size.view(shape).to(p.dtype) * m / denom)


def dynamic_eval_last_logits(
    model: nn.Module,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: DynamicEvalConfig | None = None,
) -> torch.Tensor:
    """Each row's logits [B, V] at its last token after dynamic evaluation on that row alone
    (what :func:`dynamically_evaluated` gives one prompt), for ``ids`` [B, N] padded on either
    side (``attention_mask`` [B, N]), in one batched forward and backward per window.

    Each row keeps its own weights and optimiser state (``torch.func``: the weights stacked on
    a first axis, B copies in memory). The rows are re-padded on the right, so that window k
    covers the same columns of every row; a row with no target left in a window takes no
    step. The model's own weights are not changed."""
    from torch.func import functional_call, grad, vmap

    cfg = config or DynamicEvalConfig()
    rows = check_batch(model, ids, attention_mask, what="dynamic evaluation")
    hf = hf_model(model)
    dev = rows[0].device
    n = torch.tensor([r.numel() - 1 for r in rows], device=dev)  # each row's targets
    x = torch.zeros(len(rows), int(n.max()) + 1, dtype=torch.long, device=dev)
    for b, r in enumerate(rows):
        x[b, : r.numel()] = r
    w = _row_weights(hf, len(rows), cfg.optimizer == "adam")

    def forward(p: dict, xb: torch.Tensor) -> torch.Tensor:
        # a mask of ones (no vmap dimension: the mask code may branch on it); without one,
        # GPT-2 looks for padding in the ids, which vmap cannot branch on
        ones = torch.ones(1, xb.shape[-1], dtype=torch.long, device=dev)
        kw = {"use_cache": False, "attention_mask": ones}
        return functional_call(hf, p, (xb[None],), kw).logits[0].float()

    def loss(p: dict, xb: torch.Tensor, yb: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        nll = nn.functional.cross_entropy(forward(p, xb)[-yb.numel() :], yb, reduction="none")
        return (nll * keep).sum()

    was_training = hf.training
    hf.eval()
    with warnings.catch_warnings():
        # attention under vmap falls back to a loop over the rows, with a warning per call
        warnings.filterwarnings("ignore", message="There is a performance drop because")
        try:
            for t in range(0, int(n.max()), cfg.window):
                e = min(t + cfg.window, int(n.max()))
                keep = (torch.arange(t, e, device=dev)[None] < n[:, None]).float()  # [B, e-t]
                # causal attention: the columns past a row's own window end do not reach it
                grads = vmap(grad(loss))(w.params, x[:, :e], x[:, t + 1 : e + 1], keep)
                _row_step(w, grads, keep.any(1), cfg)
            with torch.no_grad():
                logits = vmap(forward)(w.params, x)
        finally:
            hf.train(was_training)
    return logits[torch.arange(len(rows), device=dev), n]
