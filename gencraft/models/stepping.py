"""Stepping: incremental next-token log-probabilities for one input, over a batch of
hypotheses, with the KV cache carried and reordered (the one stepping helper of gencraft).

Search loops (beam search, exact DFS) see a model only through this interface, so they work
alike for decoder-only and encoder-decoder models, for gencraft's method wrappers (anything
wrapping a ``base`` model and returning its logits, e.g. ``FocusForConditionalGeneration``;
or defining ``gencraft_step``, e.g. ``PointerSentinelHead``), and tests can drive them with a
hand-written table of next-token distributions.

A ``Stepper`` holds one input (a prompt for a causal LM, the encoder input for an
encoder-decoder). ``start()`` returns the distribution of the first generated token;
``step(tokens, cache)`` feeds one token to each of N hypotheses whose KV cache is ``cache``.
Log-probabilities are ``log_softmax`` of the logits in float32, exactly as
``transformers``' beam search computes them. ``grad=True`` keeps the autograd graph (through
the cache too), for methods that optimise the cache or the model per step (HSO).

A model wrapper can take over stepping by defining ``gencraft_step(tokens, cache, *, start,
hidden) -> StepOutput``: ``tokens`` [N, t] the new decoder inputs (the whole prompt at the
start), ``cache`` its own state from the previous call (None at the start).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.attention import attention_context, current_context
from gencraft.models.compat import (
    Cache,
    DynamicCache,
    DynamicLayer,
    EncoderDecoderCache,
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


class HFStepper:
    """A ``Stepper`` over a Hugging Face causal LM or encoder-decoder.

    Args:
        model: ``*ForCausalLM`` or an encoder-decoder (BART, T5, Pegasus, ``EncoderDecoderModel``).
        input_ids: [1, P] the prompt (causal) or encoder input (encoder-decoder).
        max_new_tokens: how deep the search may go; checked against the model's context.
        hidden: also return every decoder layer's last hidden state (for attribute classifiers).
        grad: keep the autograd graph (default: no gradient).
        encoder_hidden: [1, S, H] the encoder's output, already computed (an encoder-decoder
            inside ``generate``); ``input_ids`` is then not encoded.
    """

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        *,
        max_new_tokens: int,
        hidden: bool = False,
        grad: bool = False,
        encoder_hidden: torch.Tensor | None = None,
    ) -> None:
        try:
            hf = hf_model(model)
        except GencraftError:
            hf = None
        if hf is None or not hasattr(hf, "get_output_embeddings"):
            raise GencraftError(
                f"search needs a Hugging Face causal LM or encoder-decoder (or a gencraft "
                f"wrapper of one), got {type(model).__name__}"
            )
        config = hf.config
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
            raise GencraftError("input_ids must be a LongTensor of shape [1, P]")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
            raise GencraftError(
                f"input_ids must have shape [1, P] with P >= 1 (one input; search runs its "
                f"hypotheses as the batch), got {list(input_ids.shape)}"
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
        ctx = context_size(hf)
        need = max_new_tokens + (1 if self.is_ed else input_ids.shape[1])
        if ctx is not None and need > ctx:
            what = "1 start token" if self.is_ed else f"a prompt of {input_ids.shape[1]} tokens"
            raise GencraftError(
                f"{what} plus max_new_tokens={max_new_tokens} exceeds the model's context of "
                f"{ctx} positions"
            )
        self.device = next(hf.parameters()).device
        self.input_ids = input_ids.to(self.device)
        self._encoder_out: torch.Tensor | None = None
        self._given_encoder_out = encoder_hidden

    def _forward(self, tokens: torch.Tensor, cache: Any) -> StepOutput:
        n = tokens.shape[0]
        kw: dict[str, Any] = dict(
            **cache_kwargs(cache),
            use_cache=True,
            return_dict=True,
            output_hidden_states=self.hidden,
        )
        if self.is_ed:
            from transformers.modeling_outputs import BaseModelOutput

            enc = self._encoder_out
            kw.update(
                encoder_outputs=BaseModelOutput(last_hidden_state=enc.expand(n, *enc.shape[1:])),
                attention_mask=torch.ones(n, enc.shape[1], dtype=torch.long, device=self.device),
                decoder_input_ids=tokens,
            )
        else:
            kw.update(input_ids=tokens)
        with torch.set_grad_enabled(self.grad):
            out = self.model(**kw)
        logits = out.logits[:, -1, :].float()
        hidden = None
        if self.hidden:
            src = getattr(out, "base_output", None) or out  # a wrapper's output keeps the base's
            states = src.decoder_hidden_states if self.is_ed else src.hidden_states
            hidden = torch.stack([h[:, -1, :] for h in states], dim=1).float()
        return StepOutput(torch.log_softmax(logits, dim=-1), output_cache(out), hidden)

    def start(self) -> StepOutput:
        """The first generated token's distribution: [1, V], and the cache of one row."""
        if self.custom is not None:
            with torch.set_grad_enabled(self.grad):
                return self.custom(self.input_ids, None, start=True, hidden=self.hidden)
        if not self.is_ed:
            return self._forward(self.input_ids, None)
        if self._given_encoder_out is not None:
            self._encoder_out = self._given_encoder_out.to(self.device)
        else:
            with torch.set_grad_enabled(self.grad):
                enc = self.hf.get_encoder()(input_ids=self.input_ids, return_dict=True)
            self._encoder_out = enc.last_hidden_state
        start = decoder_start_id(self.hf)
        return self._forward(torch.tensor([[start]], device=self.device), None)

    def step(self, tokens: torch.Tensor, cache: Any) -> StepOutput:
        """Feed ``tokens`` [N] (one per hypothesis) after ``cache`` (N rows)."""
        tokens = tokens.to(self.device).view(-1, 1)
        if self.custom is not None:
            with torch.set_grad_enabled(self.grad):
                return self.custom(tokens, cache, start=False, hidden=self.hidden)
        return self._forward(tokens, cache)

    def prefix_ids(self) -> torch.Tensor:
        """[1, P0]: what precedes the generated tokens in ``generate``'s ``input_ids`` (the
        prompt of a causal LM; the decoder start token of an encoder-decoder)."""
        if self.is_ed:
            return torch.tensor([[decoder_start_id(self.hf)]], device=self.device)
        return self.input_ids

    def reorder(self, cache: Any, index: torch.Tensor) -> Any:
        """Rows ``index`` [N'] of ``cache`` (repeats allowed), as a cache of N' rows."""
        cache.reorder_cache(index.to(self.device))
        return cache


