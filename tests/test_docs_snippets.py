"""Every Python snippet in README.md and docs/*.md runs as written (offline)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
REAL_WEIGHTS = re.compile(r"smollm2|minilm")
SNIPPETS = [
    pytest.param(
        block,
        id=f"{path.name}#{i}",
        marks=[pytest.mark.slow] if REAL_WEIGHTS.search(block) else [],
    )
    for path in FILES
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("code", SNIPPETS)
def test_snippet_runs(code, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GENCRAFT_DATA_DIR", str(shared_data))
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})
