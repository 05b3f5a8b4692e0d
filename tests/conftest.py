"""Shared fixtures. Every test runs offline; real data comes from ../shared/data when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

# hypothesis draws the same cases on every run, so CI's verdict is the developer's; set
# HYPOTHESIS_PROFILE=explore to draw new ones (docs/core.md, "Tests")
from hypothesis import Phase as _Phase  # noqa: E402
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("gencraft", derandomize=True, print_blob=True)
_hypothesis_settings.register_profile("explore", derandomize=False, max_examples=500)
# mutation runs need only the verdict: the same cases, no shrinking of a failure
_hypothesis_settings.register_profile(
    "mutants",
    derandomize=True,
    phases=[_Phase.explicit, _Phase.reuse, _Phase.generate],
    database=None,
)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gencraft"))

# a mutation run (.ci/mutations.py) must test the mutated copy, not the checkout
_MUTANT = os.environ.get("GENCRAFT_MUTANT_ROOT")
if _MUTANT:
    import gencraft

    if not Path(gencraft.__file__).resolve().is_relative_to(Path(_MUTANT).resolve()):
        pytest.exit(
            f"mutation run: gencraft was imported from {gencraft.__file__}, not the mutated "
            f"copy in {_MUTANT}",
            returncode=3,
        )


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
def _real_weights_only_in_slow_tests(request, monkeypatch):
    """A test that loads real pretrained weights (SmolLM2, MiniLM) must be marked ``slow``:
    elsewhere the packaged weights are out of reach, so an unmarked one fails, naming this."""
    if request.node.get_closest_marker("slow") is not None:
        return
    from gencraft.models import pretrained

    def refuse(*args, **kwargs):
        raise AssertionError("this test loads real pretrained weights: mark it @pytest.mark.slow")

    for name in ("smollm2_gguf_path", "smollm2_dir", "minilm_dir", "minilm_bert2bert"):
        monkeypatch.setattr(pretrained, name, refuse)


@pytest.fixture(autouse=True)
def _no_ambient_data_dir(monkeypatch):
    """Tests pass data directories explicitly, so an exported GENCRAFT_DATA_DIR can't leak in."""
    monkeypatch.delenv("GENCRAFT_DATA_DIR", raising=False)


@pytest.fixture(scope="session")
def synthetic_lm_dir(tmp_path_factory) -> Path:
    """A data directory with a PTB-format corpus of 39 words (``<unk>`` included) whose
    sentences often repeat their first words, so a pointer has something to copy."""
    import random

    root = tmp_path_factory.mktemp("lmdata")
    (root / "ptb").mkdir()
    rng = random.Random(0)
    words = [f"w{i}" for i in range(38)] + ["<unk>"]
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        lines = []
        for _ in range(n):
            s = [rng.choice(words) for _ in range(rng.randint(3, 8))]
            lines.append(" " + " ".join(s + s[: rng.randint(0, 3)]) + " ")
        (root / "ptb" / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def pytest_collection_modifyitems(config, items):
    """``-m gpu`` tests need CUDA: without a GPU they skip, saying so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: the gpu precision contract is skipped")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
