"""Training rows for DASP. A causal LM reads ``source + SEPARATOR + target + EOS`` with the
loss on the target only (Li & Liang's GPT-2 format); an encoder-decoder reads the source and is
trained on the target. Generation continues ``source + SEPARATOR``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gencraft.data.tasks import Pair
from gencraft.models.introspect import is_encoder_decoder, target_eos_id
from gencraft.models.prompts import pad_batch

SEPARATOR = "\nText:"


def encode_pairs(
    pairs: list[Pair],
    tokenizer: Any,
    model: nn.Module,
    max_source_tokens: int,
    max_target_tokens: int,
) -> list[dict[str, list[int]]]:
    """Token rows: causal LM ``input_ids``/``labels`` (-100 on the source), encoder-decoder
    ``input_ids`` and ``labels``."""
    if not pairs:
        return []
    eos = target_eos_id(model, tokenizer)
    # one batched call each (the fast tokenizers' batch path): the same ids as pair by pair
    sources = tokenizer([p.source for p in pairs], add_special_tokens=False)["input_ids"]
    targets = [" " + p.target.strip() for p in pairs]
    targets = tokenizer(targets, add_special_tokens=False)["input_ids"]
    sep = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    seq2seq = is_encoder_decoder(model)
    rows = []
    for src, tgt in zip(sources, targets, strict=True):
        src = src[:max_source_tokens]
        tgt = [*tgt[:max_target_tokens], eos]
        if seq2seq:
            rows.append({"input_ids": [*src, eos], "labels": tgt})
        else:
            rows.append({"input_ids": src + sep + tgt, "labels": [-100] * len(src + sep) + tgt})
    return rows


def collate_rows(rows: list[dict[str, list[int]]], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded training batch; encoder-decoder labels padded separately."""
    if "labels" in rows[0] and len(rows[0]["labels"]) != len(rows[0]["input_ids"]):
        enc = pad_batch([{"input_ids": r["input_ids"]} for r in rows], pad)
        lab = pad_batch([{"input_ids": r["labels"]} for r in rows], -100)["input_ids"]
        return {**enc, "labels": lab}
    return pad_batch(rows, pad)
