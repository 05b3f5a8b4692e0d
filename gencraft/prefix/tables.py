"""DASP's block tables: which prefix columns each token may see ([B, T, P] bool), from the
tokens' segments (given, or the configured segmenter's) and the prefix groups of
:func:`~gencraft.prefix.functional.prefix_block_mask`."""

from __future__ import annotations

from typing import Any

import torch

from gencraft.errors import ConfigError
from gencraft.prefix.config import PrefixConfig
from gencraft.prefix.functional import prefix_block_mask
from gencraft.prefix.segment import check_segment_ids, segment


def blocks(cfg: PrefixConfig, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    """[B, T, P]: the prefix columns each token of ``segment_ids`` [B, T] may see."""
    return prefix_block_mask(segment_ids, cfg.num_virtual_tokens, num_segments)


def segments(
    cfg: PrefixConfig,
    tokenizer: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    s: int,
    given: torch.Tensor | None,
    what: str,
) -> torch.Tensor:
    """[B, T] each token's segment in [0, s): ``given`` (checked) or the segmenter's."""
    if given is not None:
        check_segment_ids(given, ids.shape, s, what)
        return given.long().to(ids.device)
    return segment(cfg.segmenter, ids, mask, s, tokenizer)


def decoder_only_table(
    cfg: PrefixConfig,
    tokenizer: Any,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    segment_ids: torch.Tensor | None,
    output_mask: torch.Tensor,
) -> torch.Tensor:
    """[B, T, P] of a decoder-only model: prompt tokens by ``encoder_segments`` groups, output
    tokens (``output_mask``) by ``decoder_segments`` groups."""
    s_in, s_out = cfg.encoder_segments, cfg.decoder_segments
    if segment_ids is not None:
        check_segment_ids(segment_ids, input_ids.shape, max(s_in, s_out), "segment_ids")
        seg_in = seg_out = segment_ids.long()
        for region, s, name in ((~output_mask, s_in, "prompt"), (output_mask, s_out, "output")):
            bad = segment_ids[region & mask.bool()]
            if bad.numel() and int(bad.max()) >= s:
                raise ConfigError(
                    f"segment_ids of {name} tokens must lie in [0, {s}) ({name} segments), "
                    f"got up to {int(bad.max())}"
                )
    else:
        m = mask.bool()
        seg_in = segment(cfg.segmenter, input_ids, m & ~output_mask, s_in, tokenizer)
        seg_out = segment(cfg.segmenter, input_ids, m & output_mask, s_out, tokenizer)
    blocks_in = blocks(cfg, seg_in.clamp(max=s_in - 1), s_in)
    blocks_out = blocks(cfg, seg_out.clamp(max=s_out - 1), s_out)
    return torch.where(output_mask[..., None], blocks_out, blocks_in)


def input_blocks(
    cfg: PrefixConfig,
    tokenizer: Any,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    segment_ids: torch.Tensor | None,
) -> torch.Tensor:
    """[B, T, P] the prefix columns each input token may see (``encoder_segments``
    groups; ``segment_ids`` or the segmenter's)."""
    s = cfg.encoder_segments
    return blocks(cfg, segments(cfg, tokenizer, input_ids, mask, s, segment_ids, "segment_ids"), s)


def needs_tables(cfg: PrefixConfig) -> bool:
    """Whether any layer is blocked (else every token sees every prefix column)."""
    return cfg.blocking and cfg.blocked_layers != "none"


def decoder_table(
    cfg: PrefixConfig,
    tokenizer: Any,
    decoder_input_ids: torch.Tensor | None,
    decoder_attention_mask: torch.Tensor | None,
    labels: torch.Tensor | None,
    given: torch.Tensor | None,
) -> torch.Tensor:
    """[B, T, P] of an encoder-decoder's decoder: from ``decoder_input_ids``, else from
    ``labels`` shifted right (the start token in segment 0)."""
    s = cfg.decoder_segments
    if decoder_input_ids is not None:
        ids = decoder_input_ids
        mask = decoder_attention_mask
        if mask is None:
            mask = torch.ones_like(ids)
        seg = segments(cfg, tokenizer, ids, mask, s, given, "decoder_segment_ids")
        return blocks(cfg, seg, s)
    if labels is None:
        raise ConfigError("an encoder-decoder forward needs labels or decoder_input_ids")
    if given is not None:
        check_segment_ids(given, labels.shape, s, "decoder_segment_ids")
        return blocks(cfg, given.long(), s)
    lab_mask = labels != -100
    seg = segment(cfg.segmenter, labels.clamp(min=0), lab_mask, s, tokenizer)
    # decoder input j holds label j - 1 (the start token at 0, in segment 0)
    shifted = torch.cat([seg.new_zeros(seg.shape[0], 1), seg[:, :-1]], dim=1)
    return blocks(cfg, shifted, s)
