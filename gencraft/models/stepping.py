"""Stepping: incremental next-token log-probabilities for a batch of inputs, over a batch of
hypotheses, with the KV cache carried and reordered (the one stepping helper of gencraft).

Search loops (beam search, exact DFS) see a model only through this interface, so they work
alike for decoder-only and encoder-decoder models, for gencraft's method wrappers (anything
wrapping a ``base`` model and returning its logits, e.g. ``FocusForConditionalGeneration``;
or defining ``gencraft_step``, e.g. ``PointerSentinelHead``), and tests can drive them with a
hand-written table of next-token distributions.

A ``Stepper`` holds ``batch_size`` inputs (default 1: prompts for a causal LM, left-padded
with an attention mask; encoder inputs for an encoder-decoder). ``start()`` returns the
distribution of the first generated token of each input, [B, V]; ``step(tokens, cache)`` feeds
one token to each of N hypotheses whose KV cache is ``cache``; the N rows are B equal
contiguous blocks (a beam search's [B, K] flattened), or ``step(tokens, cache, rows)`` names
each one's input. A hand-written ``Stepper`` without ``batch_size`` holds one input.
Log-probabilities are ``log_softmax`` of the logits in float32, exactly as
``transformers``' beam search computes them. ``grad=True`` keeps the autograd graph (through
the cache too), for methods that optimise the cache or the model per step (HSO).

A model wrapper can take over stepping by defining ``gencraft_step(tokens, cache, *, start,
hidden, attention_mask=None, position_ids=None) -> StepOutput``: ``tokens`` [N, t] the new
decoder inputs (the whole prompts at the start), ``cache`` its own state from the previous call
(None at the start); ``attention_mask`` [N, past + t] and ``position_ids`` [N, t] come only
when the batch is padded.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.caches import build_cache, cat_rows, kv_pairs, left_pad, select_row
from gencraft.models.compat import (
    cache_kwargs,
    output_cache,
)
from gencraft.models.introspect import context_size, decoder_start_id, eos_ids, hf_model


@dataclass
class StepOutput:
    """``log_probs`` [N, V] float32; ``cache`` the updated KV cache (N rows); ``hidden`` [N, M+1, H]
    the last position's hidden states of every decoder layer, embeddings first (only when
    asked for), else None."""

    log_probs: torch.Tensor
    cache: Any
    hidden: torch.Tensor | None = None


class Stepper(Protocol):
    vocab_size: int

    def start(self) -> StepOutput: ...

    def step(self, tokens: torch.Tensor, cache: Any) -> StepOutput: ...

    def reorder(self, cache: Any, index: torch.Tensor) -> Any: ...


def _searchable(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside ``model``, refused in one line when it is not a causal LM
    or an encoder-decoder with an output layer."""
    try:
        hf = hf_model(model)
    except GencraftError:
        hf = None
    if hf is None or not hasattr(hf, "get_output_embeddings"):
        raise GencraftError(
            f"search needs a Hugging Face causal LM or encoder-decoder (or a gencraft "
            f"wrapper of one), got {type(model).__name__}"
        )
    return hf


