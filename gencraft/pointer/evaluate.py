"""Evaluation of :class:`PointerSentinelLSTM` on a token stream: per-token log-loss over the
whole stream in BPTT-sized chunks, the LSTM state carried across them."""

from __future__ import annotations

import math
from typing import Any

import torch

from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.progress import tqdm
from gencraft.training import batchify


def detach_state(state: Any) -> Any:
    if state is None:
        return None
    return tuple(s.detach() for s in state)


@torch.no_grad()
def evaluate(
    model: PointerSentinelLSTM,
    ids: torch.Tensor,
    *,
    batch_size: int = 10,
    bptt: int = 100,
    progress: bool = False,
    return_details: bool = False,
    desc: str = "eval",
    flag: str = "--batch-size",
) -> dict[str, Any]:
    """Perplexity of ``ids`` [N] split into ``batch_size`` streams, run in chunks of ``bptt``
    with the window carried across chunks (so the chunk size does not change the result).

    Returns ``{"nll", "tokens", "ppl"}`` and, with ``return_details``, per-position ``token_nll``
    [B, n], ``gate`` [B, n] (pointer only) and ``targets`` [B, n].
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    data = batchify(ids, batch_size, f"the {desc} split", flag).to(device)
    n = data.shape[1] - 1
    state = None
    memory = memory_ids = None
    total, count = 0.0, 0
    nlls, gates = [], []
    bar = tqdm(range(0, n, bptt), desc=desc, disable=not progress, leave=False, unit="chunk")
    for s in bar:
        e = min(s + bptt, n)
        x, y = data[:, s:e], data[:, s + 1 : e + 1]
        out = model(x, y, state, memory=memory, memory_ids=memory_ids)
        state = out.state
        keep = model.config.window - 1
        if model.config.pointer and keep > 0:
            memory = out.outputs if memory is None else torch.cat([memory, out.outputs], 1)
            memory_ids = x if memory_ids is None else torch.cat([memory_ids, x], 1)
            memory, memory_ids = memory[:, -keep:], memory_ids[:, -keep:]
        total += float(out.nll.double().sum())
        count += out.nll.numel()
        if return_details:
            nlls.append(out.nll.cpu())
            if out.gate is not None:
                gates.append(out.gate.cpu())
    model.train(was_training)
    result: dict[str, Any] = {"nll": total, "tokens": count, "ppl": math.exp(total / count)}
    if return_details:
        result["token_nll"] = torch.cat(nlls, 1)
        result["gate"] = torch.cat(gates, 1) if gates else None
        result["targets"] = data[:, 1 : n + 1].cpu()
    return result
