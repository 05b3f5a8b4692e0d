"""Text in, text out around ``model.generate`` for causal LMs and encoder-decoders."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from gencraft.errors import GencraftError


def build_inputs(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    chat: bool | None = None,
    max_input_tokens: int | None = None,
    left: bool = True,
    pad_token_id: int | None = None,
    allow_empty: bool = False,
) -> dict:
    """Tokenise ``prompts`` as one padded batch (``input_ids``/``attention_mask`` [B, T]) with
    the shared prompt encoder and pad rule (:mod:`gencraft.models.prompts`): each prompt one
    user turn (chat template when the tokenizer has one, ``chat=None``); padded on the left for
    a causal LM to continue (``left=False`` for an encoder's input). ``pad_token_id``: default
    the tokenizer's, else its EOS (``generate_text`` passes
    :func:`gencraft.models.introspect.pad_id`). ``allow_empty``: an empty prompt is the
    tokenizer's encoding of "" (its special tokens; EOS when it has none), as CAD's empty
    source for an encoder-decoder."""
    from gencraft.models.prompts import encode_user_turn, pad_batch

    if isinstance(prompts, str) or not prompts:
        raise GencraftError("prompts must be a non-empty list of strings")
    empty = [i for i, p in enumerate(prompts) if not p.strip()]
    if empty and not allow_empty:
        raise GencraftError(f"prompt(s) {empty} are empty; give text to continue")
    rows = []
    for i, p in enumerate(prompts):
        ids = encode_user_turn(tokenizer, p, chat=chat) if p.strip() else tokenizer("")["input_ids"]
        ids = list(ids) or [tokenizer.eos_token_id]
        if ids == [None]:  # "" encodes to nothing and no EOS can stand for it
            raise GencraftError(f"prompt {i} is empty and this tokenizer has no EOS id for it")
        if max_input_tokens is not None:
            ids = ids[-max_input_tokens:] if left else ids[:max_input_tokens]
        rows.append({"input_ids": ids})
    pad = pad_token_id
    if pad is None:
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    return pad_batch(rows, pad if pad is not None else 0, left=left)


def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    chat: bool | None = None,
    max_input_tokens: int | None = None,
    seed: int | None = None,
    negative_prompts: Sequence[str] | None = None,
    **generate_kw,
) -> list[str]:
    """Generate one continuation per prompt and return only the new text.

    ``generate_kw`` goes to ``model.generate`` (``max_new_tokens``, ``num_beams``,
    ``do_sample``, ``top_k``, ``top_p``, ``logits_processor``, ``custom_generate``...).
    ``seed`` seeds sampling. ``negative_prompts``: one per prompt, encoded as the prompts are
    (chat template, padding side) and passed as ``negative_input_ids``/
    ``negative_attention_mask`` (a contrastive ``custom_generate`` such as CAD's context-free
    stream). Minimum Bayes risk decoding is :func:`gencraft.search.mbr.mbr_generate_text`.
    """
    mbr = sorted(set(generate_kw) & {"mbr", "mbr_utility", "epsilon"})
    if mbr:
        raise GencraftError(
            f"generate_text does no MBR ({', '.join(mbr)}): use gencraft.search.mbr."
            "mbr_generate_text(model, tokenizer, prompts, n=N, utility=..., epsilon=...)"
        )
    with torch.no_grad():  # a context, not a decorator: mutmut mutates undecorated bodies
        enc = prepared_inputs(model, tokenizer, prompts, chat, max_input_tokens, generate_kw)
        if negative_prompts is not None:
            if len(negative_prompts) != len(prompts):
                raise GencraftError(
                    f"negative_prompts: one per prompt ({len(prompts)}, got "
                    f"{len(negative_prompts)})"
                )
            neg = prepared_inputs(
                model, tokenizer, negative_prompts, chat, max_input_tokens, dict(generate_kw), True
            )
            generate_kw.update(
                negative_input_ids=neg["input_ids"], negative_attention_mask=neg["attention_mask"]
            )
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**enc, **generate_kw)
        return decoded_text(model, tokenizer, enc, out)


def generation_settings(model: PreTrainedModel, generate_kw: dict) -> GenerationConfig:
    """The generation config ``generate`` starts from before its keywords: the call's
    ``generation_config`` with each field it leaves None taken from the model's (as
    ``generate`` merges them), else the model's own. For a caller that must read a setting
    (beams, returns, lengths) before handing the call on."""
    given = generate_kw.get("generation_config")
    if given is None:
        return model.generation_config
    merged = copy.deepcopy(given)
    for key, value in model.generation_config.to_dict().items():
        if getattr(merged, key, None) is None:
            setattr(merged, key, value)
    return merged


def lengths_as_new_tokens(
    generate_kw: dict, generation_config: GenerationConfig, prompt: int
) -> dict:
    """``generate_kw`` with ``generate``'s length limits as counts of new tokens, read as
    ``generate`` reads them after a prompt of ``prompt`` tokens (a causal LM's input width; an
    encoder-decoder's decoder start, 1). ``max_new_tokens``: the call's, else the generation
    config's, else ``max_length - prompt`` (the call's ``max_length``, else the config's when it
    is not the release's default), else 20. ``min_new_tokens`` likewise from ``min_length``, and
    only when positive. ``max_length`` and ``min_length`` are dropped. For a caller that feeds
    ``generate`` tokens before the prompt (a prefix's placeholders), which its total lengths
    would count. Unlike ``generate``, the default 20 is not cut to the model's positions.
    Raises when ``max_length`` leaves no new token."""
    kw, default = dict(generate_kw), GenerationConfig()
    for new, total in (("max_new_tokens", "max_length"), ("min_new_tokens", "min_length")):
        length = kw.pop(total, None)
        if length is None and getattr(generation_config, total) != getattr(default, total):
            length = getattr(generation_config, total)
        count = kw.get(new)
        if count is None:
            count = getattr(generation_config, new)
        if count is None and length is not None:
            count = length - prompt
            if new == "max_new_tokens" and count < 1:
                raise GencraftError(
                    f"max_length={length} leaves no new token after a prompt of {prompt} "
                    "tokens; raise it or give max_new_tokens"
                )
        if new == "max_new_tokens":
            kw[new] = 20 if count is None else count
        elif count is not None and count > 0:
            kw[new] = count
    return kw


def decoded_text(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, enc: dict, out
) -> list[str]:
    """The new text of ``generate``'s output [B, ...] for the batch ``enc``, stripped."""
    if not model.config.is_encoder_decoder:
        out = out[:, enc["input_ids"].shape[1] :]  # drop the (left-padded) prompt
    return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]


def prepared_inputs(
    model, tokenizer, prompts, chat, max_input_tokens, generate_kw: dict, allow_empty=False
) -> dict:
    """The padded batch on the model's device, checked against the model's context; sets
    ``generate_kw``'s default pad id."""
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
        allow_empty=allow_empty,
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
    generate_kw.setdefault("pad_token_id", pad_id(model, tokenizer))
    return enc
