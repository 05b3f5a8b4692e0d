"""``PrefixModel``: prefix-tuning (Li & Liang) with DASP's blocking and sparse attention, on any
Hugging Face causal LM or encoder-decoder whose attention gencraft's dispatcher knows.

Where the prefixes go (P key/value vectors per layer, the base frozen):

* decoder self-attention (every model): in the KV cache, as peft does, so the real tokens take
  positions P, P+1, ... and a dense ``PrefixModel`` *is* the base run with
  ``past_key_values=prefix_cache(B)``;
* encoder self-attention (encoder-decoders, ``encoder_prefix``) and, optionally, the decoder's
  cross-attention (``cross_prefix``): extra key/value columns through the dispatcher
  (:class:`~gencraft.prefix.attention.PrefixKeyValues`); they carry no position.

Parameters are stored as peft stores them (``embedding`` [P, L·2·n_kv·d], or with
``prefix_projection`` an embedding [P, n_kv·d] and the MLP ``transform``), per stack, so a peft
adapter loads by copying (:meth:`PrefixModel.from_peft`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.errors import ConfigError, GencraftError
from gencraft.models.attention import (
    AttentionCall,
    AttentionPlugin,
    attach,
    attention_context,
    attention_sites,
    plugins_of,
)
from gencraft.models.caches import RowStateCache, carrying_row_state
from gencraft.models.compat import (
    CACHE_NAMES,
    DynamicCache,
    EncoderDecoderCache,
    cache_kwargs,
)
from gencraft.models.generate import generation_settings, lengths_as_new_tokens
from gencraft.models.introspect import decoder_start_id, hf_model, is_encoder_decoder, pad_id
from gencraft.models.method import MethodModel
from gencraft.prefix.attention import PrefixAttention, PrefixCall, PrefixKeyValues
from gencraft.prefix.config import PrefixConfig, resolve_layers
from gencraft.prefix.encoder import PrefixEncoder
from gencraft.prefix.segment import output_segment
from gencraft.prefix.tables import (
    blocks,
    decoder_only_table,
    decoder_table,
    input_blocks,
    needs_tables,
)

#: the files PrefixModel wrote before the shared method format (still loaded)
CONFIG_FILE = "prefix_config.json"
WEIGHTS_FILE = "prefix_model.safetensors"
#: generate's keywords PrefixModel.generate sets itself (the inputs, the decoder's start, the
#: prefix cache) or cannot follow (assisted decoding drafts without the prefixes)
NOT_TAKEN = (
    "decoder_input_ids",
    "inputs_embeds",
    "decoder_inputs_embeds",
    *CACHE_NAMES,
    "assistant_model",
    "prompt_lookup_num_tokens",
    "assistant_early_exit",
)
#: the prefix groups: (stack, kind) -> name of the parameter module
GROUPS = {
    ("decoder", "self"): "decoder",
    ("encoder", "self"): "encoder",
    ("decoder", "cross"): "cross",
}


def _refuse_not_taken(generate_kw: dict, generation_config: Any) -> None:
    """One line naming every keyword (or generation-config field) of :data:`NOT_TAKEN` given."""
    given = [
        k for k in NOT_TAKEN if k in generate_kw or getattr(generation_config, k, None) is not None
    ]
    if given:
        raise GencraftError(
            f"PrefixModel.generate does not take {', '.join(given)}: it builds the inputs, the "
            "decoder's start and the prefix cache itself, and assisted decoding would draft "
            "without the prefixes"
        )


class _Probe(AttentionPlugin):
    """Records every site's key/value at one forward (never acts)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def active(self, call: AttentionCall) -> bool:
        s = call.site
        self.seen[(s.stack, s.kind, s.layer)] = (call.key.detach(), call.value.detach())
        return False


