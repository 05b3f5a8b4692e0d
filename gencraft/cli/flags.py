"""CLI flags generated from config dataclasses, so that every default and help text lives in
one place (the dataclass) and every command validates its arguments the same way (the
dataclass's ``__post_init__``).

A field ``max_new_tokens: int = 64`` with ``metadata={"help": ...}`` becomes
``--max-new-tokens N`` (default 64); ``bool`` fields become ``--name`` / ``--no-name``;
``Literal[...]`` fields get ``choices``; ``X | None`` fields accept ``none``; tuples and lists
take several values. A field holding a dataclass (a method's ``fit: FitConfig``, made by
:func:`gencraft.training.fit_options`) is flattened: its fields become flags of the same
command, with the defaults of the field's own instance, minus the names in its metadata's
``hide`` (settings the method derives itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, get_args, get_origin

from gencraft.errors import GencraftError

_NONE = ("none", "None", "null")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(get_args(tp))
        return args, len(args) < len(get_args(tp))
    return tp, False


def _converter(tp: Any, optional: bool, name: str):
    def convert(text: str) -> Any:
        if optional and text in _NONE:
            return None
        try:
            if isinstance(tp, list):  # a union such as int | str: first that parses
                for t in tp:
                    try:
                        return t(text) if t is not str else text
                    except (TypeError, ValueError):
                        continue
                raise ValueError(text)
            return tp(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"--{name}: cannot read {text!r}") from None

    return convert


def add_dataclass_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    prefix: str = "",
) -> None:
    """Add one flag per field of dataclass ``cls`` (minus ``exclude``) to ``parser``;
    ``defaults`` overrides the dataclass's defaults for this command only."""
    hints = typing.get_type_hints(cls)
    skip = set(exclude)
    defaults = defaults or {}
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        nested = _nested(cls, f, hints)
        if nested is not None:
            inner_cls, inner, hidden = nested
            inner_defaults = {**_field_values(inner), **defaults}
            add_dataclass_arguments(
                parser, inner_cls, exclude=skip | hidden, defaults=inner_defaults, prefix=prefix
            )
            continue
        name = prefix + f.name.replace("_", "-")
        dest = f.name
        help_text = f.metadata.get("help", "")
        if f.name in defaults:
            default = defaults[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        tp, optional = _unwrap_optional(hints[f.name])
        shown = f"{help_text} (default: {default})" if help_text else f"default: {default}"
        if tp is bool:
            parser.add_argument(
                f"--{name}",
                dest=dest,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=help_text or None,
            )
            continue
        kw: dict[str, Any] = {"dest": dest, "default": default, "help": shown}
        origin = get_origin(tp)
        if origin is Literal:
            choices = list(get_args(tp))
            kw["choices"] = choices + ([None] if optional else [])
            kw["type"] = _converter(type(choices[0]), optional, name)
        elif origin in (tuple, list):
            inner = get_args(tp)[0] if get_args(tp) else str
            kw["nargs"] = "+"
            kw["type"] = _converter(inner, False, name)
        elif tp in (int, float, str) or isinstance(tp, list):
            kw["type"] = _converter(tp, optional, name)
        else:  # dicts and other structures are not flags
            continue
        parser.add_argument(f"--{name}", **kw)


def _nested(cls: type, f: dataclasses.Field, hints: dict[str, Any]) -> Any:
    """(dataclass, its default instance, hidden names) for a field holding a dataclass whose
    fields are flattened into flags; None for any other field."""
    tp = hints[f.name]
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return None
    inner = f.default_factory() if f.default_factory is not dataclasses.MISSING else tp()
    own = {g.name for g in dataclasses.fields(cls)}
    clash = own & {g.name for g in dataclasses.fields(tp)} - set(f.metadata.get("hide", ()))
    if clash:  # one flag per name: a method may not re-declare what its nested config holds
        raise TypeError(f"{cls.__name__} re-declares {sorted(clash)} of its {f.name} field")
    return tp, inner, set(f.metadata.get("hide", ()))


def _field_values(obj: Any) -> dict[str, Any]:
    return {g.name: getattr(obj, g.name) for g in dataclasses.fields(obj)}


def _values(cls: type, args: argparse.Namespace, skip: set[str]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        nested = _nested(cls, f, hints)
        if nested is not None:
            inner_cls, inner, hidden = nested
            given = _values(inner_cls, args, hidden)
            values[f.name] = dataclasses.replace(inner, **given) if given else inner
        elif hasattr(args, f.name):
            v = getattr(args, f.name)
            tp, _ = _unwrap_optional(hints[f.name])
            if get_origin(tp) is tuple and isinstance(v, list):
                v = tuple(v)
            values[f.name] = v
    return values


def dataclass_from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """An instance of ``cls`` from the parsed flags (validated by ``__post_init__``); a
    ``ValueError`` from validation becomes a :class:`GencraftError`. Flattened fields
    (``fit``) are rebuilt from their own flags."""
    try:
        values = _values(cls, args, set())
        values.update(overrides)
        return cls(**values)
    except ValueError as err:
        raise GencraftError(str(err)) from None
