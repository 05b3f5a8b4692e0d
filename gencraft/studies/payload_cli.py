"""``gencraft pack`` and ``gencraft unpack``: a campaign's weights, data and state in
checksummed pieces for an offline GPU machine (see :mod:`gencraft.studies.payload`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gencraft.config import REQUIRED, option


@dataclass
class PackCommand:
    out: str = option(REQUIRED, "folder the pieces and manifest.json go to", positional=True)
    scale: Literal["tiny", "cpu", "slot"] = option("slot", "the campaign scale to pack for")
    claims: tuple[str, ...] = option(
        ("hso-fewshot", "recurrence", "fame", "rum-sundae", "dasp"), "the claims to pack for"
    )
    campaign: str | None = option(None, "campaign folder whose state travels too")
    piece_size: float = option(60.0, "largest piece, in MB (10^6 bytes)")


@dataclass
class UnpackCommand:
    src: str = option(
        REQUIRED, "folder holding manifest.json and (some of) the pieces", positional=True
    )
    into: str = option(".gencraft-payload", "staging folder: pieces, data and python packages")
    campaign: str | None = option(None, "campaign folder the state is restored into")


def cmd_pack(args: argparse.Namespace) -> None:
    from gencraft.data.sources import configured_data_dir
    from gencraft.errors import GencraftError
    from gencraft.studies.payload import campaign_entries, pack

    data = configured_data_dir(args.data_dir)
    if data is None:
        raise GencraftError("give --data-dir (or set GENCRAFT_DATA_DIR): the datasets travel too")
    campaign = Path(args.campaign) if args.campaign else None
    entries = campaign_entries(tuple(args.claims), args.scale, Path(data), campaign)
    m = pack(entries, Path(args.out), args.piece_size)
    kinds: dict[str, int] = {}
    for f in m["files"]:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + f["bytes"]
    print(
        f"packed {len(m['files'])} files ("
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(kinds.items()))
        + f") into {len(m['pieces'])} pieces of at most {args.piece_size:g} MB "
        f"({m['archive_bytes'] / 1e6:.1f} MB in all) in {m['seconds']:.0f} s: {args.out}"
    )
    for p in m["pieces"]:
        print(f"  {p['name']}  {p['bytes'] / 1e6:6.1f} MB  sha256 {p['sha256'][:16]}")


def cmd_unpack(args: argparse.Namespace) -> None:
    from gencraft.studies.payload import unpack

    campaign = Path(args.campaign) if args.campaign else None
    r = unpack(Path(args.src), Path(args.into), campaign)
    if "missing" in r:
        have = r["pieces"] - len(r["missing"])
        print(
            f"{have} of {r['pieces']} pieces checked and staged in {args.into}; missing: "
            + ", ".join(r["missing"])
            + ". Bring them and run `gencraft unpack` again."
        )
        return
    print(
        f"restored {r['files']} files ({r['bytes'] / 1e6:.1f} MB); kept {len(r['kept'])} "
        f"as they were. Data: --data-dir {r['data_dir']}; the gguf package: "
        f"export PYTHONPATH={r['python']}:$PYTHONPATH"
    )


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments

    p = sub.add_parser("pack", help="a campaign's weights, data and state in checksummed pieces")
    add_dataclass_arguments(p, PackCommand)
    add_data_dir(p)
    p.set_defaults(func=cmd_pack)
    u = sub.add_parser("unpack", help="check pieces from `gencraft pack` and restore them")
    add_dataclass_arguments(u, UnpackCommand)
    u.set_defaults(func=cmd_unpack)