def _probe(base: nn.Module, ids: torch.Tensor) -> dict[tuple[str, str, int], Any]:
    """Key/value [1, n_kv, T, d] of every attention site when ``base`` reads ``ids`` [1, T]
    (the encoder and the decoder both read ``ids`` in an encoder-decoder)."""
    probe = _Probe()
    handle = attach(base, probe, kind="any")
    try:
        with torch.no_grad():
            if is_encoder_decoder(base):
                base(input_ids=ids, decoder_input_ids=ids, use_cache=False)
            else:
                base(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
    return probe.seen


class PrefixModel(MethodModel):
    """Prefix-tuning with DASP's structure on a frozen Hugging Face model.

    Args:
        base: a ``*ForCausalLM``, a ``*ForConditionalGeneration`` (BART, T5...) or an
            ``EncoderDecoderModel`` (BERT2BERT).
        config: :class:`~gencraft.prefix.PrefixConfig`.
        tokenizer: needed by the ``"sentence"`` segmenter only.

    Disabled (:meth:`disable`), forward and generate are the base's own.
    """

    method = "prefix"
    legacy_files = (CONFIG_FILE, WEIGHTS_FILE)

    def __init__(self, base: nn.Module, config: PrefixConfig, *, tokenizer: Any = None) -> None:
        super().__init__()
        self._record: dict | None = None  # the store of an open recording() block
        if not isinstance(config, PrefixConfig):
            raise ConfigError(f"config must be a PrefixConfig, got {type(config).__name__}")
        hf = hf_model(base)
        if not hasattr(hf, "generate") or hf.get_output_embeddings() is None:
            raise GencraftError(
                f"unsupported model {type(hf).__name__} (model_type "
                f"{getattr(hf.config, 'model_type', '?')!r}): PrefixModel needs a causal LM or "
                "an encoder-decoder with a language-model head"
            )
        self.base, self.config, self.tokenizer = hf, config, tokenizer
        self._freeze(self.base)
        self.is_encoder_decoder = is_encoder_decoder(hf)
        sites = attention_sites(hf)  # raises, naming the model, when unsupported
        if any(isinstance(q, PrefixAttention) for _, m in sites for q in plugins_of(m)):
            raise GencraftError(
                f"this {type(hf).__name__} already carries a PrefixModel; call .remove() on "
                "that one first (or load another copy of the base)"
            )
        layers: dict[tuple[str, str], int] = {}
        for s, _ in sites:
            layers[(s.stack, s.kind)] = max(layers.get((s.stack, s.kind), 0), s.layer + 1)
        self.num_layers = layers
        groups = [("decoder", "self")]
        if self.is_encoder_decoder:
            if ("encoder", "self") not in layers:
                raise GencraftError(f"{type(hf).__name__}: no encoder self-attention found")
            if config.encoder_prefix:
                groups.append(("encoder", "self"))
            if config.cross_prefix:
                groups.append(("decoder", "cross"))
        self.groups = groups
        self._build_prefixes(hf, config, groups, layers)
        self._init_prefixes()
        self._handles = self._attach()

    def _build_prefixes(
        self, hf: nn.Module, config: PrefixConfig, groups: list, layers: dict
    ) -> None:
        """One ``PrefixEncoder`` per (stack, kind) group, shaped as a probe forward finds that
        group's keys ([n_kv, d], one shape per stack)."""
        device = next(hf.parameters()).device
        seen = _probe(hf, torch.zeros(1, 1, dtype=torch.long, device=device))
        self.prefix = nn.ModuleDict()
        self.kv_shapes: dict[str, tuple[int, int]] = {}
        for stack, kind in groups:
            shapes = {
                (k.shape[1], k.shape[3])
                for (st, kd, _), (k, _) in seen.items()
                if (st, kd) == (stack, kind)
            }
            if len(shapes) != 1:
                raise GencraftError(
                    f"{type(hf).__name__}: the {stack} {kind}-attention layers have key shapes "
                    f"{sorted(shapes)}; PrefixModel needs one [n_kv, d] per stack"
                )
            (n_kv, d) = shapes.pop()
            name = GROUPS[(stack, kind)]
            self.kv_shapes[name] = (n_kv, d)
            self.prefix[name] = PrefixEncoder(
                config.num_virtual_tokens,
                layers[(stack, kind)],
                n_kv,
                d,
                projection=config.prefix_projection,
                hidden=config.encoder_hidden_size,
            ).to(device)

    # ------------------------------------------------------------------ construction
    def _init_prefixes(self) -> None:
        cfg = self.config
        gen = torch.Generator().manual_seed(cfg.init_seed)
        for enc in self.prefix.values():
            w = enc.embedding.weight
            w.data.copy_(torch.randn(w.shape, generator=gen).to(w))
        if cfg.init != "tokens":
            return
        if cfg.prefix_projection:
            raise ConfigError(
                "init='tokens' sets the prefixes directly: use prefix_projection=False"
            )
        vocab = self.base.get_output_embeddings().weight.shape[0]
        special = {pad_id(self.base)} | set(range(min(5, vocab)))
        pool = torch.tensor([i for i in range(vocab) if i not in special])
        ids = pool[torch.randperm(len(pool), generator=gen)[: cfg.num_virtual_tokens]]
        device = next(self.base.parameters()).device
        seen = _probe(self.base, ids[None].to(device))
        for (stack, kind), name in ((g, GROUPS[g]) for g in self.groups):
            enc = self.prefix[name]
            p, layers, n, d = enc.shape
            rows = torch.empty(layers * 2, n, p, d, device=device)
            for i in range(layers):
                k, v = seen[(stack, kind, i)]
                rows[2 * i], rows[2 * i + 1] = k[0, :, -p:], v[0, :, -p:]
            enc.embedding.weight.data.copy_(rows.permute(2, 0, 1, 3).reshape(p, -1))

    def _attach(self) -> list[Any]:
        cfg, owner, handles = self.config, id(self), []
        extend = [g for g in self.groups if g != ("decoder", "self")]
        if extend:
            plugin = PrefixKeyValues(owner)
            for stack, kind in extend:
                handles.append(attach(self.base, plugin, kind=kind, stack=stack))
        sparse_stacks = cfg.sparse_stacks(self.is_encoder_decoder)
        for (stack, kind), n in self.num_layers.items():
            has_prefix = (stack, kind) in self.groups
            blocked = set(resolve_layers(cfg.blocked_layers, n, cfg.lower_layers))
            sparse = set()
            if cfg.normalizer != "softmax" and stack in sparse_stacks and kind == "self":
                sparse = set(resolve_layers(cfg.sparse_layers, n, cfg.lower_layers))
            plugin = PrefixAttention(
                owner, cfg.num_virtual_tokens if has_prefix else 0, blocked, sparse, cfg
            )
            handles.append(attach(self.base, plugin, kind=kind, stack=stack))
        return handles

    def _detach(self) -> None:
        """Take the plug-ins off the base."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _set_enabled(self, on: bool) -> None:
        pass  # forward and generate read self.enabled

    # ------------------------------------------------------------------ prefixes
    @property
    def num_virtual_tokens(self) -> int:
        return self.config.num_virtual_tokens

    def _kv(self, name: str, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        dtype = self.base.dtype
        return [
            (k.to(dtype).expand(batch_size, -1, -1, -1), v.to(dtype).expand(batch_size, -1, -1, -1))
            for k, v in self.prefix[name].layer_kv()
        ]

    def prefix_cache(self, batch_size: int) -> RowStateCache:
        """The decoder self-attention prefixes as a ``DynamicCache`` (per layer [B, n_kv, P, d],
        after any projection), exactly what :meth:`forward` and :meth:`generate` use (a
        :class:`~gencraft.models.caches.RowStateCache`: causal TruncSA keeps its running
        column mass in it)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        return RowStateCache(self._kv("decoder", batch_size))

    def _cache(self, batch_size: int) -> Any:
        cache = self.prefix_cache(batch_size)
        if self.is_encoder_decoder:
            return EncoderDecoderCache(cache, DynamicCache())
        return cache

    @contextmanager
    def _context(
        self, tables: dict[str, torch.Tensor | None], cache: Any, record: Any = None
    ) -> Iterator[None]:
        """The plug-ins' state for one base call over ``cache`` (prefixes, block tables,
        the record store, and the cache's row store for causal TruncSA)."""
        kv = {g: self._kv(GROUPS[g], 1) for g in self.groups if g != ("decoder", "self")}
        record = record if record is not None else self._record  # recording() sets it
        call = PrefixCall(owner=id(self), kv=kv, tables=tables, record=record)
        with attention_context(prefix=call), carrying_row_state(cache):
            yield

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        output_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_segment_ids: torch.Tensor | None = None,
        record: dict | None = None,
        **kwargs: Any,
    ) -> Any:
        """The base model's output (``loss`` with ``labels``, ``logits`` [B, T, V]).

        Args:
            input_ids, attention_mask: [B, T] (the encoder input of an encoder-decoder).
            segment_ids: [B, T] each token's segment (default: the segmenter's). Decoder-only:
                prompt tokens in [0, encoder_segments), output tokens in [0, decoder_segments).
            labels: [B, T] (decoder-only, -100 on the prompt) or [B, T_out] (encoder-decoder).
            output_mask: decoder-only, [B, T] bool, the output tokens (default:
                ``labels != -100``; without labels, none: every token is prompt).
            decoder_segment_ids: encoder-decoders, [B, T_dec] aligned with the decoder inputs
                (default: the segmenter on the labels, shifted right as the inputs are).
            record: a dict that receives the attention probabilities of every layer (analysis).
        """
        if input_ids.dim() != 2:
            raise ConfigError(f"input_ids must be [B, T], got shape {list(input_ids.shape)}")
        if labels is not None:  # a slice (labels=ids[:, :8]) breaks the base's loss .view
            labels = labels.contiguous()
        if not self.enabled:
            if self.is_encoder_decoder:
                kwargs.update(
                    decoder_input_ids=decoder_input_ids,
                    decoder_attention_mask=decoder_attention_mask,
                )
            return self.base(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs
            )
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        if not self.is_encoder_decoder:
            return self._forward_decoder_only(
                input_ids, mask, segment_ids, labels, output_mask, record, kwargs
            )
        decoder = (decoder_input_ids, decoder_attention_mask, decoder_segment_ids)
        return self._forward_encoder_decoder(
            input_ids, mask, segment_ids, labels, decoder, record, kwargs
        )

    def _forward_decoder_only(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        segment_ids: torch.Tensor | None,
        labels: torch.Tensor | None,
        output_mask: torch.Tensor | None,
        record: dict | None,
        kwargs: dict[str, Any],
    ) -> Any:
        """A causal LM's forward: the prefix as a cache of P positions before ``input_ids``
        [B, T], the mask [B, P + T]; the segment table over prompt and output tokens."""
        b, p = input_ids.shape[0], self.config.num_virtual_tokens
        tables: dict[str, torch.Tensor | None] = {}
        if needs_tables(self.config) or segment_ids is not None:
            if output_mask is None:  # the output tokens: the labelled ones (none without labels)
                output_mask = (
                    labels != -100
                    if labels is not None
                    else torch.zeros_like(input_ids, dtype=torch.bool)
                )
            tables["decoder"] = decoder_only_table(
                self.config, self.tokenizer, input_ids, mask, segment_ids, output_mask.bool()
            )
        full_mask = torch.cat([mask.new_ones(b, p), mask], dim=1)
        cache = self._cache(b)
        with self._context(tables, cache, record):
            return self.base(
                input_ids=input_ids,
                attention_mask=full_mask,
                **cache_kwargs(cache),
                labels=labels,
                **kwargs,
            )

    def _forward_encoder_decoder(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        segment_ids: torch.Tensor | None,
        labels: torch.Tensor | None,
        decoder: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
        record: dict | None,
        kwargs: dict[str, Any],
    ) -> Any:
        """An encoder-decoder's forward: the encoder reads ``input_ids`` [B, T]; ``decoder`` is
        (decoder_input_ids, decoder_attention_mask [B, T_dec], decoder_segment_ids); the
        decoder's mask grows by the P prefix positions of its cache."""
        decoder_input_ids, decoder_attention_mask, decoder_segment_ids = decoder
        p = self.config.num_virtual_tokens
        tables: dict[str, torch.Tensor | None] = {}
        if needs_tables(self.config) or segment_ids is not None or decoder_segment_ids is not None:
            tables["encoder"] = input_blocks(
                self.config, self.tokenizer, input_ids, mask, segment_ids
            )
            tables["decoder"] = decoder_table(
                self.config,
                self.tokenizer,
                decoder_input_ids,
                decoder_attention_mask,
                labels,
                decoder_segment_ids,
            )
        if decoder_attention_mask is not None:
            ones = decoder_attention_mask.new_ones(decoder_attention_mask.shape[0], p)
            decoder_attention_mask = torch.cat([ones, decoder_attention_mask], dim=1)
        cache = self._cache(input_ids.shape[0])
        with self._context(tables, cache, record):
            return self.base(
                input_ids=input_ids,
                attention_mask=mask,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                **cache_kwargs(cache),
                labels=labels,
                **kwargs,
            )

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        **generate_kw: Any,
    ) -> torch.Tensor:
        """``base.generate`` with the prefixes (greedy, beam search, sampling...).

        Returns what ``generate`` returns without prefixes: the prompt and the new tokens
        (decoder-only), or the decoder's tokens starting with the start token. Generated
        token i is in output segment ``min(S-1, i*S // L)`` (L = ``config.output_length``,
        else ``max_new_tokens``, 20 when neither the call nor the generation config sets
        it); the prompt's segments are the segmenter's (or ``segment_ids``). ``max_length``
        and ``min_length`` count the prompt (or the decoder's start token) as ``generate``
        does, not the prefix (:func:`gencraft.models.generate.lengths_as_new_tokens`).
        """
        with torch.no_grad():
            if not self.enabled:
                return self.base.generate(
                    input_ids=input_ids, attention_mask=attention_mask, **generate_kw
                )
            gen_cfg = generation_settings(self.base, generate_kw)
            _refuse_not_taken(generate_kw, gen_cfg)
            beams = int(generate_kw.get("num_beams") or gen_cfg.num_beams or 1)
            returns = generate_kw.get("num_return_sequences") or gen_cfg.num_return_sequences
            copies = beams if beams > 1 else int(returns or 1)  # rows per input in the cache
            # the P placeholders before a causal prompt would count in generate's total lengths
            prompt = 1 if self.is_encoder_decoder else input_ids.shape[1]
            generate_kw = lengths_as_new_tokens(generate_kw, gen_cfg, prompt)
            max_new = generate_kw["max_new_tokens"]
            generate_kw.setdefault("pad_token_id", pad_id(self.base))
            mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            s_out = self.config.decoder_segments
            length = self.config.output_length or max_new
            out_idx = torch.arange(max_new + 1, device=input_ids.device)
            out_blocks = blocks(
                self.config,
                output_segment(out_idx, s_out, length)[None].expand(input_ids.shape[0], -1),
                s_out,
            )  # [B, max_new + 1, P]
            tables: dict[str, torch.Tensor | None] = {}
            if needs_tables(self.config) or segment_ids is not None:
                prompt = input_blocks(self.config, self.tokenizer, input_ids, mask, segment_ids)
                if self.is_encoder_decoder:
                    tables["encoder"] = prompt
                    # decoder input 0 is the start token (segment 0), input j the (j-1)-th output
                    tables["decoder"] = torch.cat([out_blocks[:, :1], out_blocks[:, :-1]], dim=1)
                else:
                    tables["decoder"] = torch.cat([prompt, out_blocks], dim=1)
            cache = self._cache(input_ids.shape[0] * copies)
            with self._context(tables, cache):
                if self.is_encoder_decoder:
                    return self._generate_encoder_decoder(input_ids, mask, cache, generate_kw)
                return self._generate_decoder_only(input_ids, mask, cache, generate_kw)

    def _generate_decoder_only(
        self, input_ids: torch.Tensor, mask: torch.Tensor, cache: Any, generate_kw: dict
    ) -> Any:
        """``generate`` on P dummy tokens (covered by the prefix cache, so generation starts
        at position P) and the prompt [B, T]; the dummies are cut from the output."""
        b, p = input_ids.shape[0], self.config.num_virtual_tokens
        dummies = torch.full_like(input_ids[:, :1], pad_id(self.base)).expand(b, p)
        out = self.base.generate(
            input_ids=torch.cat([dummies, input_ids], dim=1),
            attention_mask=torch.cat([mask.new_ones(b, p), mask], dim=1),
            **cache_kwargs(cache),
            **generate_kw,
        )
        if hasattr(out, "sequences"):  # return_dict_in_generate=True
            out.sequences = out.sequences[:, p:]
            return out
        return out[:, p:]

    def _generate_encoder_decoder(
        self, input_ids: torch.Tensor, mask: torch.Tensor, cache: Any, generate_kw: dict
    ) -> Any:
        """``generate`` from the start token: an encoder-decoder's generate feeds every
        decoder input at its first step, after the P cached prefix positions."""
        start = torch.full(
            (input_ids.shape[0], 1),
            decoder_start_id(self.base),
            dtype=input_ids.dtype,
            device=input_ids.device,
        )
        return self.base.generate(
            input_ids=input_ids,
            attention_mask=mask,
            decoder_input_ids=start,
            **cache_kwargs(cache),
            **generate_kw,
        )

    # ------------------------------------------------------------------ analysis
    @contextmanager
    def recording(self):
        """Inside the block, every forward keeps the attention probabilities of every layer
        (including the prefix columns) in the yielded dict, keyed ``(stack, kind, layer)``."""
        store: dict = {}
        self._record = store  # read by forward when it is given no record of its own
        try:
            yield store
        finally:
            self._record = None

    # ------------------------------------------------------------------ persistence
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.prefix.parameters() if p.requires_grad]

    def _signature(self) -> dict[str, Any]:
        cfg = self.base.config
        return {
            "model_type": getattr(cfg, "model_type", type(self.base).__name__),
            "layers": {GROUPS[g]: self.num_layers[g] for g in self.groups},
            "kv_shapes": {k: list(v) for k, v in self.kv_shapes.items()},
        }

    @property
    def method_config(self) -> PrefixConfig:
        return self.config

    def method_payload(self) -> dict[str, Any]:
        """The prefix settings, the base's name and its shape (checked on load); the base is
        frozen and never saved."""
        name = getattr(self.base, "gencraft_name", None) or getattr(
            self.base.config, "_name_or_path", ""
        )
        return {
            "prefix": self.config.to_dict(),
            "base_name_or_path": name,
            "base": self._signature(),
        }

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.prefix.state_dict())

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        base: nn.Module | str | None = None,
        *,
        tokenizer: Any = None,
        segmenter: Any = None,
        **overrides: Any,
    ) -> PrefixModel:
        """Load saved prefixes onto ``base`` (a model, a name for ``load_model``, or None: the
        recorded name). Raises when ``base`` is not the model the prefixes were trained on.
        ``overrides``: PrefixConfig fields to change (e.g. ``output_length``); ``device`` and
        ``dtype``: where the model goes, in which dtype (:func:`gencraft.models.method.place`)."""
        from gencraft.prefix.persistence import load_prefix_model

        kw = dict(tokenizer=tokenizer, segmenter=segmenter, **overrides)
        return load_prefix_model(cls, directory, base, **kw)

    @classmethod
    def from_peft(cls, peft_model: nn.Module, adapter: str | None = None) -> PrefixModel:
        """A PrefixModel with the prefixes of a peft prefix-tuning model (equal logits).

        peft puts prefixes in the decoder's self-attention only (also for seq2seq models), so
        the result has ``encoder_prefix=False``."""
        from gencraft.prefix.persistence import prefix_model_from_peft

        return prefix_model_from_peft(cls, peft_model, adapter)


