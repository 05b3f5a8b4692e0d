"""Progress bars for terminals and for log files alike.

``from gencraft.progress import tqdm`` is ``tqdm.auto.tqdm`` on a terminal (or in a notebook).
When the bar would go to a stream that is not a terminal (a redirected ``2> train.log``, a CI
log), it prints plain lines instead, at most one every ``GENCRAFT_PROGRESS_SECONDS``
(default 30): carriage returns would turn a long run's log into a few huge lines.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from tqdm.auto import tqdm as _auto

PLAIN_SECONDS = 30.0


def _plain_seconds() -> float:
    try:
        return float(os.environ.get("GENCRAFT_PROGRESS_SECONDS", PLAIN_SECONDS))
    except ValueError:
        return PLAIN_SECONDS


class _Lines:
    """A stream wrapper that turns tqdm's carriage-return redraws into whole lines."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
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
        if not notebook and not _is_terminal(stream) and not isinstance(stream, _Lines):
            kwargs["file"] = _Lines(stream)
            kwargs.setdefault("mininterval", _plain_seconds())
            kwargs.setdefault("maxinterval", max(_plain_seconds(), 10.0))
            kwargs.setdefault("ascii", True)
            kwargs.setdefault("ncols", 100)
        super().__init__(*args, **kwargs)
