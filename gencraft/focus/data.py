"""Summarization examples as model inputs, for encoder-decoders and causal LMs.

Encoder-decoder: ``input_ids`` = the document (truncated to ``max_source`` tokens, with the
tokenizer's special tokens), ``labels`` = the summary without special tokens + EOS
(``max_target`` in all; the model shifts labels right behind its decoder start token).

Causal LM: ``input_ids`` = prompt + summary + EOS, where the prompt is the model's chat template
(when it has one) around ``instruction`` + the truncated document; ``labels`` = -100 on the
prompt; ``source_mask`` = True on the prompt, the span FAME attends to (see
:class:`~gencraft.focus.model.FocusForConditionalGeneration`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from gencraft.errors import GencraftError

INSTRUCTION = "Summarize the following article in one sentence."
_MARK = "\x00DOCUMENT\x00"


@dataclass
class SummaryEncoder:
    """Turns (document, summary) pairs into token ids for one model family.

    Args:
        tokenizer: the model's tokenizer.
        is_encoder_decoder: the model family.
        max_source: tokens kept from the document.
        max_target: tokens kept from the summary (EOS included).
        instruction: causal LMs: the text before the document.
        eos_token_id: the id ending targets (default: the tokenizer's EOS, else SEP); the
            trainers pass :func:`gencraft.models.introspect.target_eos_id`.
    """

    tokenizer: PreTrainedTokenizerBase
    is_encoder_decoder: bool
    max_source: int = 512
    max_target: int = 64
    instruction: str = INSTRUCTION
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.max_source < 1 or self.max_target < 2:
            raise GencraftError(
                f"max_source must be >= 1 and max_target >= 2, got {self.max_source}, "
                f"{self.max_target}"
            )
        tok = self.tokenizer
        if self.eos_token_id is None and tok.eos_token_id is None and tok.sep_token_id is None:
            raise GencraftError("the tokenizer has neither an EOS nor a SEP token to end targets")
        if not self.is_encoder_decoder:
            self._prefix, self._suffix = self._prompt_parts()

    @property
    def eos_id(self) -> int:
        if self.eos_token_id is not None:
            return self.eos_token_id
        tok = self.tokenizer
        return tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id

    @property
    def prompt_tokens(self) -> int:
        """Tokens a causal LM's prompt adds around the document (0 for an encoder-decoder)."""
        return 0 if self.is_encoder_decoder else len(self._prefix) + len(self._suffix)

    def _prompt_parts(self) -> tuple[list[int], list[int]]:
        tok = self.tokenizer
        text = f"{self.instruction}\n\n{_MARK}"
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        else:
            text = f"{text}\n\nSummary:"
        before, after = text.split(_MARK)
        prefix = tok(before, add_special_tokens=False)["input_ids"]
        if tok.bos_token_id is not None and not getattr(tok, "chat_template", None):
            prefix = [tok.bos_token_id, *prefix]
        return prefix, tok(after, add_special_tokens=False)["input_ids"]

    def source_ids(self, document: str) -> list[int]:
        """Encoder input / causal prompt for one document."""
        tok = self.tokenizer
        if self.is_encoder_decoder:
            return tok(document, truncation=True, max_length=self.max_source)["input_ids"]
        doc = tok(document, add_special_tokens=False)["input_ids"][: self.max_source]
        return [*self._prefix, *doc, *self._suffix]

    def target_ids(self, summary: str) -> list[int]:
        tok = self.tokenizer
        ids = tok(summary, add_special_tokens=False)["input_ids"][: self.max_target - 1]
        return [*ids, self.eos_id]

    def encode(self, document: str, summary: str | None = None) -> dict[str, list[int]]:
        src = self.source_ids(document)
        if summary is None:
            return {"input_ids": src}
        tgt = self.target_ids(summary)
        if self.is_encoder_decoder:
            return {"input_ids": src, "labels": tgt}
        return {
            "input_ids": src + tgt,
            "labels": [-100] * len(src) + tgt,
            "source_mask": [1] * len(src) + [0] * len(tgt),
        }


def collate(
    rows: Sequence[dict[str, list[int]]], pad_token_id: int, *, left: bool = False
) -> dict[str, torch.Tensor]:
    """Pad a list of :meth:`SummaryEncoder.encode` outputs into tensors with the shared pad
    rule (:func:`gencraft.models.prompts.pad_batch`: labels padded with -100, ``source_mask``
    with 0, ``attention_mask`` added); ``source_mask`` comes back bool."""
    from gencraft.models.prompts import pad_batch

    out = pad_batch(rows, pad_token_id, left=left)
    if "source_mask" in out:
        out["source_mask"] = out["source_mask"].bool()
    return out