class SparseAttentionHandle:
    """Returned by :func:`sparse_attention`; ``remove()`` restores the model's softmax."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def sparse_attention(model: nn.Module, config: PrefixConfig) -> SparseAttentionHandle:
    """DASP's normalisers on a model without prefixes (the paper's full fine-tuning control
    rows, "FT TruncSA/SoftSA"): ``config.normalizer`` on ``config.sparse_layers`` of
    ``config.sparse_stack``'s self-attention; the prefix settings are ignored. The model's
    weights are untouched and stay trainable. With TruncSA on a causal stack, decode through
    :class:`~gencraft.models.caches.RowStateGeneration` ``(model).generate``, whose cache
    carries the column mass (``model.generate`` alone is refused in one line)."""
    hf = hf_model(model)
    stacks = config.sparse_stacks(is_encoder_decoder(hf))
    counts: dict[str, int] = {}
    for s, _ in attention_sites(hf):
        if s.kind == "self":
            counts[s.stack] = max(counts.get(s.stack, 0), s.layer + 1)
    handles = []
    for stack in sorted(stacks & set(counts)):
        layers = set(resolve_layers(config.sparse_layers, counts[stack], config.lower_layers))
        if layers:
            plugin = PrefixAttention(None, 0, set(), layers, config)
            handles.append(attach(hf, plugin, kind="self", stack=stack, layers=sorted(layers)))
    if not handles:
        raise ConfigError(
            f"no self-attention layer selected by sparse_layers={config.sparse_layers!r}"
        )
    return SparseAttentionHandle(handles)
