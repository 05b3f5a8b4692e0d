"""One run format for every trainer.

A run directory holds ``best/`` and ``last/`` (each a loadable model directory written by
:func:`save_run`), ``history.json`` (one row per validation), ``checkpoint/`` (resumption)
and ``train_summary.json``. A model directory holds the model's own files (a method model's
``method_config.json`` and ``method_model.safetensors``, or a ``transformers`` model), its
tokenizer, and ``run_settings.json``: the settings of the run that trained it.

:func:`load_run` takes a run directory (its ``best/`` by default) or a model directory, and
gives back the model, its tokenizer and the run settings, the same way for every method;
every ``eval``, ``generate`` and ``analyze`` command loads through it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from gencraft.errors import ConfigError

RUN_SETTINGS = "run_settings.json"
#: settings files of model directories saved before the shared format (still read)
LEGACY_SETTINGS = (
    "gencraft_nar_run.json",
    "gencraft_prefix_run.json",
    "gencraft_recurrence_run.json",
    "train_config.json",  # FAME's
)


class LoadedRun(NamedTuple):
    """What :func:`load_run` gives: ``model, tokenizer, settings = load_run(d)``."""

    model: nn.Module
    tokenizer: Any
    settings: dict[str, Any]


def save_run(
    directory: str | Path,
    model: nn.Module,
    tokenizer: Any = None,
    settings: dict[str, Any] | None = None,
    **save_kw: Any,
) -> Path:
    """Write one model directory of a run (``best/`` or ``last/``): ``model.save_pretrained``
    (``save_kw`` passed on), the tokenizer, and ``settings`` as ``run_settings.json``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, **save_kw)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    (d / RUN_SETTINGS).write_text(json.dumps(settings or {}, indent=2, default=str))
    return d


def _is_model_directory(d: Path) -> bool:
    from gencraft.models.method import LEGACY_CONFIGS, METHOD_CONFIG

    names = (RUN_SETTINGS, *LEGACY_SETTINGS[:3], METHOD_CONFIG, *LEGACY_CONFIGS, "config.json")
    return any((d / name).is_file() for name in names)


def model_directory(directory: str | Path, which: str = "best") -> Path:
    """The model directory of a run directory (its ``which``: best or last), or ``directory``
    itself when it is one."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(f"{d} does not exist (expected a trained run directory)")
    if not _is_model_directory(d) and (d / which).is_dir():
        d = d / which
    if not _is_model_directory(d):
        raise ConfigError(f"{d} is not a trained run (no saved model, and no {which}/ holding one)")
    return d


def read_settings(directory: str | Path) -> dict[str, Any]:
    """The run settings beside a saved model (``run_settings.json`` or a pre-format file;
    empty for a model saved outside a run)."""
    d = Path(directory)
    path = next((d / n for n in (RUN_SETTINGS, *LEGACY_SETTINGS) if (d / n).is_file()), None)
    if path is None:
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err.msg})") from None


def load_run(
    directory: str | Path,
    *,
    which: str = "best",
    base: nn.Module | None = None,
    build: Callable[[Path, dict[str, Any]], LoadedRun | None] | None = None,
    **load_kw: Any,
) -> LoadedRun:
    """(model in eval mode, tokenizer, run settings) of a run directory or model directory.

    The model is ``build(directory, settings)`` when that gives one (a method's own rebuild,
    e.g. a fine-tuned base with a plug-in), else the method model its ``method_config.json``
    names (:func:`load_method`, on ``base`` when given), else the ``transformers`` model
    saved there. The tokenizer is the one saved beside it, else the base model's (by the
    recorded name; None for a model with a vocabulary of its own).
    """
    from gencraft.models.method import LEGACY_CONFIGS, METHOD_CONFIG, load_method

    d = model_directory(directory, which)
    settings = read_settings(d)
    if build is not None:
        built = build(d, settings)
        if built is not None:
            return built
    has_method = (d / METHOD_CONFIG).is_file() or any((d / f).is_file() for f in LEGACY_CONFIGS)
    if not has_method:  # a transformers model (e.g. a fine-tuned baseline) and its tokenizer
        from gencraft.models import load_model

        model, tokenizer = load_model(str(d), **load_kw)
        return LoadedRun(model.eval(), tokenizer, settings)
    model = load_method(d, base, **load_kw)
    tokenizer = model.use_tokenizer(_tokenizer(d, model, settings))
    return LoadedRun(model.eval(), tokenizer, settings)


def _tokenizer(d: Path, model: nn.Module, settings: dict[str, Any]) -> Any:
    if (d / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(d)
    name = getattr(model, "base_name_or_path", None) or settings.get("train", {}).get("model")
    if not name:  # a model with its own vocabulary (the pointer LSTM's words)
        return None
    from gencraft.models import load_model

    return load_model(name)[1]
