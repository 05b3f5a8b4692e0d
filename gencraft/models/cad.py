"""Context-aware decoding (CAD, Shi et al. 2023; AdaCAD, Wang et al. 2024), in one place.

CAD decodes from

    log_softmax((1 + α)·log p(y | c, x) − α·log p(y | x))

where the first stream reads the input with its context c and the second the same input
without it. :class:`CADSettings` holds α (or ``adaptive``: each row's Jensen-Shannon
divergence of the two distributions at that step) and is checked once, when it is built
(:func:`gencraft.config.check_cad_alpha`, the rule the ``--cad-alpha`` flags use before
anything loads); the engines take it as it is.

Two engines, one rule for which runs when:

* **two streams** (:class:`ContrastStepper`): anything a ``Stepper`` drives (gencraft's beam
  search, ``generate(custom_generate=context_aware)``, FAME + CAD). Each stream keeps its own
  prompt, padding, positions and cache; two model calls over B rows per step.
* **paired rows** (:func:`paired_contrast_generate`, :class:`PairedContrast`): a model whose
  own ``generate`` has to run the decoding, such as a prefix model, whose prefixes, block
  tables and row states live in its ``generate`` (a ``Stepper`` runs the prompt itself and
  cannot carry them). The batch is doubled, rows [0, B) with the context and [B, 2B)
  without, and a ``LogitsProcessor`` placed after ``generate``'s own gives both copies of
  an input the contrasted distribution, so greedy and beam search make the same choices in
  both halves. One model call over 2B rows per step.

``generate``'s own processors (n-gram blocking, repetition penalty...) act on each stream
before the contrast under paired rows, and on the contrasted scores under two streams; with
none, the two engines decode alike (tested).

:func:`context_free_inputs` builds the context-free inputs of every caller: the token ids of
each input without its context (a decoder-only prompt alone, an encoder-decoder's empty
source), an empty one stood in for by one token, padded on the model's side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from gencraft.config import check_cad_alpha
from gencraft.errors import GencraftError
from gencraft.models.stepping import HFStepper, StepOutput


@dataclass(frozen=True)
class CADSettings:
    """CAD's weight: α fixed (``alpha`` >= 0, finite) or, ``adaptive``, taken per row and step
    as the two distributions' Jensen-Shannon divergence in bits (``alpha`` unused)."""

    alpha: float = 0.5
    adaptive: bool = False

    def __post_init__(self) -> None:
        if not self.adaptive:
            check_cad_alpha(self.alpha, "cad alpha")


#: log p the context-free stream gives a token it rules out (-inf), so -α·log p stays finite
_RULED_OUT = -1e4


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[N]: the Jensen-Shannon divergence, in bits (so in [0, 1]), between the distributions
    of the log-probabilities ``a`` and ``b`` [N, V]."""
    pa, pb = a.exp(), b.exp()
    m = (0.5 * (pa + pb)).clamp_min(1e-30).log()
    kl_a = torch.where(pa > 0, pa * (a - m), 0.0).sum(-1)
    kl_b = torch.where(pb > 0, pb * (b - m), 0.0).sum(-1)
    return (0.5 * (kl_a + kl_b) / torch.log(torch.tensor(2.0))).clamp(0.0, 1.0)


def contrast(with_context: torch.Tensor, without: torch.Tensor, cad: CADSettings) -> torch.Tensor:
    """[N, V]: log_softmax((1 + α)·a − α·b) of the two streams' log-probabilities a, b [N, V],
    α fixed or (``cad.adaptive``) each row's :func:`js_divergence` of a and b."""
    if cad.adaptive:
        a = js_divergence(with_context, without)[:, None]
    else:
        a = torch.tensor(cad.alpha, device=with_context.device)
    mixed = (1 + a) * with_context - a * without.clamp_min(_RULED_OUT)
    return torch.log_softmax(mixed, dim=-1)


def _settings(cad: Any) -> CADSettings:
    if not isinstance(cad, CADSettings):
        raise GencraftError(f"CAD takes a CADSettings(alpha, adaptive), got {cad!r}")
    return cad


