"""CAD by paired rows (``gencraft.models.contrast``), the route of models whose own
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
from gencraft.models.contrast import PairedContrast, paired_contrast_generate
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
        model.generate, *inputs, cad_alpha=alpha, cad_adaptive=adaptive, left_padding=left,
        pad_token_id=0, max_new_tokens=new, do_sample=False,
    )  # fmt: skip
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
    kw.update(cad_alpha=alpha, cad_adaptive=adaptive)
    ours = paired_contrast_generate(
        model.generate, ids, mask, neg, neg_mask, left_padding=left, **kw
    )
    theirs = model.generate(
        input_ids=ids, attention_mask=mask, negative_input_ids=neg,
        negative_attention_mask=neg_mask, custom_generate=context_aware, **kw,
    )  # fmt: skip
    assert ours.tolist() == theirs.tolist()


def test_paired_contrast_refusals():
    model = _model("llama", 0)
    ids, mask = torch.tensor([[3, 4]]), torch.ones(1, 2, dtype=torch.long)
    kw = dict(left_padding=True, pad_token_id=0, max_new_tokens=2)
    with pytest.raises(GencraftError, match="sampling would draw the two copies"):
        paired_contrast_generate(model.generate, ids, mask, ids, mask, do_sample=True, **kw)
    with pytest.raises(GencraftError, match="2 context-free inputs for 1 inputs"):
        two = torch.tensor([[3], [4]])
        paired_contrast_generate(model.generate, ids, mask, two, torch.ones_like(two), **kw)
    with pytest.raises(GencraftError, match="cad alpha must be >= 0"):
        PairedContrast(-0.5)
    with pytest.raises(GencraftError, match="an even number of rows, got 3"):
        PairedContrast()(ids, torch.zeros(3, 5))


@pytest.mark.parametrize("left", [True, False])
def test_the_pairing_pads_both_halves_on_the_models_side(left):
    """The doubled batch generate receives (a spy that returns its input ids, as a decoder-only
    generate starts its output with the prompt)."""
    seen = {}

    def spy(**kw):
        seen.update(kw)
        return kw["input_ids"]

    ids, neg = torch.tensor([[3, 4], [5, 6]]), torch.tensor([[7, 8, 9], [10, 11, 12]])
    mask = torch.tensor([[1, 1], [0, 1]])
    out = paired_contrast_generate(
        spy, ids, mask, neg, torch.ones_like(neg), left_padding=left, pad_token_id=0,
        logits_processor=[42], num_beams=2,
    )  # fmt: skip
    pad = [[0, 3, 4], [0, 5, 6]] if left else [[3, 4, 0], [5, 6, 0]]
    assert seen["input_ids"].tolist() == [*pad, [7, 8, 9], [10, 11, 12]]
    m = [[0, 1, 1], [0, 0, 1]] if left else [[1, 1, 0], [0, 1, 0]]
    assert seen["attention_mask"].tolist() == [*m, [1, 1, 1], [1, 1, 1]]
    first, last = seen["logits_processor"]
    assert first == 42 and isinstance(last, PairedContrast)  # after generate's own
    assert seen["num_beams"] == 2 and seen["pad_token_id"] == 0
    assert out.tolist() == (ids.tolist() if left else pad)
