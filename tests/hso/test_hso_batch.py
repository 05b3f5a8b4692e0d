"""HSO over a batch: each row of ``hso_nll_batch`` equals ``hso_nll`` on that row
alone to within 1e-5 in float32, over drawn batch sizes, lengths, padding sides and settings;
a batched ``hso_prefill`` gives each prompt the states it gets alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.hso import HSOConfig, hso_nll, hso_nll_batch, hso_prefill

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _padded(rows: list[list[int]], left: list[bool]):
    width = max(map(len, rows))
    ids, mask = [], []
    for r, lft in zip(rows, left, strict=True):
        fill = [0] * (width - len(r))
        ids.append(fill + r if lft else r + fill)
        ones = [1] * len(r)
        mask.append([0] * len(fill) + ones if lft else ones + [0] * len(fill))
    return torch.tensor(ids), torch.tensor(mask)


@settings(max_examples=60, **SETTINGS)
@given(
    lengths=st.lists(st.integers(2, 14), min_size=1, max_size=4),
    left=st.lists(st.booleans(), min_size=4, max_size=4),
    window=st.integers(1, 5),
    steps=st.integers(1, 2),
    present_only=st.booleans(),
    optimizer=st.sampled_from(["adam", "sgd"]),
    max_context=st.sampled_from([None, 4]),
    reset_every=st.sampled_from([None, 6]),
    seed=st.integers(0, 10),
)
def test_each_row_of_hso_nll_batch_equals_hso_nll_alone(
    llama, lengths, left, window, steps, present_only, optimizer, max_context, reset_every, seed
):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, 200, (n,), generator=g).tolist() for n in lengths]
    ids, mask = _padded(rows, left[: len(rows)])
    cfg = HSOConfig(
        window=window,
        # the thesis's Adam rate: a far larger one turns float noise in a near-zero gradient
        # into a ±lr first step (Adam's first step is lr·sign(g)), beyond 1e-5
        lr=0.003 if optimizer == "adam" else 0.5,
        steps=steps,
        present_only=present_only,
        optimizer=optimizer,
        max_context=max_context,
        reset_every=reset_every,
    )
    batch = hso_nll_batch(llama, ids, mask, cfg)
    assert len(batch) == len(rows)
    for r, got in zip(rows, batch, strict=True):
        alone = hso_nll(llama, torch.tensor([r]), cfg)
        assert got.token_nll.shape == alone.token_nll.shape == (len(r) - 1,)
        assert torch.allclose(got.token_nll, alone.token_nll, atol=1e-5, rtol=0)
        assert got.windows == alone.windows


def test_the_rows_are_optimised_apart(llama):
    """HSO changes the NLL (lr > 0), and a row's NLL does not depend on what it is batched
    with: the same row beside two different partners gives the same numbers."""
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randint(3, 200, (n,), generator=g).tolist() for n in (12, 9, 12))
    cfg = HSOConfig(window=3)
    plain = hso_nll(llama, torch.tensor([a]), HSOConfig(window=3, lr=0.0))
    with_b = hso_nll_batch(llama, *_padded([a, b], [True, True]), cfg)[0]
    with_c = hso_nll_batch(llama, *_padded([a, c], [False, False]), cfg)[0]
    assert (with_b.token_nll - plain.token_nll).abs().max() > 1e-3
    assert torch.allclose(with_b.token_nll, with_c.token_nll, atol=1e-5, rtol=0)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_batched_prefill_places_each_prompts_states_as_alone(llama, optimizer):
    g = torch.Generator().manual_seed(2)
    # 5 tokens: its last window holds one input and two paddings (which must not score)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (7, 5, 9)]
    ids, mask = _padded(prompts, [True] * 3)
    cfg = HSOConfig(window=3, lr=0.05, optimizer=optimizer)
    cache = hso_prefill(llama, ids, cfg, attention_mask=mask)
    width = ids.shape[1] - 1
    for i, p in enumerate(prompts):
        alone = hso_prefill(llama, torch.tensor([p]), cfg)
        n = len(p) - 1
        for got, want in zip(cache.layers, alone.layers, strict=True):
            assert torch.allclose(got.keys[i, :, width - n :], want.keys[0], atol=1e-5)
            assert torch.allclose(got.values[i, :, width - n :], want.values[0], atol=1e-5)
            assert not got.keys[i, :, : width - n].any()  # padding holds no state
    with torch.no_grad():  # generate-style: the last prompt token on top of the states
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        out = llama(
            input_ids=ids[:, -1:],
            attention_mask=mask,
            position_ids=pos[:, -1:],
            past_key_values=cache,
        ).logits[:, -1]
        for i, p in enumerate(prompts):
            alone = llama(
                input_ids=torch.tensor([p[-1:]]),
                past_key_values=hso_prefill(llama, torch.tensor([p]), cfg),
            ).logits[0, -1]
            assert torch.allclose(out[i], alone, atol=1e-4)


def test_bad_batches_are_named(llama):
    with pytest.raises(GencraftError, match="padding between its tokens"):
        hso_nll_batch(llama, torch.tensor([[5, 6, 7]]), torch.tensor([[1, 0, 1]]))
    with pytest.raises(GencraftError, match="at least 2 tokens"):
        hso_nll_batch(llama, torch.tensor([[5, 6], [7, 8]]), torch.tensor([[1, 1], [0, 1]]))
    with pytest.raises(GencraftError, match="left-padded"):
        hso_prefill(llama, torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))


def test_hso_nll_batches_its_contexts(llama):
    """With reset_every the contexts are independent: batching them gives the same NLL."""
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(3))
    cfg = HSOConfig(window=4, reset_every=9)
    one = hso_nll(llama, ids, cfg)
    batched = hso_nll(llama, ids, cfg, batch_size=3)
    assert batched.token_nll.shape == one.token_nll.shape == (39,)
    assert torch.allclose(batched.token_nll, one.token_nll, atol=1e-5, rtol=0)
    assert batched.windows == one.windows


@pytest.mark.parametrize("method", ["baseline", "hso", "hso2"])
def test_few_shot_classification_of_a_batch_equals_each_prompt_alone(llama, method):
    from gencraft.hso import DynamicEvalConfig
    from gencraft.hso.fewshot import classify, classify_batch

    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 200, (1, n), generator=g) for n in (12, 7, 15, 9, 10)]
    labels = [5, 17, 40, 99]
    hso, de = HSOConfig(window=4, lr=0.5), DynamicEvalConfig()
    # a large lr: HSO moves the prediction, so the batched states must be the prompt's own
    alone = [classify(llama, p, labels, method, hso, de) for p in prompts]
    assert classify_batch(llama, prompts, labels, method, hso, de, batch_size=3) == alone
    if method == "hso":
        plain = [classify(llama, p, labels, "baseline", hso, de) for p in prompts]
        assert plain != alone  # the check can see a wrong state
