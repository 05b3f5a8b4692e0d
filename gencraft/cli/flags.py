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
from collections.abc import Iterable, Sequence
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
    only: Iterable[str] | None = None,
    defaults: dict[str, Any] | None = None,
    helps: dict[str, str] | None = None,
    prefix: str = "",
) -> None:
    """Add one flag per field of dataclass ``cls`` (``only`` those named, minus ``exclude``)
    to ``parser``; ``defaults`` and ``helps`` override the dataclass's defaults and help texts
    for this command only.

    Field metadata (:func:`gencraft.config.option`'s keywords): ``help``; ``positional``
    (an argument without ``--``); ``aliases`` (old spellings, accepted but not shown);
    ``repeat`` (``--x a --x b`` collects a list). A field without a default is required.
    """
    hints = typing.get_type_hints(cls)
    skip = set(exclude)
    keep = set(only) if only is not None else None
    defaults = defaults or {}
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init or (keep is not None and f.name not in keep):
            continue
        nested = _nested(cls, f, hints)
        if nested is not None:
            inner_cls, inner, hidden = nested
            inner_defaults = {**_field_values(inner), **defaults}
            add_dataclass_arguments(
                parser,
                inner_cls,
                exclude=skip | hidden,
                defaults=inner_defaults,
                helps=helps,
                prefix=prefix,
            )
            continue
        _add_field(parser, f, hints[f.name], defaults, (helps or {}).get(f.name), prefix)


def _add_field(
    parser: argparse.ArgumentParser,
    f: dataclasses.Field,
    hint: Any,
    defaults: dict[str, Any],
    help_text: str | None,
    prefix: str,
) -> None:
    name = prefix + f.name.replace("_", "-")
    help_text = help_text or f.metadata.get("help", "")
    required = False
    if f.name in defaults:
        default = defaults[f.name]
    elif f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default, required = None, True
    tp, optional = _unwrap_optional(hint)
    positional = f.metadata.get("positional", False)
    shown = help_text if required or positional else _with_default(help_text, default)
    kw: dict[str, Any] = {"default": default, "help": shown}
    if tp is bool:
        kw.update(action=argparse.BooleanOptionalAction, help=help_text or None)
    else:
        origin = get_origin(tp)
        if origin is Literal:
            choices = list(get_args(tp))
            kw["choices"] = choices + ([None] if optional else [])
            kw["type"] = _converter(type(choices[0]), optional, name)
            if optional:  # shown as the word the flag reads, not Python's None
                kw["metavar"] = "{" + ",".join(map(str, [*choices, "none"])) + "}"
        elif origin in (tuple, list):
            inner = get_args(tp)[0] if get_args(tp) else str
            kw["type"] = _converter(inner, False, name)
            if f.metadata.get("repeat"):
                kw["action"] = "append"
            else:
                kw["nargs"] = "*" if positional else "+"
        elif tp in (int, float, str) or isinstance(tp, list):
            kw["type"] = _converter(tp, optional, name)
        else:  # dicts and other structures are not flags
            return
    if positional:
        if not required and "nargs" not in kw:
            kw["nargs"] = "?"
        action = parser.add_argument(f.name, metavar=f.name.upper(), **kw)
    else:
        action = parser.add_argument(f"--{name}", dest=f.name, required=required, **kw)
    action.from_config = True
    for alias in f.metadata.get("aliases", ()):
        hidden = {**kw, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
        if kw.get("action") is argparse.BooleanOptionalAction:
            hidden["action"] = "store_true"
        parser.add_argument(alias, dest=f.name, **hidden).from_config = True


def _with_default(help_text: str, default: Any) -> str:
    if "(default" in help_text:  # the help explains its default itself (e.g. None = auto)
        return help_text
    default = "none" if default is None else default  # what the flag reads back
    return f"{help_text} (default: {default})" if help_text else f"default: {default}"


def census(parser: argparse.ArgumentParser) -> tuple[int, int]:
    """(arguments, of which generated from dataclasses) over ``parser`` and every subcommand;
    help and the hidden aliases of generated flags not counted."""
    total = generated = 0
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                t, g = census(sub)
                total, generated = total + t, generated + g
            continue
        total += 1
        generated += bool(getattr(action, "from_config", False))
    return total, generated


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


def given_among(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The flags (``--name-spelling``) of those of ``names`` written out on the command line
    (:func:`given_flags`), in ``names``' order: what a command refuses as clashing."""
    given = getattr(args, "given", ())
    return [f"--{n.replace('_', '-')}" for n in names if n in given]


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations of the flags written in ``argv`` (not left at their defaults), over
    ``parser`` and its subcommands: what a command may refuse as not applying."""
    by_flag: dict[str, str] = {}

    def collect(p: argparse.ArgumentParser) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    collect(sub)
            for flag in action.option_strings:
                by_flag[flag] = action.dest

    collect(parser)
    return {by_flag[a.split("=")[0]] for a in argv if a.split("=")[0] in by_flag}
