"""Progress bars for terminals and for log files alike.

``from gencraft.progress import tqdm`` is ``tqdm.auto.tqdm`` on a terminal (or in a notebook).
When the bar would go to a stream that is not a terminal (a redirected ``2> train.log``, a CI
log), it prints plain lines instead, at most one every ``GENCRAFT_PROGRESS_SECONDS``
(default 30, fractions allowed): carriage returns would turn a long run's log into a few huge
lines. A postfix or description update does not redraw a plain bar; the next line shows it.

transformers' own bars (loading and writing weights) are off inside gencraft's loads and saves
(:func:`hf_bars_off`) unless ``GENCRAFT_HF_PROGRESS=1``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from tqdm.auto import tqdm as _auto

PLAIN_SECONDS = 30.0


def _plain_seconds() -> float:
    try:
        value = float(os.environ.get("GENCRAFT_PROGRESS_SECONDS", PLAIN_SECONDS))
    except ValueError:
        return PLAIN_SECONDS
    return value if value >= 0 else PLAIN_SECONDS


@contextmanager
def hf_bars_off() -> Iterator[None]:
    """transformers' progress bars off for the block (unless ``GENCRAFT_HF_PROGRESS=1``), then
    as they were."""
    if os.environ.get("GENCRAFT_HF_PROGRESS", "").strip().lower() in ("1", "true", "yes"):
        yield
        return
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # a terminal control sequence (cursor up...)


class _Lines:
    """A stream wrapper that turns tqdm's carriage-return redraws into whole lines, without
    the cursor moves a nested bar makes (a log file would keep them as bytes)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = _ESCAPE.sub("", text).replace("\r", "").rstrip()
        if line:  # a redraw; clearing a bar (spaces) and the closing newline print nothing
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class tqdm(_auto):
    """``tqdm.auto.tqdm``, printing periodic plain lines when its stream is not a terminal."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        notebook = type(self).__mro__[1].__module__.startswith("tqdm.notebook")
        stream = kwargs.get("file") or sys.stderr
        self._plain = not notebook and not _is_terminal(stream)
        if self._plain and not isinstance(stream, _Lines):
            kwargs["file"] = _Lines(stream)
            kwargs.setdefault("mininterval", _plain_seconds())
            kwargs.setdefault("maxinterval", max(_plain_seconds(), 10.0))
            kwargs.setdefault("ascii", True)
            kwargs.setdefault("ncols", 100)
        super().__init__(*args, **kwargs)

    # a plain bar prints at most one line per interval: these do not redraw it
    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        super().set_postfix(ordered_dict, refresh=refresh and not self._plain, **kwargs)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        super().set_postfix_str(s, refresh=refresh and not self._plain)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description(desc, refresh=refresh and not getattr(self, "_plain", False))
