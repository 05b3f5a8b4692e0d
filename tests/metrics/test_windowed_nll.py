"""Overlap evaluation (thesis §2.3): the schedule of the thesis's example, and per-target NLL
against a loop reference that re-runs each target's context on its own."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import ConfigError
from gencraft.metrics import window_schedule, windowed_nll
from gencraft.models import load_model


def test_schedule_is_the_thesis_example():
    # T = 10, o = 3: inputs t1:10, t8:17, t15:24 score t2:11, t12:18, t19:25 (1-indexed)
    got = [
        (w.start + 1, w.start + (w.end - w.start), w.first + 1, w.end + 1)
        for w in window_schedule(25, 10, 3)
    ]
    assert got[:3] == [(1, 10, 2, 11), (8, 17, 12, 18), (15, 24, 19, 25)]
    for n, t, o in [(25, 10, 3), (40, 7, 0), (40, 7, 6), (3, 5, 2)]:
        scored = [j for w in window_schedule(n, t, o) for j in range(w.first, w.end + 1)]
        assert scored == list(range(1, n))  # every target once, in order


def test_windowed_nll_equals_a_loop_reference():
    model, _ = load_model("tiny-llama", seed=0)
    model.eval()
    ids = torch.randint(3, 200, (1, 23), generator=torch.Generator().manual_seed(0))
    for window, overlap in [(6, 0), (6, 2), (6, 5), (30, 0)]:
        got = windowed_nll(model, ids, window=window, overlap=overlap)
        stride = window - overlap
        want = []
        for j in range(1, ids.shape[1]):
            n = 0  # the first window (inputs ids[n*stride : n*stride + window]) predicting j
            while not n * stride + 1 <= j <= n * stride + window:
                n += 1
            with torch.no_grad():
                logits = model(input_ids=ids[:, n * stride : j]).logits[0, -1]
            want.append(-torch.log_softmax(logits.float(), -1)[ids[0, j]])
        torch.testing.assert_close(got, torch.stack(want), rtol=1e-4, atol=1e-5)
    # overlap changes the context: disjoint windows lose it at each boundary
    assert not torch.allclose(
        windowed_nll(model, ids, window=6, overlap=0), windowed_nll(model, ids, window=6, overlap=5)
    )


@pytest.mark.parametrize(
    ("n", "window", "overlap", "message"),
    [
        (10, 0, 0, "window must be >= 1"),
        (10, 4, 4, "overlap must be in"),
        (10, 4, -1, "overlap must be in"),
        (1, 4, 0, "at least 2 tokens"),
    ],
)
def test_bad_input_names_the_problem(n, window, overlap, message):
    with pytest.raises(ConfigError, match=message):
        window_schedule(n, window, overlap)


def test_ids_shape_is_checked():
    model, _ = load_model("tiny-llama", seed=0)
    with pytest.raises(ConfigError, match=r"\[1, N\] or \[N\]"):
        windowed_nll(model, torch.zeros(2, 5, dtype=torch.long), window=4)


@pytest.mark.parametrize("batch_size", [2, 3, 8])
@pytest.mark.parametrize(("window", "overlap"), [(5, 0), (6, 2), (4, 3)])
def test_batched_windows_equal_one_window_at_a_time(batch_size, window, overlap):
    """A plain LM's windows are independent: scoring several per forward (the last, shorter
    window in its own group) gives the same NLL as one at a time."""
    from gencraft.models import load_model

    model, _ = load_model("tiny-llama", seed=0)
    ids = torch.randint(3, 200, (1, 23), generator=torch.Generator().manual_seed(1))
    one = windowed_nll(model, ids, window=window, overlap=overlap)
    batched = windowed_nll(model, ids, window=window, overlap=overlap, batch_size=batch_size)
    assert torch.allclose(batched, one, atol=1e-5, rtol=0)


# -- mutmut's survivors in gencraft/metrics/lm.py (docs/core.md, "The automatic tool") -------
class _Recording(torch.nn.Module):
    """A WindowedScorer that records what windowed_nll hands it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def windowed_token_nll(self, ids, *, window, overlap):
        self.calls.append((ids, window, overlap))
        return torch.zeros(ids.shape[-1] - 1)


