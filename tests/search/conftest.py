"""Fixtures shared by the search tests."""

from __future__ import annotations

import pytest
import torch

from gencraft.search.train import sample_training_data
from tests.search.test_search import PROMPT, small_llama


@pytest.fixture(scope="module")
def sampled():
    """24 samples of two prompts, 12 tokens at most (a sample cut there carries censored
    lower bounds), with the model and the prompts; one per module."""
    model = small_llama(0, vocab=6)
    prompts = [torch.tensor([PROMPT]), torch.tensor([[1, 2, 5, 3]])]
    rows = sample_training_data(
        model,
        None,
        prompts,
        samples_per_prompt=12,
        max_new_tokens=12,
        censored=True,
        progress=False,
    )
    return model, prompts, rows
