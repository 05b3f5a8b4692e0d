"""``PrefixModel.generate`` (issue 43's DASP claim decodes with it) against references: an
encoder-decoder's step logits equal teacher-forced forwards whose decoder inputs carry the
output-segment rule (and not a shifted one); a disabled model is the base's ``generate``;
``max_new_tokens`` defaults to 20; several sampled sequences per input are the samples of the
input repeated, each with its own rows of the prefix cache."""

from __future__ import annotations

import torch
from test_prefix_model import _batch, _model


def test_encoder_decoder_generate_follows_output_segments():
    """L = 4, S = 2: outputs 0, 1 in segment 0 and 2, 3 in segment 1; decoder input 0 is the
    start token (segment 0) and input j the output j - 1."""
    model = _model(
        "tiny-bart", encoder_segments=2, decoder_segments=2, cross_prefix=True, output_length=4
    )
    ids, mask = _batch(pad_left=0)
    gen = model.generate(
        ids, mask, max_new_tokens=4, min_new_tokens=4, return_dict_in_generate=True,
        output_logits=True,
    )  # fmt: skip
    steps = torch.stack(gen.logits, dim=1)  # [B, 4, V]
    dec = gen.sequences[:, :-1]  # the start token and the first three outputs
    for segments, same in (([0, 0, 0, 1], True), ([0, 0, 1, 1], False), ([0, 1, 1, 1], False)):
        dseg = torch.tensor([segments] * 2)
        with torch.no_grad():
            logits = model(ids, mask, decoder_input_ids=dec, decoder_segment_ids=dseg).logits
        assert torch.allclose(logits, steps, atol=1e-5) == same, segments


def test_a_disabled_model_generates_as_its_base():
    for name in ("tiny-llama", "tiny-bart"):
        model = _model(name, encoder_segments=2, decoder_segments=2)
        model.enabled = False
        ids, mask = _batch(pad_left=2 if name == "tiny-llama" else 0)
        if name == "tiny-bart":
            mask[1, -2:] = 0  # BART pads on the right
        ids[mask == 0] = 9  # not the pad id, so that only the mask hides these positions
        kw = dict(max_new_tokens=5, num_beams=2, return_dict_in_generate=True, output_scores=True)
        got = model.generate(ids, mask, **kw)
        want = model.base.generate(input_ids=ids, attention_mask=mask, **kw)
        assert torch.equal(got.sequences, want.sequences)
        torch.testing.assert_close(got.sequences_scores, want.sequences_scores)
        unmasked = model.base.generate(input_ids=ids, **kw)
        assert not torch.allclose(unmasked.sequences_scores, want.sequences_scores)


def test_max_new_tokens_defaults_to_twenty():
    model = _model("tiny-llama", encoder_segments=2, decoder_segments=2)
    assert model.base.generation_config.max_new_tokens is None
    ids, mask = _batch(pad_left=2)
    out = model.generate(ids, mask, min_new_tokens=20)
    assert out.shape == (2, ids.shape[1] + 20)


def test_several_samples_per_input_are_the_samples_of_the_input_repeated():
    for name in ("tiny-llama", "tiny-bart"):
        model = _model(name, encoder_segments=2, decoder_segments=2, blocked_layers="all")
        ids, mask = _batch(pad_left=2 if name == "tiny-llama" else 0)
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=True, top_k=0)
        torch.manual_seed(3)
        got = model.generate(ids, mask, num_return_sequences=3, **kw)
        torch.manual_seed(3)
        want = model.generate(
            ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), num_return_sequences=1, **kw
        )
        assert got.shape[0] == 6 and torch.equal(got, want)
        assert len({tuple(r) for r in got[:3].tolist()}) > 1  # the draws differ
