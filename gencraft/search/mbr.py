"""Minimum Bayes risk (MBR) decoding: N candidates per input (samples of the batched sampler,
or ``generate``'s N best beams), and of them the one with the highest expected utility against
the others (:func:`gencraft.metrics.mbr.mbr_select`: chrF, BLEU, ROUGE-L or BERTScore)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gencraft.errors import GencraftError
from gencraft.metrics.mbr import check_utility, mbr_select
from gencraft.models.generate import prepared_inputs


def mbr_generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    n: int,
    utility: str = "chrf",
    seed: int | None = None,
    epsilon: float | None = None,
    chat: bool | None = None,
    max_input_tokens: int | None = None,
    **generate_kw,
) -> list[str]:
    """One MBR output per prompt, the text only: the prompts encoded as
    :func:`gencraft.models.generate.generate_text` encodes them (chat template, padding side,
    context check), ``n`` candidates each drawn with ``generate_kw`` (``do_sample`` and its
    ``temperature``, ``top_k``, ``top_p``; ``epsilon`` its samples' epsilon cutoff; without
    ``do_sample``, the N best beams), prompt b's samples seeded ``seed + b``; the candidate of
    the highest expected ``utility`` is returned."""
    with torch.no_grad():
        enc = prepared_inputs(model, tokenizer, prompts, chat, max_input_tokens, generate_kw)
        kw = dict(n=n, utility=utility, seed=seed or 0, epsilon=epsilon)
        return mbr_batch_text(model, tokenizer, enc, **kw, **generate_kw)


def mbr_candidates(
    model: PreTrainedModel,
    enc: dict,
    *,
    n: int,
    seed: int = 0,
    epsilon: float | None = None,
    **generate_kw,
) -> list[list[int]]:
    """N candidates per input of the padded batch ``enc`` (B·n token lists, input 0's first):
    with ``do_sample``, samples of the batched sampler (input b seeded ``seed + b``; its
    ``temperature``, ``top_k``, ``top_p`` and ``epsilon`` as transformers' warpers); else the
    N best outputs of ``generate``'s beam search (``num_beams`` at least N)."""
    from transformers import (
        EpsilonLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from gencraft.models.introspect import eos_ids
    from gencraft.models.sampling import sample_batch

    new = int(generate_kw.get("max_new_tokens") or 20)
    if not generate_kw.get("do_sample"):
        if epsilon is not None:
            raise GencraftError("epsilon applies to sampled candidates; add --do-sample")
        beams = max(int(generate_kw.pop("num_beams", 1) or 1), n)
        out = model.generate(**enc, **generate_kw, num_beams=beams, num_return_sequences=n)
        start = 1 if model.config.is_encoder_decoder else enc["input_ids"].shape[1]
        return out[:, start:].tolist()
    warpers = [TemperatureLogitsWarper(float(generate_kw.get("temperature") or 1.0))]
    if generate_kw.get("top_k"):
        warpers.append(TopKLogitsWarper(int(generate_kw["top_k"])))
    if generate_kw.get("top_p") is not None:
        warpers.append(TopPLogitsWarper(float(generate_kw["top_p"])))
    if epsilon is not None:
        warpers.append(EpsilonLogitsWarper(epsilon))
    b = enc["input_ids"].shape[0]
    return sample_batch(
        model,
        enc["input_ids"],
        enc["attention_mask"],
        n=n,
        max_new_tokens=new,
        seeds=[seed + i for i in range(b)],
        eos_token_id=eos_ids(model, None),
        processors=warpers,
    )


def mbr_batch_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    enc: dict,
    *,
    n: int,
    utility: str = "chrf",
    seed: int = 0,
    epsilon: float | None = None,
    **generate_kw,
) -> list[str]:
    """Minimum Bayes risk decoding of the padded batch ``enc``: ``n`` candidates per input
    (:func:`mbr_candidates`), decoded, and the one of the highest expected ``utility``
    against the others (:func:`gencraft.metrics.mbr.mbr_select`)."""
    if n < 1:
        raise GencraftError(f"mbr (candidates per input) must be >= 1, got {n}")
    check_utility(utility)  # before any candidate is drawn
    ids = mbr_candidates(model, enc, n=n, seed=seed, epsilon=epsilon, **generate_kw)
    texts = [t.strip() for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]
    rows = [texts[i : i + n] for i in range(0, len(texts), n)]
    return [row[k] for row, k in zip(rows, mbr_select(rows, utility).index, strict=True)]
