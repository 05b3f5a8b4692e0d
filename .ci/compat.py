#!/usr/bin/env python
"""The other dependency sets CI tests: each is a constraints file (constraints/SET.txt) and
runs as an overlay over .venv: the packages whose pinned version differs from the one
installed are installed, without their dependencies, into .venv/compat/SET, which goes first
on the import path. The overlay is checked against the file before any test runs.

    python .ci/compat.py install SET          # (re)build the overlay when the file changed
    python .ci/compat.py run SET [ARGS...]    # python -m pytest ARGS with the overlay
    python .ci/compat.py resolve-newest       # rewrite constraints/newest.txt from the registry
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")
#: never overlaid: torch is the local CPU wheel in every set; gencraft is the checkout
KEEP = {"torch", "gencraft"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def base_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def overlay_dir(name: str) -> Path:
    return VENV / "compat" / name


def install(name: str) -> Path:
    cfile = ROOT / "constraints" / f"{name}.txt"
    if not cfile.is_file():
        sys.exit(f"no constraints file {cfile}")
    digest = hashlib.sha256(cfile.read_bytes()).hexdigest()
    target = overlay_dir(name)
    stamp = target / ".constraints-sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return target
    want = {k: v for k, v in pins(cfile).items() if k not in KEEP}
    differ = [f"{k}=={v}" for k, v in sorted(want.items()) if base_version(k) != v]
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if differ:
        print(f"compat {name}: overlay {' '.join(differ)}", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(target),
                *differ,
            ],
            check=True,
        )
    stamp.write_text(digest)
    return target


def check(name: str, target: Path) -> None:
    """Every pinned package that is importable resolves to its pinned version."""
    code = (
        "import json, sys\nfrom importlib import metadata\n"
        "want = json.loads(sys.argv[1])\nbad = []\n"
        "for k, v in want.items():\n"
        "    try:\n        got = metadata.version(k)\n"
        "    except metadata.PackageNotFoundError:\n        continue\n"
        "    if got.split('+')[0] != v.split('+')[0]:\n        bad.append(f'{k} {got} != {v}')\n"
        "import transformers\n"
        "print('transformers', transformers.__version__, 'from', transformers.__file__)\n"
        "sys.exit('version mismatch: ' + '; '.join(bad) if bad else 0)\n"
    )
    want = pins(ROOT / "constraints" / f"{name}.txt")
    subprocess.run([sys.executable, "-c", code, json.dumps(want)], check=True, env=env(target))


def env(target: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(target), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return e


def run(name: str, args: list[str]) -> int:
    target = install(name)
    check(name, target)
    return subprocess.run([sys.executable, "-m", "pytest", *args], env=env(target)).returncode


def resolve_newest() -> None:
    """The newest releases the registry serves for gencraft[all,dev] (torch kept at the CI
    pin), written to constraints/newest.txt."""
    torch = pins(ROOT / "constraints" / "ci.txt")["torch"]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                f"torch=={torch}",
                f"{ROOT}[all,dev]",
            ],
            check=True,
        )
        found = json.loads(report.read_text())["install"]
    lines = sorted(
        f"{m['name']}=={m['version']}"
        for m in (i["metadata"] for i in found)
        if norm(m["name"]) != "gencraft"
    )
    lines = [re.sub(r"^torch==.*", f"torch=={torch}", x) for x in lines]
    header = (
        "# The newest releases the registry served for gencraft[all,dev] (torch at the CI pin),\n"
        "# resolved by `make constraints-newest`; CI tests this set as it is written here.\n"
    )
    (ROOT / "constraints" / "newest.txt").write_text(header + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd = sys.argv[1]
    if cmd == "install" and len(sys.argv) == 3:
        check(sys.argv[2], install(sys.argv[2]))
    elif cmd == "run" and len(sys.argv) >= 3:
        sys.exit(run(sys.argv[2], sys.argv[3:]))
    elif cmd == "resolve-newest":
        resolve_newest()
    else:
        sys.exit(__doc__)
