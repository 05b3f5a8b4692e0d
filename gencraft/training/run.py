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
from gencraft.models.persistence import check_json_files

RUN_SETTINGS = "run_settings.json"
#: settings files of model directories saved before the shared format (still read)
LEGACY_SETTINGS = (
    "gencraft_nar_run.json",
    "gencraft_prefix_run.json",
    "gencraft_recurrence_run.json",
    "train_config.json",  # FAME's
)


#: the commands of each method's group that take a trained run (kept in step with the CLI by
#: tests/cli/test_bad_input.py), for the message that sends a run to the right one
RUN_COMMANDS: dict[str, tuple[str, ...]] = {
    "focus": ("generate", "eval"),
    "pointer": ("eval", "analyze"),
    "search": ("beam --classifier",),
    "prefix": ("generate", "eval", "analyze"),
    "recurrence": ("eval",),
    "nar": ("generate", "eval"),
}


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
    from gencraft.progress import hf_bars_off

    with hf_bars_off():  # transformers' "Writing model shards" bars
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


def run_method(directory: str | Path) -> str | None:
    """The method whose run ``directory`` (a model directory) is: the one its
    ``method_config.json`` or pre-format config names, else the method whose settings its
    ``run_settings.json`` holds (a fine-tuned control); None for a plain model."""
    from gencraft.models.method import LEGACY_CONFIGS, METHOD_CONFIG

    d = Path(directory)
    if (d / METHOD_CONFIG).is_file():
        try:
            return json.loads((d / METHOD_CONFIG).read_text()).get("method")
        except json.JSONDecodeError:
            return None  # reported as damaged by the loader
    legacy = [m for f, m in LEGACY_CONFIGS.items() if (d / f).is_file()]
    if legacy:
        return legacy[0]
    try:
        settings = read_settings(d)
    except ConfigError:
        return None
    return next((m for m in RUN_COMMANDS if m in settings), None)


def check_run_method(directory: Path, method: str, command: str) -> None:
    """Refuse, in one line naming the right command, a run of another method than ``method``
    given to ``gencraft METHOD COMMAND``."""
    found = run_method(directory)
    if found is None or found == method:
        return
    verb = command if command in RUN_COMMANDS.get(found, ()) else None
    use = f"gencraft {found} {verb}" if verb else f"gencraft {found} --help"
    raise ConfigError(
        f"{directory} is a {found} run, not a {method} one: `gencraft {method} {command}` "
        f"cannot use it; try `{use}`"
    )


def load_run(
    directory: str | Path,
    *,
    method: str | None = None,
    command: str = "",
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

    With ``method`` (and the ``command`` of its group that loads the run), a run of another
    method is refused in one line that names the command for it.
    """
    from gencraft.models.method import LEGACY_CONFIGS, METHOD_CONFIG, load_method

    d = model_directory(directory, which)
    check_json_files(d)
    if method is not None:
        check_run_method(d, method, command)
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
