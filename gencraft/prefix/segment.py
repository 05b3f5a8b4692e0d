"""Segmenters: which of S segments each token belongs to (UniBlock's "discourse" units).

A segmenter maps ``input_ids`` [B, T] and ``attention_mask`` [B, T] (1 = real token) to
``segment_ids`` [B, T] in [0, S). Padding gets segment 0 (its rows are masked anyway).

* ``"uniform"``: contiguous segments, as equal as possible over the real tokens of each row
  (``torch.arange(n).tensor_split(S)``, so the first ``n % S`` segments are one token longer);
* ``"sentence"``: sentences (a sentence ends after a token whose text ends in ``.``, ``!``,
  ``?`` or a newline) grouped into S contiguous runs of sentences, as equal as possible in
  sentence count; a row with fewer than S sentences uses the first segments only;
* a callable ``fn(input_ids, attention_mask, num_segments) -> segment_ids``.

During generation the segment of the i-th generated token (0-based) cannot depend on the
tokens a beam will later choose, so it follows the position rule :func:`output_segment`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gencraft.errors import ConfigError

SENTENCE_END = (".", "!", "?", "\n")


def uniform_segments(attention_mask: torch.Tensor, num_segments: int) -> torch.Tensor:
    """[B, T] mask -> [B, T] segment ids: real tokens cut into S near-equal contiguous runs."""
    mask = attention_mask.bool()
    out = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    for b in range(mask.shape[0]):
        pos = mask[b].nonzero().squeeze(-1)
        for s, chunk in enumerate(torch.arange(pos.numel()).tensor_split(num_segments)):
            out[b, pos[chunk.to(pos.device)]] = s
    return out


def sentence_segments(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, num_segments: int, tokenizer: Any
) -> torch.Tensor:
    """[B, T] -> [B, T] segment ids by sentences (see the module docstring)."""
    if tokenizer is None:
        raise ConfigError("the 'sentence' segmenter needs a tokenizer (PrefixModel(tokenizer=))")
    mask = attention_mask.bool()
    out = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    for b in range(mask.shape[0]):
        pos = mask[b].nonzero().squeeze(-1).tolist()
        texts = tokenizer.convert_ids_to_tokens([int(input_ids[b, p]) for p in pos])
        pieces = [tokenizer.convert_tokens_to_string([t]) for t in texts]
        sentence, sentences = 0, []
        for piece in pieces:
            sentences.append(sentence)
            if piece.rstrip(" ").endswith(SENTENCE_END):
                sentence += 1
        n = (sentences[-1] + 1) if sentences else 0
        group = torch.zeros(max(n, 1), dtype=torch.long)
        for s, chunk in enumerate(torch.arange(n).tensor_split(num_segments)):
            group[chunk] = s
        for p, sent in zip(pos, sentences, strict=True):
            out[b, p] = group[sent]
    return out


def segment(
    segmenter: str | Callable[..., torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_segments: int,
    tokenizer: Any = None,
) -> torch.Tensor:
    """The segment ids [B, T] of ``input_ids`` under ``segmenter`` (S = ``num_segments``)."""
    if num_segments == 1:
        return torch.zeros(input_ids.shape, dtype=torch.long, device=input_ids.device)
    if segmenter == "uniform":
        return uniform_segments(attention_mask, num_segments)
    if segmenter == "sentence":
        return sentence_segments(input_ids, attention_mask, num_segments, tokenizer)
    if callable(segmenter):
        out = segmenter(input_ids, attention_mask, num_segments)
        check_segment_ids(out, input_ids.shape, num_segments, "the segmenter's output")
        return out.long()
    raise ConfigError(f"unknown segmenter {segmenter!r}: 'uniform', 'sentence' or a callable")


def output_segment(index: torch.Tensor, num_segments: int, length: int) -> torch.Tensor:
    """Segment of the ``index``-th generated token (0-based): min(S − 1, ⌊i·S / L⌋), the
    uniform rule for an output of the expected length L."""
    return (index * num_segments // max(length, 1)).clamp(max=num_segments - 1)


def check_segment_ids(
    segment_ids: torch.Tensor, shape: tuple[int, ...] | torch.Size, num_segments: int, what: str
) -> None:
    """A clear error unless ``segment_ids`` is an integer tensor of ``shape`` in [0, S)."""
    if not isinstance(segment_ids, torch.Tensor) or segment_ids.dtype not in (
        torch.long,
        torch.int,
        torch.int32,
        torch.int16,
        torch.uint8,
    ):
        raise ConfigError(f"{what} must be an integer tensor [B, T], got {type(segment_ids)}")
    if tuple(segment_ids.shape) != tuple(shape):
        raise ConfigError(
            f"{what} must have the shape of the tokens {list(shape)}, got {list(segment_ids.shape)}"
        )
    if segment_ids.numel() and (
        int(segment_ids.min()) < 0 or int(segment_ids.max()) >= num_segments
    ):
        raise ConfigError(
            f"{what} must lie in [0, {num_segments}), got values in "
            f"[{int(segment_ids.min())}, {int(segment_ids.max())}]"
        )
