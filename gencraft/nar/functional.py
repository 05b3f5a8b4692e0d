"""Training objectives on a :class:`~gencraft.nar.NARSeq2Seq`.

A batch (:func:`collate`) holds the source ``input_ids`` / ``attention_mask`` [B, S] and the
target ``targets`` [B, L] (padded with the pad id), ``target_mask`` [B, L] (bool) and
``lengths`` [B]. Targets carry no special tokens: position i of the decoder predicts target
token i.

* **SUNDAE** (Savinov et al. 2022): corrupt the target with uniform random tokens at a rate
  α ~ U(0, 1) drawn per sequence; predict the target from it; draw a sample from that
  prediction (no gradient through the sample) and predict the target again from the sample,
  for ``unroll_steps`` steps in all; the token loss is the mean of the steps' cross-entropies.
* **Mask-Predict** (Ghazvininejad et al. 2019): replace n ~ U{1, ..., |y|} target positions by
  [MASK] and predict them (the loss covers the masked positions only).
* **autoregressive**: teacher forcing with [CLS] + y as decoder input and y + [SEP] as labels
  (the BERT2BERT baseline; needs a causal decoder).

The non-autoregressive objectives add ``length_loss_weight`` times the length predictor's
cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from gencraft.errors import GencraftError
from gencraft.nar.config import ObjectiveConfig
from gencraft.nar.model import NARSeq2Seq, target_token_ids


def noise_ids(tokenizer: Any) -> torch.Tensor:
    """The ids uniform corruption and random starts draw from: the whole vocabulary but the
    special tokens ([PAD], [CLS], [SEP], [MASK], [UNK]...)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    if not ids:
        raise GencraftError("the tokenizer has no ordinary tokens to draw noise from")
    return torch.tensor(ids, dtype=torch.long)


def collate(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int
) -> dict[str, torch.Tensor]:
    """A batch from (source ids, target ids) pairs (right padding)."""
    b = len(pairs)
    s = max(len(src) for src, _ in pairs)
    length = max(max(len(tgt) for _, tgt in pairs), 1)
    src_ids = torch.full((b, s), pad_id, dtype=torch.long)
    src_mask = torch.zeros(b, s, dtype=torch.long)
    tgt = torch.full((b, length), pad_id, dtype=torch.long)
    for i, (src, y) in enumerate(pairs):
        src_ids[i, : len(src)] = torch.as_tensor(list(src), dtype=torch.long)
        src_mask[i, : len(src)] = 1
        tgt[i, : len(y)] = torch.as_tensor(list(y), dtype=torch.long)
    lengths = torch.tensor([len(y) for _, y in pairs], dtype=torch.long)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {
        "input_ids": src_ids,
        "attention_mask": src_mask,
        "targets": tgt,
        "target_mask": mask,
        "lengths": lengths,
    }


