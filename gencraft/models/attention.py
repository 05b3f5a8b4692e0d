"""gencraft's one attention function, with per-module plug-ins (no forked model files).

``transformers`` models look their attention function up by name in ``AttentionInterface``
and their mask builder in ``AttentionMaskInterface``. This module registers **one** name,
``"gencraft"``, in both:

* the mask function hands each request to the mask builder of the implementation the model
  had before (``sdpa`` or ``eager``...), so the model keeps the masks it always built;
* the attention function looks at the plug-ins attached to the calling module. With none, it
  calls the model's previous implementation unchanged (outputs are bit-identical). A plug-in
  can

  - **observe** the softmax probabilities [B, n, T, S] of the unmodified attention (FAME
    reads its attention this way; outputs stay those of the previous implementation);
  - **extend** the keys/values with extra columns placed before the real ones, each with its
    own mask columns (prefix keys/values; an extra key/value slot such as recurrence's
    h_prev);
  - **normalize**: replace the softmax over keys (sparse normalisers).

  Extending or normalising runs gencraft's eager computation (q kᵀ · scaling + position bias
  + mask, normaliser, dropout, · v), with GQA handled by repeating key/value heads.

Plug-ins attach to modules chosen by kind (self / cross attention), stack (encoder /
decoder) and layer index (:func:`attach`). State that changes per call (segment ids, a record
store...) travels through :func:`attention_context`, not through ``generate()`` kwargs.

Example::

    model, _ = load_model("tiny-llama")
    store = Observer()
    handle = attach(model, store, layers=[-1])     # the last layer's self-attention
    model(ids)                                     # store.probs: [[B, n, T, S]]
    handle.remove()
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.compat import (
    ALL_ATTENTION_FUNCTIONS,
    ALL_MASK_ATTENTION_FUNCTIONS,
    AttentionInterface,
    AttentionMaskInterface,
    repeat_kv,
)

IMPL = "gencraft"
_PLUGINS = "_gencraft_attention_plugins"
_SITE = "_gencraft_attention_site"
ORIGINAL = "_gencraft_original_attention"
_CALLS = "_gencraft_attention_calls"
# implementations whose masks gencraft's eager computation can read (bool or additive float)
READABLE = ("sdpa", "eager")

# qualified-name suffixes of attention modules, per family (Llama/BART/GPT-2/T5/BERT,
# GPT-NeoX's "attention", Falcon's and Bloom's "self_attention"); where one match contains
# another (BERT's "attention" wraps "attention.self"), the innermost is the site
CROSS_SUFFIXES = ("encoder_attn", "EncDecAttention", "crossattention.self")
SELF_SUFFIXES = (
    "self_attn",
    "attn",
    "attention.self",
    "SelfAttention",
    "self_attention",
    "attention",
)


# ------------------------------------------------------------------------------ sites
@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model: ``kind`` self/cross, ``stack`` encoder/decoder (a
    causal LM's layers are ``"decoder"``), ``layer`` its index within the stack."""

    name: str
    kind: Literal["self", "cross"]
    stack: Literal["encoder", "decoder"]
    layer: int


def _matches(name: str, suffixes: Sequence[str]) -> bool:
    last = name.split(".")[-1]
    return last in suffixes or any(name.endswith("." + s) for s in suffixes if "." in s)


def uses_registry(module: nn.Module) -> bool:
    """Whether ``module``'s model file looks its attention function up in transformers'
    registry (``ALL_ATTENTION_FUNCTIONS``), the only way gencraft's plug-ins reach it. GPT-J,
    Falcon and Bloom compute attention inline."""
    source = sys.modules.get(type(module).__module__)
    return source is not None and hasattr(source, "ALL_ATTENTION_FUNCTIONS")


