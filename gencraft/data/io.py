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


def read_jsonl(path: str | Path, required: Iterable[str] = ()) -> list[dict]:
    """Read a JSON-lines file (blank lines skipped); every record must be an object holding
    the ``required`` keys. Raises DataError naming the file and line on bad input."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    required = tuple(required)
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: malformed JSON line ({err.msg})") from err
            if not isinstance(row, dict):
                raise DataError(
                    f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}"
                )
            missing = [k for k in required if k not in row]
            if missing:
                raise DataError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
            rows.append(row)
    return rows


def read_lines(path: str | Path) -> list[str]:
    """Read a text file as a list of lines without their newline characters."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
