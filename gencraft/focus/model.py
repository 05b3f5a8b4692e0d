"""FAME on any Hugging Face encoder-decoder or causal LM, without forked model files.

:class:`FocusForConditionalGeneration` wraps a base model and adds the focus bias f_t to its
logits from inside the base's own forward pass, through three hooks:

* a forward pre-hook on the base reads the source mask (and, during ``generate``, the encoder
  outputs) and clears the attention store;
* the source states x_i come from the encoder's output (encoder-decoder) or, for a causal LM,
  from the final hidden states of the prompt span (the forward that first sees the prompt);
* the final decoder layer's cross-attention (causal LM: its self-attention, restricted to the
  prompt span) is read through the attention-function registry (:mod:`gencraft.focus.capture`);
* a forward pre-hook on the output embedding module adds Σ_i a_{t,i} g_i to its input, so its
  output becomes y_t E + (Σ_i a_{t,i} g_i) Eᵀ = y_t E + f_t (eq. 2) with no extra
  [B, T, V] product.

Because the bias lives inside the base's forward, ``base.generate`` (greedy, beam, sampling,
with or without cache) and the base's own loss include it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.utils import ModelOutput

from gencraft.errors import GencraftError
from gencraft.focus.capture import find_attention_module, install_capture
from gencraft.focus.config import FocusConfig
from gencraft.focus.decoding import FocusLogitsProcessor, focus_vocabulary
from gencraft.focus.functional import topic_loss
from gencraft.focus.head import FocusHead
from gencraft.models.compat import CACHE_ARG, cache_kwargs, given_cache, output_cache
from gencraft.models.introspect import decoder_body, special_ids
from gencraft.models.method import MethodModel

#: the files FAME wrote before the shared method format (still loaded)
FOCUS_CONFIG = "focus_config.json"
FOCUS_WEIGHTS = "focus_head.safetensors"
_WRAPPED = "_gencraft_focus_wrapped"


@dataclass
class FocusModelOutput(ModelOutput):
    """``loss`` = λ·``mle_loss`` + (1 − λ)·``topic_loss`` (when labels are given);
    ``logits`` [B, T, V] include f_t; ``topic_logits`` T_X [B, V]; ``focus_bias`` f_t [B, T, V]
    and ``attention`` a [B, T, S] only with ``return_focus=True``; ``base_output`` is the base
    model's own output object (caches, encoder states...)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mle_loss: torch.Tensor | None = None
    topic_loss: torch.Tensor | None = None
    topic_logits: torch.Tensor | None = None
    focus_bias: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    base_output: Any = None
    # the base's cache, under the name this transformers gives it (compat.CACHE_ARG)
    if CACHE_ARG == "cache":
        cache: Any = None
    else:
        past_key_values: Any = None


@dataclass
class FocusState:
    """What the hooks of one :class:`FocusForConditionalGeneration` share during a call.

    ``source``: g, mask and identity of the current source; ``pending_mask``: [B, S] source mask
    of the next forward (causal LMs); ``source_len``: prompt length during ``generate`` (causal
    LMs); ``n_docs``: documents in the running ``generate``; ``needs_source``: the running
    forward must compute the source; ``last``: attention and focus states of the last forward;
    ``record``: the features being recorded (:meth:`FocusForConditionalGeneration.recording`);
    ``source_mask_arg``: the mask the running forward was given."""

    source: _Source | None = None
    pending_mask: torch.Tensor | None = None
    source_len: int | None = None
    n_docs: int | None = None
    needs_source: bool = False
    last: dict[str, torch.Tensor] = field(default_factory=dict)
    record: dict[str, torch.Tensor] | None = None
    source_mask_arg: torch.Tensor | None = None


@dataclass
class _Source:
    g: torch.Tensor  # [B, S, h], GELU(x W1) W2, zero under padding
    mask: torch.Tensor  # [B, S] bool
    key: tuple | None = None  # identity of the encoder states g was computed from


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output.last_hidden_state


