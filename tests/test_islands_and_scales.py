"""Float32 islands against a float64 reference in bfloat16 and float16, the plot scale rules
on drawn arrays, and progress lines in logs: each over drawn cases, so a whole
family of bugs is guarded, not one hand-picked case."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

HALF = st.sampled_from([torch.bfloat16, torch.float16])
FAST = settings(max_examples=25, deadline=None)


@FAST
@given(
    dtype=HALF,
    b=st.integers(1, 3),
    v=st.integers(2, 40),
    window=st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
def test_pointer_mixture_log_softmax_is_float32_for_half_inputs(dtype, b, v, window, seed):
    from gencraft.pointer.functional import pointer_sentinel_log_probs

    g = torch.Generator().manual_seed(seed)
    h = 8
    logits = (torch.randn(b, v, generator=g) * 6).to(dtype)  # peaked: half rounding shows
    query = torch.randn(b, h, generator=g).tanh().to(dtype)
    states = torch.randn(b, window, h, generator=g).to(dtype)
    ids = torch.randint(0, v, (b, window), generator=g)
    sentinel = torch.randn(h, generator=g).to(dtype)
    got, gate = pointer_sentinel_log_probs(logits, query, states, ids, sentinel)
    want, want_gate = pointer_sentinel_log_probs(
        logits.double(), query.double(), states.double(), ids, sentinel.double()
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(gate.double(), want_gate, atol=2e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def nar_models():
    from gencraft.nar import load_mlm_seq2seq

    return {
        d: load_mlm_seq2seq("tiny-bert", seed=3, max_target_length=24)[0].to(d).eval()
        for d in (torch.bfloat16, torch.float16)
    }


@FAST
@given(dtype=HALF, n=st.integers(1, 3), length=st.integers(2, 10), k=st.integers(1, 5))
def test_nar_length_candidates_are_float32_log_probabilities(nar_models, dtype, n, length, k):
    from gencraft.nar.decoding import length_candidates

    model = nar_models[dtype]
    enc = torch.randn(n, length, model.config.encoder.hidden_size).to(dtype) * 4
    mask = torch.ones(n, length, dtype=torch.long)
    idx, lp = length_candidates(model, enc, mask, k)
    ref = model.length_logits(enc, mask).double().log_softmax(-1)
    assert lp.dtype == torch.float32 and bool((idx > 0).all())
    torch.testing.assert_close(lp.double(), ref.gather(1, idx), atol=2e-5, rtol=1e-5)


@FAST
@given(dtype=HALF, t=st.integers(2, 8), seed=st.integers(0, 2**16))
def test_recurrence_window_nll_is_float32(dtype, t, seed):
    from gencraft.models import load_model
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM

    base, _ = load_model("tiny-llama", seed=0, dtype=dtype)
    model = RecurrentLM(base, RecurrenceConfig(window=8)).eval()
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, base.config.vocab_size, (2, t), generator=g)
    targets = torch.randint(0, base.config.vocab_size, (2, t - 1), generator=g)
    with torch.no_grad():
        total, _, nll = model._window(x, None, targets, 0, "nll", model.config.stride)
        logits = model.base(input_ids=x).logits[:, : t - 1]
    ref = torch.nn.functional.cross_entropy(
        logits.double().flatten(0, 1), targets.flatten(), reduction="none"
    ).view_as(targets)
    assert nll.dtype == torch.float32 and total.dtype == torch.float32
    torch.testing.assert_close(nll.double(), ref, atol=1e-4, rtol=1e-5)


@FAST
@given(dtype=HALF, b=st.integers(1, 3), t=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_the_pointer_lstm_stays_float32_in_a_half_model(dtype, b, t, seed):
    from gencraft.pointer.rnn import ZoneoutLSTM

    torch.manual_seed(seed)
    lstm = ZoneoutLSTM(6, 10, 2, zoneout_c=0.1, zoneout_h=0.1).eval()
    ref = ZoneoutLSTM(6, 10, 2, zoneout_c=0.1, zoneout_h=0.1).eval()
    ref.load_state_dict(lstm.state_dict())
    lstm.to(dtype)  # a cast of the model leaves the recurrence in float32
    assert all(p.dtype == torch.float32 for p in lstm.parameters())
    x = torch.randn(b, t, 6).to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast does not reach it either
        out, (h, _), _ = lstm(x)
    want, (h64, _), _ = ref.double()(x.double())
    assert out.dtype == dtype and h.dtype == torch.float32
    torch.testing.assert_close(h.double(), h64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)  # one half rounding


def test_the_pointer_trainer_runs_in_bf16_mixed_precision(tmp_path, capsys):
    from gencraft.cli.main import main

    data = tmp_path / "corpus.txt"
    data.write_text("\n".join("the cat sat on the mat number " + str(i % 7) for i in range(60)))
    argv = ["pointer", "train", "--corpus", str(data), "--preset", "tiny", "--max-steps", "2"]
    argv += ["--batch-size", "2", "--bptt", "8", "--mixed-precision", "bf16"]
    assert main([*argv, "--output", str(tmp_path / "r"), "--quiet"]) == 0


# -- plot scale rules -------------------------------------------------------------------------
VALUES = arrays(
    np.float64,
    st.tuples(st.integers(1, 5), st.integers(1, 5)),
    elements=st.one_of(
        st.just(0.0),
        st.floats(1e-9, 1.0, allow_subnormal=False),
        st.floats(-1.0, 1.0, allow_subnormal=False),
    ),
)


@settings(max_examples=60, deadline=None)
@given(values=VALUES)
@example(values=np.array([[0.0, 2.2250738585072014e-308]]))  # CI drew it: the bar went ±0.1
@example(values=np.full((2, 3), 1e6))  # constant
@example(values=np.full((1, 2), 0.5))
@example(values=np.array([[1.0, 100.0]]))  # exactly two decades: linear
@example(values=np.array([[1.0, 100.5], [0.0, 0.0]]))  # just past: log, zeros at the floor
@example(values=np.array([[0.0, 1.5e-9]]))  # narrow but drawable: the data's own range
@example(values=np.array([[1e6, 1e6 + 1e-4]]))  # below resolution for its size: widened
def test_heatmap_scale_follows_the_documented_rules(values):
    from matplotlib.colors import LogNorm

    from gencraft.plotting import heatmap, pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    try:
        image = heatmap(fig, ax, values, "p")
    finally:
        plt.close(fig)
    positive = values[values > 0]
    log = positive.size > 0 and values.min() >= 0 and positive.max() > 100 * positive.min()
    assert isinstance(image.norm, LogNorm) == log
    if log:  # about two decades switch it on; the floor four decades below the largest
        floor = max(positive.min(), positive.max() * 1e-4)
        assert image.norm.vmin == pytest.approx(floor)
        assert image.norm.vmax == pytest.approx(positive.max())
        # cells below the floor (zeros included) are drawn at it, not as masked or "under"
        assert np.asarray(image.get_array()).min() == pytest.approx(floor)
    else:
        # the range drawn holds every value; it is the data's own unless too narrow to draw
        assert image.norm.vmin <= values.min() and image.norm.vmax >= values.max()
        assert image.norm.vmax > image.norm.vmin
        if values.max() - values.min() > 1e-9 * max(1.0, np.abs(values).max()):
            assert image.norm.vmin == pytest.approx(values.min())
            assert image.norm.vmax == pytest.approx(values.max())
        else:  # constant: widened about the middle by max(10%, 0.1) each way
            mid = (values.min() + values.max()) / 2
            half = max(0.1 * abs(mid), 0.1)
            assert image.norm.vmin == pytest.approx(mid - half)
            assert image.norm.vmax == pytest.approx(mid + half)
    label = image.colorbar.ax.get_ylabel()  # says which scale the reader is looking at
    assert label == ("p (log scale)" if log else "p")
    # one flat cell per value (no smoothing across attention cells), filling the axes
    assert image.get_interpolation() == "nearest" and image.get_cmap().name == "viridis"
    assert ax.get_aspect() == "auto"


def test_a_heatmap_of_missing_values_is_drawn_not_nan():
    from gencraft.plotting import heatmap, pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    try:
        image = heatmap(fig, ax, np.full((2, 2), np.nan), "p")
    finally:
        plt.close(fig)
    assert (image.norm.vmin, image.norm.vmax) == pytest.approx((-0.1, 0.1))


# -- progress lines in logs -------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(seconds=st.floats(0.001, 1e4).map(lambda s: round(s, 3)))
def test_a_fractional_progress_period_is_honoured(seconds):
    import os

    from gencraft.progress import tqdm

    old = os.environ.get("GENCRAFT_PROGRESS_SECONDS")
    os.environ["GENCRAFT_PROGRESS_SECONDS"] = str(seconds)
    try:
        bar = tqdm(total=1, file=io.StringIO())
        assert bar.mininterval == seconds
        bar.close()
    finally:
        if old is None:
            os.environ.pop("GENCRAFT_PROGRESS_SECONDS")
        else:
            os.environ["GENCRAFT_PROGRESS_SECONDS"] = old


def test_postfix_updates_do_not_redraw_a_plain_bar(monkeypatch):
    from gencraft.progress import tqdm

    monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", "1000")
    out = io.StringIO()
    bar = tqdm(total=200, file=out, desc="train")
    for i in range(200):
        bar.set_postfix(loss=i)
        bar.set_description("train")
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) <= 2 and "200/200" in lines[-1] and "loss=199" in lines[-1]


def test_transformers_loading_bars_are_off(tmp_path, capfd, monkeypatch):
    from gencraft.models import load_model

    model, tok = load_model("tiny-llama")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    capfd.readouterr()
    load_model(str(tmp_path / "m"))
    assert "Loading weights" not in capfd.readouterr().err
    monkeypatch.setenv("GENCRAFT_HF_PROGRESS", "1")  # asked for: shown
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    load_model(str(tmp_path / "m"))
    assert "Loading weights" in capfd.readouterr().err