class HFStepper:
    """A ``Stepper`` over a Hugging Face causal LM or encoder-decoder, for a batch of B inputs.

    Hypotheses are rows of the cache: ``start()`` gives one row per input, and a search
    expands them (beams) with :meth:`reorder`. ``step`` needs to know which input each of its N
    rows belongs to (``rows`` [N]); by default the N rows are B equal contiguous blocks, input
    0's first (a beam search's ``[B, K]`` layout flattened).

    Args:
        model: ``*ForCausalLM`` or an encoder-decoder (BART, T5, Pegasus, ``EncoderDecoderModel``).
        input_ids: [B, P] the prompts (causal; left-padded when their lengths differ) or encoder
            inputs (encoder-decoder; padded on either side).
        attention_mask: [B, P] 1 for tokens, 0 for padding (default: no padding).
        max_new_tokens: how deep the search may go; checked against the model's context.
        hidden: also return every decoder layer's last hidden state (for attribute classifiers).
        grad: keep the autograd graph (default: no gradient).
        encoder_hidden: [B, S, H] the encoder's output, already computed (an encoder-decoder
            inside ``generate``); ``input_ids`` is then not encoded and ``attention_mask`` is
            the encoder's [B, S] mask.
    """

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int,
        hidden: bool = False,
        grad: bool = False,
        encoder_hidden: torch.Tensor | None = None,
    ) -> None:
        hf = _searchable(model)
        config = hf.config
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
            raise GencraftError("input_ids must be a LongTensor of shape [B, P]")
        if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
            raise GencraftError(
                f"input_ids must have shape [B, P] with B, P >= 1, got {list(input_ids.shape)}"
            )
        if max_new_tokens < 1:
            raise GencraftError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model, self.hf = model, hf
        self.is_ed = bool(config.is_encoder_decoder)
        self.hidden = hidden
        self.grad = grad
        self.custom = getattr(model, "gencraft_step", None)
        self.vocab_size = hf.get_output_embeddings().weight.shape[0]
        if int(input_ids.max()) >= self.vocab_size or int(input_ids.min()) < 0:
            raise GencraftError(f"input_ids hold ids outside the vocabulary [0, {self.vocab_size})")
        self.device = next(hf.parameters()).device
        width = encoder_hidden.shape[1] if encoder_hidden is not None else input_ids.shape[1]
        mask = _check_mask(attention_mask, input_ids.shape[0], width, left=not self.is_ed)
        self.batch_size = input_ids.shape[0]
        lengths = mask.sum(1) if mask is not None else torch.full((self.batch_size,), width)
        ctx = context_size(hf)
        need = max_new_tokens + (1 if self.is_ed else int(lengths.max()))
        if ctx is not None and need > ctx:
            what = "1 start token" if self.is_ed else f"a prompt of {int(lengths.max())} tokens"
            raise GencraftError(
                f"{what} plus max_new_tokens={max_new_tokens} exceeds the model's context of "
                f"{ctx} positions"
            )
        self.input_ids = input_ids.to(self.device)
        # None: no row is padded (the model's own positions and causal mask apply)
        self.mask = mask.to(self.device) if mask is not None else None
        # padded causal rows send position_ids only where the step takes them
        takes = _accepts(hf.forward, "position_ids") and not self.is_ed
        self.send_positions = takes or self.custom is not None
        padded_custom = self.custom is not None and self.mask is not None and not self.is_ed
        if padded_custom and not _accepts(self.custom, "attention_mask"):
            raise GencraftError(
                f"{type(model).__name__}.gencraft_step takes no attention_mask, so it "
                "cannot search a padded batch; pass the inputs one at a time"
            )
        self._encoder_out: torch.Tensor | None = None
        self._given_encoder_out = encoder_hidden
        self._expanded: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None

    def _rows(self, n: int, rows: torch.Tensor | None) -> torch.Tensor:
        if rows is not None:
            return rows.to(self.device)
        if n % self.batch_size:
            raise GencraftError(
                f"{n} hypotheses are not {self.batch_size} equal blocks; pass rows=[N]"
            )
        return torch.arange(self.batch_size, device=self.device).repeat_interleave(
            n // self.batch_size
        )

    def _masks(self, rows: torch.Tensor, t: int, past: int) -> dict[str, torch.Tensor]:
        """A causal LM's ``attention_mask`` [N, past + t] and ``position_ids`` [N, t] for t new
        tokens of hypotheses ``rows`` after ``past`` cached positions (nothing unpadded)."""
        if self.mask is None:
            return {}
        prompt = self.mask.index_select(0, rows)
        ones = prompt.new_ones(prompt.shape[0], past + t - prompt.shape[1])
        mask = torch.cat([prompt, ones], dim=1)
        kw = {"attention_mask": mask}
        if self.send_positions:
            pos = (mask.cumsum(1) - 1).clamp_min(0)
            kw["position_ids"] = pos[:, -t:]
        return kw

    def _encoder_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The encoder output [N, S, H] and its mask [N, S] (None: unpadded) of ``rows``."""
        if self._expanded is not None and torch.equal(self._expanded[0], rows):
            return self._expanded[1], self._expanded[2]
        enc = self._encoder_out.index_select(0, rows)
        mask = self.mask.index_select(0, rows) if self.mask is not None else None
        self._expanded = (rows, enc, mask)
        return enc, mask

    def _forward(
        self,
        tokens: torch.Tensor,
        cache: Any,
        rows: torch.Tensor,
        masks: dict[str, torch.Tensor] | None = None,
    ) -> StepOutput:
        n = tokens.shape[0]
        kw: dict[str, Any] = dict(
            **cache_kwargs(cache),
            use_cache=True,
            return_dict=True,
            output_hidden_states=self.hidden,
        )
        if self.is_ed:
            from transformers.modeling_outputs import BaseModelOutput

            enc, mask = self._encoder_rows(rows)
            if mask is None:
                mask = torch.ones(n, enc.shape[1], dtype=torch.long, device=self.device)
            kw.update(
                encoder_outputs=BaseModelOutput(last_hidden_state=enc),
                attention_mask=mask,
                decoder_input_ids=tokens,
            )
        else:
            if masks is None:
                past = cache.get_seq_length() if cache is not None else 0
                masks = self._masks(rows, tokens.shape[1], past)
            kw.update(input_ids=tokens, **masks)
        with torch.set_grad_enabled(self.grad):
            out = self.model(**kw)
        logits = out.logits[:, -1, :].float()
        hidden = None
        if self.hidden:
            src = getattr(out, "base_output", None) or out  # a wrapper's output keeps the base's
            states = src.decoder_hidden_states if self.is_ed else src.hidden_states
            hidden = torch.stack([h[:, -1, :] for h in states], dim=1).float()
        return StepOutput(torch.log_softmax(logits, dim=-1), output_cache(out), hidden)

    def _custom(
        self,
        tokens: torch.Tensor,
        cache: Any,
        rows: torch.Tensor,
        start: bool,
        masks: dict[str, torch.Tensor] | None = None,
    ):
        extra = masks
        if extra is None:
            past = cache.get_seq_length() if cache is not None else 0
            extra = self._masks(rows, tokens.shape[1], past) if not self.is_ed else {}
        with torch.set_grad_enabled(self.grad):
            return self.custom(tokens, cache, start=start, hidden=self.hidden, **extra)

    def start(self) -> StepOutput:
        """The first generated token's distribution: [B, V], and a cache of B rows."""
        rows = torch.arange(self.batch_size, device=self.device)
        if self.custom is not None:
            return self._custom(self.input_ids, None, rows, True)
        if not self.is_ed:
            return self._forward(self.input_ids, None, rows)
        if self._given_encoder_out is not None:
            self._encoder_out = self._given_encoder_out.to(self.device)
        else:
            with torch.set_grad_enabled(self.grad):
                enc = self.hf.get_encoder()(
                    input_ids=self.input_ids, attention_mask=self.mask, return_dict=True
                )
            self._encoder_out = enc.last_hidden_state
        start = torch.full((self.batch_size, 1), decoder_start_id(self.hf), device=self.device)
        return self._forward(start, None, rows)

    def step(
        self, tokens: torch.Tensor, cache: Any, rows: torch.Tensor | None = None
    ) -> StepOutput:
        """Feed ``tokens`` [N] (one per hypothesis) after ``cache`` (N rows); ``rows`` [N]: the
        input each hypothesis belongs to (default: B equal contiguous blocks)."""
        tokens = tokens.to(self.device).view(-1, 1)
        rows = self._rows(tokens.shape[0], rows)
        if self.custom is not None:
            return self._custom(tokens, cache, rows, False)
        return self._forward(tokens, cache, rows)

    # -- ragged steps: hypotheses of different lengths, one cache per hypothesis (exact search)
    def split(self, cache: Any) -> list[Any]:
        """A cache of the B inputs (from :meth:`start`) as B caches of one row each, a causal
        LM's prompt padding dropped."""
        if self.is_ed:
            self_part, cross = kv_pairs(cache)
            return [
                build_cache(
                    [(k[i : i + 1], v[i : i + 1]) for k, v in self_part], select_row(cross, i)
                )
                for i in range(self.batch_size)
            ]
        lengths = self.mask.sum(1).tolist() if self.mask is not None else None
        kv = kv_pairs(cache)[0]
        out = []
        for i in range(self.batch_size):
            n = lengths[i] if lengths else None
            part = [
                (
                    k[i : i + 1, :, -n:] if n else k[i : i + 1],
                    v[i : i + 1, :, -n:] if n else v[i : i + 1],
                )
                for k, v in kv
            ]
            out.append(build_cache([(k.clone(), v.clone()) for k, v in part], None))
        return out

    def step_ragged(
        self, tokens: torch.Tensor, caches: Sequence[Any], rows: torch.Tensor
    ) -> list[StepOutput]:
        """Feed ``tokens`` [N] to N hypotheses of inputs ``rows`` [N], each with its own cache
        of one row (of any length; prompt padding dropped, as :meth:`split` gives them), in as
        few model calls as the model allows: one for a causal LM (caches left-padded to the
        longest, with an attention mask and positions); one per cache length for an
        encoder-decoder (its decoder positions follow the cache length). Returns one output
        per hypothesis, with a cache of its own."""
        tokens = tokens.to(self.device).view(-1, 1)
        rows = rows.to(self.device)
        lengths = [kv_pairs(c)[0][0][0].shape[-2] for c in caches]
        outs: list[StepOutput | None] = [None] * len(caches)
        if self.is_ed:
            groups: dict[int, list[int]] = {}
            for i, n in enumerate(lengths):
                groups.setdefault(n, []).append(i)
        else:
            groups = {0: list(range(len(caches)))}
        for members in groups.values():
            idx = torch.tensor(members, device=self.device)
            parts = [kv_pairs(caches[i]) for i in members]
            width = max(lengths[i] for i in members)
            kv = [
                tuple(torch.cat([left_pad(p[0][layer][j], width) for p in parts]) for j in (0, 1))
                for layer in range(len(parts[0][0]))
            ]
            cross = None
            if self.is_ed:
                cross = cat_rows([p[1] for p in parts])
            masks: dict[str, torch.Tensor] | None = {}
            if not self.is_ed and any(lengths[i] != width for i in members):
                have = torch.tensor([lengths[i] for i in members], device=self.device)
                cols = torch.arange(width + 1, device=self.device)
                mask = (cols[None, :] >= (width - have)[:, None]).long()
                masks = {"attention_mask": mask}
                if self.send_positions:
                    masks["position_ids"] = have[:, None]
            merged = build_cache(kv, cross)
            sub_tok, sub_rows = tokens.index_select(0, idx), rows.index_select(0, idx)
            if self.custom is not None:
                out = self._custom(sub_tok, merged, sub_rows, False, masks)
            else:
                out = self._forward(sub_tok, merged, sub_rows, masks)
            new_kv = kv_pairs(out.cache)[0]
            for j, i in enumerate(members):
                keep = lengths[i] + 1
                own = [
                    (k[j : j + 1, :, -keep:].clone(), v[j : j + 1, :, -keep:].clone())
                    for k, v in new_kv
                ]
                own_cross = kv_pairs(caches[i])[1]
                hidden = out.hidden[j : j + 1] if out.hidden is not None else None
                outs[i] = StepOutput(out.log_probs[j : j + 1], build_cache(own, own_cross), hidden)
        return outs  # type: ignore[return-value]

    def prefix_ids(self) -> torch.Tensor:
        """[B, P0]: what precedes the generated tokens in ``generate``'s ``input_ids`` (the
        padded prompts of a causal LM; the decoder start token of an encoder-decoder)."""
        if self.is_ed:
            start = decoder_start_id(self.hf)
            return torch.full((self.batch_size, 1), start, device=self.device)
        return self.input_ids

    def reorder(self, cache: Any, index: torch.Tensor) -> Any:
        """Rows ``index`` [N'] of ``cache`` (repeats allowed), as a cache of N' rows."""
        cache.reorder_cache(index.to(self.device))
        return cache


