"""What gencraft needs to know about a model, asked in one place: layers, heads, sizes,
special ids, context size. Works on Hugging Face models and on gencraft's wrappers (anything
with a ``base`` model, such as ``FocusForConditionalGeneration`` or ``PointerSentinelHead``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError


def hf_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside ``model`` (``model`` itself, or its ``base``)."""
    seen = 0
    while not hasattr(model, "config") or not hasattr(model.config, "to_dict"):
        inner = getattr(model, "base", None)
        if inner is None or seen > 4:
            raise GencraftError(
                f"{type(model).__name__} is not a Hugging Face model and wraps none (no .base)"
            )
        model, seen = inner, seen + 1
    return model


def decoder_config(model: nn.Module) -> Any:
    """The config of the part that generates (the decoder of an encoder-decoder)."""
    cfg = hf_model(model).config
    if hasattr(cfg, "decoder") and getattr(cfg, "is_encoder_decoder", False):
        return cfg.decoder
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def is_encoder_decoder(model: nn.Module) -> bool:
    return bool(getattr(hf_model(model).config, "is_encoder_decoder", False))


def decoder_body(model: nn.Module) -> nn.Module | None:
    """The module a causal LM runs to get the hidden states its output layer reads: OPT's
    ``model.decoder`` (``OPTForCausalLM`` calls it directly), else the ``base_model``."""
    hf = hf_model(model)
    get = getattr(hf, "get_decoder", None)
    body = None
    if callable(get):
        try:
            body = get()
        except (AttributeError, NotImplementedError):
            body = None
    if not isinstance(body, nn.Module) or body is hf:
        body = getattr(hf, "base_model", None)
    return body


def is_causal_lm(model: nn.Module) -> bool:
    """A decoder-only language model: a ``transformers`` causal-LM class (or a decoder-flagged
    config) with an output layer; not an encoder-decoder, not a masked LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    hf = hf_model(model)
    if is_encoder_decoder(hf) or not hasattr(hf, "get_output_embeddings"):
        return False
    name = type(hf).__name__
    return name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) or bool(
        getattr(hf.config, "is_decoder", False)
    )


def _first(cfg: Any, *names: str) -> int | None:
    for name in names:
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


@dataclass(frozen=True)
class ModelShape:
    """Sizes of the generating stack: ``layers``, ``hidden``, attention ``heads``, key/value
    heads ``kv_heads`` (GQA), ``head_dim``, ``vocab`` and ``context`` (positions; None when
    unbounded, e.g. relative positions)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int | None


def model_shape(model: nn.Module) -> ModelShape:
    """The :class:`ModelShape` of ``model``'s generating stack."""
    cfg = decoder_config(model)
    # an encoder-decoder's own config names its decoder's sizes (the generic names may be
    # its encoder's: BART's num_hidden_layers, T5's num_layers); its text config is no
    # help, as transformers releases build it differently
    own = hf_model(model).config if is_encoder_decoder(model) else None
    layers = _first(own, "num_decoder_layers", "decoder_layers") or _first(
        cfg, "num_hidden_layers", "n_layer"
    )
    heads = _first(own, "decoder_attention_heads") or _first(
        cfg, "num_attention_heads", "num_heads", "n_head"
    )
    hidden = _first(cfg, "hidden_size", "d_model", "n_embd")
    if layers is None or hidden is None or heads is None:
        raise GencraftError(f"cannot read layers/hidden size/heads from {type(cfg).__name__}")
    kv = _first(cfg, "num_key_value_heads") or heads
    head_dim = _first(cfg, "head_dim", "d_kv") or hidden // heads
    out = hf_model(model).get_output_embeddings()
    vocab = int(out.weight.shape[0]) if out is not None else int(cfg.vocab_size)
    return ModelShape(layers, hidden, heads, kv, head_dim, vocab, context_size(model))