def test_a_windowed_scorer_gets_the_text_window_and_overlap_after_the_same_checks():
    model, ids = _Recording(), torch.arange(12)[None]
    out = windowed_nll(model, ids, window=5, overlap=2)
    assert out.shape == (11,) and len(model.calls) == 1
    got_ids, window, overlap = model.calls[0]
    assert torch.equal(got_ids, ids) and (window, overlap) == (5, 2)
    with pytest.raises(ConfigError, match="overlap must be in"):
        windowed_nll(model, ids, window=5, overlap=5)  # the schedule's checks apply first
    with pytest.raises(ConfigError, match="at least 2 tokens"):
        windowed_nll(model, ids[:, :1], window=5)
    assert len(model.calls) == 1


def test_defaults_are_disjoint_windows_and_the_smallest_legal_values_pass():
    import math

    from gencraft.metrics.lm import causal_lm_nll, perplexity, stream_perplexities

    model, _ = load_model("tiny-llama", seed=0)
    model.eval()
    ids = torch.randint(3, 200, (1, 13), generator=torch.Generator().manual_seed(1))
    assert torch.equal(
        windowed_nll(model, ids, window=4), windowed_nll(model, ids, window=4, overlap=0)
    )
    assert window_schedule(3, 1, 0)  # a window of one token is legal
    # exactly the model's positions in one window: scored, not refused
    n = model.config.max_position_embeddings
    long = torch.randint(3, 200, (n + 1,), generator=torch.Generator().manual_seed(2))
    assert windowed_nll(model, long, window=n + 50).shape == (n,)
    with pytest.raises(ValueError, match="stride"):
        causal_lm_nll(model, ids[0], max_length=8, stride=0, progress=False)
    assert perplexity(0.0, 1) == 1.0  # one token, zero loss
    assert perplexity(math.log(3.0), 1) == pytest.approx(3.0)
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="non-negative number"):
            perplexity(bad, 2)
    one = stream_perplexities(torch.tensor([math.log(2.0)]), words=1, seconds=0.5)
    assert one["tokens"] == 1 and one["words"] == 1 and one["token ppl"] == pytest.approx(2.0)
    assert one["seconds"] == 0.5 and one["ms/token"] == pytest.approx(500.0)


# -- drawn schedules and batches ----------------------------------------------------
_LLAMA: dict = {}


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(2, 24),
    window=st.integers(1, 9),
    overlap_share=st.floats(0, 1, allow_subnormal=False),
    batch_size=st.integers(1, 9),
    seed=st.integers(0, 5),
)
def test_each_target_of_a_drawn_schedule_and_batch_is_scored_by_its_own_window(
    n, window, overlap_share, batch_size, seed
):
    """Every target j gets -log p(ids[j] | its window's inputs before j), whatever the length,
    window, overlap and number of windows per forward (windows of two lengths in one chunk
    included); checked against one forward per target."""
    if "m" not in _LLAMA:
        _LLAMA["m"] = load_model("tiny-llama", seed=0)[0].eval()
    model = _LLAMA["m"]
    overlap = min(window - 1, int(overlap_share * window))
    ids = torch.randint(3, 200, (1, n), generator=torch.Generator().manual_seed(seed))
    got = windowed_nll(model, ids, window=window, overlap=overlap, batch_size=batch_size)
    want = torch.empty(n - 1)
    for w in window_schedule(n, window, overlap):
        for j in range(w.first, w.end + 1):
            with torch.no_grad():
                logits = model(input_ids=ids[:, w.start : j]).logits[0, -1]
            want[j - 1] = -torch.log_softmax(logits.float(), -1)[ids[0, j]]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("n", "window", "ok"), [(600, 512, True), (600, 513, False), (513, 600, True)]
)
def test_a_window_longer_than_the_models_positions_is_refused_before_any_pass(n, window, ok):
    """GPT-2's 512 learned positions: a pass of 512 tokens is scored; one of 513 is refused in
    one line naming the model and the setting, before any forward. A text of 513 tokens needs
    passes of 512 at most, whatever the window."""
    model, _ = load_model("tiny-gpt2", seed=0)
    ids = torch.randint(5, 200, (n,), generator=torch.Generator().manual_seed(0))
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        if ok:
            assert windowed_nll(model, ids, window=window).shape == (n - 1,)
            assert calls
        else:
            msg = (
                "GPT2LMHeadModel has 512 positions, fewer than the 513 tokens one pass would "
                "take; set window <= 512"
            )
            with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
                windowed_nll(model, ids, window=window)
            assert calls == []
    finally:
        hook.remove()
