"""Text in, text out around ``model.generate`` for causal LMs and encoder-decoders."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gencraft.errors import GencraftError


def build_inputs(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    chat: bool | None = None,
    max_input_tokens: int | None = None,
    left: bool = True,
    pad_token_id: int | None = None,
) -> dict:
    """Tokenise ``prompts`` as one padded batch (``input_ids``/``attention_mask`` [B, T]) with
    the shared prompt encoder and pad rule (:mod:`gencraft.models.prompts`): each prompt one
    user turn (chat template when the tokenizer has one, ``chat=None``); padded on the left for
    a causal LM to continue (``left=False`` for an encoder's input). ``pad_token_id``: default
    the tokenizer's, else its EOS (``generate_text`` passes
    :func:`gencraft.models.introspect.pad_id`)."""
    from gencraft.models.prompts import encode_user_turn, pad_batch

    if isinstance(prompts, str) or not prompts:
        raise GencraftError("prompts must be a non-empty list of strings")
    empty = [i for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        raise GencraftError(f"prompt(s) {empty} are empty; give text to continue")
    rows = []
    for p in prompts:
        ids = encode_user_turn(tokenizer, p, chat=chat)
        if max_input_tokens is not None:
            ids = ids[-max_input_tokens:] if left else ids[:max_input_tokens]
        rows.append({"input_ids": ids})
    pad = pad_token_id
    if pad is None:
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    return pad_batch(rows, pad if pad is not None else 0, left=left)


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
    from gencraft.models.introspect import (
        context_size,
        encoder_context_size,
        is_encoder_decoder,
        pad_id,
    )

    lm_head = getattr(model, "get_output_embeddings", lambda: None)()
    if not callable(getattr(model, "generate", None)) or lm_head is None:
        raise GencraftError(
            f"{type(model).__name__} cannot generate text: it is an encoder without a "
            "language-model head; use a causal LM or an encoder-decoder (e.g. smollm2-135m, "
            "minilm-l6-bert2bert)"
        )
    enc = build_inputs(
        tokenizer,
        prompts,
        chat=chat,
        max_input_tokens=max_input_tokens,
        left=not is_encoder_decoder(model),
        pad_token_id=pad_id(model, tokenizer),
    )
    enc = {k: v.to(model.device) for k, v in enc.items()}
    n_in, n_new = enc["input_ids"].shape[1], int(generate_kw.get("max_new_tokens") or 20)
    if is_encoder_decoder(model):
        ctx, need, what = encoder_context_size(model), n_in, "the input"
        dec = context_size(model)
        if dec is not None and n_new + 1 > dec:
            raise GencraftError(
                f"max_new_tokens={n_new} exceeds the decoder's context of {dec} positions"
            )
    else:
        ctx, need, what = context_size(model), n_in + n_new, "the prompt plus max_new_tokens"
    if ctx is not None and need > ctx:
        raise GencraftError(
            f"{what} ({need} tokens) exceeds the model's context of {ctx} positions; shorten "
            "the prompt or lower max_new_tokens"
        )
    if seed is not None:
        torch.manual_seed(seed)
    generate_kw.setdefault("pad_token_id", pad_id(model, tokenizer))
    out = model.generate(**enc, **generate_kw)
    if not model.config.is_encoder_decoder:
        out = out[:, enc["input_ids"].shape[1] :]  # drop the (left-padded) prompt
    return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