def architecture(model: nn.Module) -> str:
    """``LlamaForCausalLM (llama)``: the class and model type, for messages."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    return f"{type(model).__name__} ({kind})" if kind else type(model).__name__


def attention_sites(model: nn.Module) -> list[tuple[AttentionSite, nn.Module]]:
    """Every attention module of a Hugging Face model, in forward order within each stack.
    Raises for an architecture whose attention modules are not named like any we know, or do
    not go through transformers' attention-function registry."""
    is_ed = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
    encoder = model.get_encoder() if is_ed and hasattr(model, "get_encoder") else None
    enc_ids = {id(m) for m in encoder.modules()} if encoder is not None else set()
    matched: list[tuple[str, str, nn.Module]] = []
    for name, module in model.named_modules():
        if _matches(name, CROSS_SUFFIXES):
            matched.append((name, "cross", module))
        elif _matches(name, SELF_SUFFIXES):
            matched.append((name, "self", module))
    names = [n for n, _, _ in matched]
    # the innermost match: BERT's `attention` (a wrapper) holds `attention.self`
    matched = [m for m in matched if not any(o.startswith(m[0] + ".") for o in names)]
    found: list[tuple[AttentionSite, nn.Module]] = []
    counters: dict[tuple[str, str], int] = {}
    for name, kind, module in matched:
        stack = "encoder" if id(module) in enc_ids else "decoder"
        layer = counters.get((stack, kind), 0)
        counters[(stack, kind)] = layer + 1
        found.append((AttentionSite(name, kind, stack, layer), module))
    if not found:
        raise GencraftError(
            f"{architecture(model)} is not supported: no attention module named like "
            f"{', '.join(SELF_SUFFIXES + CROSS_SUFFIXES)}"
        )
    inline = sorted({type(m).__name__ for _, m in found if not uses_registry(m)})
    if inline:
        raise GencraftError(
            f"{architecture(model)} is not supported: its attention ({', '.join(inline)}) is "
            "computed inline, not through transformers' attention-function registry that "
            "gencraft's attention plug-ins attach to"
        )
    return found


def select_sites(
    model: nn.Module,
    *,
    kind: Literal["self", "cross", "any"] = "self",
    stack: Literal["encoder", "decoder", "any"] = "any",
    layers: Sequence[int] | Callable[[int, int], bool] | None = None,
) -> list[tuple[AttentionSite, nn.Module]]:
    """The attention sites of ``model`` with the given kind and stack; ``layers``: indices
    within the stack (negative from the end), or ``f(layer, num_layers) -> bool``."""
    sites = [
        (s, m)
        for s, m in attention_sites(model)
        if kind in ("any", s.kind) and stack in ("any", s.stack)
    ]
    if layers is None:
        return sites
    counts: dict[tuple[str, str], int] = {}
    for s, _ in sites:
        counts[(s.stack, s.kind)] = counts.get((s.stack, s.kind), 0) + 1
    chosen = []
    for s, m in sites:
        n = counts[(s.stack, s.kind)]
        if callable(layers):
            keep = layers(s.layer, n)
        else:
            bad = [i for i in layers if not -n <= i < n]
            if bad:
                raise GencraftError(f"layer indices {bad} out of range for {n} {s.kind} layers")
            keep = s.layer in {i % n for i in layers}
        if keep:
            chosen.append((s, m))
    return chosen


# ------------------------------------------------------------------------------ context
@dataclass(frozen=True)
class AttentionContext:
    """What an attention plug-in may receive during a model call, one field per source:

    * ``prefix``: the running :class:`~gencraft.prefix.attention.PrefixCall` (its prefix keys
      and values, blocking tables and attention record); set by ``PrefixModel``'s forward and
      generate;
    * ``row_state``: the per-row tensors of a ``RowStateCache`` (reordered with the cache);
      set by :func:`gencraft.models.caches.carrying_row_state`;
    * ``memory``: recurrence's previous-window state [B, H] per slot, keyed by the slot's
      ``id``; set by ``RecurrentLM`` around each window;
    * ``extra``: a user's own plug-in's values (e.g. ``segment_ids``), by name.
    """

    prefix: Any = None
    row_state: dict[Any, torch.Tensor] | None = None
    memory: dict[int, torch.Tensor] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_FIELDS = ("prefix", "row_state", "memory")
_EMPTY = AttentionContext()
_CONTEXT: contextvars.ContextVar[AttentionContext | None] = contextvars.ContextVar(
    "gencraft_attention_context", default=None
)


@contextmanager
def attention_context(**values: Any) -> Iterator[AttentionContext]:
    """Per-call state for plug-ins, visible inside the block through :func:`current_context`:
    ``prefix``, ``row_state`` and ``memory`` set those fields, ``extra={name: value}`` adds a
    user's own plug-in's values; any other name is refused. Nested blocks add to (and
    override) the outer ones."""
    unknown = sorted(set(values) - {*_FIELDS, "extra"})
    if unknown:
        raise GencraftError(
            f"attention_context takes prefix, row_state, memory and extra, not {unknown}; "
            "pass your own plug-in's values as extra={name: value}"
        )
    outer = _CONTEXT.get() or _EMPTY
    known = {k: v for k, v in values.items() if k in _FIELDS}
    extra = {**outer.extra, **dict(values.get("extra") or {})}
    token = _CONTEXT.set(replace(outer, **known, extra=extra))
    try:
        yield _CONTEXT.get()
    finally:
        _CONTEXT.reset(token)


