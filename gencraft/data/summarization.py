"""Summarization datasets: XSum and CNN/DailyMail as (id, document, summary) examples.

Two layouts of ``<data_dir>/<name>/`` are read:

* official splits as ``train.jsonl`` / ``validation.jsonl`` / ``test.jsonl`` (what the
  canonical download writes): used as they are;
* a single JSON-lines file (here: ``xsum-1000.jsonl``, 1,000 documents of the official XSum
  TEST split; ``cnndm-frank-250.jsonl``, 250 CNN/DM TEST documents). It is split
  deterministically by :data:`LOCAL_SPLIT`: examples sorted by SHA-1 of their ``id``, the first
  80% train, the next 10% validation, the last 10% test. The result does not depend on the
  file's line order. Every reported number must name this split, e.g.
  "xsum-1000 local test split (100 docs, sha1-80/10/10)".
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from gencraft.data.io import normalize_split, read_jsonl
from gencraft.data.sources import dataset_dir
from gencraft.errors import DataError

SUMMARIZATION_DATASETS = ("xsum", "cnndm")
SPLITS = ("train", "validation", "test")
LOCAL_SPLIT = (0.8, 0.1, 0.1)
"""Fractions (train, validation, test) for a single local file, in SHA-1(id) order."""


@dataclass(frozen=True)
class SummarizationExample:
    id: str
    document: str
    summary: str


def local_split(
    ids: list[str], split: str, fractions: tuple[float, float, float] = LOCAL_SPLIT
) -> list[int]:
    """Indices of ``ids`` in ``split`` under the SHA-1 ordered 80/10/10 split, in file order."""
    order = sorted(range(len(ids)), key=lambda i: hashlib.sha1(ids[i].encode()).hexdigest())
    n_train = round(fractions[0] * len(ids))
    n_val = round(fractions[1] * len(ids))
    bounds = {
        "train": (0, n_train),
        "validation": (n_train, n_train + n_val),
        "test": (n_train + n_val, len(ids)),
    }
    lo, hi = bounds[split]
    return sorted(order[lo:hi])


def load_summarization(
    name: str, split: str = "test", data_dir: str | os.PathLike | None = None
) -> list[SummarizationExample]:
    """Examples of ``xsum`` or ``cnndm`` for ``split`` (train/validation/test, or ``all`` for
    the whole local file). See the module docstring for the local split."""
    if name not in SUMMARIZATION_DATASETS:
        raise DataError(
            f"unknown summarization dataset {name!r}; choose one of "
            f"{', '.join(SUMMARIZATION_DATASETS)}"
        )
    split = normalize_split(split, (*SPLITS, "all"))
    root = dataset_dir(name, data_dir, "*.jsonl")
    official = root / f"{split}.jsonl"
    if all((root / f"{s}.jsonl").is_file() for s in SPLITS):
        if split == "all":
            raise DataError(
                f"{name}: official splits found in {root}; ask for one of {', '.join(SPLITS)}"
            )
        return _examples(official)
    files = sorted(p for p in root.glob("*.jsonl"))
    if len(files) != 1:
        raise DataError(
            f"{name}: expected one local .jsonl file or train/validation/test.jsonl "
            f"in {root}, found {[p.name for p in files]}"
        )
    examples = _examples(files[0])
    if split == "all":
        return examples
    return [examples[i] for i in local_split([e.id for e in examples], split)]


def _examples(path: Path) -> list[SummarizationExample]:
    rows = read_jsonl(path, required=("id", "document", "summary"))
    return [SummarizationExample(str(r["id"]), r["document"], r["summary"]) for r in rows]
