"""How gencraft's ``custom_generate`` decoders read ``generate``'s call (mutmut's survivors in
search/custom_generate.py): every refusal word for word and from each decoder, a
generation config whose fields are unset (a direct call), ``num_return_sequences`` beyond
what a row found, ``generate``'s own EOS and pad ids, ``max_length`` in place of
``max_new_tokens``, a prompt that fills the model's context, the encoder's output as a tuple,
and the Hub folders' entry point."""

from __future__ import annotations

import pytest
import torch
from method_testing import small_llama
from test_custom_generate import PROMPTS, THESIS, _causal, _left_padded
from transformers import GenerationConfig

from gencraft import search
from gencraft.models.architectures import tiny_architecture
from gencraft.search import custom_generate as cg
from gencraft.search.train import classifier_for

DECODERS = ["beam_search", "conditional_beam_search", "exact_mode"]


@pytest.fixture(scope="module")
def model():
    return _causal()


@pytest.fixture(scope="module")
def clf(model):
    torch.manual_seed(1)
    return classifier_for(model, "degenerate", d_clf=8, num_heads=2, d_out=4).eval()


def _own(name, clf):
    """The decoder's own required arguments."""
    return {"classifier": clf} if name == "conditional_beam_search" else {}


def _message(call) -> str:
    with pytest.raises(Exception) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize("name", DECODERS)
def test_each_decoder_refuses_a_streamer_synced_gpus_and_sampling_word_for_word(name, model, clf):
    """``generate`` drops a streamer and ``synced_gpus`` before calling a callable, so they are
    refused on a direct call; sampling through ``generate``."""
    ids, mask = _left_padded(PROMPTS)
    config = GenerationConfig(max_new_tokens=2, eos_token_id=2, pad_token_id=0)
    decoder = getattr(cg, name)
    kw = dict(generation_config=config, attention_mask=mask, **_own(name, clf))
    got = _message(lambda: decoder(model, ids, streamer=object(), **kw))
    assert got == f"gencraft's {name} from generate() takes no streamer"
    got = _message(lambda: decoder(model, ids, synced_gpus=True, **kw))
    assert got == f"gencraft's {name} from generate() does not run with synced_gpus"
    got = _message(
        lambda: model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=2,
            do_sample=True,
            custom_generate=decoder,
            **_own(name, clf),
        )
    )
    assert got == f"gencraft's {name} from generate() does not sample: pass do_sample=False"


@pytest.mark.parametrize("name", DECODERS)
def test_each_decoder_names_every_other_stopping_criterion(name, model, clf):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    class Later(Never):
        pass

    ids, mask = _left_padded(PROMPTS[:1])
    got = _message(
        lambda: model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=2,
            custom_generate=getattr(cg, name),
            stopping_criteria=StoppingCriteriaList([Never(), Later()]),
            **_own(name, clf),
        )
    )
    assert got == (
        f"gencraft's {name} from generate() takes no stopping criteria other than the length "
        "and EOS ones; got Never, Later"
    )


class _ByResidue:
    """log P_clf = -(token id mod 3): a classifier whose weight changes the kept beams."""

    num_layers, hidden_size = 3, 32  # _causal()'s

    def init(self, n):
        return None

    def score(self, state, hidden, candidates):
        return -(candidates % 3).float(), state

    def reorder(self, state, index):
        return state


def test_conditional_beam_searchs_alpha_defaults_to_one(model):
    ids, mask = _left_padded(PROMPTS)
    kw = dict(
        input_ids=ids,
        attention_mask=mask,
        num_beams=2,
        max_new_tokens=4,
        custom_generate=cg.conditional_beam_search,
        classifier=_ByResidue(),
    )
    default, one, two = (model.generate(**kw, **a) for a in ({}, {"alpha": 1.0}, {"alpha": 2.0}))
    assert torch.equal(default, one)
    assert default.shape != two.shape or not torch.equal(default, two)  # alpha matters here


def test_conditional_beam_search_without_a_classifier_is_named(model):
    ids, mask = _left_padded(PROMPTS)
    got = _message(
        lambda: model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=2,
            custom_generate=cg.conditional_beam_search,
        )
    )
    assert got == "conditional_beam_search needs classifier=<an AttributeScorer>"


@pytest.mark.parametrize("beams", [None, 2])
def test_a_config_whose_fields_are_unset_means_generates_defaults(beams, model):
    """A direct call with a bare ``GenerationConfig`` (``num_beams``, ``length_penalty``,
    ``early_stopping``, ``num_return_sequences`` unset): one beam means greedy, and beams score
    as ``generate`` does by default (length penalty 1.0, no early stopping; with EOS id 4 on
    this model, early stopping would change the outputs)."""
    ids, mask = _left_padded(PROMPTS)
    config = GenerationConfig(max_new_tokens=4, eos_token_id=4, pad_token_id=0, num_beams=beams)
    copies = beams or 1  # generate repeats each input once per beam before the call
    got = cg.beam_search(
        model,
        ids.repeat_interleave(copies, 0),
        generation_config=config,
        attention_mask=mask.repeat_interleave(copies, 0),
    )
    want = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=4,
        num_beams=beams or 1,
        do_sample=False,
        eos_token_id=4,
        pad_token_id=0,
    )
    assert got.tolist() == want.tolist()


