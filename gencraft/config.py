"""Helpers for config dataclasses: every method's settings are dataclasses whose fields carry
their help text (``option``), so that defaults and help live in one place and CLI flags are
generated from them (:mod:`gencraft.cli.flags`); validation raises :class:`ConfigError`."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from gencraft.errors import ConfigError

#: ``option(REQUIRED, ...)``: a field without a default (a required flag)
REQUIRED: Any = object()


def option(
    default: Any,
    help: str,
    *,
    positional: bool = False,
    aliases: tuple[str, ...] = (),
    repeat: bool = False,
    **kwargs: Any,
) -> Any:
    """A dataclass field with its help text (the CLI flag's). ``positional``: an argument
    without ``--``; ``aliases``: old spellings the CLI still accepts, unlisted; ``repeat``: a
    list given as ``--x a --x b``."""
    meta: dict[str, Any] = {"help": help}
    if positional:
        meta["positional"] = True
    if aliases:
        meta["aliases"] = tuple(aliases)
    if repeat:
        meta["repeat"] = True
    if default is REQUIRED:
        return field(metadata=meta, **kwargs)
    if isinstance(default, (list, dict, set)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=meta, **kwargs)
    return field(default=default, metadata=meta, **kwargs)


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def field_options() -> tuple[Any, Any]:
    """The ``source_field`` and ``target_field`` of a training config whose task may be a
    path (one definition for every method's flags)."""
    return (
        option("source", "with --task PATH: the field holding the input"),
        option("target", "with --task PATH: the field holding the reference (text or a list)"),
    )


def positive(obj: Any, *names: str, allow_none: bool = False) -> None:
    """Each named integer field of ``obj`` is >= 1 (or None when ``allow_none``)."""
    for name in names:
        v = getattr(obj, name)
        if v is None and allow_none:
            continue
        check(v is not None and v >= 1, f"{name} must be >= 1, got {v}")


def check_cad_alpha(alpha: float | None, name: str = "--cad-alpha") -> None:
    """CAD's weight A: None (off) or a finite number >= 0 (one rule for every entry that
    takes it; ``inf`` would turn every score into nan)."""
    import math

    check(
        alpha is None or (math.isfinite(alpha) and alpha >= 0),
        f"{name} takes a finite weight A >= 0, got {alpha}",
    )