def corrupt(
    targets: torch.Tensor,
    target_mask: torch.Tensor,
    noise: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SUNDAE's corruption: ``(corrupted [B, L], alpha [B], replaced [B, L] bool)``. Each
    sequence draws α ~ U(0, 1), then each of its target positions is replaced with
    probability α by a token drawn uniformly from ``noise`` [K] (which may equal the old one).
    Draws, in order: α [B], the replace coins [B, L], the noise indices [B, L]."""
    b, length = targets.shape
    dev = targets.device
    alpha = torch.rand(b, generator=generator, device=dev)
    replaced = (
        torch.rand(b, length, generator=generator, device=dev) < alpha[:, None]
    ) & target_mask
    pick = torch.randint(noise.numel(), (b, length), generator=generator, device=dev)
    corrupted = torch.where(replaced, noise.to(dev)[pick], targets)
    return corrupted, alpha, replaced


def _token_ce(
    logits: torch.Tensor, targets: torch.Tensor, where: torch.Tensor, smoothing: float
) -> torch.Tensor:
    return F.cross_entropy(logits[where].float(), targets[where], label_smoothing=smoothing)


def length_loss(model: NARSeq2Seq, enc_hidden: torch.Tensor, batch: dict) -> torch.Tensor:
    """Cross-entropy of the length predictor against the batch's target lengths."""
    top = model.max_target_length
    if int(batch["lengths"].max()) > top:
        raise GencraftError(
            f"a target of {int(batch['lengths'].max())} tokens exceeds the model's "
            f"max_target_length={top}"
        )
    logits = model.length_logits(enc_hidden, batch["attention_mask"])
    return F.cross_entropy(logits.float(), batch["lengths"])


@dataclass
class LossOutput:
    """``loss`` (what is minimised); ``parts``: its named pieces (floats, for logs);
    ``inputs``: the decoder input of each unrolled step (SUNDAE), for inspection."""

    loss: torch.Tensor
    parts: dict[str, float] = field(default_factory=dict)
    inputs: list[torch.Tensor] = field(default_factory=list)


def sundae_loss(
    model: NARSeq2Seq,
    batch: dict,
    *,
    noise: torch.Tensor,
    unroll_steps: int = 2,
    length_loss_weight: float = 0.1,
    label_smoothing: float = 0.0,
    generator: torch.Generator | None = None,
) -> LossOutput:
    """SUNDAE's unrolled denoising loss. Draws: :func:`corrupt`'s, then for each unrolled step
    after the first, one ``torch.multinomial`` sample [B·L] from the previous prediction."""
    enc = model.encode(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    y, mask = batch["targets"], batch["target_mask"]
    current, _, _ = corrupt(y, mask, noise, generator)
    losses, inputs = [], []
    for step in range(unroll_steps):
        inputs.append(current)
        logits = model.decode_logits(current, enc, batch["attention_mask"], mask.long())
        losses.append(_token_ce(logits, y, mask, label_smoothing))
        if step + 1 < unroll_steps:
            with torch.no_grad():  # the sample is an input, not a path for gradients
                probs = torch.softmax(logits.detach().float(), dim=-1)
                sample = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=generator)
                current = torch.where(mask, sample.view_as(y), y)
    token = torch.stack(losses).mean()
    length = length_loss(model, enc, batch)
    parts = {f"step{i + 1}": float(v.detach()) for i, v in enumerate(losses)}
    parts.update(tokens=float(token.detach()), length=float(length.detach()))
    return LossOutput(token + length_loss_weight * length, parts, inputs)


def mask_predict_loss(
    model: NARSeq2Seq,
    batch: dict,
    *,
    mask_id: int,
    length_loss_weight: float = 0.1,
    label_smoothing: float = 0.0,
    generator: torch.Generator | None = None,
) -> LossOutput:
    """Mask-Predict's conditional masked-LM loss: n ~ U{1..|y|} positions of each target are
    [MASK]ed (chosen uniformly), and only they are scored. Draws: n [B], then the scores
    [B, L] whose n smallest positions are masked."""
    enc = model.encode(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    y, mask, lengths = batch["targets"], batch["target_mask"], batch["lengths"]
    dev = y.device
    n = (torch.rand(y.shape[0], generator=generator, device=dev) * lengths).floor().long() + 1
    n = torch.minimum(n, lengths)
    scores = torch.rand(y.shape, generator=generator, device=dev).masked_fill(~mask, 2.0)
    rank = scores.argsort(dim=1).argsort(dim=1)
    masked = (rank < n[:, None]) & mask
    inputs = y.masked_fill(masked, mask_id)
    logits = model.decode_logits(inputs, enc, batch["attention_mask"], mask.long())
    token = _token_ce(logits, y, masked, label_smoothing)
    length = length_loss(model, enc, batch)
    parts = {"tokens": float(token.detach()), "length": float(length.detach())}
    return LossOutput(token + length_loss_weight * length, parts, [inputs])


def autoregressive_loss(
    model: NARSeq2Seq, batch: dict, *, start_id: int, end_id: int, label_smoothing: float = 0.0
) -> LossOutput:
    """Teacher forcing: decoder input [CLS] y, labels y [SEP] (the standard BERT2BERT loss)."""
    if model.nar_settings.bidirectional:
        raise GencraftError(
            "the autoregressive objective needs a causal decoder (convert with "
            "bidirectional=False): a bidirectional decoder would see the token it predicts"
        )
    y, mask = batch["targets"], batch["target_mask"]
    b = y.shape[0]
    start = torch.full((b, 1), start_id, dtype=torch.long, device=y.device)
    dec_in = torch.cat([start, y], dim=1)
    labels = torch.cat([y, torch.zeros_like(start)], dim=1)
    labels[torch.arange(b), batch["lengths"]] = end_id
    valid = torch.cat([torch.ones_like(start, dtype=torch.bool), mask], dim=1)
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=dec_in,
        decoder_attention_mask=valid.long(),
        use_cache=False,
    )
    token = _token_ce(out.logits, labels, valid, label_smoothing)
    return LossOutput(token, {"tokens": float(token.detach())})


def make_loss(
    cfg: ObjectiveConfig, tokenizer: Any, generator: torch.Generator | None = None
) -> Callable[[NARSeq2Seq, dict], tuple[torch.Tensor, dict[str, float]]]:
    """``loss_fn(model, batch) -> (loss, parts)`` of ``cfg.objective``, for the shared ``fit``."""
    ids = target_token_ids(tokenizer)
    noise = noise_ids(tokenizer)

    def loss_fn(model: NARSeq2Seq, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        if cfg.objective == "sundae":
            out = sundae_loss(
                model,
                batch,
                noise=noise,
                unroll_steps=cfg.unroll_steps,
                length_loss_weight=cfg.length_loss_weight,
                label_smoothing=cfg.label_smoothing or 0.0,
                generator=generator,
            )
        elif cfg.objective == "mask-predict":
            out = mask_predict_loss(
                model,
                batch,
                mask_id=ids["mask"],
                length_loss_weight=cfg.length_loss_weight,
                label_smoothing=cfg.label_smoothing or 0.0,
                generator=generator,
            )
        else:
            out = autoregressive_loss(
                model,
                batch,
                start_id=ids["start"],
                end_id=ids["end"],
                label_smoothing=cfg.label_smoothing or 0.0,
            )
        return out.loss, out.parts

    return loss_fn
