"""One prompt encoder and one pad rule for every gencraft method.

* :func:`encode_user_turn`: a text as one user turn with the assistant turn opened, through the
  tokenizer's chat template when it has one (instruction models such as SmolLM2-Instruct), else
  the tokenizer's plain encoding with its special tokens;
* :func:`left_padded_batches`: prompts (id lists or [1, P] tensors) in left-padded batches of
  a given size, with the model's pad id: what every batched decoder takes;
* :func:`pad_batch`: rows of token-id lists -> padded tensors and ``attention_mask``. The pad
  rule: **left** padding for inputs a causal LM continues (generation), **right** padding for
  everything else (encoder inputs, teacher-forced training rows); ``labels`` are padded with
  -100, any other field with 0; the pad id comes from
  :func:`gencraft.models.introspect.pad_id` (the tokenizer's, else the model's, else EOS).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.models.introspect import pad_id

FILL = {"labels": -100}


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_user_turn(tokenizer: Any, text: str, *, chat: bool | None = None) -> list[int]:
    """Token ids of ``text`` as one user turn (``chat=None``: the chat template when the
    tokenizer has one; ``True`` requires it; ``False``: plain encoding)."""
    if not isinstance(text, str) or not text.strip():
        raise GencraftError("a prompt must be a non-empty string")
    use_chat = has_chat_template(tokenizer) if chat is None else chat
    if use_chat:
        if not has_chat_template(tokenizer):
            raise GencraftError("chat=True but this tokenizer has no chat template")
        turn = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(turn, add_generation_prompt=True, return_dict=True)
        return [int(i) for i in ids["input_ids"]]
    return list(tokenizer(text)["input_ids"])


def pad_batch(
    rows: Sequence[dict[str, Sequence[int]]], pad_token_id: int, *, left: bool = False
) -> dict[str, torch.Tensor]:
    """Pad rows (each a dict of equal-length-per-row id lists, ``input_ids`` required) into
    [B, T] tensors plus ``attention_mask``; ``left`` pads on the left (see the module doc)."""
    if not rows:
        raise GencraftError("cannot pad an empty batch")
    keys = list(rows[0])
    if "input_ids" not in keys:
        raise GencraftError("each row needs input_ids")
    out: dict[str, torch.Tensor] = {}
    for k in keys:
        width = max(len(r[k]) for r in rows)
        fill = pad_token_id if k == "input_ids" else FILL.get(k, 0)
        padded = []
        for r in rows:
            extra = [fill] * (width - len(r[k]))
            padded.append([*extra, *r[k]] if left else [*r[k], *extra])
        out[k] = torch.tensor(padded, dtype=torch.long)
    width = out["input_ids"].shape[1]
    out["attention_mask"] = torch.tensor(
        [
            [0] * (width - len(r["input_ids"])) + [1] * len(r["input_ids"])
            if left
            else [1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"]))
            for r in rows
        ]
    )
    return out


def left_padded_batches(
    model: Any, tokenizer: Any, prompts: Sequence[Sequence[int] | torch.Tensor], size: int
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(first prompt's index, ids [b, P], attention mask [b, P]) for each batch of ``size``
    prompts in order, left-padded with the pad id of ``tokenizer`` (else the model's, else
    EOS). A prompt is a list of ids or a tensor [P] or [1, P]."""
    if size < 1:
        raise GencraftError(f"batch size must be >= 1, got {size}")
    pad = pad_id(model, tokenizer)
    rows = [
        {"input_ids": p.flatten().tolist() if isinstance(p, torch.Tensor) else list(p)}
        for p in prompts
    ]
    for first in range(0, len(rows), size):
        batch = pad_batch(rows[first : first + size], pad, left=True)
        yield first, batch["input_ids"], batch["attention_mask"]