def _accepts(fn: Any, name: str) -> bool:
    """Whether callable ``fn`` takes keyword ``name`` (or any keyword)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_mask(
    mask: torch.Tensor | None, b: int, width: int, *, left: bool
) -> torch.Tensor | None:
    """``mask`` [B, P] as a long tensor, or None when it pads nothing; every row must keep a
    token, and a causal LM's prompts must be left-padded."""
    if mask is None:
        return None
    if tuple(mask.shape) != (b, width):
        raise GencraftError(
            f"attention_mask must have shape [{b}, {width}], got {list(mask.shape)}"
        )
    mask = mask.long()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise GencraftError("attention_mask must hold only 0 (padding) and 1 (tokens)")
    empty = (mask.sum(1) == 0).nonzero().flatten().tolist()
    if empty:
        raise GencraftError(f"input rows {empty} are all padding")
    if left and bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise GencraftError(
            "a causal LM's prompts must be left-padded (padding before the tokens); set "
            "tokenizer.padding_side = 'left'"
        )
    return None if bool(mask.all()) else mask


def batch_size(stepper: Stepper) -> int:
    """How many inputs ``stepper`` holds (a hand-written one without ``batch_size``: 1)."""
    return int(getattr(stepper, "batch_size", 1))


def resolve(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None,
    eos_token_id: int | list[int] | None,
    *,
    max_new_tokens: int,
    hidden: bool = False,
    attention_mask: torch.Tensor | None = None,
) -> tuple[Stepper, list[int]]:
    """The ``Stepper`` and EOS ids for a search: an HF model is wrapped (its EOS ids are the
    default); a ``Stepper`` is used as is and needs ``eos_token_id``. Ids are range-checked."""
    if isinstance(model, nn.Module):
        if input_ids is None:
            raise GencraftError("input_ids is required with a model")
        stepper: Stepper = HFStepper(
            model,
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            hidden=hidden,
        )
        eos = eos_ids(model, eos_token_id)
    else:
        stepper = model
        if eos_token_id is None:
            raise GencraftError("eos_token_id is required with a Stepper")
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if any(not 0 <= e < stepper.vocab_size for e in eos):
        raise GencraftError(f"eos_token_id {eos} outside the vocabulary [0, {stepper.vocab_size})")
    return stepper, eos


