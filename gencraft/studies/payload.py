"""``gencraft pack`` and ``gencraft unpack``: what a campaign needs on an offline GPU machine,
in pieces small enough to travel one per transfer.

``pack`` writes one xz-compressed tar of: the weights of the models the chosen claims use
(each in its smallest form: SmolLM2's Q4_1 GGUF, 98 MB, is smaller than its bfloat16
safetensors, 270 MB; MiniLM's float32 safetensors become bfloat16, 90 MB -> 45 MB), the
``gguf`` package that reads the GGUF, the datasets the claims read, and the campaign's
state so far (every run's ``results.json``). The archive is cut into pieces of at most
``piece_size`` MB, and ``manifest.json`` gives each piece's and each file's SHA-256.

``unpack`` checks each piece it is given and keeps the good ones in its staging folder, so
pieces may arrive over several transfers (a warm machine keeps the folder between calls).
Once every piece is there it restores: the weights into gencraft's cache, where the loaders
look when the weights packages are not installed; the datasets and the ``gguf`` package
into the staging folder; the state into the campaign folder, never over a run that has
more finished units.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import lzma
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencraft.errors import GencraftError

MANIFEST = "manifest.json"
PIECE = "payload.{:03d}"


@dataclass
class Entry:
    """One file of the payload: its path in the archive, where it comes from (or its bytes),
    and what it is (``weights``, ``python``, ``data`` or ``state``)."""

    name: str
    kind: str
    source: Path | None = None
    data: bytes | None = None

    def read(self) -> bytes:
        return self.data if self.data is not None else Path(self.source).read_bytes()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weight_entries(models: set[str]) -> list[Entry]:
    """The weights of registered models (``smollm2-135m``, ``minilm-l6*``), smallest form."""
    from gencraft.models import pretrained

    out: list[Entry] = []
    if "smollm2" in models:
        gguf = pretrained.smollm2_gguf_path()
        out.append(Entry(f"weights/{gguf.name}", "weights", gguf))
        out += package_entries("gguf")
    if "minilm" in models:
        src = pretrained.minilm_dir()
        for p in sorted(src.rglob("*")):
            if not p.is_file():
                continue
            name = f"weights/{pretrained.MINILM_CACHE}/{p.relative_to(src)}"
            if p.suffix == ".safetensors":
                out.append(Entry(name, "weights", data=_bfloat16(p)))
            else:
                out.append(Entry(name, "weights", p))
    return out


def package_entries(name: str) -> list[Entry]:
    """An installed package's files and its ``.dist-info``, under ``python/``.

    The ``.dist-info`` travels too: ``transformers`` asks ``importlib.metadata`` for the
    ``gguf`` version before it reads a GGUF, and a bare package has none (without it a GPU
    run stopped on "Invalid version: 'N/A'")."""
    dist = importlib.metadata.distribution(name)
    out = []
    for f in sorted(dist.files or [], key=str):
        path = Path(str(dist.locate_file(f)))
        top = f.parts[0]
        ours = (top == name or top.endswith(".dist-info")) and "__pycache__" not in f.parts
        if ours and path.is_file():
            out.append(Entry(f"python/{f.as_posix()}", "python", path))
    return out


def _bfloat16(path: Path) -> bytes:
    """A float32 safetensors file as bfloat16 (half the bytes; bfloat16 keeps float32's
    exponent, so no weight overflows)."""
    from safetensors.torch import load_file, save

    tensors = load_file(str(path))
    return save({k: v.bfloat16() if v.is_floating_point() else v for k, v in tensors.items()})


def data_entries(data_dir: Path, names: set[str]) -> list[Entry]:
    out = []
    for name in sorted(names):
        folder = data_dir / name
        if not folder.is_dir():
            raise GencraftError(f"dataset {name!r} is not in {data_dir}")
        out += [
            Entry(f"data/{p.relative_to(data_dir)}", "data", p)
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        ]
    return out


def state_entries(campaign: Path | None) -> list[Entry]:
    """Every ``results.json`` under the campaign folder (its runs' finished units)."""
    if campaign is None or not campaign.is_dir():
        return []
    return [
        Entry(f"state/{p.relative_to(campaign)}", "state", p)
        for p in sorted(campaign.rglob("results.json"))
    ]


def pack(entries: list[Entry], out_dir: Path, piece_mb: float = 60.0) -> dict[str, Any]:
    """Write ``entries`` as one xz-compressed tar cut into pieces of at most ``piece_mb`` MB
    (10^6 bytes) in ``out_dir``, with ``manifest.json``; returns the manifest."""
    if not piece_mb > 0:
        raise GencraftError(f"--piece-size must be > 0 MB, got {piece_mb}")
    t0 = time.perf_counter()
    buf, files = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            data = e.read()
            info = tarfile.TarInfo(e.name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            files.append({"name": e.name, "kind": e.kind, "bytes": len(data), "sha256": _sha(data)})
    blob = lzma.compress(buf.getvalue(), preset=6)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("payload.*"):  # pieces of an earlier pack
        old.unlink()
    size, pieces = max(1, int(piece_mb * 1e6)), []
    for i, start in enumerate(range(0, max(len(blob), 1), size)):
        piece = blob[start : start + size]
        (out_dir / PIECE.format(i)).write_bytes(piece)
        pieces.append({"name": PIECE.format(i), "bytes": len(piece), "sha256": _sha(piece)})
    manifest = {
        "format": 1,
        "archive_bytes": len(blob),
        "pieces": pieces,
        "files": files,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def stage(src: Path, into: Path) -> tuple[dict[str, Any], list[str]]:
    """Check the pieces in ``src`` and keep the good ones in ``into/pieces``; returns the
    manifest and the names of the pieces still missing. A damaged piece is refused by name."""
    staged = into / "pieces"
    staged.mkdir(parents=True, exist_ok=True)
    if (src / MANIFEST).is_file():
        shutil.copyfile(src / MANIFEST, staged / MANIFEST)
    if not (staged / MANIFEST).is_file():
        raise GencraftError(f"{src} has no {MANIFEST} (give the folder `gencraft pack` wrote)")
    manifest = json.loads((staged / MANIFEST).read_text())
    missing = []
    for piece in manifest["pieces"]:
        here, kept = src / piece["name"], staged / piece["name"]
        if here.is_file() and here.resolve() != kept.resolve():
            if _sha(here.read_bytes()) != piece["sha256"]:
                raise GencraftError(f"{here} is damaged (its SHA-256 differs from the manifest's)")
            shutil.copyfile(here, kept)
        if not kept.is_file() or _sha(kept.read_bytes()) != piece["sha256"]:
            missing.append(piece["name"])
    return manifest, missing


def unpack(src: Path, into: Path, campaign: Path | None) -> dict[str, Any]:
    """Stage the pieces in ``src``; once all are there, check every file and restore them
    (see the module docstring). Returns what was restored, or the pieces still missing."""
    manifest, missing = stage(src, into)
    if missing:
        return {"missing": missing, "pieces": len(manifest["pieces"])}
    staged = into / "pieces"
    blob = b"".join((staged / p["name"]).read_bytes() for p in manifest["pieces"])
    want = {f["name"]: f for f in manifest["files"]}
    done: dict[str, Any] = {"files": 0, "bytes": 0, "kept": []}
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob)), mode="r") as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()
            meta = want.get(member.name)
            if meta is None or _sha(data) != meta["sha256"]:
                raise GencraftError(f"{member.name} in the payload does not match its manifest")
            target = _target(member.name, meta["kind"], into, campaign)
            if target is None or not _newer(target, data):
                done["kept"].append(member.name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            done["files"] += 1
            done["bytes"] += len(data)
    done["python"] = str(into / "python")
    done["data_dir"] = str(into / "data")
    return done


def _target(name: str, kind: str, into: Path, campaign: Path | None) -> Path | None:
    """Where a payload file goes (None: nowhere, a state file without a campaign folder)."""
    from gencraft.utils import cache_dir

    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise GencraftError(f"unsafe path in the payload: {name}")
    inner = Path(*rel.parts[1:])
    if kind == "weights":
        return cache_dir("weights", *inner.parts)
    if kind == "state":
        return None if campaign is None else campaign / inner
    return into / rel  # python/ and data/


def _newer(target: Path, data: bytes) -> bool:
    """Whether ``data`` should replace ``target``: always, unless both are results files and
    the one there has more finished units."""
    if not target.is_file() or target.name != "results.json":
        return True
    try:
        here = len(json.loads(target.read_text()).get("units", {}))
        return len(json.loads(data).get("units", {})) >= here
    except ValueError:
        return True


def model_kinds(names: set[str]) -> set[str]:
    """Which packed weights the model names need (random ``tiny-*`` models need none)."""
    kinds = {"smollm2" for n in names if n == "smollm2-135m"}
    return kinds | {"minilm" for n in names if n.startswith("minilm-l6")}


def campaign_entries(
    claims: tuple[str, ...], scale: str, data_dir: Path, campaign: Path | None
) -> list[Entry]:
    """Everything the claims' runs at campaign ``scale`` read: weights, data and state."""
    from gencraft.studies.campaign import CLAIMS, run_states

    unknown = [c for c in claims if c not in CLAIMS]
    if unknown:
        raise GencraftError(f"unknown claims {unknown}; the campaign has {', '.join(CLAIMS)}")
    root = campaign or Path("campaign")
    models = {
        st.settings.model
        for c in claims
        for st in (
            run_states(CLAIMS[c], scale, root, str(data_dir)) if CLAIMS[c].runs[scale] else []
        )
    }
    names = {d for c in claims for d in CLAIMS[c].data}
    return [
        *weight_entries(model_kinds(models)),
        *data_entries(data_dir, names),
        *state_entries(campaign),
    ]