def resolve(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None,
    eos_token_id: int | list[int] | None,
    *,
    max_new_tokens: int,
    hidden: bool = False,
) -> tuple[Stepper, list[int]]:
    """The ``Stepper`` and EOS ids for a search: an HF model is wrapped (its EOS ids are the
    default); a ``Stepper`` is used as is and needs ``eos_token_id``. Ids are range-checked."""
    if isinstance(model, nn.Module):
        if input_ids is None:
            raise GencraftError("input_ids is required with a model")
        stepper: Stepper = HFStepper(model, input_ids, max_new_tokens=max_new_tokens, hidden=hidden)
        eos = eos_ids(model, eos_token_id)
    else:
        stepper = model
        if eos_token_id is None:
            raise GencraftError("eos_token_id is required with a Stepper")
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if any(not 0 <= e < stepper.vocab_size for e in eos):
        raise GencraftError(f"eos_token_id {eos} outside the vocabulary [0, {stepper.vocab_size})")
    return stepper, eos


@torch.no_grad()
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
        self.prefix = prefix() if callable(prefix) else torch.zeros(1, 0, dtype=torch.long)

    def __bool__(self) -> bool:
        return bool(self.processors)

    def __call__(self, scores: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """``scores`` [N, V], ``generated`` [N, t] -> processed scores [N, V]."""
        if not self.processors:
            return scores
        prefix = self.prefix.to(generated.device).expand(generated.shape[0], -1)
        ids = torch.cat([prefix, generated.to(prefix.device)], dim=1)
        for proc in self.processors:
            scores = proc(ids.to(scores.device), scores)
        return scores


# ------------------------------------------------------------------------------ KV states
class _StateLayer(DynamicLayer):
    """A ``DynamicLayer`` that starts from given keys/values and adds ``shift`` to the next
    states it receives. With no shift given, the shift is a zero leaf that requires grad, so
    the gradient of a loss with respect to it is the gradient with respect to those new
    (present) states."""

    def __init__(self, key=None, value=None, shift=None) -> None:
        super().__init__()
        self.shift = shift
        if key is not None:
            DynamicLayer.update(self, key, value)

    def update(self, key_states, value_states, *args, **kwargs):
        if self.shift is None:
            self.shift = tuple(
                torch.zeros_like(t, dtype=t.dtype).requires_grad_(True)
                for t in (key_states, value_states)
            )
        dk, dv = self.shift
        return super().update(key_states + dk, value_states + dv, *args, **kwargs)


class KVStates(DynamicCache):
    """A KV cache built from per-layer states, for methods that optimise them (HSO).

    Args:
        states: per layer ``(key, value)`` [B, n_kv, S, d] (S may be 0 / None for an empty
            cache); gradients flow back to these tensors.
        shifts: per layer ``(dk, dv)`` [B, n_kv, t, d] added to the t new states of the next
            forward; None gives zero leaves that require grad (read them from :attr:`shifts`
            after the forward).
        num_layers: the number of layers when ``states`` is None.
    """

    def __init__(
        self,
        states: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
        shifts: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
        *,
        num_layers: int | None = None,
    ) -> None:
        n = len(states) if states is not None else num_layers
        if n is None:
            raise GencraftError("KVStates needs states or num_layers")
        layers = []
        for i in range(n):
            k, v = states[i] if states is not None else (None, None)
            if k is not None and k.shape[-2] == 0:
                k = v = None
            layers.append(_StateLayer(k, v, shifts[i] if shifts is not None else None))
        Cache.__init__(self, layers=layers)

    @property
    def shifts(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the ``(dk, dv)`` added to the last forward's new states."""
        return [layer.shift for layer in self.layers]

    def states(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(key, value)`` [B, n_kv, S, d], cached and new."""
        return [(layer.keys, layer.values) for layer in self.layers]


#: the attention-context key under which plug-ins find the current RowStateCache's store
ROW_STATE = "gencraft_row_state"


class RowStateCache(DynamicCache):
    """A ``DynamicCache`` that also carries per-row tensors (dim 0: the cache's rows) for
    attention plug-ins whose rows depend on earlier queries' attention (e.g. causal TruncSA's
    running column mass). ``generate`` reorders, repeats and selects them with the keys and
    values, so beam search keeps each hypothesis's own state. Plug-ins reach the store through
    :func:`current_row_state` inside :func:`carrying_row_state`.

    Args:
        layers: per layer ``(key, value)`` [B, n_kv, S, d] to start from (None: empty).
    """

    def __init__(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        super().__init__(layers)
        self.row_state: dict[Any, torch.Tensor] = {}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        for k, v in self.row_state.items():
            self.row_state[k] = v.index_select(0, beam_idx.to(v.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        for k, v in self.row_state.items():
            self.row_state[k] = v.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        for k, v in self.row_state.items():
            self.row_state[k] = v[indices]


def row_state_cache(model: nn.Module) -> Cache:
    """An empty cache for ``model`` whose self-attention part is a :class:`RowStateCache`."""
    if getattr(hf_model(model).config, "is_encoder_decoder", False):
        return EncoderDecoderCache(RowStateCache(), DynamicCache())
    return RowStateCache()


@contextmanager
def carrying_row_state(cache: Cache) -> Iterator[dict[Any, torch.Tensor]]:
    """Within the block, :func:`current_row_state` is ``cache``'s row store (the
    :class:`RowStateCache` itself, or an ``EncoderDecoderCache``'s self-attention part)."""
    rows = getattr(cache, "self_attention_cache", cache)
    if not isinstance(rows, RowStateCache):
        raise GencraftError(f"expected a RowStateCache, got {type(rows).__name__}")
    with attention_context(**{ROW_STATE: rows.row_state}):
        yield rows.row_state


def current_row_state() -> dict[Any, torch.Tensor] | None:
    """The row store of the enclosing :func:`carrying_row_state` (None outside one)."""
    return current_context().get(ROW_STATE)
