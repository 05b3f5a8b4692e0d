"""``gencraft.pointer.evaluate``: the chunked, state-carrying evaluation against one call per
stream (the model's own definition of a pass), its counts, bar, modes and refusals."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from recording_bar import RecordingBar

from gencraft.errors import GencraftError
from gencraft.pointer import PointerSentinelLSTM
from gencraft.training import batchify

# the package re-exports the function `evaluate` under the module's name
pe = importlib.import_module("gencraft.pointer.evaluate")
V = 23


def _model(pointer: bool, window: int) -> PointerSentinelLSTM:
    torch.manual_seed(0)
    return PointerSentinelLSTM.from_preset("tiny", V, pointer=pointer, window=window)


def _ids(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g)


def _reference(m: PointerSentinelLSTM, ids: torch.Tensor, b: int) -> list[torch.Tensor]:
    """Each stream of ``batchify(ids, b)`` alone, in one call (the window inside the call):
    its per-token NLL [n] and gate [n] (or None)."""
    m.eval()
    out = []
    with torch.no_grad():
        for row in batchify(ids, b):
            step = m(row[None, :-1], row[None, 1:])
            out.append((step.nll[0], None if step.gate is None else step.gate[0]))
    return out


@pytest.mark.parametrize("pointer", [True, False])
@given(
    b=st.integers(1, 4),
    bptt=st.integers(1, 13),
    window=st.integers(1, 7),
    n=st.integers(24, 60),
    seed=st.integers(0, 3),
)
@settings(max_examples=12, deadline=None)
def test_chunked_evaluation_is_each_stream_in_one_call(pointer, b, bptt, window, n, seed):
    m = _model(pointer, window)
    ids = _ids(n, seed)
    got = pe.evaluate(m, ids, batch_size=b, bptt=bptt, return_details=True)
    ref = _reference(m, ids, b)
    steps = n // b - 1
    assert got["tokens"] == steps * b
    assert got["token_nll"].shape == got["targets"].shape == (b, steps)
    assert torch.equal(got["targets"], batchify(ids, b)[:, 1:])
    for r, (nll, gate) in enumerate(ref):
        torch.testing.assert_close(got["token_nll"][r], nll, atol=1e-5, rtol=1e-5)
        if pointer:
            torch.testing.assert_close(got["gate"][r], gate, atol=1e-6, rtol=1e-5)
    if not pointer:
        assert got["gate"] is None
    total = sum(float(nll.double().sum()) for nll, _ in ref)
    assert math.isclose(got["nll"], total, rel_tol=1e-6)
    assert math.isclose(got["ppl"], math.exp(got["nll"] / got["tokens"]), rel_tol=1e-12)


def test_the_window_reaches_across_chunks():
    """A pointer model whose window spans chunks: dropping the carried memory changes the
    scores of each chunk's first positions, so the reference above does test the carry."""
    m = _model(True, 6)
    ids = _ids(48, 1)
    got = pe.evaluate(m, ids, batch_size=2, bptt=5, return_details=True)["token_nll"]
    m.eval()
    alone = []
    with torch.no_grad():
        data = batchify(ids, 2)
        state = None
        n = data.shape[1] - 1
        for s in range(0, n, 5):
            e = min(s + 5, n)
            step = m(data[:, s:e], data[:, s + 1 : e + 1], state)
            state = step.state
            alone.append(step.nll)
    alone = torch.cat(alone, 1)
    assert not torch.allclose(got[:, 5:6], alone[:, 5:6], atol=1e-4)
    torch.testing.assert_close(got[:, :5], alone[:, :5], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_scores_in_eval_mode_without_gradients_and_restores_the_mode(training):
    m = _model(True, 4)
    ids = _ids(40, 2)
    ref = _reference(m, ids, 2)
    m.train(training)
    got = pe.evaluate(m, ids, batch_size=2, bptt=6, return_details=True)
    assert m.training is training
    for r, (nll, _) in enumerate(ref):  # dropout and zoneout off while scoring
        torch.testing.assert_close(got["token_nll"][r], nll, atol=1e-5, rtol=1e-5)
    assert not got["token_nll"].requires_grad and not got["gate"].requires_grad
    assert all(p.grad is None for p in m.parameters())


@pytest.mark.parametrize(("n", "b", "bptt", "chunks"), [(40, 2, 6, 4), (40, 4, 3, 3), (9, 3, 9, 1)])
@pytest.mark.parametrize("progress", [True, False])
def test_the_bar_counts_chunks_under_its_name(monkeypatch, n, b, bptt, chunks, progress):
    monkeypatch.setattr(pe, "tqdm", RecordingBar.reset())
    pe.evaluate(_model(True, 3), _ids(n, 0), batch_size=b, bptt=bptt, progress=progress, desc="va")
    (bar,) = RecordingBar.made
    assert bar.kw == dict(total=chunks, desc="va", disable=not progress, leave=False, unit="chunk")
    assert bar.updates == chunks and bar.closed


def test_sharded_on_one_process_is_the_plain_pass():
    m = _model(True, 5)
    ids = _ids(50, 3)
    a = pe.evaluate(m, ids, batch_size=3, bptt=4)
    b = pe.evaluate(m, ids, batch_size=3, bptt=4, shard=True)
    assert a == b


def test_too_few_tokens_name_the_split_and_the_flag():
    m = _model(True, 3)
    want = "the dev split: 5 tokens are too few for 3 streams of at least 2 tokens; lower --bs"
    with pytest.raises(GencraftError, match=want):
        pe.evaluate(m, _ids(5, 0), batch_size=3, desc="dev", flag="--bs")
    with pytest.raises(GencraftError, match=r"the eval split: .*; lower --batch-size"):
        pe.evaluate(m, _ids(5, 0), batch_size=3)


def test_detach_state():
    assert pe.detach_state(None) is None
    h = torch.ones(2, requires_grad=True) * 2
    out = pe.detach_state((h, h + 1))
    assert isinstance(out, tuple) and len(out) == 2
    assert not out[0].requires_grad and torch.equal(out[1], h.detach() + 1)


def test_defaults_ten_streams_chunks_of_100_no_bar(monkeypatch):
    monkeypatch.setattr(pe, "tqdm", RecordingBar.reset())
    got = pe.evaluate(_model(True, 3), _ids(2030, 0))
    (bar,) = RecordingBar.made
    assert got["tokens"] == 202 * 10  # 10 streams of 203 tokens
    assert bar.kw == dict(total=3, desc="eval", disable=True, leave=False, unit="chunk")


def test_the_total_is_summed_in_float64():
    """Many one-token chunks: a float32 running sum would drift from the per-token sum."""
    got = pe.evaluate(_model(True, 3), _ids(600, 4), batch_size=2, bptt=1, return_details=True)
    assert math.isclose(got["nll"], float(got["token_nll"].double().sum()), rel_tol=1e-12)


def test_a_process_without_streams_runs_no_chunk():
    """Sharded over more processes than streams, a process may get none: no model call."""
    m = _model(True, 3)
    calls = []
    m.register_forward_hook(lambda *a: calls.append(1))
    bar = RecordingBar()
    run = pe._run_streams(m, batchify(_ids(40, 0), 2)[:0], 4, bar, True)
    assert run.row_nll.shape == (0,) and run.row_nll.dtype == torch.float64
    assert bar.updates == 0 and not calls and not run.nlls
