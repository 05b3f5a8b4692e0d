"""Data-to-text datasets: E2E, WebNLG 2017, DART -> (linearised input, references).

Inputs are linearised as in Li & Liang (2021, prefix-tuning):

* E2E: ``name[The Vaults], eatType[pub]`` -> ``name : The Vaults | eatType : pub``. Li & Liang's
  preprocessed files also renamed two slots (eatType -> Type, priceRange -> price) and
  tokenised the text; we keep the official slot names and raw text.
* WebNLG / DART: each (subject, property, object) -> ``subject : property : object``, triples
  joined by `` | ``. Underscores (WebNLG entity names) become spaces; ``underscores=True``
  keeps them.

One example per distinct input (E2E MR, WebNLG entry, DART entry) with all its references.
Splits: ``train``, ``validation`` (E2E devset, WebNLG dev, DART dev), ``test`` (E2E
testset_w_refs, WebNLG testdata_with_lex = seen + unseen categories, DART test).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gencraft.data.io import normalize_split, read_text
from gencraft.data.sources import dataset_dir
from gencraft.errors import DataError

DATA_TO_TEXT_DATASETS = ("e2e", "webnlg", "dart")
WEBNLG_SEEN_CATEGORIES = frozenset(
    {
        "Airport",
        "Astronaut",
        "Building",
        "City",
        "ComicsCharacter",
        "Food",
        "Monument",
        "SportsTeam",
        "University",
        "WrittenWork",
    }
)
_MR_SLOT = re.compile(r"\s*([^\[\],]+?)\s*\[([^\]]*)\]\s*(?:,|$)")


@dataclass(frozen=True)
class DataToTextExample:
    id: str
    input: str
    references: list[str]
    meta: dict = field(default_factory=dict, compare=False)


def parse_e2e_mr(mr: str) -> list[tuple[str, str]]:
    """``"name[X], food[Y]"`` -> ``[("name", "X"), ("food", "Y")]``; DataError if malformed."""
    slots, pos = [], 0
    while pos < len(mr):
        m = _MR_SLOT.match(mr, pos)
        if not m:
            raise DataError(f"malformed E2E meaning representation at char {pos}: {mr!r}")
        slots.append((m.group(1), m.group(2)))
        pos = m.end()
    return slots


def linearize_e2e(mr: str) -> str:
    """Li & Liang style: ``slot : value | slot : value``."""
    return " | ".join(f"{k} : {v}" for k, v in parse_e2e_mr(mr))


def linearize_triples(triples: list[tuple[str, str, str]], underscores: bool = False) -> str:
    """``subject : property : object | ...``; underscores -> spaces unless ``underscores``."""

    def clean(s: str) -> str:
        return s.strip() if underscores else s.replace("_", " ").strip()

    return " | ".join(" : ".join(clean(x) for x in t) for t in triples)


def _e2e(root: Path, split: str) -> list[DataToTextExample]:
    fname = {"train": "trainset.csv", "validation": "devset.csv", "test": "testset_w_refs.csv"}
    path = root / fname[split]
    if not path.is_file():
        raise DataError(f"e2e: missing {path}")
    grouped: dict[str, list[str]] = {}
    with io.StringIO(read_text(path), newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or {"mr", "ref"} - set(reader.fieldnames):
            raise DataError(f"{path}: expected CSV columns 'mr' and 'ref', got {reader.fieldnames}")
        for row in reader:
            grouped.setdefault(row["mr"], []).append(row["ref"])
    return [
        DataToTextExample(f"e2e-{split}-{i}", linearize_e2e(mr), refs, {"mr": mr})
        for i, (mr, refs) in enumerate(grouped.items())
    ]


def _split_triple(text: str, path: Path) -> tuple[str, str, str]:
    parts = [p.strip() for p in text.split(" | ")]
    if len(parts) != 3:
        raise DataError(f"{path}: triple {text!r} is not 'subject | property | object'")
    return parts[0], parts[1], parts[2]


def _xml_entries(path: Path, prefix: str, underscores: bool) -> list[DataToTextExample]:
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise DataError(f"{path}: malformed XML ({err})") from err
    out = []
    for entry in root.iter("entry"):
        triples = [_split_triple(m.text or "", path) for m in entry.iter("mtriple")]
        refs = [(lex.text or "").strip() for lex in entry.findall("lex")]
        category = entry.get("category", "")
        out.append(
            DataToTextExample(
                f"{prefix}-{category}-{entry.get('size')}-{entry.get('eid')}",
                linearize_triples(triples, underscores),
                refs,
                {
                    "category": category,
                    "triples": triples,
                    "seen": category in WEBNLG_SEEN_CATEGORIES,
                },
            )
        )
    return out


def _webnlg(root: Path, split: str, underscores: bool) -> list[DataToTextExample]:
    if split == "test":
        files = [root / "test" / "testdata_with_lex.xml"]
    else:
        folder = {"train": "train", "validation": "dev"}[split]
        files = sorted((root / folder).glob("*triples/*.xml"))
    if not files or not all(f.is_file() for f in files):
        raise DataError(f"webnlg: no {split} XML files under {root}")
    return [ex for f in files for ex in _xml_entries(f, f"webnlg-{split}", underscores)]


def _dart(root: Path, split: str, underscores: bool) -> list[DataToTextExample]:
    stem = f"dart-v1.1.1-full-{ {'validation': 'dev'}.get(split, split) }"
    if (root / f"{stem}.json").is_file():
        path = root / f"{stem}.json"
        try:
            rows = json.loads(read_text(path))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: malformed JSON ({err.msg})") from err
        return [
            DataToTextExample(
                f"dart-{split}-{i}",
                linearize_triples([tuple(t) for t in r["tripleset"]], underscores),
                [a["text"] for a in r["annotations"]],
                {"triples": [tuple(t) for t in r["tripleset"]]},
            )
            for i, r in enumerate(rows)
        ]
    if (root / f"{stem}.xml").is_file():
        return _xml_entries(root / f"{stem}.xml", f"dart-{split}", underscores)
    raise DataError(f"dart: neither {stem}.json nor {stem}.xml in {root}")


def load_data_to_text(
    name: str,
    split: str = "test",
    data_dir: str | os.PathLike | None = None,
    *,
    underscores: bool = False,
) -> list[DataToTextExample]:
    """Examples of ``e2e``, ``webnlg`` or ``dart`` for ``split`` (train/validation/test)."""
    if name not in DATA_TO_TEXT_DATASETS:
        raise DataError(
            f"unknown data-to-text dataset {name!r}; choose one of "
            f"{', '.join(DATA_TO_TEXT_DATASETS)}"
        )
    split = normalize_split(split, ("train", "validation", "test"))
    probe = {"e2e": "*.csv", "webnlg": "*/*", "dart": "dart-*"}[name]
    root = dataset_dir(name, data_dir, probe)
    if name == "e2e":
        return _e2e(root, split)
    if name == "webnlg":
        return _webnlg(root, split, underscores)
    return _dart(root, split, underscores)
