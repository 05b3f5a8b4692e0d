"""The one contract of a trained gencraft method model (peft's ``PeftModel`` idea):

* ``save_pretrained(dir)`` writes ``method_config.json`` (which method and class, its
  settings, how to get the base back) and ``method_model.safetensors`` (the method's own
  tensors), plus ``base/`` when the base was trained or cannot be reloaded by name;
* ``from_pretrained(dir, base=None)`` reads them back; the base comes from ``base``, else
  ``dir/base``, else the recorded ``base_name_or_path``;
* ``disable()`` / ``enable()`` switch the method off and on (``with model.disable(): ...``
  switches it back on at the end); off, the model gives its base model's outputs exactly;
* ``remove()`` detaches the method and gives back the untouched base model;
* ``method_config``: the method's settings dataclass.

A method model subclasses :class:`MethodModel` and supplies the hooks below (its settings,
its tensors, how to rebuild itself from them, how it switches off). Directories saved before
the shared format (each class's ``legacy_files``) still load.

:func:`load_method` loads any saved method model by the class its directory records.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.persistence import check_json_files, load_base, read_head, save_head

METHOD_CONFIG = "method_config.json"
METHOD_WEIGHTS = "method_model.safetensors"
FORMAT_VERSION = 1

#: every MethodModel subclass by class name (filled when its module is imported)
METHOD_CLASSES: dict[str, type[MethodModel]] = {}
#: config file of a pre-format save -> the method package that reads it
LEGACY_CONFIGS = {
    "focus_config.json": "focus",
    "pointer_head_config.json": "pointer",
    "pointer_config.json": "pointer",
    "prefix_config.json": "prefix",
    "recurrence_config.json": "recurrence",
    "classifier_config.json": "search",
}


class _Reenable:
    """What :meth:`MethodModel.disable` returns: used in a ``with``, the method is switched
    back on at the end."""

    def __init__(self, model: MethodModel) -> None:
        self.model = model

    def __enter__(self) -> MethodModel:
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self.model.enable()


class MethodModel(nn.Module):
    """Base class of every trained gencraft method model (see the module docstring).

    Subclasses set ``method`` (the package name) and implement :attr:`method_config`,
    :meth:`method_state_dict` and :meth:`from_method_payload`; a model that wraps a base
    also implements :meth:`_set_enabled` and :meth:`_detach` and keeps the base in
    ``self.base``.
    """

    method: ClassVar[str] = ""
    #: (config, weights) file names this class wrote before the shared format
    legacy_files: ClassVar[tuple[str, str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        METHOD_CLASSES[cls.__name__] = cls

    # ------------------------------------------------------------------ hooks
    @property
    def method_config(self) -> Any:
        """The method's settings (a dataclass)."""
        raise NotImplementedError

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors :meth:`save_pretrained` writes (never the base's)."""
        raise NotImplementedError

    def method_payload(self) -> dict[str, Any]:
        """The JSON settings :meth:`save_pretrained` writes beside the tensors."""
        return {"config": asdict(self.method_config)}

    @classmethod
    def from_method_payload(
        cls, payload: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, **kwargs: Any
    ) -> MethodModel:
        """Rebuild the model from what :meth:`save_pretrained` wrote, on ``base``."""
        raise NotImplementedError

    @classmethod
    def base_task(cls, payload: dict[str, Any]) -> str | None:
        """How the base is reloaded (a registry task), or None when there is no base."""
        return "causal-lm"

    def saves_base(self) -> bool:
        """Whether :meth:`save_pretrained` writes ``base/`` by default."""
        return False

    @property
    def base_model(self) -> nn.Module | None:
        """The wrapped Hugging Face model (None for a model that wraps none)."""
        return getattr(self, "base", None)

    def _set_enabled(self, on: bool) -> None:
        raise GencraftError(
            f"{type(self).__name__} wraps no base model whose outputs it could give back: it "
            "cannot be disabled"
        )

    def _detach(self) -> None:
        """Take the method's hooks and plug-ins off the base."""

    def use_tokenizer(self, tokenizer: Any) -> Any:
        """Called by :func:`gencraft.training.load_run` with the run's tokenizer; returns it
        (set up as this model needs it, e.g. padding side or special ids)."""
        return tokenizer

    def _freeze(self, base: nn.Module) -> None:
        """Stop gradients to ``base``; :meth:`remove` gives the flags back as they were."""
        if "_base_requires_grad" not in self.__dict__:
            self.__dict__["_base_requires_grad"] = {
                n: p.requires_grad for n, p in base.named_parameters()
            }
        base.requires_grad_(False)

    # ------------------------------------------------------------------ verbs
    @property
    def enabled(self) -> bool:
        return self.__dict__.get("_method_enabled", True)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._set_enabled(bool(on))
        self.__dict__["_method_enabled"] = bool(on)

    def disable(self) -> _Reenable:
        """Switch the method off: the model gives its base's outputs. In a ``with`` block
        the method is switched back on at the end."""
        self.enabled = False
        return _Reenable(self)

    def enable(self) -> MethodModel:
        self.enabled = True
        return self

    def remove(self) -> nn.Module:
        """Detach the method and return the untouched base model."""
        base = self.base_model
        if base is None:
            raise GencraftError(f"{type(self).__name__} wraps no base model to give back")
        self._detach()
        flags = self.__dict__.pop("_base_requires_grad", None)
        if flags is not None:
            for n, p in base.named_parameters():
                p.requires_grad_(flags.get(n, p.requires_grad))
        return base

    def save_pretrained(
        self,
        directory: str | Path,
        *,
        save_base: bool | None = None,
        base_name_or_path: str | None = None,
    ) -> Path:
        """Write ``method_config.json``, ``method_model.safetensors`` and, when ``save_base``
        (default: :meth:`saves_base`), the base under ``base/``. ``base_name_or_path``: the
        name the base is reloaded by (default: the one the model records)."""
        base = self.base_model
        keep_base = (self.saves_base() if save_base is None else save_base) and base is not None
        config = {
            "method": self.method,
            "class": type(self).__name__,
            "format": FORMAT_VERSION,
            **self.method_payload(),
        }
        if base_name_or_path:
            config["base_name_or_path"] = base_name_or_path
        if config.get("base_name_or_path"):  # a local path absolute: the run loads anywhere
            from gencraft.models.registry import canonical_name

            config["base_name_or_path"] = canonical_name(config["base_name_or_path"])
        return save_head(
            directory,
            config=config,
            tensors=self.method_state_dict(),
            base=base,
            save_base=keep_base,
            config_name=METHOD_CONFIG,
            weights_name=METHOD_WEIGHTS,
        )

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, base: nn.Module | None = None, **kwargs: Any
    ) -> MethodModel:
        """Load what :meth:`save_pretrained` wrote (or a pre-format save of this class). The
        base comes from ``base``, else ``directory/base``, else the recorded name
        (``kwargs`` go to :func:`gencraft.models.load_model` and the class)."""
        d = Path(directory)
        if "base_model" in kwargs:  # the argument's name before the shared contract
            base = kwargs.pop("base_model")
        payload, tensors = cls.read_saved(d)
        task = cls.base_task(payload)
        load_kw = {k: kwargs.pop(k) for k in ("device", "dtype", "seed") if k in kwargs}
        if task is not None:
            base = load_base(d, payload, task, base, **load_kw)
        try:
            model = cls.from_method_payload(payload, tensors, base, **kwargs)
        except (KeyError, TypeError) as err:
            raise GencraftError(
                f"{d}: the saved settings do not fit {cls.__name__} ({err})"
            ) from None
        return place(model, load_kw.get("device"), load_kw.get("dtype"))

    @classmethod
    def read_saved(cls, directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(settings, tensors) of a saved model of this class, in the shared format or this
        class's pre-format files; a clear error for anything else."""
        d = Path(directory)
        if (d / METHOD_CONFIG).is_file():
            payload, tensors = read_head(
                d, config_name=METHOD_CONFIG, weights_name=METHOD_WEIGHTS, what=cls.__name__
            )
            saved = payload.get("class")
            if saved != cls.__name__:
                raise GencraftError(
                    f"{d} holds a {saved} ({payload.get('method')}), not a {cls.__name__}; "
                    f"load it with gencraft.models.load_method({str(d)!r})"
                )
            return payload, tensors
        if cls.legacy_files and (d / cls.legacy_files[0]).is_file():
            config_name, weights_name = cls.legacy_files
            return read_head(
                d, config_name=config_name, weights_name=weights_name, what=cls.__name__
            )
        raise GencraftError(
            f"{d} is not a saved {cls.__name__} (expected {METHOD_CONFIG} and {METHOD_WEIGHTS})"
        )


def place(model: nn.Module, device: Any = None, dtype: Any = None) -> nn.Module:
    """``model`` moved to ``device`` and cast to ``dtype`` (a ``--dtype`` name or a
    ``torch.dtype``; ``auto``/None: as it is), both checked first."""
    if device is None and dtype is None:
        return model
    from gencraft.models.placement import check_placement

    dev, dt = check_placement(device, dtype)
    if dt is not None:
        model = model.to(dt)
    return model.to(dev) if device is not None else model


def load_method(directory: str | Path, base: nn.Module | None = None, **kwargs: Any) -> Any:
    """Any saved method model, by the class its ``method_config.json`` records (or the
    pre-format config file it holds)."""
    import json

    d = Path(directory)
    check_json_files(d)
    if (d / METHOD_CONFIG).is_file():
        try:
            saved = json.loads((d / METHOD_CONFIG).read_text())
        except json.JSONDecodeError as err:
            raise GencraftError(f"{d / METHOD_CONFIG} is not valid JSON ({err.msg})") from None
        package, name = saved.get("method"), saved.get("class")
    else:
        found = [f for f in LEGACY_CONFIGS if (d / f).is_file()]
        if not found:
            raise GencraftError(f"{d} holds no saved gencraft model (no {METHOD_CONFIG})")
        package, name = LEGACY_CONFIGS[found[0]], None
    methods = importlib.import_module(f"gencraft.{package}")
    for export in methods.__all__:  # registers the package's classes (its exports are lazy)
        getattr(methods, export)
    if name is None:  # a pre-format save: the class whose legacy config is there
        name = next(
            n
            for n, c in METHOD_CLASSES.items()
            if c.legacy_files and (d / c.legacy_files[0]).is_file()
        )
    if name not in METHOD_CLASSES:
        raise GencraftError(f"{d / METHOD_CONFIG} names an unknown model class {name!r}")
    try:
        return METHOD_CLASSES[name].from_pretrained(d, base, **kwargs)
    except GencraftError:
        raise
    except Exception as err:  # e.g. a truncated file read by transformers' own loader
        from gencraft.models.registry import damaged_weights

        damaged = damaged_weights(d)
        if damaged is None:
            raise
        raise GencraftError(
            f"{damaged} is damaged or truncated ({str(err).splitlines()[0]})"
        ) from None
