"""A researcher's own data: a generation task or an LM corpus given as a path.

**Generation tasks** (``--task PATH``): a ``.jsonl``, ``.csv`` or ``.tsv`` file, or a folder
holding ``train``, ``valid`` (or ``validation``/``dev``) and ``test`` files in one of those
formats. Each record has a source field and a target field (``--source-field`` /
``--target-field``, default ``source`` / ``target``). Several references per source are
written either as a JSON list in the target field, or as repeated rows with the same source:
rows are grouped by source text, in order of first appearance. A single file serves every
split (a train command then validates on its training data: a folder with a valid file
holds data out).

**LM corpora** (``--corpus PATH``): a plain UTF-8 text file, or a folder holding
``train.txt``, ``valid.txt`` and ``test.txt``. Lines are split on whitespace, each followed by
``<eos>``, as the named corpora are (:mod:`gencraft.data.lm`); the vocabulary comes from the
training text. A single file serves every split.

Every error names the file, the line and the field.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from gencraft.data.io import normalize_split, read_jsonl_numbered, read_text
from gencraft.errors import ConfigError, DataError

TASK_SUFFIXES = (".jsonl", ".csv", ".tsv")
_SPLIT_STEMS = {"train": ("train",), "validation": ("valid", "validation", "dev", "val")}
_SPLIT_STEMS["test"] = ("test",)


@dataclass
class OwnExample:
    """One source with all its references (what ``task_examples`` returns for a path)."""

    id: str
    source: str
    references: list[str]
    meta: dict = field(default_factory=dict, compare=False)

    # the attribute names the named tasks' examples use, so every evaluator reads these too
    @property
    def input(self) -> str:
        return self.source

    @property
    def document(self) -> str:
        return self.source

    @property
    def summary(self) -> str:
        return self.references[0]


def is_path_spec(spec: str | os.PathLike, names: tuple[str, ...] = ()) -> bool:
    """Whether ``spec`` names a path rather than one of ``names``: it exists, holds a path
    separator, or ends with a data suffix."""
    text = os.fspath(spec)
    if text in names:
        return False
    return (
        Path(text).exists()
        or os.sep in text
        or "/" in text
        or text.endswith((*TASK_SUFFIXES, ".txt"))
    )


def canonical_spec(spec: str, names: tuple[str, ...] = ()) -> str:
    """``spec`` as a run records it: a named dataset as written, a path made absolute (so the
    run evaluates from any working directory)."""
    if is_path_spec(spec, names):
        return str(Path(spec).expanduser().resolve())
    return spec


def spec_name(spec: str) -> str:
    """A short name for a dataset or model (a default output folder's): the name, or the
    path's last part without a data suffix."""
    name = Path(spec).name
    return Path(name).stem if name.endswith((*TASK_SUFFIXES, ".txt")) else name


def split_file(root: Path, split: str, suffixes: tuple[str, ...], what: str) -> Path:
    """The file of ``split`` in folder ``root`` (``train.jsonl``, ``valid.txt``, ...)."""
    split = normalize_split(split, ("train", "validation", "test"))
    found = [
        root / f"{stem}{suffix}"
        for stem in _SPLIT_STEMS[split]
        for suffix in suffixes
        if (root / f"{stem}{suffix}").is_file()
    ]
    if not found:
        names = ", ".join(f"{s}{x}" for s in _SPLIT_STEMS[split] for x in suffixes)
        raise DataError(f"{root}: no {split} file for {what} (looked for {names})")
    if len(found) > 1:
        raise DataError(f"{root}: several {split} files ({', '.join(p.name for p in found)})")
    return found[0]


def _records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of a .jsonl, .csv or .tsv file."""
    suffix = path.suffix.lower()
    text = read_text(path)
    if suffix == ".jsonl":
        return read_jsonl_numbered(path)
    if suffix in (".csv", ".tsv"):
        reader = csv.DictReader(io.StringIO(text), delimiter="\t" if suffix == ".tsv" else ",")
        if not reader.fieldnames:
            raise DataError(f"{path}: empty, or no header line naming the fields")
        rows = []
        for row in reader:
            if None in row:  # more cells than the header names
                raise DataError(
                    f"{path}, line {reader.line_num}: {len(reader.fieldnames) + len(row[None])} "
                    f"cells but the header names {len(reader.fieldnames)}"
                )
            short = [k for k, v in row.items() if v is None]
            if short:  # fewer cells than the header names
                raise DataError(
                    f"{path}, line {reader.line_num}: {len(row) - len(short)} cells but the "
                    f"header names {len(reader.fieldnames)} (no {short[0]!r})"
                )
            rows.append((reader.line_num, row))
        return rows
    raise DataError(f"{path}: a task file is .jsonl, .csv or .tsv, not {suffix or 'no suffix'}")


def _text(path: Path, lineno: int, row: dict, name: str, flag: str, many: bool) -> list[str]:
    if name not in row:
        raise DataError(
            f"{path}, line {lineno}: no field {name!r} (fields: {', '.join(map(str, row))}); "
            f"name yours with {flag}"
        )
    value = row[name]
    values = value if many and isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise DataError(
            f"{path}, line {lineno}: field {name!r} must be "
            f"{'non-empty text or a list of texts' if many else 'non-empty text'}, got {value!r}"
        )
    return values


def read_task_file(
    path: str | os.PathLike, source_field: str = "source", target_field: str = "target"
) -> list[OwnExample]:
    """The examples of one task file: rows grouped by source, references in row order."""
    path = Path(path)
    grouped: dict[str, OwnExample] = {}
    for lineno, row in _records(path):
        (source,) = _text(path, lineno, row, source_field, "--source-field", many=False)
        targets = _text(path, lineno, row, target_field, "--target-field", many=True)
        if source not in grouped:
            grouped[source] = OwnExample(str(row.get("id", len(grouped))), source, [])
        grouped[source].references.extend(targets)
    if not grouped:
        raise DataError(f"{path}: no examples")
    return list(grouped.values())


def load_task_path(
    spec: str | os.PathLike,
    split: str,
    source_field: str = "source",
    target_field: str = "target",
) -> list[OwnExample]:
    """``split`` of the task at ``spec`` (a file: every split; a folder: its split file). A
    split name outside train/validation/test is refused either way."""
    normalize_split(split, ("train", "validation", "test"))
    path = Path(spec).expanduser()
    if path.is_dir():
        path = split_file(path, split, TASK_SUFFIXES, "a task")
    elif not path.is_file():
        raise DataError(
            f"{spec}: no such task file or folder (a .jsonl, .csv or .tsv file, or a folder "
            "with train/valid/test files)"
        )
    return read_task_file(path, source_field, target_field)


def corpus_files(spec: str | os.PathLike, splits: tuple[str, ...]) -> dict[str, Path]:
    """{split: text file} of a corpus given as a file (every split) or a folder."""
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() in (*TASK_SUFFIXES, ".json"):
        # its markup would be scored as words: refuse rather than read it as text
        raise DataError(
            f"{spec}: a corpus is plain text (one document or paragraph per line), not "
            f"{path.suffix}; write the text itself to a .txt file"
        )
    if path.is_file():
        for s in splits:  # a file is every split, but a misspelt split is still refused
            normalize_split(s, ("train", "validation", "test"))
        return {s: path for s in splits}
    if path.is_dir():
        return {s: split_file(path, s, (".txt",), "a corpus") for s in splits}
    raise DataError(
        f"{spec}: no such corpus file or folder (a text file, or a folder with train.txt, "
        "valid.txt and test.txt)"
    )


def own_task(task: str, names: tuple[str, ...], what: str = "task") -> str:
    """``task`` (or a ``corpus``: ``what``) checked for a training config: one of ``names``, or
    a path to the user's own data, which the run records absolute (so it evaluates from any
    working directory). Raises a ``ConfigError`` naming both kinds otherwise."""
    if task in names:
        return task
    kinds = (
        "a text file or a folder"
        if what == "corpus"
        else "a .jsonl, .csv or .tsv file, or a folder"
    )
    if not is_path_spec(task, names):
        raise ConfigError(
            f"{what} must be one of {', '.join(names)} or a path to your own data ({kinds}), "
            f"got {task!r}"
        )
    return canonical_spec(task, names)
