"""Inputs shared by the search studies: instruction prompts from E2E and XSum, and their
left-padded batches."""

from __future__ import annotations

import torch

from gencraft.search.prompts import encode_prompt, instruction_texts

TINY = {"model": "tiny-llama"}


def batched(model, tok, prompts: list[torch.Tensor], size: int):
    """Left-padded batches (ids [b, P], attention mask [b, P]) of ``size`` prompts [1, P]."""
    from gencraft.models.prompts import left_padded_batches

    return [(ids, mask) for _, ids, mask in left_padded_batches(model, tok, prompts, size)]


def instruction_prompts(
    tok, n: int, data_dir: str | None, xsum_words: int = 60
) -> list[torch.Tensor]:
    texts = instruction_texts("e2e", n // 2, data_dir) + instruction_texts(
        "xsum", n - n // 2, data_dir, max_source_words=xsum_words
    )
    return [encode_prompt(tok, t) for t in texts]