def check_generator(model: nn.Module, what: str) -> None:
    """Refuse a model that cannot generate (an encoder or a masked LM) for ``what``, which
    samples continuations: a causal LM or an encoder-decoder is needed."""
    if is_causal_lm(model) or is_encoder_decoder(model):
        return
    hf = hf_model(model)
    raise GencraftError(
        f"{what} needs a model that generates (a causal LM or an encoder-decoder); "
        f"{model_name(model) or type(hf).__name__} is a {type(hf).__name__}, an encoder"
    )


def model_name(model: nn.Module) -> str | None:
    """The name ``model`` was loaded by (:func:`gencraft.models.load_model`: a registered name,
    path or hub id), else its config's ``_name_or_path``; None when neither is known."""
    hf = hf_model(model)
    name = getattr(hf, "gencraft_name", None) or getattr(hf.config, "_name_or_path", None)
    return str(name) if name else None


def same_model_name(a: str | None, b: str | None) -> bool:
    """Whether two recorded model names name the same model: registered names and hub ids
    as written, local paths resolved (``own/x`` and ``/abs/own/x`` are one folder)."""
    if not a or not b:
        return False
    from gencraft.models.registry import canonical_name

    return canonical_name(a) == canonical_name(b)


def fingerprint(model: nn.Module) -> str:
    """A short hash of ``model``'s architecture config (names and paths left out) and its
    first 64 input-embedding rows: the same model wherever its folder lies, a different one
    when its weights differ."""
    import hashlib
    import json

    hf = hf_model(model)
    config = {
        k: v
        for k, v in hf.config.to_dict().items()
        if not k.startswith("_") and k not in ("transformers_version", "torch_dtype", "dtype")
    }
    digest = hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode())
    emb = hf.get_input_embeddings().weight[:64].detach().float().cpu()
    digest.update(emb.mul(1e4).round().to(torch.int64).numpy().tobytes())
    return digest.hexdigest()[:16]


