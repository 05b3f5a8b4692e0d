"""Evaluation of :class:`PointerSentinelLSTM` on a token stream: per-token log-loss over the
whole stream in BPTT-sized chunks, the LSTM state carried across them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gencraft.models.modes import scoring
from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.progress import tqdm
from gencraft.training import batchify


def detach_state(state: Any) -> Any:
    if state is None:
        return None
    return tuple(s.detach() for s in state)


@dataclass
class _Streams:
    """What a pass over streams ``data`` [b, n + 1] leaves: each stream's summed NLL
    (float64) [b], and with details the per-position ``nll`` and ``gate`` chunks."""

    row_nll: torch.Tensor
    nlls: list[torch.Tensor]
    gates: list[torch.Tensor]


def _run_streams(
    model: PointerSentinelLSTM, data: torch.Tensor, bptt: int, bar: Any, details: bool
) -> _Streams:
    """The streams ``data`` [b, n + 1] in chunks of ``bptt``, the LSTM state and the pointer's
    window carried across chunks (the caller holds :func:`~gencraft.models.modes.scoring`)."""
    n = data.shape[1] - 1
    out = _Streams(torch.zeros(data.shape[0], dtype=torch.float64), [], [])
    state = memory = memory_ids = None
    for s in range(0, n if data.shape[0] else 0, bptt):
        e = min(s + bptt, n)
        x, y = data[:, s:e], data[:, s + 1 : e + 1]
        step = model(x, y, state, memory=memory, memory_ids=memory_ids)
        state = step.state
        keep = model.config.window - 1
        if model.config.pointer and keep > 0:
            memory = step.outputs if memory is None else torch.cat([memory, step.outputs], 1)
            memory_ids = x if memory_ids is None else torch.cat([memory_ids, x], 1)
            memory, memory_ids = memory[:, -keep:], memory_ids[:, -keep:]
        out.row_nll += step.nll.double().sum(1).cpu()
        if details:
            out.nlls.append(step.nll.cpu())
            if step.gate is not None:
                out.gates.append(step.gate.cpu())
        bar.update(1)
    return out


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
    shard: bool = False,
) -> dict[str, Any]:
    """Perplexity of ``ids`` [N] split into ``batch_size`` streams, run in chunks of ``bptt``
    with the window carried across chunks (so the chunk size does not change the result).

    With ``shard`` (accelerate's processes), each process runs a contiguous share of the
    streams (their own batch: the same numbers up to float rounding) and every process gets
    the sum. Returns ``{"nll", "tokens", "ppl"}`` and, with ``return_details`` (one process),
    per-position ``token_nll`` [B, n], ``gate`` [B, n] (pointer only) and ``targets`` [B, n].
    """
    from gencraft.distributed import gather_in_order, process_info, share_of

    data = batchify(ids, batch_size, f"the {desc} split", flag)
    n = data.shape[1] - 1
    share = share_of(batch_size, *process_info(), 1) if shard else share_of(batch_size, 0, 1, 1)
    rows = range(share.first_batch, share.stop_batch)
    chunks = len(range(0, n, bptt)) if len(rows) else 0
    bar = tqdm(total=chunks, desc=desc, disable=not progress, leave=False, unit="chunk")
    part = data[rows.start : rows.stop].to(next(model.parameters()).device)
    with scoring(model):
        run = _run_streams(model, part, bptt, bar, return_details)
    bar.close()
    pairs = list(zip(rows, run.row_nll.tolist(), strict=True))
    total = sum(gather_in_order(pairs, batch_size) if shard else run.row_nll.tolist())
    result: dict[str, Any] = {"nll": total, "tokens": n * batch_size}
    result["ppl"] = math.exp(total / result["tokens"])
    if return_details:
        result["token_nll"] = torch.cat(run.nlls, 1)
        result["gate"] = torch.cat(run.gates, 1) if run.gates else None
        result["targets"] = data[:, 1 : n + 1].cpu()
    return result