def test_a_direct_call_without_pad_or_eos_ids_uses_the_models(model):
    """A bare config (no pad, no EOS id): the model's own, as ``generate`` fills them in; with
    ``return_dict_in_generate`` the output class of a causal LM."""
    from transformers.generation.utils import GenerateBeamDecoderOnlyOutput

    ids, mask = _left_padded(PROMPTS)
    for name in ("beam_search", "exact_mode"):
        kw = dict(attention_mask=mask, max_new_tokens=3, custom_generate=getattr(cg, name))
        want = model.generate(input_ids=ids, **kw)
        config = GenerationConfig(max_new_tokens=3, return_dict_in_generate=True)
        got = getattr(cg, name)(model, ids, generation_config=config, attention_mask=mask)
        assert type(got) is GenerateBeamDecoderOnlyOutput and torch.equal(got.sequences, want)


def test_a_config_that_leaves_no_new_tokens_is_named(model):
    ids, mask = _left_padded(PROMPTS)
    config = GenerationConfig(max_length=ids.shape[1], eos_token_id=2, pad_token_id=0)
    got = _message(lambda: cg.exact_mode(model, ids, generation_config=config, attention_mask=mask))
    assert got == "max_new_tokens must be >= 1, got 0"


def test_a_direct_call_with_max_length_alone(model):
    """``generate`` turns ``max_length`` into ``max_new_tokens`` itself; a direct call whose
    config has only ``max_length`` counts the new tokens after the prompt."""
    ids, mask = _left_padded(PROMPTS)
    config = GenerationConfig(max_length=ids.shape[1] + 3, eos_token_id=2, pad_token_id=0)
    got = cg.exact_mode(model, ids, generation_config=config, attention_mask=mask)
    want = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=3, custom_generate=cg.exact_mode
    )
    assert torch.equal(got, want)


def test_num_return_sequences_beyond_what_a_row_found_is_refused_naming_the_row(model):
    """Row 1 may only end (its processor allows EOS alone): one output, not two."""
    ids, mask = _left_padded(PROMPTS[:2])
    width = ids.shape[1]

    def allowed(batch_id, sent):
        return [2] if batch_id == 1 and len(sent) == width else list(range(12))

    got = _message(
        lambda: model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=3,
            num_beams=3,
            num_return_sequences=2,
            prefix_allowed_tokens_fn=allowed,
            custom_generate=cg.beam_search,
            **THESIS,
        )
    )
    assert got == "beam_search found 1 outputs for input 1; num_return_sequences is 2"
    config = GenerationConfig(max_new_tokens=2, eos_token_id=2, pad_token_id=0)
    config.num_return_sequences = 2
    got = _message(lambda: cg.exact_mode(model, ids, generation_config=config, attention_mask=mask))
    assert got == "exact_mode found 1 outputs for input 0; num_return_sequences is 2"


@pytest.mark.parametrize("name", ["beam_search", "exact_mode"])
def test_generates_own_eos_and_pad_ids_are_the_ones_used(name, model):
    """``eos_token_id=5`` (not the model's 2) ends the outputs and, with pad id 0, fills them;
    a pad id of 7 fills them when it is not 0."""
    ids, mask = _left_padded(PROMPTS)
    for pad, fill in ((0, 5), (7, 7)):
        kw = dict(num_beams=2, **THESIS) if name == "beam_search" else {}
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=3,
            eos_token_id=5,
            pad_token_id=pad,
            custom_generate=getattr(cg, name),
            **kw,
        )
        rows = []
        for p in PROMPTS:
            if name == "beam_search":
                h = search.beam_search(
                    model, torch.tensor([p]), num_beams=2, max_new_tokens=3, eos_token_id=5
                )[0]
                rows.append(h.tokens + ([5] if h.finished else []))
            else:
                r = search.exact_mode(model, torch.tensor([p]), max_new_tokens=3, eos_token_id=5)
                rows.append([*r.tokens, 5])
        width = max(map(len, rows))
        want = [ids[b].tolist() + r + [fill] * (width - len(r)) for b, r in enumerate(rows)]
        assert out.tolist() == want


