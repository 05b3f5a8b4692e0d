"""FAME's ``generate`` options against references built from their definitions (the FAME
claim decodes with them): ``focus_k`` is generate with a ``FocusLogitsProcessor`` over each
document's V_k ∪ F drawn from its own T_X (``focus_mode``, ``focus_seed`` in document order,
``focus_renormalize``); ``focus_vocabularies`` is the same processor over the given sets plus
F; a causal LM's source is its prompt with or without a cache; every refusal word for word."""

from __future__ import annotations

import re

import pytest
import torch
from test_focus_model import _wrapped

from gencraft.errors import GencraftError
from gencraft.focus import FocusLogitsProcessor
from gencraft.focus.decoding import focus_vocabulary

SOURCES = ["the cat sat on the mat", "a dog ran far"]
BEAMS = dict(
    max_new_tokens=6,
    min_new_tokens=6,
    num_beams=2,
    do_sample=False,
    return_dict_in_generate=True,
    output_scores=True,
)


def _fame(name: str):
    model, tok = _wrapped(name)  # a head far from zero, so that T_X and f_t matter
    return model.eval(), tok


@pytest.fixture(scope="module", params=["tiny-bart", "tiny-llama"])
def fame(request):
    model, tok = _fame(request.param)
    enc = tok(SOURCES, return_tensors="pt", padding=True)
    return model, enc


def _topics(model, enc) -> torch.Tensor:
    """T_X [B, V] of each document, from a forward over the source alone."""
    with torch.no_grad():
        if model.is_encoder_decoder:
            model(**enc, decoder_input_ids=enc["input_ids"][:, :1])
        else:
            model(**enc)
        return model.topic_logits()


def _with_processor(model, enc, sets, renormalize: bool):
    proc = FocusLogitsProcessor(sets, always_allowed=model.special_ids(), renormalize=renormalize)
    return model.generate(**enc, logits_processor=[proc], **BEAMS)


def _same(a, b) -> None:
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.sequences_scores, b.sequences_scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["sample", "top"])
@pytest.mark.parametrize("renormalize", [True, False, None])
def test_focus_k_is_generate_over_each_documents_own_focus_vocabulary(fame, mode, renormalize):
    model, enc = fame
    topics = _topics(model, enc)
    g = torch.Generator().manual_seed(11)
    freq = model.frequent_ids
    sets = [focus_vocabulary(t, 15, mode=mode, frequent_ids=freq, generator=g) for t in topics]
    want = _with_processor(model, enc, sets, renormalize is not False)
    opts = {} if renormalize is None else {"focus_renormalize": renormalize}  # None: the default
    got = model.generate(**enc, focus_k=15, focus_mode=mode, focus_seed=11, **opts, **BEAMS)
    _same(got, want)


def test_the_focus_mode_is_sampling_by_default(fame):
    model, enc = fame
    default = model.generate(**enc, focus_k=15, focus_seed=4, **BEAMS)
    _same(default, model.generate(**enc, focus_k=15, focus_seed=4, focus_mode="sample", **BEAMS))
    top = model.generate(**enc, focus_k=15, focus_mode="top", **BEAMS)
    assert not torch.equal(default.sequences_scores, top.sequences_scores)


@pytest.mark.parametrize("renormalize", [True, False])
def test_given_vocabularies_are_each_documents_with_the_frequent_ids(fame, renormalize):
    model, enc = fame
    given = [torch.tensor([20, 30, 40, 50]), torch.tensor([60, 61, 62, 90, 91])]
    sets = [torch.unique(torch.cat([v, model.frequent_ids])) for v in given]
    want = _with_processor(model, enc, sets, renormalize)
    got = model.generate(**enc, focus_vocabularies=given, focus_renormalize=renormalize, **BEAMS)
    _same(got, want)
    plain = model.generate(**enc, **BEAMS)
    assert not torch.equal(got.sequences, plain.sequences)


def test_a_one_token_focus_vocabulary_is_allowed(fame):
    model, enc = fame
    out = model.generate(**enc, focus_k=1, focus_mode="top", max_new_tokens=3)
    assert out.shape[0] == len(SOURCES)


def test_a_causal_source_is_its_prompt_with_or_without_a_cache():
    model, tok = _fame("tiny-llama")
    enc = tok(SOURCES[:1], return_tensors="pt")
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1)
    kw.update(return_dict_in_generate=True, output_logits=True)
    cached = model.generate(**enc, **kw)
    full = model.generate(**enc, use_cache=False, **kw)  # every step reads the source again
    assert torch.equal(full.sequences, cached.sequences)
    for a, b in zip(full.logits, cached.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_refusals_word_for_word(fame):
    model, enc = fame
    v = model.embedding_weight.shape[0]
    cases = [
        ({"input_ids": None}, "generate needs input_ids (the source / prompt)"),
        (
            {**enc, "focus_k": 3, "focus_vocabularies": [torch.tensor([1])] * 2},
            "give focus_k or focus_vocabularies, not both",
        ),
        ({**enc, "focus_k": 0}, f"focus_k must lie in [1, |V| = {v}], got 0"),
        ({**enc, "focus_k": v + 1}, f"focus_k must lie in [1, |V| = {v}], got {v + 1}"),
        (
            {**enc, "focus_vocabularies": [torch.tensor([1])]},
            "focus_vocabularies has 1 sets for 2 documents",
        ),
    ]
    for kwargs, msg in cases:
        with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
            model.generate(**kwargs, max_new_tokens=2)
