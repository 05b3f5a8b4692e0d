"""``PrefixModel.generate`` (the DASP claim decodes with it) against references: an
encoder-decoder's step logits equal teacher-forced forwards whose decoder inputs carry the
output-segment rule (and not a shifted one); a disabled model is the base's ``generate``;
``max_new_tokens`` defaults to 20; several sampled sequences per input are the samples of the
input repeated, each with its own rows of the prefix cache."""

from __future__ import annotations

import pytest
import torch
from test_prefix_model import _batch, _model

from gencraft.errors import GencraftError


def test_encoder_decoder_generate_follows_output_segments():
    """L = 4, S = 2: outputs 0, 1 in segment 0 and 2, 3 in segment 1; decoder input 0 is the
    start token (segment 0) and input j the output j - 1."""
    model = _model(
        "tiny-bart", encoder_segments=2, decoder_segments=2, cross_prefix=True, output_length=4
    )
    ids, mask = _batch(pad_left=0)
    gen = model.generate(
        ids,
        mask,
        max_new_tokens=4,
        min_new_tokens=4,
        return_dict_in_generate=True,
        output_logits=True,
    )
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


# generate's length limits: (call, generation config); each row's width is the base's generate's
LENGTHS = [
    ({"max_length": 12}, {}),
    ({}, {"max_length": 12}),
    ({"max_length": 12, "max_new_tokens": 3}, {}),
    ({"max_length": 12}, {"max_new_tokens": 4}),
    ({"max_length": 10}, {"max_length": 14}),
    ({}, {}),
]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
@pytest.mark.parametrize(("call", "config"), LENGTHS)
def test_length_limits_count_the_prompt_not_the_prefix(name, call, config):
    """``max_length`` counts the prompt (or the decoder's start token) as the base's
    ``generate`` does, never the prefix's placeholders; ``max_new_tokens`` wins over it."""
    model = _model(name, encoder_segments=2, decoder_segments=2)
    model.base.generation_config.eos_token_id = None  # no row stops early
    for key, value in config.items():
        setattr(model.base.generation_config, key, value)
    ids, mask = _batch(pad_left=0 if name == "tiny-bart" else 2)
    got = model.generate(ids, mask, **call)
    model.enabled = False
    want = model.generate(ids, mask, **call)
    assert got.shape == want.shape


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
@pytest.mark.parametrize("where", ["call", "config"])
def test_min_length_counts_the_prompt_not_the_prefix(name, where):
    """With EOS set to row 0's first output, ``min_length`` = prompt + 3 decodes as
    ``min_new_tokens=3`` (and not as no minimum, which the placeholders would make it)."""
    model = _model(name, encoder_segments=2, decoder_segments=2)
    ids, mask = _batch(pad_left=0 if name == "tiny-bart" else 2)
    prompt = 1 if name == "tiny-bart" else ids.shape[1]
    eos = int(model.generate(ids, mask, max_new_tokens=6)[0, prompt])
    kw = dict(max_new_tokens=6, eos_token_id=eos)
    free = model.generate(ids, mask, **kw)
    assert free[0, prompt] == eos  # row 0 ends at once without a minimum
    want = model.generate(ids, mask, min_new_tokens=3, **kw)
    if where == "call":
        got = model.generate(ids, mask, min_length=prompt + 3, **kw)
    else:
        model.base.generation_config.min_length = prompt + 3
        got = model.generate(ids, mask, **kw)
    assert torch.equal(got, want) and not torch.equal(got, free)


@pytest.mark.parametrize(("name", "prompt"), [("tiny-llama", 7), ("tiny-bart", 1)])
def test_a_max_length_that_leaves_no_new_token_is_refused(name, prompt):
    model = _model(name, encoder_segments=2, decoder_segments=2)
    ids, mask = _batch(pad_left=0)
    with pytest.raises(GencraftError) as err:
        model.generate(ids, mask, max_length=prompt)
    assert str(err.value) == (
        f"max_length={prompt} leaves no new token after a prompt of {prompt} tokens; "
        "raise it or give max_new_tokens"
    )
    assert model.generate(ids, mask, max_length=prompt + 1).shape[1] == prompt + 1


# a generation config in the call, as keywords, and (last) a setting it leaves to the model's
CONFIGS = [
    ({"max_new_tokens": 5}, {}),
    ({"max_new_tokens": 5, "num_beams": 2, "num_return_sequences": 2}, {}),
    ({"max_length": 12}, {}),
    ({"max_new_tokens": 3, "do_sample": True, "num_return_sequences": 2}, {}),
    ({"num_beams": 2}, {"max_new_tokens": 4}),
]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
@pytest.mark.parametrize(("given", "model_settings"), CONFIGS)
def test_a_generation_config_in_the_call_decodes_as_its_keywords(name, given, model_settings):
    """``generation_config=`` sizes the prefix cache and the lengths as its settings given as
    keywords do (its unset fields the model's, as ``generate`` merges them), and the output
    has the width and rows of the base's ``generate`` under it."""
    from transformers import GenerationConfig

    model = _model(name, encoder_segments=2, decoder_segments=2)
    model.base.generation_config.eos_token_id = None  # no row stops early
    for key, value in model_settings.items():
        setattr(model.base.generation_config, key, value)
    ids, mask = _batch(pad_left=0 if name == "tiny-bart" else 2)
    torch.manual_seed(0)
    got = model.generate(ids, mask, generation_config=GenerationConfig(**given))
    torch.manual_seed(0)
    assert torch.equal(got, model.generate(ids, mask, **given))
    model.enabled = False
    assert got.shape == model.generate(ids, mask, generation_config=GenerationConfig(**given)).shape


def test_what_generate_is_not_given_is_refused_in_one_line():
    """The inputs, the decoder's start and the cache are the prefix model's own; assisted
    decoding (in the call or the config) would draft without the prefixes."""
    from transformers import GenerationConfig

    from gencraft.prefix.model import NOT_TAKEN

    model = _model("tiny-bart", encoder_segments=2, decoder_segments=2)
    ids, mask = _batch(pad_left=0)
    tail = (
        ": it builds the inputs, the decoder's start and the prefix cache itself, and assisted "
        "decoding would draft without the prefixes"
    )
    for key in NOT_TAKEN:
        with pytest.raises(GencraftError) as err:
            model.generate(ids, mask, max_new_tokens=2, **{key: None})
        assert str(err.value) == f"PrefixModel.generate does not take {key}{tail}"
    config = GenerationConfig(prompt_lookup_num_tokens=2, max_new_tokens=2)
    with pytest.raises(GencraftError) as err:
        model.generate(ids, mask, generation_config=config, inputs_embeds=None)
    assert str(err.value).startswith(
        "PrefixModel.generate does not take inputs_embeds, prompt_lookup_num_tokens: "
    )
    model.enabled = False  # the base's own generate takes them
    assert model.generate(ids, mask, max_new_tokens=2, past_key_values=None).shape[0] == 2
