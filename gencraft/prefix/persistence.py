"""Loading a PrefixModel: saved prefixes onto their base (checked to be the base they were
trained on), and a peft prefix-tuning adapter copied into gencraft's layout (checked against
peft's own cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.errors import ConfigError, GencraftError
from gencraft.extras import require
from gencraft.prefix.config import PrefixConfig


def _load_base(
    directory: str | Path, base: str | None, recorded: str, placement: dict[str, Any]
) -> tuple[nn.Module, Any]:
    """(model, tokenizer) of the base named ``base``, else of the ``recorded`` name, saying how
    to name another when the recorded one does not load here."""
    from gencraft.errors import ModelLoadError
    from gencraft.models import load_model

    name = base or recorded
    if not name:
        raise GencraftError(f"{directory} records no base model; pass base=")
    try:
        return load_model(name, **placement)
    except ModelLoadError as err:
        if base:
            raise
        raise ModelLoadError(
            f"the base these prefixes were trained on, {name!r}, does not load from "
            f"here ({err}); name it with --base PATH (Python: base=)"
        ) from None


def load_prefix_model(
    cls: type,
    directory: str | Path,
    base: nn.Module | str | None = None,
    *,
    tokenizer: Any = None,
    segmenter: Any = None,
    **overrides: Any,
) -> Any:
    """``PrefixModel.from_pretrained`` (its docstring), ``cls`` the class to build."""
    from gencraft.models.method import place

    placement = {k: overrides.pop(k) for k in ("device", "dtype") if k in overrides}
    saved, tensors = cls.read_saved(Path(directory))
    settings = dict(saved["prefix"])
    if settings.get("segmenter") == "callable" and segmenter is None:
        raise ConfigError(f"{directory} was trained with a callable segmenter; pass segmenter=")
    if segmenter is not None:
        settings["segmenter"] = segmenter
    settings.update(overrides)
    try:
        config = PrefixConfig(**settings)
    except TypeError as err:
        raise GencraftError(f"{directory}: the saved prefix settings: {err}") from None
    recorded = saved.get("base_name_or_path") or ""
    if base is None or isinstance(base, str):
        base, tok = _load_base(directory, base, recorded, placement)
        tokenizer = tokenizer or tok
    model = cls(base, config, tokenizer=tokenizer)
    mine, theirs = model._signature(), saved.get("base", {})
    if mine != theirs:
        here = getattr(model.base, "gencraft_name", None) or model.base.config._name_or_path
        raise GencraftError(
            f"the prefixes in {directory} were trained on {recorded or '?'} "
            f"({json.dumps(theirs)}), not on {here or type(model.base).__name__} "
            f"({json.dumps(mine)})"
        )
    missing, unexpected = model.prefix.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise GencraftError(
            f"the weights in {directory} do not match their config: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}"
        )
    return place(model, **placement)


def prefix_model_from_peft(cls: type, peft_model: nn.Module, adapter: str | None = None) -> Any:
    """``PrefixModel.from_peft`` (its docstring), ``cls`` the class to build."""
    PeftType = require("peft", "peft", "from_peft").PeftType
    adapter = adapter or getattr(peft_model, "active_adapter", "default")
    pcfg = peft_model.peft_config[adapter]
    if pcfg.peft_type != PeftType.PREFIX_TUNING:
        raise ConfigError(f"adapter {adapter!r} is {pcfg.peft_type}, not prefix tuning")
    if pcfg.prefix_projection and pcfg.inference_mode:
        raise ConfigError(
            "a peft prefix with prefix_projection in inference mode stores no MLP; load it "
            "with inference_mode=False"
        )
    config = PrefixConfig(
        num_virtual_tokens=pcfg.num_virtual_tokens,
        prefix_projection=bool(pcfg.prefix_projection),
        encoder_hidden_size=pcfg.encoder_hidden_size if pcfg.prefix_projection else None,
        encoder_prefix=False,
    )
    model = cls(peft_model.get_base_model(), config)
    target = model.prefix["decoder"]
    state = dict(peft_model.prompt_encoder[adapter].state_dict())
    layers = target.shape[1]
    if pcfg.num_transformer_submodules == 2:
        # peft's seq2seq layout: the chunks are doubled and split in fours per layer, so
        # layer l's self-attention key/value are chunks 4l and 4l + 1 (mod 2L)
        order = [(4 * i + j) % (2 * layers) for i in range(layers) for j in (0, 1)]
        name = "transform.2" if config.prefix_projection else "embedding"
        key = f"{name}.weight"
        w = state[key]
        chunks = (
            w.view(-1, 2 * layers, w.shape[-1] // (2 * layers)) if name == "embedding" else None
        )
        if name == "embedding":
            state[key] = chunks[:, order].reshape(w.shape)
        else:
            rows = w.view(2 * layers, -1, w.shape[-1])
            state[key] = rows[order].reshape(w.shape)
            b = state["transform.2.bias"].view(2 * layers, -1)
            state["transform.2.bias"] = b[order].reshape(-1)
    try:
        target.load_state_dict(state)
    except RuntimeError as err:
        raise GencraftError(f"the peft prefix does not fit this model: {err}") from None
    # check against peft's own cache (its layout is an implementation detail of peft)
    with torch.no_grad():
        theirs = peft_model.get_prompt(1)
        theirs = getattr(theirs, "self_attention_cache", theirs)
        for i, (k, v) in enumerate(target.layer_kv()):
            tk, tv = theirs.layers[i].keys, theirs.layers[i].values
            if not (torch.equal(tk.to(k), k) and torch.equal(tv.to(v), v)):
                raise GencraftError(
                    f"peft {getattr(peft_model, '__version__', '')} lays out prefix layer {i} "
                    "differently from what from_peft expects; please report this"
                )
    return model