class ContrastStepper:
    """CAD's two streams as one ``Stepper``: the same hypotheses stepped with the context
    (``context``: its prompts, padding, positions and cache) and without it (``plain``), and
    the contrasted next-token distribution of ``cad``. Both caches are stepped and reordered
    together; the cache is the pair. The hidden states and ``prefix_ids`` (what logits
    processors see) are the context stream's. A token the context-free stream rules out
    counts as log p = -10⁴ there. ``plain_guard`` is entered around every call of the
    context-free stream (a method whose base both streams share keeps its own state out of
    it: ``FocusForConditionalGeneration.bypassed``)."""

    def __init__(
        self,
        context: HFStepper,
        plain: HFStepper,
        cad: CADSettings = CADSettings(),
        plain_guard: Callable[[], AbstractContextManager] | None = None,
    ) -> None:
        if context.batch_size != plain.batch_size:
            raise GencraftError(
                f"the context-free stream holds {plain.batch_size} inputs, the context stream "
                f"{context.batch_size}; give one context-free input per input"
            )
        if context.vocab_size != plain.vocab_size:
            raise GencraftError("the two streams' models have different vocabularies")
        self.context, self.plain, self.cad = context, plain, _settings(cad)
        self.guard = plain_guard or nullcontext
        self.batch_size, self.vocab_size = context.batch_size, context.vocab_size
        self.device, self.hidden = context.device, context.hidden

    def prefix_ids(self) -> torch.Tensor:
        return self.context.prefix_ids()

    def _both(self, a: StepOutput, b: StepOutput) -> StepOutput:
        mixed = contrast(a.log_probs, b.log_probs, self.cad)
        return StepOutput(mixed, (a.cache, b.cache), a.hidden)

    def start(self) -> StepOutput:
        a = self.context.start()
        with self.guard():
            return self._both(a, self.plain.start())

    def step(
        self, tokens: torch.Tensor, cache: Any, rows: torch.Tensor | None = None
    ) -> StepOutput:
        a = self.context.step(tokens, cache[0], rows)
        with self.guard():
            return self._both(a, self.plain.step(tokens, cache[1], rows))

    def reorder(self, cache: Any, index: torch.Tensor) -> Any:
        with self.guard():
            plain = self.plain.reorder(cache[1], index)
        return self.context.reorder(cache[0], index), plain


class PairedContrast(LogitsProcessor):
    """Scores [2N, V] of a doubled batch (rows [0, N) with the context, [N, 2N) without, in
    the same order: ``generate`` lays inputs out input-major, beams within) -> the contrasted
    log-probabilities [N, V] of ``cad``, given to both halves."""

    def __init__(self, cad: CADSettings = CADSettings()) -> None:
        self.cad = _settings(cad)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = scores.shape[0] // 2
        if scores.shape[0] != 2 * n:
            raise GencraftError(f"paired contrast needs an even number of rows, got {2 * n + 1}")
        lp = torch.log_softmax(scores.float(), dim=-1)
        mixed = contrast(lp[:n], lp[n:], self.cad)
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


def _refuse_paired(b: int, negative_input_ids: torch.Tensor, kw: dict) -> None:
    if kw.get("do_sample"):
        raise GencraftError(
            "CAD by paired rows decodes greedily or with beam search: sampling would draw "
            "the two copies of an input apart"
        )
    if kw.get("return_dict_in_generate"):
        raise GencraftError("CAD by paired rows returns token ids, not generate's dict")
    if negative_input_ids.shape[0] != b:
        raise GencraftError(
            f"{negative_input_ids.shape[0]} context-free inputs for {b} inputs; give one each"
        )


def paired_contrast_generate(
    generate: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    negative_input_ids: torch.Tensor,
    negative_attention_mask: torch.Tensor,
    *,
    cad: CADSettings = CADSettings(),
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
    b, t = input_ids.shape
    _refuse_paired(b, negative_input_ids, generate_kw)
    width = max(t, negative_input_ids.shape[1])
    a = _padded(input_ids, attention_mask, width, pad_token_id, left_padding)
    n = _padded(negative_input_ids, negative_attention_mask, width, pad_token_id, left_padding)
    processors = LogitsProcessorList(
        [*(generate_kw.pop("logits_processor", None) or []), PairedContrast(cad)]
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


def context_free_inputs(
    rows: Sequence[Sequence[int]], pad_token_id: int, *, left: bool, empty: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The context-free inputs: ``rows`` (per input the token ids without its context)
    as ids [B, P] and attention mask [B, P], padded on the left (``left``: a decoder-only
    prompt) or the right; an empty row is ``[empty]`` (a model needs one token to start)."""
    from gencraft.models.prompts import pad_batch

    filled = [{"input_ids": list(r) or [empty]} for r in rows]
    out = pad_batch(filled, pad_token_id, left=left)
    return out["input_ids"], out["attention_mask"]
