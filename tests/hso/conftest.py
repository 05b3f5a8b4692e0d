"""The tiny Llama every HSO test module runs on (one per module: some tests change it)."""

from __future__ import annotations

import pytest

from gencraft.models import load_model


@pytest.fixture(scope="module")
def llama():
    model, _ = load_model("tiny-llama", seed=0)
    return model.eval()
