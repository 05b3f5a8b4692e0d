"""``left_padded_batches``: every batched caller's one way to left-pad prompts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.models.prompts import left_padded_batches


class _Tok:
    pad_token_id = 0


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=6), min_size=1, max_size=9),
    size=st.integers(1, 4),
    as_tensor=st.booleans(),
)
def test_batches_keep_every_prompt_in_order_left_padded(prompts, size, as_tensor):
    given_prompts = [torch.tensor([p]) for p in prompts] if as_tensor else prompts
    seen = []
    for first, ids, mask in left_padded_batches(None, _Tok(), given_prompts, size):
        assert first == len(seen) and ids.shape == mask.shape and ids.shape[0] <= size
        for row, m in zip(ids.tolist(), mask.tolist(), strict=True):
            n = sum(m)
            assert m == [0] * (len(m) - n) + [1] * n  # padding on the left only
            assert row[: len(m) - n] == [0] * (len(m) - n)  # the tokenizer's pad id
            seen.append(row[len(m) - n :])
        assert ids.shape[1] == max(map(sum, mask.tolist()))  # as wide as its longest prompt
    assert seen == prompts


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(GencraftError, match="batch size must be >= 1, got 0"):
        next(left_padded_batches(None, _Tok(), [[1]], 0))
