"""The summary-induced topic loss (FAME eq. 3) and the frequent-token set F.

Shapes: B batch, V vocabulary, T target length, F number of frequent tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F


def frequent_token_ids(
    sequences: Iterable[Sequence[int]], k: int, *, exclude: Iterable[int] = ()
) -> torch.Tensor:
    """The ``k`` most frequent token ids over ``sequences`` (e.g. the tokenised training
    summaries and documents), ties broken by smaller id, ``exclude`` (special tokens) skipped.
    Returns a LongTensor [min(k, #distinct)] sorted by decreasing frequency."""
    if k < 0:
        raise ValueError(f"|F| must be >= 0, got {k}")
    skip = set(exclude)
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq if int(t) not in skip)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return torch.tensor([t for t, _ in ranked], dtype=torch.long)


def topic_targets(
    target_ids: torch.Tensor,
    vocab_size: int,
    pad_token_id: int | None,
    frequent_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, V] float: 1 for tokens of the reference summary (Ŷ), minus F (Ŷ_c = Ŷ − F)."""
    if target_ids.dim() != 2:
        raise ValueError(f"target_ids must be [B, T], got shape {tuple(target_ids.shape)}")
    ids = target_ids.long()
    keep = ids >= 0  # -100 (ignored labels) never counts
    if pad_token_id is not None:
        keep &= ids != pad_token_id
    if bool((ids[keep] >= vocab_size).any()):
        raise ValueError(f"target_ids must lie in [0, {vocab_size})")
    y = torch.zeros(ids.shape[0], vocab_size, device=ids.device)
    y.scatter_(1, ids.where(keep, 0), keep.float())
    if frequent_ids is not None and frequent_ids.numel():
        y[:, frequent_ids.to(ids.device)] = 0.0
    return y


def topic_loss(
    topic_logits: torch.Tensor,
    target_ids: torch.Tensor,
    frequent_ids: torch.Tensor | None,
    pad_token_id: int | None,
    *,
    frequent: Literal["negative", "ignore"] = "negative",
) -> torch.Tensor:
    """FAME eq. 3: multi-label binary cross-entropy of ``sigmoid(topic_logits)`` against the
    reference-summary tokens minus F, averaged over the vocabulary, then over the batch.

    Args:
        topic_logits: [B, V], T_X.
        target_ids: [B, T] reference summary ids (``pad_token_id`` and -100 ignored).
        frequent_ids: [F], the |F| most frequent training tokens (see
            :func:`frequent_token_ids`), or None.
        frequent: ``"negative"`` (the paper read literally: tokens of F fall in the v ∉ Ŷ_c
            branch) or ``"ignore"`` (tokens of F are left out of the loss and the average).
    """
    if topic_logits.dim() != 2 or topic_logits.shape[0] != target_ids.shape[0]:
        raise ValueError(
            f"topic_logits must be [B, V] with B = {target_ids.shape[0]}, got "
            f"{tuple(topic_logits.shape)}"
        )
    if frequent not in ("negative", "ignore"):
        raise ValueError(f"frequent must be 'negative' or 'ignore', got {frequent!r}")
    v = topic_logits.shape[1]
    y = topic_targets(target_ids, v, pad_token_id, frequent_ids)
    bce = F.binary_cross_entropy_with_logits(topic_logits.float(), y, reduction="none")
    if frequent == "ignore" and frequent_ids is not None and frequent_ids.numel():
        weight = torch.ones(v, device=bce.device)
        weight[frequent_ids.to(bce.device)] = 0.0
        return ((bce * weight).sum(1) / weight.sum()).mean()
    return bce.mean()
