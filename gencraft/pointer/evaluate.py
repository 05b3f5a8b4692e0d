"""Evaluation of :class:`PointerSentinelLSTM` on a token stream: per-token log-loss over the
whole stream in BPTT-sized chunks, the LSTM state carried across them; and of a
:class:`~gencraft.pointer.PointerSentinelHead` on a pretrained LM, block by block, against its
base (:func:`evaluate_head`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gencraft.errors import GencraftError
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


def token_blocks(tokenizer: Any, text: str, block: int, limit: int | None = None) -> torch.Tensor:
    """``text`` tokenized by a pretrained LM's tokenizer (no special tokens) and cut into
    non-overlapping blocks: [N, block] token ids, the last partial block dropped; the first
    ``limit`` tokens only, when given. Refuses a text too short for one block."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = ids[:limit] if limit is not None else ids
    n = len(ids) // block
    if n < 1:
        raise GencraftError(
            f"the text holds {len(ids)} tokens, fewer than one block of {block} (--bptt)"
        )
    return torch.tensor(ids[: n * block], dtype=torch.long).view(n, block)


def evaluate_head(
    head: Any,
    blocks: torch.Tensor,
    *,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, float]:
    """Token perplexity of a :class:`~gencraft.pointer.PointerSentinelHead` over ``blocks``
    [N, T] and of its base alone (the head disabled: gate 1), each block scored on its own
    (T - 1 predictions; nothing carries across blocks), ``batch_size`` blocks a call. Returns
    ``{"head_ppl", "base_ppl", "tokens", "mean_gate"}``; ``mean_gate`` is the softmax share."""
    device = next(head.parameters()).device
    totals = {"head": 0.0, "base": 0.0}
    gate_sum, scored = 0.0, 0
    bar = tqdm(total=blocks.shape[0], desc=desc, disable=not progress, leave=False)
    with scoring(head):
        for start in range(0, blocks.shape[0], batch_size):
            batch = blocks[start : start + batch_size].to(device)
            out = head(batch)
            totals["head"] += float(out.nll.sum())
            gate_sum += float(out.gate[:, :-1].sum())
            scored += batch.numel() - batch.shape[0]
            with head.disable():
                totals["base"] += float(head(batch).nll.sum())
            bar.update(batch.shape[0])
    bar.close()
    return {
        "head_ppl": math.exp(totals["head"] / scored),
        "base_ppl": math.exp(totals["base"] / scored),
        "tokens": scored,
        "mean_gate": gate_sum / scored,
    }
