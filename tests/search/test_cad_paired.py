"""CAD by paired rows (``gencraft.models.cad``), the route of models whose own
``generate`` must run (prefix models): greedy equals the brute-force loop of full forward
passes over both streams on each row, and greedy and beam search equal
``generate(custom_generate=context_aware)`` on the same rows, for causal and
encoder-decoder models, fixed and adaptive α, padded context and context-free inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.models.cad import CADSettings, PairedContrast, paired_contrast_generate
from gencraft.search.custom_generate import context_aware
from tests.search.test_batch import SETTINGS, V, _batch, _model
from tests.search.test_cad import EOS, _greedy_reference, prompt

# context-free inputs as long as or longer than the context ones: the pairing pads both
plain = st.lists(st.integers(3, V - 1), min_size=1, max_size=8)


def _inputs(kind, rows):
    left = kind != "bart"
    ids, mask = _batch([r[0] for r in rows], left=left)
    neg, neg_mask = _batch([r[1] for r in rows], left=left)
    return left, (ids, mask, neg, neg_mask)


@settings(max_examples=15, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "peaked-llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    rows=st.lists(st.tuples(prompt, plain), min_size=1, max_size=3),
    alpha=st.integers(0, 8).map(lambda i: i / 4),
    adaptive=st.booleans(),
    new=st.integers(1, 6),
)
def test_paired_greedy_cad_equals_a_brute_force_loop_on_each_row(
    kind, seed, rows, alpha, adaptive, new
):
    model = _model(kind, seed)
    model.generation_config.eos_token_id = EOS
    left, inputs = _inputs(kind, rows)
    out = paired_contrast_generate(
        model.generate,
        *inputs,
        cad=CADSettings(alpha, adaptive),
        left_padding=left,
        pad_token_id=0,
        max_new_tokens=new,
        do_sample=False,
    )
    start = 1 if kind == "bart" else inputs[0].shape[1]
    assert out.shape[0] == len(rows)
    if left:  # the prompt as given, without the pairing's padding
        assert torch.equal(out[:, :start], inputs[0])
    for r, (ctx, plain) in enumerate(rows):
        want, _ = _greedy_reference(model, ctx, plain, alpha, adaptive, new)
        got = out[r, start:].tolist()
        assert got[: len(want)] == want and set(got[len(want) :]) <= {0}


@settings(max_examples=15, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    rows=st.lists(st.tuples(prompt, plain), min_size=1, max_size=3),
    alpha=st.integers(0, 8).map(lambda i: i / 4),
    adaptive=st.booleans(),
    beams=st.integers(1, 4),
    new=st.integers(1, 5),
)
def test_paired_cad_equals_context_aware(kind, seed, rows, alpha, adaptive, beams, new):
    """The two routes of CAD decode the same rows alike, greedy and beam search."""
    model = _model(kind, seed)
    model.generation_config.eos_token_id = EOS
    left, (ids, mask, neg, neg_mask) = _inputs(kind, rows)
    kw = dict(max_new_tokens=new, num_beams=beams, do_sample=False, pad_token_id=0)
    cad = CADSettings(alpha, adaptive)
    ours = paired_contrast_generate(
        model.generate, ids, mask, neg, neg_mask, cad=cad, left_padding=left, **kw
    )
    theirs = model.generate(
        input_ids=ids,
        attention_mask=mask,
        negative_input_ids=neg,
        negative_attention_mask=neg_mask,
        custom_generate=context_aware,
        cad_alpha=alpha,
        cad_adaptive=adaptive,
        **kw,
    )
    assert ours.tolist() == theirs.tolist()


def test_paired_contrast_refusals():
    model = _model("llama", 0)
    ids, mask = torch.tensor([[3, 4]]), torch.ones(1, 2, dtype=torch.long)
    kw = dict(left_padding=True, pad_token_id=0, max_new_tokens=2)
    with pytest.raises(
        GencraftError,
        match=r"^CAD by paired rows decodes greedily or with beam search: sampling would draw "
        r"the two copies of an input apart$",
    ):
        paired_contrast_generate(model.generate, ids, mask, ids, mask, do_sample=True, **kw)
    with pytest.raises(GencraftError, match=r"^CAD by paired rows returns token ids, not gen"):
        paired_contrast_generate(
            model.generate, ids, mask, ids, mask, return_dict_in_generate=True, **kw
        )
    with pytest.raises(GencraftError, match="2 context-free inputs for 1 inputs"):
        two = torch.tensor([[3], [4]])
        paired_contrast_generate(model.generate, ids, mask, two, torch.ones_like(two), **kw)
    with pytest.raises(GencraftError, match="cad alpha takes a finite weight A >= 0"):
        PairedContrast(CADSettings(-0.5))
    with pytest.raises(
        GencraftError, match=r"^CAD takes a CADSettings\(alpha, adaptive\), got 0.5"
    ):
        PairedContrast(0.5)
    with pytest.raises(GencraftError, match=r"an even number of rows, got 3$"):
        PairedContrast()(ids, torch.zeros(3, 5))
    assert PairedContrast().cad == CADSettings(0.5, False)  # CAD's usual α


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_processor_gives_both_halves_the_contrast_by_its_definition(adaptive):
    """Scores [2N, V] (some ruled out) against (1 + α)·a − α·b renormalised, computed in
    float64 from the definitions (α: the JSD of a and b in bits when adaptive)."""
    import math

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 7, generator=g) * 3
    scores[1, 2] = scores[4, 5] = -float("inf")  # ruled out in a context row and a free row
    got = PairedContrast(CADSettings(0.75, adaptive))(None, scores)
    assert torch.equal(got[:3], got[3:])
    half = PairedContrast(CADSettings(0.75, adaptive))(None, scores.bfloat16())
    assert half.dtype == torch.bfloat16  # generate's scores keep their dtype
    lp = torch.log_softmax(scores.double(), -1)
    for r in range(3):
        a, b = lp[r], lp[r + 3].clamp_min(-1e4)
        alpha = 0.75
        if adaptive:
            pa, pb = lp[r].exp(), lp[r + 3].exp()
            m = (pa + pb) / 2
            kl = [
                sum(float(x * math.log(x / y)) for x, y in zip(p, m, strict=True) if x > 0)
                for p in (pa, pb)
            ]
            alpha = (kl[0] + kl[1]) / 2 / math.log(2)
        want = torch.log_softmax((1 + alpha) * a - alpha * b, -1)
        torch.testing.assert_close(got[r].double(), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("left", [True, False])
def test_the_pairing_pads_both_halves_on_the_models_side(left):
    """The doubled batch generate receives (a spy that returns its input ids, as a decoder-only
    generate starts its output with the prompt)."""
    seen = {}

    def spy(**kw):
        seen.update(kw)
        return kw["input_ids"].repeat_interleave(kw.get("num_return_sequences", 1), 0)

    ids, neg = torch.tensor([[3, 4], [5, 6]]), torch.tensor([[7, 8, 9], [10, 11, 12]])
    mask = torch.tensor([[1, 1], [0, 1]])
    out = paired_contrast_generate(
        spy,
        ids,
        mask,
        neg,
        torch.ones_like(neg),
        left_padding=left,
        pad_token_id=0,
        logits_processor=[42],
        num_beams=2,
    )
    pad = [[0, 3, 4], [0, 5, 6]] if left else [[3, 4, 0], [5, 6, 0]]
    assert seen["input_ids"].tolist() == [*pad, [7, 8, 9], [10, 11, 12]]
    m = [[0, 1, 1], [0, 0, 1]] if left else [[1, 1, 0], [0, 1, 0]]
    assert seen["attention_mask"].tolist() == [*m, [1, 1, 1], [1, 1, 1]]
    first, last = seen["logits_processor"]
    assert first == 42 and isinstance(last, PairedContrast)  # after generate's own
    assert last.cad == CADSettings(0.5, False)  # CAD's usual α by default
    assert seen["num_beams"] == 2 and seen["pad_token_id"] == 0
    assert out.tolist() == (ids.tolist() if left else pad)
    out = paired_contrast_generate(
        spy,
        ids,
        mask,
        neg,
        torch.ones_like(neg),
        left_padding=left,
        pad_token_id=0,
        cad=CADSettings(0.25, True),
        num_return_sequences=3,
    )
    assert seen["logits_processor"][-1].cad == CADSettings(0.25, True)
    want = torch.tensor(ids.tolist() if left else pad).repeat_interleave(3, 0)
    assert out.tolist() == want.tolist()  # each input's 3 sequences, the context rows only
