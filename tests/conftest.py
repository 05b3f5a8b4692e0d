"""Shared fixtures. Every test runs offline; real data comes from ../shared/data when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


def _shared_data() -> Path | None:
    env = os.environ.get("GENCRAFT_DATA_DIR")
    for cand in (Path(env) if env else None, REPO.parent / "shared" / "data"):
        if cand is not None and cand.is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real datasets directory; tests using it skip (with the reason) when it is absent."""
    path = _shared_data()
    if path is None:
        pytest.skip("../shared/data (or $GENCRAFT_DATA_DIR) is absent: real-data checks skipped")
    return path


@pytest.fixture(autouse=True)
def _no_ambient_data_dir(monkeypatch):
    """Tests pass data directories explicitly, so an exported GENCRAFT_DATA_DIR can't leak in."""
    monkeypatch.delenv("GENCRAFT_DATA_DIR", raising=False)
