"""The three ways ``gencraft prefix train`` trains a base: prefix-tuning (a
:class:`~gencraft.prefix.PrefixModel`), the same through peft's ``PrefixTuning`` (same start),
or full fine-tuning (with :func:`~gencraft.prefix.sparse_attention` for a sparse normaliser:
the paper's control rows); and how each is saved in, and rebuilt from, a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from gencraft.errors import ConfigError
from gencraft.extras import require
from gencraft.models.caches import RowStateGeneration
from gencraft.models.introspect import is_encoder_decoder
from gencraft.models.persistence import load_saved_model
from gencraft.prefix.config import PrefixConfig, PrefixTrainConfig
from gencraft.training import LoadedRun, save_run, settings_of


def build_model(
    base: nn.Module, tokenizer: Any, prefix: PrefixConfig, method: str
) -> tuple[nn.Module, Any]:
    """(model to train, handle): a PrefixModel, or the base itself for fine-tuning (with
    :func:`~gencraft.prefix.sparse_attention` when the normaliser is not softmax)."""
    from gencraft.prefix.model import PrefixModel, sparse_attention

    if method == "prefix":
        return PrefixModel(base, prefix, tokenizer=tokenizer), None
    if method == "peft":
        return peft_prefix_model(base, prefix), None
    for p in base.parameters():
        p.requires_grad_(True)
    handle = sparse_attention(base, prefix) if prefix.normalizer != "softmax" else None
    return base, handle


def peft_prefix_model(base: nn.Module, prefix: PrefixConfig) -> nn.Module:
    """peft's prefix-tuning of ``base`` starting from the prefixes a dense ``PrefixModel``
    with the same settings starts from (so the two train alike); decoder-only models."""
    peft = require("peft", "peft", "peft's prefix-tuning")
    PrefixTuningConfig, TaskType, get_peft_model = (
        peft.PrefixTuningConfig,
        peft.TaskType,
        peft.get_peft_model,
    )
    from gencraft.prefix.model import PrefixModel

    if is_encoder_decoder(base) or prefix.blocking or prefix.normalizer != "softmax":
        raise ConfigError("--method peft is dense prefix-tuning of a causal LM")
    start = PrefixModel(base, prefix)
    weights = {k: v.detach().clone() for k, v in start.prefix["decoder"].state_dict().items()}
    start.remove()
    model = get_peft_model(
        base,
        PrefixTuningConfig(
            task_type=TaskType.CAUSAL_LM,
            num_virtual_tokens=prefix.num_virtual_tokens,
            prefix_projection=prefix.prefix_projection,
            encoder_hidden_size=prefix.encoder_hidden_size,
        ),
    )
    model.prompt_encoder["default"].load_state_dict(weights)
    return model


def save_trained(
    model: nn.Module, directory: Path, cfg: PrefixTrainConfig, prefix: Any, tokenizer: Any
) -> None:
    """One model directory of the run (:func:`gencraft.training.save_run`): the prefixes
    (a PrefixModel; peft's saved as the PrefixModel it equals) or the whole fine-tuned base."""
    from gencraft.prefix.model import PrefixModel

    model = getattr(model, "module", model)
    settings = {"train": settings_of(cfg), "prefix": prefix.to_dict()}
    if hasattr(model, "peft_config"):
        as_prefix = PrefixModel.from_peft(model)
        save_run(directory, as_prefix, tokenizer, settings, base_name_or_path=cfg.model)
        as_prefix.remove()
    elif isinstance(model, PrefixModel):
        save_run(directory, model, tokenizer, settings, base_name_or_path=cfg.model)
    else:
        save_run(directory, model, tokenizer, settings)


def rebuild_finetuned(directory: Path, settings: dict[str, Any]) -> LoadedRun | None:
    """:func:`~gencraft.training.load_run`'s ``build`` for this package: a fine-tuned base
    gets its attention normaliser back, under TruncSA as a
    :class:`~gencraft.models.caches.RowStateGeneration` (None for a prefix run, which loads as
    a method model)."""
    if settings.get("train", {}).get("method") != "finetune":
        return None
    from gencraft.models import load_model

    if (directory / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(directory)
    else:  # a run saved before the shared format: the named base's tokenizer
        tok = load_model(settings["train"]["model"])[1]
    saved = directory / "base" if (directory / "base").is_dir() else directory  # pre-format
    base = load_saved_model(saved)
    prefix = PrefixConfig(**settings["prefix"])
    model, _ = build_model(base, tok, prefix, "finetune")
    if prefix.normalizer == "truncsa":  # its generate carries the causal column mass
        model = RowStateGeneration(model)
    return LoadedRun(model.eval(), tok, settings)