def sequence_log_prob(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None,
    tokens: list[int],
    eos_token_id: int | list[int] | None = None,
    *,
    end: bool = True,
) -> float:
    """log P(y | x) under the model itself (no processor, no length forcing): the summed
    log-probabilities of ``tokens`` after ``input_ids`` [1, P], plus, with ``end``, the
    log-probability of ending there (summed over the EOS ids). What searches are compared on.
    """
    stepper, eos = resolve(model, input_ids, eos_token_id, max_new_tokens=len(tokens) + 1)
    with torch.no_grad():
        out = stepper.start()
        total = 0.0
        for t in tokens:
            total += float(out.log_probs[0, int(t)])
            out = stepper.step(torch.tensor([int(t)], device=out.log_probs.device), out.cache)
        if end:
            total += float(torch.logsumexp(out.log_probs[0, eos].double(), dim=0))
    return total


class ProcessorChain:
    """``LogitsProcessor``s applied to a search's step scores as ``generate`` applies them:
    to the log-probabilities [N, V] with the ids each hypothesis would have in ``generate``'s
    ``input_ids`` (the stepper's :meth:`~HFStepper.prefix_ids`, then the generated tokens)."""

    def __init__(self, stepper: Stepper, processors: Any = None) -> None:
        self.processors = list(processors or [])
        prefix = getattr(stepper, "prefix_ids", None)
        b = batch_size(stepper)
        self.prefix = prefix() if callable(prefix) else torch.zeros(b, 0, dtype=torch.long)

    def __bool__(self) -> bool:
        return bool(self.processors)

    def __call__(self, scores: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """``scores`` [N, V], ``generated`` [N, t] -> processed scores [N, V]; the N rows are
        the inputs' equal contiguous blocks, as ``generate`` lays out its beams."""
        if not self.processors:
            return scores
        n, b = generated.shape[0], self.prefix.shape[0]
        prefix = self.prefix.to(generated.device)
        prefix = prefix.expand(n, -1) if b == 1 else prefix.repeat_interleave(n // b, dim=0)
        ids = torch.cat([prefix, generated.to(prefix.device)], dim=1)
        for proc in self.processors:
            scores = proc(ids.to(scores.device), scores)
        return scores