class FocusForConditionalGeneration(MethodModel):
    """A base model plus a :class:`FocusHead`; ``forward``/``generate`` and the
    :class:`~gencraft.models.method.MethodModel` verbs (disabled: the base's own logits).

    Args:
        base: a Hugging Face encoder-decoder (BART, T5, Pegasus, ``EncoderDecoderModel``...) or
            causal LM (Llama, GPT-2, SmolLM2...) with a linear output embedding E [V, h].
        config: :class:`FocusConfig`.
        frequent_ids: [F] the frequent tokens F (topic loss; always allowed in focus decoding).
    """

    def __init__(
        self,
        base: nn.Module,
        config: FocusConfig | None = None,
        *,
        frequent_ids: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.config = config or FocusConfig()
        self.base = base
        self.is_encoder_decoder = bool(getattr(base.config, "is_encoder_decoder", False))
        out = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        if not isinstance(out, nn.Linear):
            raise GencraftError(
                f"unsupported architecture {type(base).__name__}: FAME needs a linear output "
                f"embedding E (get_output_embeddings()), found {type(out).__name__}"
            )
        self.output_embedding = out
        kind = "cross" if self.is_encoder_decoder else "self"
        self.attention_name, attention = find_attention_module(base, kind)
        hidden = out.in_features
        self.head = FocusHead(
            hidden, self.config.intermediate_size, bias=self.config.bias, heads=self.config.heads
        ).to(device=out.weight.device, dtype=out.weight.dtype)
        self.register_buffer(
            "frequent_ids",
            torch.as_tensor(frequent_ids if frequent_ids is not None else [], dtype=torch.long).to(
                out.weight.device
            ),
        )
        v = out.out_features
        if self.frequent_ids.numel() and not (
            int(self.frequent_ids.min()) >= 0 and int(self.frequent_ids.max()) < v
        ):
            raise GencraftError(f"frequent_ids must lie in [0, |V| = {v})")
        if getattr(base, _WRAPPED, None) is not None:
            raise GencraftError(
                "this base model is already wrapped by a FocusForConditionalGeneration; call "
                "remove() on that wrapper first (or load a fresh base)"
            )
        if self.config.freeze_base:
            self._freeze(base)
        self._store, self._capture_handle = install_capture(base, attention)
        setattr(base, _WRAPPED, True)
        self.state = FocusState()  # everything the hooks share, in one object
        self._hooks = [
            base.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            base.register_forward_hook(self._after_forward),
        ]
        if self.is_encoder_decoder:
            self._hooks.append(base.get_encoder().register_forward_hook(self._after_encoder))
        else:
            body = decoder_body(base)
            if body is None or body is base:
                raise GencraftError(
                    f"unsupported architecture {type(base).__name__}: no decoder body "
                    "(base_model) whose last hidden states give the prompt representations"
                )
            self._hooks.append(body.register_forward_hook(self._after_body))
        self._hooks.append(out.register_forward_pre_hook(self._before_output_embedding))

    method = "focus"
    legacy_files = (FOCUS_CONFIG, FOCUS_WEIGHTS)

    def _set_enabled(self, on: bool) -> None:
        pass  # the hooks read self.enabled

    def use_tokenizer(self, tokenizer: Any) -> Any:
        """A causal LM's prompts pad on the left (batched generation), EOS as padding."""
        if not self.is_encoder_decoder:
            tokenizer.padding_side = "left"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def _detach(self) -> None:
        """Take FAME's hooks and attention plug-in off the base."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._capture_handle.remove()
        if hasattr(self.base, _WRAPPED):
            delattr(self.base, _WRAPPED)

    # ---------------------------------------------------------------- hooks
    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._store.clear()
        self.state.last = {}
        mask = (
            self.state.pending_mask
            if self.state.pending_mask is not None
            else kwargs.get("attention_mask")
        )
        if self.is_encoder_decoder:
            enc = kwargs.get("encoder_outputs")
            self.state.needs_source = enc is None
            if enc is not None:
                self._set_source(_first(enc), mask)
            else:
                self.state.source_mask_arg = mask
        else:
            cache = given_cache(kwargs)
            cached = cache is not None and hasattr(cache, "get_seq_length")
            self.state.needs_source = not (cached and cache.get_seq_length() > 0)
            self.state.source_mask_arg = mask

    def _after_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        # an encoder call outside our forward (generate runs the encoder first) is not ours
        self.state.needs_source = False

    def _after_encoder(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.state.needs_source:  # inside our forward (training): use this encoder output
            self._set_source(_first(output), self.state.source_mask_arg)

    def _after_body(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self.state.needs_source:
            return
        states = _first(output)  # [B, T, h]
        p = self.state.source_len or states.shape[1]
        mask = self.state.source_mask_arg
        mask = mask[:, :p] if mask is not None else None
        self._set_source(states[:, :p], mask)

    def _set_source(self, states: torch.Tensor, mask: torch.Tensor | None) -> None:
        b, s = states.shape[:2]
        grad = torch.is_grad_enabled()
        key = (id(states), states.data_ptr(), tuple(states.shape), id(mask), grad)
        if (
            self.state.record is None
            and not grad
            and self.state.source
            and self.state.source.key == key
        ):
            return  # generate: the same encoder states and mask at every step
        if mask is None:
            mask = torch.ones(b, s, dtype=torch.bool, device=states.device)
        mask = mask.bool()
        if self.state.record is not None:
            self.state.record.update(source_states=states, source_mask=mask)
        if tuple(mask.shape) != (b, s):
            raise GencraftError(f"source mask must be [B, S] = [{b}, {s}], got {tuple(mask.shape)}")
        empty = (mask.sum(1) == 0).nonzero().flatten().tolist()
        if empty:
            raise GencraftError(f"source rows {empty} have no non-padding token")
        if states.shape[-1] != self.head.hidden_size:
            raise GencraftError(
                f"source states have width {states.shape[-1]} but the output embedding has "
                f"{self.head.hidden_size}; FAME needs them equal (t_x = GELU(x W1) W2 Eᵀ)"
            )
        g = self._project_once_per_document(states).masked_fill(~mask.unsqueeze(2), 0.0)
        self.state.source = _Source(g, mask, None if grad else key)

    def _project_once_per_document(self, states: torch.Tensor) -> torch.Tensor:
        """g for [B·r, S, h] states that ``generate`` expanded r times per document (beams,
        samples): projected once per document, then repeated."""
        docs, rows = self.state.n_docs, states.shape[0]
        if torch.is_grad_enabled() or not docs or rows == docs or rows % docs:
            return self.head.project(states)
        r = rows // docs
        first = states[::r]
        if not torch.equal(first.repeat_interleave(r, 0), states):
            return self.head.project(states)
        return self.head.project(first).repeat_interleave(r, 0)

    def _before_output_embedding(self, module: nn.Module, args: tuple) -> tuple | None:
        active = self.enabled or self.state.record is not None
        if not active or not self._store or self.state.source is None:
            return None
        y = args[0]  # [B, T', h]
        a = self.head.reduce_heads(self._store[-1])[:, -y.shape[1] :]  # [B, T', S_all]
        src = self.state.source
        docs, rows = src.g.shape[0], a.shape[0]
        if rows > docs and rows % docs == 0:  # each document's hypotheses in a block (search)
            r = rows // docs
            src = _Source(src.g.repeat_interleave(r, 0), src.mask.repeat_interleave(r, 0), src.key)
        if not self.is_encoder_decoder:
            a = a[..., : src.mask.shape[1]]
            if self.config.source_attention == "renormalized":
                a = a.masked_fill(~src.mask.unsqueeze(1), 0.0)
                a = a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
        if a.shape[0] != src.g.shape[0] or a.shape[2] != src.g.shape[1]:
            raise GencraftError(
                f"attention {tuple(a.shape)} does not match the source "
                f"[B = {src.g.shape[0]}, S = {src.g.shape[1]}]"
            )
        if self.state.record is not None:
            self.state.record.update(output_inputs=y, attention=a)
            return None
        states = self.head.focus_states(a, src.g, src.mask)  # [B, T', h]
        self.state.last = {"attention": a, "focus_states": states}
        return (y + states.to(y.dtype), *args[1:])

    # ---------------------------------------------------------------- API
    @contextmanager
    def recording(self) -> Iterator[dict[str, torch.Tensor]]:
        """Record, instead of applying, what the head needs from the next forward passes: the
        yielded dict gets ``source_states`` [B, S, h], ``source_mask`` [B, S], the output
        embedding's input ``output_inputs`` [B, T, h] and the attention ``attention`` [B, T, S]
        (the logits stay the base's). Used to train the head over a frozen base."""
        self.state.record = {}
        try:
            yield self.state.record
        finally:
            self.state.record = None

    @contextmanager
    def bypassed(self) -> Iterator[nn.Module]:
        """Yield the base: its calls inside add no focus bias and leave FAME's own state (the
        source it is decoding) as it was. For a second stream of the base beside FAME's, e.g.
        context-aware decoding's context-free stream (FAME + CAD)."""
        saved, on = self.state, self.enabled
        self.state, self.enabled = FocusState(), False
        try:
            yield self.base
        finally:
            self.state, self.enabled = saved, on

    @property
    def generation_config(self) -> Any:
        return self.base.generation_config

    def get_output_embeddings(self) -> nn.Module:
        return self.output_embedding

    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def get_encoder(self) -> nn.Module:
        return self.base.get_encoder()

    @property
    def embedding_weight(self) -> torch.Tensor:
        """E [V, h]."""
        return self.output_embedding.weight

    def topic_logits(self) -> torch.Tensor:
        """T_X [B, V] of the source seen by the last forward pass."""
        if self.state.source is None:
            raise GencraftError("no source has been seen yet: run forward or generate first")
        src = self.state.source
        return self.head.pooled(src.g, src.mask) @ self.embedding_weight.to(src.g.dtype).t()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        source_mask: torch.Tensor | None = None,
        return_focus: bool = False,
        **kwargs: Any,
    ) -> FocusModelOutput:
        """Args:
        input_ids: [B, S] source (encoder-decoder) or [B, T] prompt + target (causal LM).
        attention_mask: [B, S] / [B, T].
        labels: [B, T] target ids, -100 = not scored (causal LM: mask the prompt with -100).
        source_mask: causal LM only, [B, T] bool: which positions are the source (default: all
            non-padding positions, the prompt-only case of ``generate``).
        return_focus: also return f_t [B, T, V] and a [B, T, S].
        kwargs: passed to the base (``decoder_input_ids``, ``past_key_values``...).
        """
        if source_mask is not None and self.is_encoder_decoder:
            raise GencraftError(
                "source_mask is for causal LMs; encoder-decoders use attention_mask"
            )
        self.state.pending_mask = source_mask
        try:
            out = self.base(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs
            )
        finally:
            self.state.pending_mask = None
        result = FocusModelOutput(
            logits=out.logits,
            **cache_kwargs(output_cache(out)),
            base_output=out,
        )
        if labels is not None or return_focus:
            result.topic_logits = self.topic_logits()
        if labels is not None:
            result.mle_loss = out.loss
            result.topic_loss = topic_loss(
                result.topic_logits,
                labels,
                self.frequent_ids,
                None,
                frequent=self.config.frequent,
            )
            lam = self.config.mle_weight
            result.loss = lam * out.loss + (1.0 - lam) * result.topic_loss
        if return_focus and self.state.last:
            result.attention = self.state.last["attention"]
            result.focus_bias = self.state.last["focus_states"] @ self.embedding_weight.t()
        return result

    def focus_processor(
        self,
        k: int,
        *,
        mode: Literal["sample", "top"] = "sample",
        generator: torch.Generator | None = None,
        renormalize: bool = True,
    ) -> LogitsProcessor:
        """A logits processor that, at its first call inside ``generate``, builds V_k ∪ F for each
        document from T_X of the source the model has just read, then restricts every step
        (re-normalising over V_k ∪ F unless ``renormalize=False``)."""
        return _LazyFocusProcessor(self, k, mode, generator, renormalize)

    def special_ids(self) -> set[int]:
        """EOS/PAD/decoder-start ids of the base: always allowed by focus decoding."""
        return special_ids(self.base)

    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        focus_k: int | None = None,
        focus_mode: Literal["sample", "top"] = "sample",
        focus_vocabularies: list[torch.Tensor] | None = None,
        focus_seed: int | None = None,
        focus_renormalize: bool = True,
        **kwargs: Any,
    ) -> Any:
        """``base.generate`` with the focus bias, plus optional focus decoding:

        * ``focus_k`` with ``focus_mode="sample"`` (focus_sample,k: V_k drawn from softmax(T_X)
          once per document, seeded by ``focus_seed``) or ``"top"`` (focus_top,k);
        * ``focus_vocabularies``: explicit allowed ids per document (e.g. the oracle);
        * ``focus_renormalize``: scores re-normalised over V_k ∪ F (eq. 5; matters for beam
          scores), or only masked (False).

        Everything else (``num_beams``, ``do_sample``, ``top_k``, ``top_p``...) goes to
        ``base.generate``; focus restriction runs before its top-k/top-p warpers.
        """
        if input_ids is None:
            raise GencraftError("generate needs input_ids (the source / prompt)")
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        if focus_vocabularies is not None and focus_k is not None:
            raise GencraftError("give focus_k or focus_vocabularies, not both")
        if focus_vocabularies is not None:
            processors.append(
                self._given_vocabularies(focus_vocabularies, input_ids.shape[0], focus_renormalize)
            )
        elif focus_k is not None:
            v = self.embedding_weight.shape[0]
            if not 1 <= focus_k <= v:
                raise GencraftError(f"focus_k must lie in [1, |V| = {v}], got {focus_k}")
            gen = torch.Generator().manual_seed(focus_seed) if focus_seed is not None else None
            processors.append(
                self.focus_processor(
                    focus_k, mode=focus_mode, generator=gen, renormalize=focus_renormalize
                )
            )
        self.state.source_len = None if self.is_encoder_decoder else input_ids.shape[1]
        self.state.n_docs = input_ids.shape[0]
        self.state.source = None
        try:
            with torch.no_grad():
                return self.base.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    logits_processor=processors,
                    **kwargs,
                )
        finally:
            self.state.source_len = self.state.n_docs = None

    def _given_vocabularies(
        self, vocabularies: list[torch.Tensor], documents: int, renormalize: bool
    ) -> FocusLogitsProcessor:
        """The processor of explicit allowed ids per document (each set with the frequent
        ids F added), refused when the sets do not match the documents."""
        if len(vocabularies) != documents:
            raise GencraftError(
                f"focus_vocabularies has {len(vocabularies)} sets for {documents} documents"
            )
        sets = [
            torch.unique(torch.cat([v.cpu().long(), self.frequent_ids.cpu()])) for v in vocabularies
        ]
        return FocusLogitsProcessor(
            sets, always_allowed=self.special_ids(), renormalize=renormalize
        )

    # ---------------------------------------------------------------- persistence
    @property
    def method_config(self) -> FocusConfig:
        return self.config

    def saves_base(self) -> bool:
        """The base is saved unless it is frozen and loadable by name."""
        return not self.config.freeze_base or not self.config.base_name_or_path

    def method_payload(self) -> dict[str, Any]:
        return {**asdict(self.config), "task": self.task, "hidden_size": self.head.hidden_size}

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        tensors = {f"head.{k}": v for k, v in self.head.state_dict().items()}
        tensors["frequent_ids"] = self.frequent_ids
        return tensors

    @property
    def task(self) -> str:
        return "seq2seq-lm" if self.is_encoder_decoder else "causal-lm"

    @classmethod
    def base_task(cls, payload: dict[str, Any]) -> str:
        return payload["task"]

    @classmethod
    def from_method_payload(
        cls, payload: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, **kwargs: Any
    ) -> FocusForConditionalGeneration:
        fields = set(FocusConfig.__dataclass_fields__)
        cfg = FocusConfig(**{k: v for k, v in payload.items() if k in fields})
        state = dict(tensors)
        model = cls(base, cfg, frequent_ids=state.pop("frequent_ids"))
        if model.head.hidden_size != payload["hidden_size"]:
            raise GencraftError(
                f"the base model's width {model.head.hidden_size} differs from the saved head's "
                f"{payload['hidden_size']}"
            )
        model.head.load_state_dict({k[len("head.") :]: v for k, v in state.items()})
        return model


class _LazyFocusProcessor(LogitsProcessor):
    """Builds a :class:`FocusLogitsProcessor` from the wrapper's T_X at the first step."""

    def __init__(
        self,
        model: FocusForConditionalGeneration,
        k: int,
        mode: str,
        generator: torch.Generator | None,
        renormalize: bool = True,
    ) -> None:
        self.model, self.k, self.mode, self.generator = model, k, mode, generator
        self.renormalize = renormalize
        self.inner: FocusLogitsProcessor | None = None
        self.vocabularies: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self.inner is None:
            topic = self.model.topic_logits()  # [B * r, V]: r copies per document
            rows = topic.shape[0]
            docs = self.model.state.n_docs or rows
            if rows % docs:
                raise GencraftError(f"{rows} source rows cannot be split among {docs} documents")
            freq = self.model.frequent_ids
            self.vocabularies = [
                focus_vocabulary(
                    t, self.k, mode=self.mode, frequent_ids=freq, generator=self.generator
                )
                for t in topic[:: rows // docs]
            ]
            self.inner = FocusLogitsProcessor(
                self.vocabularies,
                always_allowed=self.model.special_ids(),
                renormalize=self.renormalize,
            )
        return self.inner(input_ids, scores)
