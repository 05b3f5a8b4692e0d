"""Optional dependencies: the core needs only torch, transformers, accelerate, safetensors,
tokenizers, numpy and tqdm; everything else comes with an extra of ``gencraft[...]``.

:func:`require` imports an optional module or raises :class:`MissingExtraError` with the one
``pip install`` line that adds it, e.g.::

    plt = require("matplotlib.pyplot", "plots", "drawing PNGs")
"""

from __future__ import annotations

import importlib
from types import ModuleType

from gencraft.errors import GencraftError

#: the extras of pyproject.toml and what each adds (kept in step by tests/test_packaging.py)
EXTRAS: dict[str, tuple[str, ...]] = {
    "metrics": ("rouge_score", "sacrebleu", "nltk", "pycocoevalcap", "scipy"),
    "bertscore": ("bert_score", "pandas"),
    "plots": ("matplotlib",),
    "peft": ("peft",),
    "sparse": ("entmax",),
    "gguf": ("gguf",),
    "mbr": ("fastchrf",),
    "hub-data": ("datasets",),
}


class MissingExtraError(GencraftError, ImportError):
    """An optional dependency is not installed; the message names the pip command."""


def install_line(extra: str) -> str:
    return f"pip install 'gencraft[{extra}]'"


def require(module: str, extra: str, purpose: str | None = None) -> ModuleType:
    """``import module``, or :class:`MissingExtraError` naming ``pip install 'gencraft[extra]'``.

    ``purpose`` says what needed it ("BLEU", "drawing PNGs"...)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        missing = getattr(e, "name", None) or top
        what = f"{purpose} needs" if purpose else "this needs"
        raise MissingExtraError(
            f"{what} the optional package {missing!r} (not installed): {install_line(extra)}"
        ) from None
