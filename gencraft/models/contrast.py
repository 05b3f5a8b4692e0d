"""Context-aware decoding (CAD) by paired rows, for a model whose own ``generate`` has to run
the decoding: a prefix model, whose prefixes, block tables and row states live in its
``generate`` (gencraft's steppers run the prompt themselves and cannot carry them).

The batch is doubled: rows [0, B) are the inputs with their context, rows [B, 2B) the same
inputs without it. :class:`PairedContrast`, a ``LogitsProcessor`` placed after ``generate``'s
own, gives both copies of an input the contrasted distribution

    log_softmax((1 + α)·log p(y | c, x) − α·log p(y | x))

(:func:`gencraft.models.stepping.contrast`) at every step, so greedy and beam search make the
same choices in both halves: the context-free copy follows its twin's hypotheses with its own
padding, positions and cache, which ``generate`` reorders. One model call over 2B rows per
step, where :class:`~gencraft.models.stepping.ContrastStepper` makes two over B.

``generate``'s own processors (its generation config's n-gram blocking, repetition penalty...)
act on each stream before the contrast, and a decoder-only model's processors see each
stream's own prompt; :func:`gencraft.search.custom_generate.context_aware` applies them to the
contrasted scores instead. With none, the two decode alike (tested)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from gencraft.config import check_cad_alpha
from gencraft.errors import GencraftError
from gencraft.models.stepping import contrast


class PairedContrast(LogitsProcessor):
    """Scores [2N, V] of a doubled batch (rows [0, N) with the context, [N, 2N) without, in
    the same order: ``generate`` lays inputs out input-major, beams within) -> the contrasted
    log-probabilities [N, V], given to both halves."""

    def __init__(self, alpha: float = 0.5, adaptive: bool = False) -> None:
        if not adaptive:
            check_cad_alpha(alpha, "cad alpha")
        self.alpha, self.adaptive = alpha, adaptive

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = scores.shape[0] // 2
        if scores.shape[0] != 2 * n:
            raise GencraftError(f"paired contrast needs an even number of rows, got {2 * n + 1}")
        lp = torch.log_softmax(scores.float(), dim=-1)
        mixed = contrast(lp[:n], lp[n:], self.alpha, self.adaptive)
        return torch.cat([mixed, mixed]).to(scores.dtype)


def _padded(ids: torch.Tensor, mask: torch.Tensor, width: int, pad: int, left: bool):
    """[B, width]: ``ids`` and ``mask`` padded on one side."""
    extra = width - ids.shape[1]
    if extra == 0:
        return ids, mask
    fill = ids.new_full((ids.shape[0], extra), pad)
    parts = (fill, ids) if left else (ids, fill)
    masks = (torch.zeros_like(fill), mask) if left else (mask, torch.zeros_like(fill))
    return torch.cat(parts, 1), torch.cat(masks, 1).to(mask.dtype)


def paired_contrast_generate(
    generate: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    negative_input_ids: torch.Tensor,
    negative_attention_mask: torch.Tensor,
    *,
    cad_alpha: float = 0.5,
    cad_adaptive: bool = False,
    left_padding: bool,
    pad_token_id: int,
    **generate_kw: Any,
) -> torch.Tensor:
    """CAD with a model's own ``generate`` (greedy or beam search): the context inputs
    [B, T] and the context-free ones [B, T'] as one batch of 2B, padded to one width (on the
    left for a decoder-only model, ``left_padding``; an encoder's inputs on the right), with
    :class:`PairedContrast` after ``generate``'s processors. Returns the token ids ``generate``
    returns for the B context inputs (a decoder-only model's prompt as given, [B, T], then the
    new tokens)."""
    if generate_kw.get("do_sample"):
        raise GencraftError(
            "CAD by paired rows decodes greedily or with beam search: sampling would draw "
            "the two copies of an input apart"
        )
    if generate_kw.get("return_dict_in_generate"):
        raise GencraftError("CAD by paired rows returns token ids, not generate's dict")
    b, t = input_ids.shape
    if negative_input_ids.shape[0] != b:
        raise GencraftError(
            f"{negative_input_ids.shape[0]} context-free inputs for {b} inputs; give one each"
        )
    width = max(t, negative_input_ids.shape[1])
    a = _padded(input_ids, attention_mask, width, pad_token_id, left_padding)
    n = _padded(negative_input_ids, negative_attention_mask, width, pad_token_id, left_padding)
    processors = LogitsProcessorList(
        [
            *(generate_kw.pop("logits_processor", None) or []),
            PairedContrast(cad_alpha, cad_adaptive),
        ]
    )
    out = generate(
        input_ids=torch.cat([a[0], n[0].to(a[0].device)]),
        attention_mask=torch.cat([a[1], n[1].to(a[1].device)]),
        logits_processor=processors,
        pad_token_id=pad_token_id,
        **generate_kw,
    )
    out = out[: b * int(generate_kw.get("num_return_sequences") or 1)]
    # a decoder-only output starts with the prompt: drop the padding the pairing added
    return out[:, width - t :] if left_padding else out
