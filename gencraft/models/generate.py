"""Text in, text out around ``model.generate`` for causal LMs and encoder-decoders."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def build_inputs(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    chat: bool | None = None,
    max_input_tokens: int | None = None,
) -> dict:
    """Tokenise ``prompts`` as one padded batch (``input_ids``/``attention_mask`` [B, T]).

    ``chat=None`` applies the tokenizer's chat template when it has one (instruction-tuned
    models such as SmolLM2-Instruct), each prompt as a single user turn.
    """
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
    if use_chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat=True but this tokenizer has no chat template")
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]
        kw = {"add_special_tokens": False}
    else:
        texts, kw = list(prompts), {}
    return tokenizer(
        texts,
        return_tensors="pt",
        padding=True,
        truncation=max_input_tokens is not None,
        max_length=max_input_tokens,
        **kw,
    )


@torch.no_grad()
def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    chat: bool | None = None,
    max_input_tokens: int | None = None,
    seed: int | None = None,
    **generate_kw,
) -> list[str]:
    """Generate one continuation per prompt and return only the new text.

    ``generate_kw`` goes to ``model.generate`` (``max_new_tokens``, ``num_beams``,
    ``do_sample``, ``top_k``, ``top_p``, ``logits_processor``...). ``seed`` seeds sampling.
    """
    enc = build_inputs(tokenizer, prompts, chat=chat, max_input_tokens=max_input_tokens)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    if seed is not None:
        torch.manual_seed(seed)
    generate_kw.setdefault("pad_token_id", tokenizer.pad_token_id)
    out = model.generate(**enc, **generate_kw)
    if not model.config.is_encoder_decoder:
        out = out[:, enc["input_ids"].shape[1] :]  # drop the (left-padded) prompt
    return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