def weights_digest(model: nn.Module) -> str:
    """A hash of every parameter and buffer of ``model`` (names, dtypes, shapes and bytes): the
    identity of the weights a run's outputs came from, unlike :func:`fingerprint`, which reads
    only the first embedding rows. About a second for 135M float32 parameters."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def context_size(model: nn.Module) -> int | None:
    """Positions the generating stack can take (None: no absolute limit)."""
    return _first(
        decoder_config(model), "max_position_embeddings", "n_positions", "max_target_positions"
    )


def encoder_context_size(model: nn.Module) -> int | None:
    """Positions the encoder of an encoder-decoder (or a causal LM) can take."""
    cfg = hf_model(model).config
    enc = getattr(cfg, "encoder", cfg)
    return _first(enc, "max_position_embeddings", "n_positions", "max_source_positions")


def check_token_budget(
    model: nn.Module,
    source: int,
    target: int,
    flags: tuple[str, str] = ("--max-source-tokens", "--max-target-tokens"),
    reserve: int = 0,
) -> int:
    """The source budget the model's positions hold, or a one-line refusal naming the flag.

    An encoder-decoder's source is checked against its encoder, its target against its
    decoder: a budget past either is refused. A causal LM reads ``reserve`` (a prompt
    template's tokens) + source + target in one sequence: a source budget that leaves no room
    for the target is refused, one that leaves too little is cut to fit, with a note. Models
    without an absolute limit (relative positions) keep ``source``."""
    import warnings

    from gencraft.errors import ConfigError

    name = model_name(model) or type(hf_model(model)).__name__
    if is_encoder_decoder(model):
        enc, dec = encoder_context_size(model), context_size(model)
        if enc is not None and source > enc:
            raise ConfigError(
                f"{flags[0]} {source} exceeds the {enc} encoder positions of {name}; "
                f"use at most {enc}"
            )
        if dec is not None and target + 1 > dec:  # + the decoder's start token
            raise ConfigError(
                f"{flags[1]} {target} exceeds the {dec} decoder positions of {name} (with its "
                f"start token); use at most {dec - 1}"
            )
        return source
    ctx = context_size(model)
    if ctx is None or reserve + source + target <= ctx:
        return source
    room = ctx - reserve - target
    if room < 1 or source > ctx:
        raise ConfigError(
            f"{flags[0]} {source} + {flags[1]} {target} (+ {reserve} prompt tokens) exceed the "
            f"{ctx} positions of {name}; make them sum to at most {ctx - reserve}"
        )
    warnings.warn(
        f"{flags[0]} {source} cut to {room}: {name} holds {ctx} positions, {target} of them "
        f"for {flags[1]}" + (f" and {reserve} for the prompt" if reserve else ""),
        stacklevel=2,
    )
    return room


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def eos_ids(model: nn.Module, eos_token_id: int | list[int] | None = None) -> list[int]:
    """The end-of-sequence ids: ``eos_token_id`` if given, else the model's generation config,
    else its config."""
    if eos_token_id is None:
        m = hf_model(model)
        gc = getattr(m, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(m.config, "eos_token_id", None)
    if eos_token_id is None:
        raise GencraftError("no eos_token_id given and the model's config defines none")
    ids = _ids(eos_token_id)
    if not ids:
        raise GencraftError("eos_token_id is an empty list")
    return ids


def target_eos_id(model: nn.Module, tokenizer: Any) -> int:
    """The EOS a method appends to training targets: the generation config's first EOS id
    (what generation stops on), even where the tokenizer names another one, which is said
    once (a GGUF conversion under some transformers releases gave SmolLM2's tokenizer
    ``<|im_start|>`` as EOS). Without one in the configs: the tokenizer's EOS, else SEP."""
    import warnings

    own = getattr(tokenizer, "eos_token_id", None)
    if own is None:
        own = getattr(tokenizer, "sep_token_id", None)
    try:
        eos = eos_ids(model)[0]
    except GencraftError:
        if own is None:
            raise GencraftError(
                "neither the model's configs nor its tokenizer define an EOS"
            ) from None
        return int(own)
    if own is not None and own != eos:
        name = model_name(model) or type(hf_model(model)).__name__
        warnings.warn(
            f"{name}: the tokenizer's EOS is id {own}, the generation config's is {eos}; "
            f"training targets end with {eos}, the id generation stops on",
            stacklevel=2,
        )
    return eos


def decoder_start_id(model: nn.Module) -> int:
    """The first decoder input of an encoder-decoder."""
    m = hf_model(model)
    for cfg in (getattr(m, "generation_config", None), m.config):
        v = getattr(cfg, "decoder_start_token_id", None)
        if v is not None:
            return int(v)
    dec = getattr(m.config, "decoder", None)
    v = getattr(dec, "bos_token_id", None) if dec is not None else None
    if v is None:
        raise GencraftError(
            "this encoder-decoder defines no decoder_start_token_id; set "
            "model.generation_config.decoder_start_token_id"
        )
    return int(v)


def special_ids(model: nn.Module) -> set[int]:
    """EOS, PAD and decoder-start ids of ``model`` (generation config and config)."""
    m = hf_model(model)
    ids: set[int] = set()
    for src in (getattr(m, "generation_config", None), m.config):
        for name in ("eos_token_id", "pad_token_id", "decoder_start_token_id"):
            ids.update(_ids(getattr(src, name, None) if src is not None else None))
    return ids


def pad_id(model: nn.Module, tokenizer: Any = None) -> int:
    """The padding id: the tokenizer's, else the model's, else its first EOS."""
    if tokenizer is not None and getattr(tokenizer, "pad_token_id", None) is not None:
        return int(tokenizer.pad_token_id)
    m = hf_model(model)
    for src in (getattr(m, "generation_config", None), m.config):
        v = getattr(src, "pad_token_id", None) if src is not None else None
        if v is not None:
            return int(v)
    return eos_ids(m)[0]
