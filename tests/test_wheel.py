"""The wheel builds and installs into a fresh virtual environment outside the repository;
``gencraft --help`` and the README's Python snippets run from there. The new environment
takes gencraft from the wheel and its dependencies from the test's own environment (a path
line in a ``.pth`` file: no download, and no editable install of the checkout leaks in)."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = dist.glob("gencraft-*.whl")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.check_output(
        [py, "-c", "import gencraft; print(gencraft.__file__)"], cwd=work, text=True
    )
    assert Path(where.strip()).is_relative_to(env_dir)
    out = subprocess.run(
        [env_dir / "bin" / "gencraft", "--help"], cwd=work, capture_output=True, text=True
    )
    assert out.returncode == 0 and "usage" in out.stdout.lower()
    readme = (REPO / "README.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        if "smollm2" in block or "minilm" in block:
            continue
        r = subprocess.run([py, "-c", block], cwd=work, capture_output=True, text=True)
        assert r.returncode == 0, f"{block}\n{r.stderr[-1500:]}"