def current_context() -> AttentionContext:
    """The enclosing :func:`attention_context` blocks' values (all empty outside any)."""
    return _CONTEXT.get() or _EMPTY


# ------------------------------------------------------------------------------ plug-ins
@dataclass
class AttentionCall:
    """What a plug-in sees of one attention call. ``query`` [B, n, T, d], ``key``/``value``
    [B, n_kv, S, d] (after the module's cache update and rotary embedding), ``mask`` the
    model's own mask (bool [B, 1, T, S], additive float, or None with ``is_causal``)."""

    module: nn.Module
    site: AttentionSite
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    kwargs: dict[str, Any]

    @property
    def autoregressive(self) -> bool:
        """Whether the queries are the positions of an autoregressive stack (a causal
        self-attention, or a decoder's cross-attention), so that query t's output must not
        depend on later queries."""
        return self.site.kind == "cross" or _is_causal(self.module, self.kwargs)


@dataclass
class ExtraKeyValues:
    """Key/value columns a plug-in adds before the real keys: ``key``/``value``
    [B, n_kv, P, d]; ``allowed`` bool [B, T, P] or [B, 1|n, T, P] (None: every query sees
    every column)."""

    key: torch.Tensor
    value: torch.Tensor
    allowed: torch.Tensor | None = None


class AttentionPlugin:
    """Base class of plug-ins; override what the plug-in does. The dispatcher calls
    ``extend`` (extra key/value columns), then ``normalize`` (at most one plug-in per module
    may define it), then ``observe`` on the probabilities."""

    #: observe the probabilities of the unmodified attention without changing outputs
    observes: bool = False
    #: this plug-in defines ``normalize``
    normalizes: bool = False

    def active(self, call: AttentionCall) -> bool:
        """Whether the plug-in acts on this call (default: always)."""
        return True

    def extend(self, call: AttentionCall) -> ExtraKeyValues | None:
        return None

    def normalize(
        self, scores: torch.Tensor, allowed: torch.Tensor, call: AttentionCall
    ) -> torch.Tensor:
        """``scores`` float32 [B, n, T, S] with disallowed entries at the dtype's minimum,
        ``allowed`` bool broadcastable to it -> probabilities [B, n, T, S]."""
        raise NotImplementedError

    def observe(self, probs: torch.Tensor, call: AttentionCall) -> None:
        pass


@dataclass
class Observer(AttentionPlugin):
    """Keeps the probabilities [B, n, T, S] (float32) of every call in ``probs``."""

    probs: list[torch.Tensor] = field(default_factory=list)
    observes = True

    def observe(self, probs: torch.Tensor, call: AttentionCall) -> None:
        self.probs.append(probs)


@dataclass
class Normalizer(AttentionPlugin):
    """A normaliser over keys given as a function ``fn(scores, allowed) -> probs`` (see
    :meth:`AttentionPlugin.normalize`)."""

    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = None  # type: ignore[assignment]
    normalizes = True

    def normalize(self, scores, allowed, call):
        return self.fn(scores, allowed)


@dataclass
class StaticKeyValues(AttentionPlugin):
    """The same extra columns at every call: ``key``/``value`` [1 or B, n_kv, P, d] (expanded
    over the batch), ``allowed`` as in :class:`ExtraKeyValues`."""

    key: torch.Tensor = None  # type: ignore[assignment]
    value: torch.Tensor = None  # type: ignore[assignment]
    allowed: torch.Tensor | None = None

    def extend(self, call: AttentionCall) -> ExtraKeyValues:
        b = call.query.shape[0]
        k = self.key.expand(b, *self.key.shape[1:]) if self.key.shape[0] == 1 else self.key
        v = self.value.expand(b, *self.value.shape[1:]) if self.value.shape[0] == 1 else self.value
        return ExtraKeyValues(k.to(call.key.dtype), v.to(call.value.dtype), self.allowed)


