"""Generation tasks as (source, references) examples, the same for every method: data-to-text
(E2E, WebNLG, DART) and summarisation (XSum), with their training pairs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gencraft.errors import ConfigError

GENERATION_TASKS = ("e2e", "webnlg", "dart", "xsum")


@dataclass
class Pair:
    source: str
    target: str


def is_task_path(task: str) -> bool:
    """Whether ``task`` is a researcher's own data (a path), not a named task."""
    from gencraft.data.own import is_path_spec

    return is_path_spec(task, GENERATION_TASKS)


def task_examples(
    task: str,
    split: str,
    data_dir: str | None = None,
    *,
    source_field: str = "source",
    target_field: str = "target",
) -> list[Any]:
    """Evaluation examples (``.input``/``.source`` and ``.references``) of a task's split.

    ``task`` is a named task or a path (:mod:`gencraft.data.own`: a ``.jsonl``/``.csv``/
    ``.tsv`` file or a folder of split files, whose fields ``source_field`` and
    ``target_field`` name)."""
    if task not in GENERATION_TASKS and is_task_path(task):
        from gencraft.data.own import load_task_path

        return load_task_path(task, split, source_field, target_field)
    if task in ("e2e", "webnlg", "dart"):
        from gencraft.data.data2text import load_data_to_text

        if task == "dart" and split in ("train", "validation"):
            # DART's train split is not local: train on the dev split minus its last 300
            # triple sets, validate on those
            dev = load_data_to_text("dart", "validation", data_dir)
            return dev[:-300] if split == "train" else dev[-300:]
        return load_data_to_text(task, split, data_dir)
    if task == "xsum":
        from gencraft.data.summarization import load_summarization

        return load_summarization("xsum", split, data_dir)
    raise ConfigError(
        f"unknown task {task!r}; choose one of {', '.join(GENERATION_TASKS)}, or give a path "
        "(a .jsonl, .csv or .tsv file, or a folder of train/valid/test files)"
    )


def pick_examples(examples: list[Any], limit: int | None, spread: bool = False) -> list[Any]:
    """The first ``limit`` examples, or ``limit`` evenly spaced ones (``i * N // limit``)."""
    if limit is None or limit >= len(examples):
        return list(examples)
    if spread:
        return [examples[i * len(examples) // limit] for i in range(limit)]
    return examples[:limit]


def source_of(example: Any) -> str:
    return getattr(example, "input", None) or getattr(example, "document", None) or example.source


def references_of(example: Any) -> list[str]:
    refs = getattr(example, "references", None)
    if refs is None:
        refs = [example.summary]
    return list(refs)


def training_pairs(task: str, split: str, data_dir: str | None = None, **fields: str) -> list[Pair]:
    """(source, target) pairs: every reference of every input is one pair (``fields``:
    ``source_field``/``target_field`` of a task given as a path)."""
    return [
        Pair(source_of(e), r)
        for e in task_examples(task, split, data_dir, **fields)
        for r in references_of(e)
    ]
