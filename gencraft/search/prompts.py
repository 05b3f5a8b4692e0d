"""Instruction prompts built from the local data, for the search experiments (thesis §6.5, 7.4).

``xsum``: "Summarize in one sentence:" + an XSum document (truncated to ``max_source_words``);
``e2e``: "Describe this restaurant:" + an E2E meaning representation (``name[...], ...``).
With a chat model (a tokenizer that has a chat template) the instruction becomes one user turn
and the assistant turn is opened, as ``generate`` users would do.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gencraft.errors import GencraftError

INSTRUCTIONS = {"xsum": "Summarize in one sentence:", "e2e": "Describe this restaurant:"}


def instruction_texts(
    kind: str,
    n: int,
    data_dir: str | os.PathLike | None = None,
    *,
    split: str = "test",
    max_source_words: int = 200,
) -> list[str]:
    """The first ``n`` instructions of ``kind`` (``xsum`` or ``e2e``) on ``split``."""
    if kind == "xsum":
        from gencraft.data import load_summarization

        docs = [d.document for d in load_summarization("xsum", split, data_dir)[:n]]
        docs = [" ".join(d.split()[:max_source_words]) for d in docs]
    elif kind == "e2e":
        from gencraft.data.data2text import load_data_to_text

        docs = [ex.meta["mr"] for ex in load_data_to_text("e2e", split, data_dir)[:n]]
    else:
        raise GencraftError(
            f"unknown prompt kind {kind!r}; choose one of {', '.join(INSTRUCTIONS)}"
        )
    return [f"{INSTRUCTIONS[kind]}\n{d}" for d in docs]


def instruction_references(
    kind: str,
    n: int,
    data_dir: str | os.PathLike | None = None,
    *,
    split: str = "test",
    every: bool = False,
) -> list[str] | list[list[str]]:
    """The first reference output of each of the first ``n`` examples (summary or text);
    ``every``: each example's list of all its references (E2E has several)."""
    if kind == "xsum":
        from gencraft.data import load_summarization

        docs = load_summarization("xsum", split, data_dir)[:n]
        return [[d.summary] if every else d.summary for d in docs]
    if kind == "e2e":
        from gencraft.data.data2text import load_data_to_text

        exs = load_data_to_text("e2e", split, data_dir)[:n]
        return [list(ex.references) if every else ex.references[0] for ex in exs]
    raise GencraftError(f"unknown prompt kind {kind!r}; choose one of {', '.join(INSTRUCTIONS)}")


def encode_prompt(tokenizer: Any, text: str) -> torch.Tensor:
    """[1, P] ids of ``text`` as one user turn (chat template when the tokenizer has one); see
    :func:`gencraft.models.prompts.encode_user_turn`."""
    from gencraft.models.prompts import encode_user_turn

    return torch.tensor([encode_user_turn(tokenizer, text)])
