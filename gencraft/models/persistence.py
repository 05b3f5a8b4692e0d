"""The file layer under :class:`gencraft.models.method.MethodModel` (the one save/load of
every method model), with one error type for a damaged or foreign directory
(:class:`~gencraft.errors.GencraftError` naming the file).

Layout of a saved directory: a config JSON (the method's settings plus ``base_name_or_path``,
``base_saved``), a safetensors file (the method's tensors) and, when the base was trained or
has no loadable name, ``base/`` written by the base's own ``save_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from gencraft.errors import ConfigError, GencraftError


def save_head(
    directory: str | Path,
    *,
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    base: nn.Module,
    save_base: bool,
    config_name: str,
    weights_name: str,
) -> Path:
    """Write ``config`` (with ``base_saved``), ``tensors`` and, if ``save_base``, ``base/``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / config_name).write_text(json.dumps({**config, "base_saved": bool(save_base)}, indent=2))
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(d / weights_name))
    if save_base:
        from gencraft.progress import hf_bars_off

        with hf_bars_off():
            base.save_pretrained(d / "base")
    return d


def read_head(
    directory: str | Path, *, config_name: str, weights_name: str, what: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, tensors) of a saved head; a clear error when ``directory`` is not one."""
    d = Path(directory)
    if not (d / config_name).is_file() or not (d / weights_name).is_file():
        raise GencraftError(
            f"{d} is not a saved {what} (expected {config_name} and {weights_name})"
        )
    try:
        config = json.loads((d / config_name).read_text())
    except json.JSONDecodeError as err:
        raise GencraftError(f"{d / config_name} is not valid JSON ({err.msg})") from None
    try:
        tensors = load_file(str(d / weights_name))
    except Exception as err:
        raise GencraftError(
            f"{d / weights_name} is damaged or truncated ({str(err).splitlines()[0]})"
        ) from None
    return config, tensors


def load_saved_model(directory: str | Path) -> nn.Module:
    """A ``transformers`` model saved in ``directory`` by ``save_pretrained`` (no tokenizer
    needed), with the auto class of the task its config says, in eval mode."""
    from transformers import AutoConfig

    from gencraft.models.registry import _AUTO_CLASSES, infer_task

    config = AutoConfig.from_pretrained(directory)
    return _AUTO_CLASSES[infer_task(config)].from_pretrained(directory).eval()


def load_base(
    directory: str | Path,
    config: dict[str, Any],
    task: str,
    base_model: nn.Module | None = None,
    **load_kw: Any,
) -> nn.Module:
    """The base of a saved head: ``base_model`` if given, else ``directory/base``, else
    :func:`gencraft.models.load_model` on the recorded ``base_name_or_path``."""
    if base_model is not None and not isinstance(base_model, str):
        return base_model
    from gencraft.models.registry import _AUTO_CLASSES, load_model

    d = Path(directory)
    if isinstance(base_model, str):  # another base than the recorded one (--base)
        return load_model(base_model, task=task, **load_kw)[0]
    if config.get("base_saved"):
        return _AUTO_CLASSES[task].from_pretrained(d / "base").eval()
    if config.get("base_name_or_path"):
        return load_model(config["base_name_or_path"], task=task, **load_kw)[0]
    raise GencraftError(f"{d} records no base model; pass base_model=")


def check_json_files(directory: Path) -> None:
    """A model directory's JSON files all parse (a truncated ``config.json`` is named here,
    not deep inside ``transformers``)."""
    for f in sorted(directory.glob("*.json")):
        try:
            json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            why = getattr(err, "msg", "not text")
            raise ConfigError(
                f"{f} is damaged or truncated (not valid JSON: {why}); train the run again "
                "or copy the file back"
            ) from None
