"""Line-oriented readers (errors name the file and line) and split-name normalisation."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from gencraft.errors import DataError

_VALIDATION_NAMES = ("validation", "valid", "dev", "val")


def normalize_split(split: str, allowed: tuple[str, ...]) -> str:
    """``split`` in the naming of ``allowed``: any of validation/valid/dev/val becomes whichever
    of them ``allowed`` uses. Raises DataError for a split not in ``allowed``."""
    if split in _VALIDATION_NAMES:
        split = next((a for a in allowed if a in _VALIDATION_NAMES), split)
    if split not in allowed:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(allowed)}")
    return split


def read_text(path: str | Path) -> str:
    """A UTF-8 text file; a clear error naming the file when it is missing or not UTF-8
    (every gencraft reader of text files goes through here)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        return path.read_bytes().decode("utf-8-sig")  # a byte-order mark is not text
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); convert it to UTF-8"
        ) from None


def read_text_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (see :func:`read_text`)."""
    return read_text(path).splitlines()


def read_jsonl_numbered(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON-lines file; DataError naming
    the file and line for a line that is not a JSON object."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(read_text_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}, line {lineno}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(
                f"{path}, line {lineno}: expected a JSON object, got {type(row).__name__}"
            )
        rows.append((lineno, row))
    return rows


def read_jsonl(path: str | Path, required: Iterable[str] = ()) -> list[dict]:
    """Read a JSON-lines file (blank lines skipped); every record must be an object holding
    the ``required`` keys. Raises DataError naming the file and line on bad input."""
    rows = []
    for lineno, row in read_jsonl_numbered(path):
        missing = [k for k in required if k not in row]
        if missing:
            raise DataError(f"{path}, line {lineno}: missing field(s) {', '.join(missing)}")
        rows.append(row)
    return rows


def read_lines(path: str | Path) -> list[str]:
    """Read a text file as a list of lines without their newline characters."""
    return read_text_lines(path)
