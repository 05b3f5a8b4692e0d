"""Training only the FAME head over a frozen base, with the base run once per example.

With the base frozen and teacher forcing, nothing the base computes depends on the head: f_t
is added to the logits only, never fed back. So one no-grad pass per example can keep what the
head needs, and every epoch after that costs only the head and the output projection:

* ``x`` [S, h]: source states at the real source positions (encoder output / prompt states);
* ``y`` [N, h]: the output embedding's input at the N scored positions;
* ``a`` [N, S]: the final layer's attention from those positions to the source (heads reduced);
* ``targets`` [N]: the token each scored position predicts.

logits = (y + a·g(x)) Eᵀ + b + r, where b is the output embedding's bias and r a per-vocabulary
residual the base adds after it (BART's ``final_logits_bias``), checked to be position-independent
when the features are collected. What this changes against full training: the base (and its
dropout) stays fixed, so the head fits a deterministic base; the MLE and topic losses are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gencraft.errors import GencraftError
from gencraft.focus.functional import topic_loss
from gencraft.focus.model import FocusForConditionalGeneration
from gencraft.models.modes import scoring


@dataclass
class HeadFeatures:
    """One example's frozen-base features (see the module docstring for shapes)."""

    x: torch.Tensor
    y: torch.Tensor
    a: torch.Tensor
    targets: torch.Tensor


def collect_features(
    model: FocusForConditionalGeneration, batch: dict[str, torch.Tensor]
) -> tuple[list[HeadFeatures], torch.Tensor]:
    """Run the base once on ``batch`` (from :func:`gencraft.focus.data.collate`, with labels) and
    split what the head needs per example. Returns ``(features, residual)``, residual [V]; no
    graph is kept."""
    if "labels" not in batch:
        raise GencraftError("collecting head features needs labels (the scored positions)")
    with scoring(model.base):  # the base only: dropout in the head is the trainer's
        return _collect(model, batch)


def _collect(
    model: FocusForConditionalGeneration, batch: dict[str, torch.Tensor]
) -> tuple[list[HeadFeatures], torch.Tensor]:
    with model.recording() as rec:
        out = model(**batch)
    missing = {"source_states", "output_inputs", "attention"} - set(rec)
    if missing:
        raise GencraftError(f"the base forward did not expose {sorted(missing)}")
    y_all, a_all = rec["output_inputs"], rec["attention"]  # [B, T, h], [B, T, S]
    labels = batch["labels"]
    if model.is_encoder_decoder:
        rows, targets = labels >= 0, labels
    else:  # causal: position t predicts token t + 1
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
        rows = targets >= 0
    base_only = F.linear(y_all, model.output_embedding.weight, model.output_embedding.bias)
    residual = (out.logits - base_only)[rows]  # [N_total, V]
    if residual.numel() and float((residual - residual[:1]).abs().max()) > 1e-4:
        raise GencraftError(
            f"{type(model.base).__name__} transforms the output embedding's result in a "
            "position-dependent way; train with the base in the loop instead of precomputing"
        )
    x_all, mask = rec["source_states"], rec["source_mask"]
    feats = []
    for b in range(labels.shape[0]):
        keep = mask[b]
        feats.append(
            HeadFeatures(
                x=x_all[b, keep].cpu(),
                y=y_all[b, rows[b]].cpu(),
                a=a_all[b, rows[b]][:, keep].cpu(),
                targets=targets[b, rows[b]].cpu(),
            )
        )
    return feats, residual[0].cpu() if residual.numel() else torch.zeros(base_only.shape[-1])


def head_losses(
    model: FocusForConditionalGeneration,
    feats: Sequence[HeadFeatures],
    residual: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, mle, topic) for a batch of features: λ·MLE + (1 − λ)·topic, the MLE averaged over
    the batch's scored tokens as the base's own loss does."""
    dev = model.output_embedding.weight.device
    b = len(feats)
    s = max(f.x.shape[0] for f in feats)
    n = max(f.y.shape[0] for f in feats)
    h = feats[0].x.shape[1]
    x = torch.zeros(b, s, h, device=dev)
    mask = torch.zeros(b, s, dtype=torch.bool, device=dev)
    y = torch.zeros(b, n, h, device=dev)
    a = torch.zeros(b, n, s, device=dev)
    tgt = torch.full((b, n), -100, dtype=torch.long, device=dev)
    for i, f in enumerate(feats):
        si, ni = f.x.shape[0], f.y.shape[0]
        x[i, :si], mask[i, :si] = f.x.to(dev), True
        y[i, :ni], a[i, :ni, :si], tgt[i, :ni] = f.y.to(dev), f.a.to(dev), f.targets.to(dev)
    head, e = model.head, model.output_embedding
    g = head.project(x).masked_fill(~mask.unsqueeze(2), 0.0)
    states = head.focus_states(a, g, mask)
    logits = F.linear(y + states, e.weight, e.bias) + residual.to(dev)
    mle = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), ignore_index=-100)
    topic = topic_loss(
        head.pooled(g, mask) @ e.weight.t(),
        tgt,
        model.frequent_ids,
        None,
        frequent=model.config.frequent,
    )
    lam = model.config.mle_weight
    return lam * mle + (1 - lam) * topic, mle, topic
