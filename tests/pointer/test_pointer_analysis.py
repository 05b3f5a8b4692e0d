"""``passage_view`` and ``head_passage_view`` against the model's own attention over one pass
from the start of the text: the gate, the window attention by distance back, the most attended
word, the modes they leave and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from gencraft.data import load_lm_corpus
from gencraft.models import load_model
from gencraft.pointer import PointerSentinelHead, PointerSentinelLSTM
from gencraft.pointer.analysis import (
    bucket_gains,
    frequency_buckets,
    head_passage_view,
    passage_shares,
    passage_view,
    plot_bucket_gains,
    plot_passage,
)


@pytest.fixture(scope="module")
def corpus(synthetic_lm_dir):
    return load_lm_corpus("ptb", synthetic_lm_dir)


def _model(corpus, window: int, pointer: bool = True) -> PointerSentinelLSTM:
    torch.manual_seed(0)
    return PointerSentinelLSTM.from_preset(
        "tiny", len(corpus.vocab), pointer=pointer, window=window
    )


def _by_distance(log_attn: torch.Tensor, first: int, length: int, window: int) -> torch.Tensor:
    """[length, window]: attention of positions ``first ..`` on the position d back, from
    ``log_attn`` [T, T] over absolute positions."""
    attn = log_attn.exp()
    ref = torch.zeros(length, window)
    for t in range(length):
        pos = first + t
        for d in range(min(window, pos + 1)):
            ref[t, d] = attn[pos, pos - d]
    return ref


def _check_top(view, words: list[str], first: int) -> None:
    for t, (word, d, mass) in enumerate(view.top):
        assert d == int(view.attention[t].argmax())
        assert word == words[first + t - d] and mass == pytest.approx(float(view.attention[t, d]))


@pytest.mark.parametrize(("start", "length", "window"), [(0, 6, 4), (2, 5, 6), (17, 9, 5)])
@pytest.mark.parametrize("training", [True, False])
def test_passage_view_is_one_pass_from_the_split_start(corpus, start, length, window, training):
    m = _model(corpus, window)
    ids = corpus["test"]
    m.eval()
    with torch.no_grad():
        out = m(
            ids[None, : start + length], ids[None, 1 : start + length + 1], return_attention=True
        )
    m.train(training)
    view = passage_view(m, corpus, "test", start, length)
    assert m.training is training
    words = corpus.vocab.decode(ids[: start + length + 1])
    assert view.inputs == words[start : start + length]
    assert view.targets == words[start + 1 : start + length + 1]
    torch.testing.assert_close(view.gate, out.gate[0, start:], atol=1e-6, rtol=1e-5)
    ref = _by_distance(out.log_attn[0], start, length, window)
    torch.testing.assert_close(view.attention, ref, atol=1e-6, rtol=1e-5)
    assert view.attention.shape == (length, window)
    _check_top(view, words, start)
    assert not view.gate.requires_grad and not view.attention.requires_grad


def test_passage_view_refusals(corpus):
    n = corpus["test"].numel()
    with pytest.raises(ValueError, match=r"^passage_view needs a pointer model$"):
        passage_view(_model(corpus, 3, pointer=False), corpus, "test", 0, 4)
    m = _model(corpus, 3)
    for start, length in ((-1, 4), (0, 0), (n - 4, 4)):
        with pytest.raises(
            ValueError, match=rf"^passage \[{start}, {start + length}\) lies outside test$"
        ):
            passage_view(m, corpus, "test", start, length)
    assert len(passage_view(m, corpus, "test", n - 5, 4).top) == 4  # the last full passage
    assert len(passage_view(m, corpus, "test", 3, 1).top) == 1  # one word is a passage


class _Tok:
    """Words of ``w<i>`` as ids i: a tokenizer whose pieces are easy to check."""

    def __call__(self, text, return_tensors):
        assert return_tensors == "pt"
        return {"input_ids": torch.tensor([[int(w[1:]) for w in text.split()]])}

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("max_tokens", [5, 12, 40, None])
def test_head_passage_view_is_the_heads_attention(training, max_tokens):
    base, _ = load_model("tiny-gpt2", seed=0)
    torch.manual_seed(0)
    # a trainable base follows the head's mode: its dropout (0.1) is on in training mode
    head = PointerSentinelHead(base, 4, base_name_or_path="tiny-gpt2", freeze_base=False).train(
        training
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 14, (45,), generator=g).tolist()
    text = " ".join(f"w{i}" for i in ids)
    if max_tokens is None:  # 40 by default
        view = head_passage_view(head, _Tok(), text)
    else:
        view = head_passage_view(head, _Tok(), text, max_tokens)
    assert head.training is training
    kept = ids[: max_tokens or 40]
    head.eval()
    with torch.no_grad():
        out = head(torch.tensor([kept]), return_attention=True)
    t = len(kept) - 1
    words = [f"w{i}" for i in kept]
    assert view.inputs == words[:-1] and view.targets == words[1:]
    torch.testing.assert_close(view.gate, out.gate[0, :t])
    torch.testing.assert_close(view.attention, _by_distance(out.log_attn[0], 0, t, 4))
    _check_top(view, words, 0)


def test_frequency_buckets_rank_by_count_ties_by_id():
    counts = [3, 9, 3, 0, 9, 1, 5]
    order = sorted(range(7), key=lambda i: (-counts[i], i))  # 1, 4, 6, 0, 2, 5, 3
    for n_buckets in (1, 2, 3, 7):
        want = [0] * 7
        for rank, i in enumerate(order):
            want[i] = rank * n_buckets // 7
        assert frequency_buckets(counts, n_buckets).tolist() == want


def test_bucket_gains_by_hand():
    g = torch.Generator().manual_seed(0)
    targets = torch.tensor([[0, 1, 2, 2], [1, 1, 0, 4]])
    base, ptr = torch.rand(2, 4, generator=g), torch.rand(2, 4, generator=g)
    buckets = torch.tensor([0, 2, 2, 1, 0])  # word 3 never occurs, bucket 1 has no token
    rows = bucket_gains(base, ptr, targets, buckets, n_buckets=3)
    assert [r["bucket"] for r in rows] == [1, 2, 3]
    for r in rows:
        sel = buckets[targets] == r["bucket"] - 1
        assert r["tokens"] == int(sel.sum())
        if r["tokens"]:
            assert r["nll_lstm"] == pytest.approx(float(base[sel].double().mean()))
            assert r["nll_pointer"] == pytest.approx(float(ptr[sel].double().mean()))
            assert r["gain"] == pytest.approx(r["nll_lstm"] - r["nll_pointer"])
        else:
            assert math.isnan(r["nll_lstm"]) and math.isnan(r["nll_pointer"])
    assert [r["tokens"] for r in rows] == [3, 0, 5]


def _png_size(path) -> tuple[int, int]:
    import struct

    head = path.read_bytes()[:24]
    assert head[:4] == b"\x89PNG"
    return struct.unpack(">II", head[16:24])


def test_a_plot_makes_its_folders_and_is_840_by_420_pixels(tmp_path):
    from gencraft.plotting import pyplot

    rows = [{"bucket": i + 1, "gain": 0.1 * i} for i in range(4)]
    assert _png_size(plot_bucket_gains(rows, tmp_path / "a" / "b" / "gain.png")) == (840, 420)
    assert not pyplot().get_fignums()  # the figure was closed


def _view(gate: list[float], attention: list[list[float]]):
    from gencraft.pointer.analysis import PassageView

    n = len(gate)
    words = [f"w{i}" for i in range(n + 1)]
    top = [(words[0], 0, 0.0)] * n
    return PassageView(words[:n], words[1:], torch.tensor(gate), torch.tensor(attention), top)


@pytest.mark.parametrize("max_distance", [None, 1, 2])
def test_passage_shares_are_the_pointers_own_distribution(max_distance):
    """Rows of a_i summing to 1 - g (the window's mass), one row with no mass in reach."""
    gate = [0.25, 0.9, 0.5, 1.0]
    attention = [[0.5, 0.25, 0.0], [0.05, 0.0, 0.05], [0.1, 0.1, 0.3], [0.0, 0.0, 0.0]]
    att, share = passage_shares(_view(gate, attention), max_distance)
    d = max_distance or 3
    for t, row in enumerate(attention):
        mass = sum(row[:d])
        want = [a / mass if mass else 0.0 for a in row[:d]]
        assert att[t].tolist() == pytest.approx(want, abs=1e-6)
    assert att.dtype == share.dtype == torch.float64
    assert share.tolist() == pytest.approx([0.75, 0.1, 0.5, 1e-12], rel=1e-6)


def test_the_passage_plot_grows_with_its_rows(tmp_path):
    """11 by 0.28 n + 1.8 inches at 120 dpi: a row of labels stays readable."""
    view = _view([0.5] * 10, [[0.5, 0.0, 0.0]] * 10)
    assert _png_size(plot_passage(view, tmp_path / "p.png", title="t")) == (1320, 552)