class PluginHandle:
    """Returned by :func:`attach`; ``remove()`` detaches the plug-in again.

    Until one of its modules has been called through gencraft's attention function, every
    forward of the model it was attached through checks that one was: a model whose attention
    bypasses the dispatcher raises instead of running without the plug-in."""

    def __init__(
        self, plugin: AttentionPlugin, modules: list[nn.Module], model: nn.Module | None = None
    ) -> None:
        self.plugin, self.modules = plugin, modules
        self._guards: list[Any] = []
        if model is not None:
            self._guards = [
                model.register_forward_pre_hook(self._before, with_kwargs=True),
                model.register_forward_hook(self._after, with_kwargs=True),
            ]
            self._model_name = architecture(model)
            self._calls: int | None = None

    def _count(self) -> int:
        return sum(getattr(m, _CALLS, 0) for m in self.modules)

    def _before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # an encoder-decoder given encoder_outputs does not run its encoder
        encoder_only = all(getattr(m, _SITE).stack == "encoder" for m in self.modules)
        self._calls = None if encoder_only and kwargs.get("encoder_outputs") else self._count()

    def _after(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self._calls is None:
            return
        if self._count() == self._calls:
            self._unguard()
            sites = ", ".join(getattr(m, _SITE).name for m in self.modules[:3])
            raise GencraftError(
                f"{self._model_name} is not supported: a forward ran without calling its "
                f"attention at {sites} through gencraft's attention function, so "
                f"{type(self.plugin).__name__} would have no effect"
            )
        self._unguard()  # the dispatcher is reached: no need to check again

    def _unguard(self) -> None:
        for g in self._guards:
            g.remove()
        self._guards = []

    def remove(self) -> None:
        self._unguard()
        for m in self.modules:
            plugins = getattr(m, _PLUGINS, [])
            if self.plugin in plugins:
                plugins.remove(self.plugin)

    def __enter__(self) -> PluginHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


# ------------------------------------------------------------------------------ install
def _configs(model: nn.Module) -> list[Any]:
    seen: dict[int, Any] = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation_internal"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


def install(model: nn.Module) -> list[tuple[AttentionSite, nn.Module]]:
    """Route ``model``'s attention through gencraft's function (idempotent). Its previous
    implementation is kept per config and used whenever no plug-in changes the call."""
    for cfg in _configs(model):
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if impl != IMPL:
            if impl != "eager" and impl not in ALL_ATTENTION_FUNCTIONS:
                raise GencraftError(f"unknown attention implementation {impl!r}")
            setattr(cfg, ORIGINAL, impl)
    sites = attention_sites(model)
    for site, module in sites:
        cfg = getattr(module, "config", None)
        original = getattr(cfg, ORIGINAL, None) or getattr(module, ORIGINAL, None) or "eager"
        setattr(module, ORIGINAL, original)
        setattr(module, _SITE, site)
        if not hasattr(module, _PLUGINS):
            setattr(module, _PLUGINS, [])
    for cfg in _configs(model):
        cfg._attn_implementation = IMPL
    return sites


def attach(
    model: nn.Module,
    plugin: AttentionPlugin,
    *,
    kind: Literal["self", "cross", "any"] = "self",
    stack: Literal["encoder", "decoder", "any"] = "any",
    layers: Sequence[int] | Callable[[int, int], bool] | None = None,
    modules: Sequence[nn.Module] | None = None,
) -> PluginHandle:
    """Attach ``plugin`` to the attention modules chosen by ``kind``/``stack``/``layers``
    (see :func:`select_sites`) or given as ``modules``; installs the dispatcher if needed."""
    install(model)
    if modules is None:
        modules = [m for _, m in select_sites(model, kind=kind, stack=stack, layers=layers)]
    modules = list(modules)
    if not modules:
        raise GencraftError(
            f"{architecture(model)}: no {kind}-attention module in the {stack} stack matches "
            f"{'every layer' if layers is None else layers}; this plug-in cannot attach to it"
        )
    for m in modules:
        if not hasattr(m, _SITE):
            raise GencraftError(f"{type(m).__name__} is not an attention module of this model")
        plugins = getattr(m, _PLUGINS)
        if plugin.normalizes and any(p.normalizes for p in plugins):
            raise GencraftError(f"{getattr(m, _SITE).name} already has a normaliser")
        plugins.append(plugin)
    return PluginHandle(plugin, modules, model)


def plugins_of(module: nn.Module) -> list[AttentionPlugin]:
    return list(getattr(module, _PLUGINS, []))


def original_implementation(module: nn.Module) -> str:
    """The implementation ``module`` used before :func:`install` (``sdpa``, ``eager``...)."""
    return getattr(module, ORIGINAL, "eager")


# ------------------------------------------------------------------------------ extra inputs
#: the LayerNorm before a block's self-attention, per family (Llama, GPT-2, BART)
INPUT_NORMS = ("input_layernorm", "ln_1", "self_attn_layer_norm")


#: a post-norm block (OLMo-2) has these and feeds its attention the raw hidden states
POST_NORMS = ("post_attention_layernorm",)


def input_norm(model: nn.Module, site: AttentionSite) -> nn.Module:
    """The norm a block applies to its input before the self-attention at ``site``
    (``nn.Identity()`` for a post-norm block such as OLMo-2's, which applies none)."""
    block = model.get_submodule(site.name.rsplit(".", 1)[0]) if "." in site.name else model
    for name in INPUT_NORMS:
        norm = getattr(block, name, None)
        if isinstance(norm, nn.Module):
            return norm
    names = {n for n, m in block.named_children() if "norm" in n.lower()}
    if names and names <= {*POST_NORMS, "post_feedforward_layernorm"}:
        return nn.Identity()
    raise GencraftError(
        f"{architecture(model)}: no input norm ({', '.join(INPUT_NORMS)}) found beside "
        f"{site.name} in {type(block).__name__}"
    )


def project_key_value(module: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values an attention module computes from inputs ``hidden`` [B, P, H]:
    [B, n_kv, P, d] each, without position embedding (for extra inputs such as recurrence's
    h_prev). Llama-style ``k_proj``/``v_proj`` (with a ``k_norm`` per head as in Qwen3, or over
    all heads as in OLMo-2), Phi-3's fused ``qkv_proj``, GPT-NeoX's and Falcon's
    ``query_key_value`` and GPT-2's ``c_attn``."""
    b, p, _ = hidden.shape
    d = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
    k_norm = getattr(module, "k_norm", None)
    if hasattr(module, "k_proj") and hasattr(module, "v_proj") and d:
        k, v = module.k_proj(hidden), module.v_proj(hidden)
        if isinstance(k_norm, nn.Module) and _norm_width(k_norm) == k.shape[-1] != d:
            k = k_norm(k)  # OLMo-2: one norm over all heads, before the split
            k_norm = None
        k, v = k.view(b, p, -1, d), v.view(b, p, -1, d)
        if isinstance(k_norm, nn.Module):
            k = k_norm(k)
        return k.transpose(1, 2), v.transpose(1, 2)
    if hasattr(module, "qkv_proj") and d:  # Phi-3: [q | k | v], query heads first
        n_kv = getattr(module, "num_key_value_heads", None) or module.config.num_key_value_heads
        qkv = module.qkv_proj(hidden)
        q_size = qkv.shape[-1] - 2 * n_kv * d
        k, v = qkv[..., q_size : q_size + n_kv * d], qkv[..., q_size + n_kv * d :]
        return k.view(b, p, -1, d).transpose(1, 2), v.view(b, p, -1, d).transpose(1, 2)
    if hasattr(module, "query_key_value") and hasattr(module, "multi_query") and d:
        return _falcon_key_value(module, module.query_key_value(hidden).view(b, p, -1, d))
    if hasattr(module, "query_key_value") and d:  # GPT-NeoX: per head [q | k | v]
        qkv = module.query_key_value(hidden).view(b, p, -1, 3 * d).transpose(1, 2)
        _, k, v = qkv.chunk(3, dim=-1)
        return k, v
    if hasattr(module, "c_attn") and d and not getattr(module, "is_cross_attention", False):
        fused = module.c_attn(hidden)
        split = getattr(module, "split_size", None)
        if not split or fused.shape[-1] != 3 * split:  # e.g. GPTBigCode's multi-query [q | k | v]
            raise GencraftError(
                f"{type(module).__name__} fuses its key/value projection in a layout gencraft "
                f"does not know (c_attn gives {fused.shape[-1]} columns, not 3 x {split}: "
                "multi-query attention)"
            )
        _, k, v = fused.split(split, dim=2)
        return k.view(b, p, -1, d).transpose(1, 2), v.view(b, p, -1, d).transpose(1, 2)
    raise GencraftError(
        f"cannot project keys/values with {type(module).__name__} (no k_proj/v_proj, qkv_proj, "
        "query_key_value or c_attn)"
    )


def _falcon_key_value(module: nn.Module, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Falcon's fused ``query_key_value`` [B, P, columns / d, d] in its three layouts (the
    registry's from transformers 5.25): grouped (new decoder architecture: each kv group's
    queries, then its key and value), multi-query ([all queries | k | v]) or per head
    interleaved; keys and values [B, n_kv, P, d]."""
    b, p, _, d = fused.shape
    if module.new_decoder_architecture:
        grouped = fused.view(b, p, module.num_kv_heads, -1, d)
        k, v = grouped[..., -2, :], grouped[..., -1, :]
    elif module.multi_query:
        _, k, v = fused.split([module.num_heads, 1, 1], dim=-2)
    else:
        _, k, v = fused.unflatten(-2, (module.num_heads, 3)).unbind(-2)
    return k.transpose(1, 2), v.transpose(1, 2)


def _norm_width(norm: nn.Module) -> int | None:
    w = getattr(norm, "weight", None)
    return int(w.shape[-1]) if isinstance(w, torch.Tensor) else None


# ------------------------------------------------------------------------------ computation
def _model_eager(module: nn.Module) -> Callable:
    """The model file's own ``eager_attention_forward`` (exact eager semantics: T5's position
    bias, GPT-2's scaling...), else gencraft's."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if fn is not None else _eager_forward


def _eager_forward(module, query, key, value, attention_mask, **kwargs):
    probs = _probs(module, query, key, attention_mask, kwargs, None, None)
    return _weighted(module, probs, value, kwargs), probs


def _original_fn(module: nn.Module) -> Callable:
    impl = original_implementation(module)
    return _model_eager(module) if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]


def allowed_mask(
    mask: torch.Tensor | None, t: int, s: int, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """The model's mask as bool "allowed" [B|1, 1|n, T, S] (None = all allowed): a bool mask as
    is, an additive one as ``> min / 2``, None with ``causal`` as the causal pattern in which
    query i (of T) is at position S − T + i."""
    if mask is not None:
        m = mask[..., -s:] if mask.shape[-1] > s else mask
        return m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    if causal and t > 1:
        q_pos = torch.arange(t, device=device).unsqueeze(1) + (s - t)
        return (torch.arange(s, device=device) <= q_pos)[None, None]
    return None


def _is_causal(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    c = kwargs.get("is_causal")
    return bool(c if c is not None else getattr(module, "is_causal", False))


def _probs(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
    normalizer: AttentionPlugin | None,
    call: AttentionCall | None,
    extra_allowed: torch.Tensor | None = None,
    n_extra: int = 0,
) -> torch.Tensor:
    # extra_allowed is given whenever n_extra > 0
    """normalize(q kᵀ · scaling + position_bias, allowed) in float32 [B, n, T, S]."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = repeat_kv(key, groups)
    scale = kwargs.get("scaling")
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scale
    softcap = kwargs.get("softcap")
    if softcap:  # Gemma-2: logits soft-capped before masking, as its eager attention does
        scores = torch.tanh(scores / softcap) * softcap
    t, s = scores.shape[-2:]
    bias = kwargs.get("position_bias")
    if bias is not None:  # T5: covers the real keys only; extra columns get no bias
        bias = bias.float()[..., -(s - n_extra) :]
        scores = torch.cat([scores[..., :n_extra], scores[..., n_extra:] + bias], dim=-1)
    allowed = allowed_mask(mask, t, s - n_extra, _is_causal(module, kwargs), scores.device)
    if n_extra:
        real = (
            allowed
            if allowed is not None
            else torch.ones(1, 1, t, s - n_extra, dtype=torch.bool, device=scores.device)
        )
        extra = extra_allowed  # [B|1, 1|n, T, P], built by gencraft_attention
        shape = (max(real.shape[0], extra.shape[0]), max(real.shape[1], extra.shape[1]), t)
        allowed = torch.cat([extra.expand(*shape, n_extra), real.expand(*shape, s - n_extra)], -1)
    neg = torch.finfo(scores.dtype).min
    if allowed is not None:
        # a finite fill: a fully masked row (left padding) stays NaN-free, as in eager
        scores = scores.masked_fill(~allowed, neg)
    else:
        allowed = torch.ones(1, 1, t, s, dtype=torch.bool, device=scores.device)
    if normalizer is not None:
        return normalizer.normalize(scores, allowed, call)
    return torch.softmax(scores, dim=-1)


def _weighted(
    module: nn.Module, probs: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any]
) -> torch.Tensor:
    """dropout(probs) · v -> [B, T, n, d] (the layout every implementation returns)."""
    p = nn.functional.dropout(probs, p=kwargs.get("dropout", 0.0), training=module.training)
    groups = p.shape[1] // value.shape[1]
    v = repeat_kv(value, groups) if groups > 1 else value
    return torch.matmul(p.to(v.dtype), v).transpose(1, 2).contiguous()


def gencraft_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The registered attention function: the previous implementation, or gencraft's eager
    computation when an attached plug-in extends keys/values or normalises."""
    plugins = getattr(module, _PLUGINS, None)
    setattr(module, _CALLS, getattr(module, _CALLS, 0) + 1)
    if not plugins:
        return _original_fn(module)(module, query, key, value, attention_mask, **kwargs)
    call = AttentionCall(module, getattr(module, _SITE), query, key, value, attention_mask, kwargs)
    live = [p for p in plugins if p.active(call)]
    if not live:
        return _original_fn(module)(module, query, key, value, attention_mask, **kwargs)
    original = original_implementation(module)
    if original not in READABLE:
        raise GencraftError(
            f"attention implementation {original!r} cannot be read or changed by gencraft's "
            "plug-ins; load the model with attn_implementation='sdpa' or 'eager'"
        )
    observers = [p for p in live if p.observes]
    if observers:
        probs = _probs(module, query, key, attention_mask, kwargs, None, call)
        for p in observers:
            p.observe(probs, call)
    extras = [e for e in (p.extend(call) for p in live) if e is not None]
    normalizers = [p for p in live if p.normalizes]
    if not extras and not normalizers:
        return _original_fn(module)(module, query, key, value, attention_mask, **kwargs)
    _check_extras(extras, key, call)
    n_extra = sum(e.key.shape[-2] for e in extras)
    extra_allowed = None
    if extras:
        extra_allowed = _extra_allowed(extras, query)
        key = torch.cat([*(e.key for e in extras), key], dim=-2)
        value = torch.cat([*(e.value for e in extras), value], dim=-2)
    probs = _probs(
        module,
        query,
        key,
        attention_mask,
        kwargs,
        normalizers[0] if normalizers else None,
        call,
        extra_allowed,
        n_extra,
    )
    return _weighted(module, probs, value, kwargs), probs


def _check_extras(extras: list[Any], key: torch.Tensor, call: AttentionCall) -> None:
    """Extra key/value columns must be [B, n_kv, P, d] with the site's B, n_kv and d."""
    want = (key.shape[0], key.shape[1], key.shape[3])
    for e in extras:
        for name, t in (("key", e.key), ("value", e.value)):
            if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != want:
                raise GencraftError(
                    f"extra {name} columns at {call.site.name} must be [B, n_kv, P, d] = "
                    f"[{want[0]}, {want[1]}, P, {want[2]}], got {list(t.shape)}"
                )


def _extra_allowed(extras: list[Any], query: torch.Tensor) -> torch.Tensor:
    """Which query may attend to which extra column: [B or 1, heads or 1, T, sum P] bool,
    each plug-in's ``allowed`` (all, when it gives none) broadcast to one shape."""
    t = query.shape[2]
    parts = []
    for e in extras:
        a = e.allowed
        if a is None:
            a = torch.ones(1, t, e.key.shape[-2], dtype=torch.bool, device=query.device)
        parts.append(a[:, None] if a.dim() == 3 else a)
    if len(parts) > 1:
        b = max(p.shape[0] for p in parts)
        n = max(p.shape[1] for p in parts)
        parts = [p.expand(b, n, *p.shape[2:]) for p in parts]
    return torch.cat(parts, dim=-1)


def _mask(*args: Any, config: Any = None, **kwargs: Any) -> Any:
    """The mask of the model's previous implementation (recorded on its config)."""
    original = getattr(config, ORIGINAL, None) or "sdpa"
    return ALL_MASK_ATTENTION_FUNCTIONS[original](*args, config=config, **kwargs)


# registered once, for every model and method
AttentionInterface.register(IMPL, gencraft_attention)
AttentionMaskInterface.register(IMPL, _mask)
