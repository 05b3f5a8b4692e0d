"""Package exports imported on first use (PEP 562), so that ``import gencraft.prefix.config``
or ``gencraft --help`` does not pay for torch and transformers.

A package's ``__init__`` lists where each public name lives::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {
        "gencraft.prefix.config": ("PrefixConfig",),
        "gencraft.prefix.model": ("PrefixModel", "sparse_attention"),
    })

``from gencraft.prefix import PrefixModel`` then imports ``gencraft.prefix.model`` at that
moment, and the name is cached in the package like an eager import.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class _LazyPackage(types.ModuleType):
    """A package whose exports load on first use. The import system binds each loaded
    submodule to its package's attribute of the same name; where an export has that name
    (``gencraft.pointer.evaluate`` the function, in ``evaluate.py``), the export wins, as
    it did under an eager ``from .evaluate import evaluate``."""

    def __setattr__(self, name: str, value: Any) -> None:
        where = self.__dict__.get("_lazy_where", {})
        if isinstance(value, types.ModuleType) and where.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` from ``{module: names}``."""
    where = {name: module for module, names in exports.items() for name in names}
    module = sys.modules[package]
    module.__class__ = _LazyPackage
    module._lazy_where = where

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain lookup
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) - {"_lazy_where"} | set(where))

    return __getattr__, __dir__, sorted(where)
