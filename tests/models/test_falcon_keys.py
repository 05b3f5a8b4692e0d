"""Falcon's fused ``query_key_value`` in its three layouts (grouped, multi-query, per head
interleaved), from the release where Falcon attends through transformers' attention-function
registry (5.25): ``project_key_value`` equals the keys and values the module itself computes
(at position 0 rotary embeddings are the identity). Part of the compatibility tests, so it
runs on the newest release; on a release where Falcon computes attention inline, it skips."""

from __future__ import annotations

import pytest
import torch
from test_attention import projected_and_own_keys

LAYOUTS = {
    "multi-query": {"multi_query": True, "new_decoder_architecture": False},
    "per head": {"multi_query": False, "new_decoder_architecture": False},
    "grouped": {"new_decoder_architecture": True, "num_kv_heads": 2},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_project_key_value_equals_falcons_own_keys(layout):
    import inspect
    import sys

    from transformers import FalconConfig, FalconForCausalLM

    if "ALL_ATTENTION_FUNCTIONS" not in inspect.getsource(
        sys.modules[FalconForCausalLM.__module__]
    ):
        pytest.skip("this release's Falcon computes attention inline (before 5.25)")
    torch.manual_seed(0)
    config = FalconConfig(
        vocab_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        alibi=False,
        **LAYOUTS[layout],
    )
    model = FalconForCausalLM(config).eval()
    model.config._attn_implementation = "eager"
    (k, v), seen = projected_and_own_keys(model)
    kv_heads = 1 if layout == "multi-query" else (2 if layout == "grouped" else 4)
    assert k.shape == (1, kv_heads, 1, 8)
    torch.testing.assert_close(k, seen["key"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, seen["value"], atol=1e-5, rtol=1e-5)