def test_a_row_whose_exact_search_finds_nothing_is_its_prompt_then_the_pad_id(model):
    """Row 1 may only end, so no output of length 2 exists for it: its prompt, then pad id 7
    in every column, beside row 0's mode."""
    ids, mask = _left_padded(PROMPTS[:2])
    width = ids.shape[1]

    def allowed(batch_id, sent):
        return [2] if batch_id == 1 else list(range(12))

    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=3,
        pad_token_id=7,
        length=2,
        prefix_allowed_tokens_fn=allowed,
        custom_generate=cg.exact_mode,
    )
    r = search.exact_mode(model, torch.tensor([PROMPTS[0]]), max_new_tokens=3, length=2)
    assert out[0, width:].tolist() == [*r.tokens, 2]
    assert out[1].tolist() == [*ids[1].tolist(), 7, 7, 7]


def test_max_length_in_place_of_max_new_tokens(model):
    ids, mask = _left_padded(PROMPTS)
    by_new = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=3, custom_generate=cg.exact_mode
    )
    by_length = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_length=ids.shape[1] + 3,
        custom_generate=cg.exact_mode,
    )
    assert torch.equal(by_new, by_length)


@pytest.mark.parametrize("name", ["beam_search", "exact_mode"])
def test_a_prompt_and_max_new_tokens_that_fill_the_context_exactly_are_accepted(name):
    """Prompt 3 + 5 new tokens on an 8-position model: the deepest forward covers 8 positions,
    as ``generate``'s own search allows."""
    model = small_llama(0, vocab=6, context=8)
    ids = torch.tensor([[1, 3, 4]])
    kw = dict(num_beams=2, **THESIS) if name == "beam_search" else dict(length=5)
    out = model.generate(input_ids=ids, max_new_tokens=5, custom_generate=getattr(cg, name), **kw)
    if name == "beam_search":
        h = search.beam_search(model, ids, num_beams=2, max_new_tokens=5)[0]
        assert out[0, 3:].tolist() == h.tokens + ([h.eos_token] if h.finished else [])
    else:
        assert out.shape[1] == 3 + 5 + 1  # the forced length, then EOS


def test_the_encoders_output_as_a_tuple_and_none_at_all():
    from transformers.modeling_outputs import BaseModelOutput

    model = tiny_architecture("bart", vocab_size=12, seed=2)
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0]])
    mask = (src != 0).long()
    config = GenerationConfig(
        max_new_tokens=3, num_beams=2, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2
    )
    hidden = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    kw = dict(generation_config=config, attention_mask=mask.repeat_interleave(2, 0))
    ids = src.repeat_interleave(2, 0)
    ref = cg.beam_search(
        model, ids, encoder_outputs=BaseModelOutput(hidden.repeat_interleave(2, 0)), **kw
    )
    got = cg.beam_search(model, ids, encoder_outputs=(hidden.repeat_interleave(2, 0),), **kw)
    assert torch.equal(got, ref)
    got = _message(lambda: cg.beam_search(model, ids, **kw))
    assert got == "generate() passed no encoder_outputs to the custom decoder"


def test_the_hub_entry_point_takes_generates_raw_arguments(model):
    """``hub_generate``: positional ids, the ``custom_generate`` and ``trust_remote_code`` a Hub
    call carries dropped, a streamer or ``synced_gpus`` refused by name."""
    ids, mask = _left_padded(PROMPTS)
    kw = dict(attention_mask=mask, num_beams=2, max_new_tokens=3)
    ref = model.generate(input_ids=ids, custom_generate=cg.beam_search, **kw)
    got = cg.hub_generate(
        cg.beam_search, model, ids, custom_generate="x", trust_remote_code=True, **kw
    )
    assert torch.equal(got, ref)
    for name in ("streamer", "synced_gpus"):
        got = _message(lambda n=name: cg.hub_generate(cg.exact_mode, model, ids, **{n: True}))
        assert got == f"gencraft's exact_mode from generate() takes no {name}"


def test_a_given_cache_is_refused_not_ignored():
    """A filled past_key_values (a prefix model's virtual tokens, HSO's states) would be
    dropped by a decoder that runs the prompt itself: refused in one line; generate's own
    empty cache passes."""
    from transformers import DynamicCache

    from gencraft.errors import GencraftError
    from gencraft.models import load_model
    from gencraft.models.compat import cache_kwargs, output_cache
    from gencraft.search.custom_generate import beam_search

    model, _ = load_model("tiny-llama")
    ids = torch.tensor([[5, 6, 7]])
    kw = dict(custom_generate=beam_search, num_beams=2, max_new_tokens=2, do_sample=False)
    model.generate(ids, attention_mask=torch.ones_like(ids), **kw)  # no cache given: runs
    with torch.no_grad():
        out = model(ids[:, :2], **cache_kwargs(DynamicCache()), use_cache=True)
    cache = output_cache(out)
    with pytest.raises(GencraftError, match="ignore the given past_key_values \\(2 positions"):
        model.generate(ids, attention_mask=torch.ones_like(ids), **cache_kwargs(cache), **kw)
