"""The beam core's tensor result and settings: the result's ranking score is the
documented equation over drawn settings; the conditional score means one thing under both
policies; settings that cannot be honoured are refused in one line, before any work."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_batch import SETTINGS, TokenScorer, V, _batch, _model, prompts_st

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.search import beam_search, beam_search_batch
from gencraft.search import custom_generate as cg
from gencraft.search.beam import beam_search_tensors

HUB = __import__("pathlib").Path(__file__).resolve().parents[2] / "hub"


def _scorer(model):
    ed = model.config.is_encoder_decoder
    layers = model.config.decoder_layers if ed else model.config.num_hidden_layers
    return TokenScorer(layers + 1, model.config.hidden_size)


@settings(max_examples=40, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2", "bart"]),
    prompts=prompts_st,
    beams=st.integers(1, 4),
    max_new=st.integers(1, 5),
    length_penalty=st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]),
    early_stopping=st.sampled_from([True, False, "never"]),
    classifier=st.booleans(),
)
def test_the_result_ranks_by_the_penalised_score_best_first(
    kind, prompts, beams, max_new, length_penalty, early_stopping, classifier
):
    """sequence_score = (S, or S + log P_clf) / (tokens + EOS)^length_penalty, valid outputs
    first and in descending order; tokens past an output's length are 0."""
    model = _model(kind, 0)
    ids, mask = _batch(prompts, left=not model.config.is_encoder_decoder)
    out = beam_search_tensors(
        model,
        ids,
        mask,
        num_beams=beams,
        max_new_tokens=max_new,
        classifier=_scorer(model) if classifier else None,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    assert out.tokens.shape[:2] == out.valid.shape == (len(prompts), beams)
    for r in range(len(prompts)):
        n = int(out.valid[r].sum())
        assert n >= 1 and bool(out.valid[r, :n].all())
        ranked = out.sequence_score[r, :n].tolist()
        assert ranked == sorted(ranked, reverse=True)
        for j in range(n):
            base = out.conditional[r, j] if classifier else out.score[r, j]
            length = int(out.length[r, j]) + int(out.finished[r, j])
            assert float(out.sequence_score[r, j]) == pytest.approx(
                float(base) / length**length_penalty, rel=1e-5, abs=1e-5
            )
            assert not out.tokens[r, j, int(out.length[r, j]) :].any()
        assert math.isnan(float(out.conditional[r, 0])) != classifier


@settings(max_examples=12, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2"]),
    prompt=st.lists(st.integers(3, V - 1), min_size=1, max_size=4),
)
def test_the_conditional_score_means_one_thing_under_both_policies(kind, prompt):
    """With a forced length of 1 and V beams, both policies keep every 1-token output: each
    output's conditional score (S + log P_clf at completion) is the same under both, and is
    not the model score."""
    model = _model(kind, 1)
    kw = dict(num_beams=V, max_new_tokens=3, classifier=_scorer(model), force_length=1)
    aside = beam_search(model, torch.tensor([prompt]), finished="aside", **kw)
    on_beam = beam_search(model, torch.tensor([prompt]), finished="on_beam", **kw)
    by_tokens = {tuple(h.tokens): h for h in on_beam}
    shared = [h for h in aside if tuple(h.tokens) in by_tokens]
    assert len(shared) >= 3
    for h in shared:
        assert h.conditional_score == pytest.approx(
            by_tokens[tuple(h.tokens)].conditional_score, abs=1e-4
        )
    assert any(abs(h.conditional_score - h.score) > 1e-3 for h in shared)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(finished="on_beam", length_penalty=1.0), "on_beam"),
        (dict(finished="on_beam", early_stopping=False), "on_beam"),
        (dict(early_stopping=1), "early_stopping"),
        (dict(early_stopping="always"), "early_stopping"),
        (dict(length_penalty=float("nan")), "length_penalty"),
        (dict(num_beams=0), "num_beams"),
        (dict(k=V + 1), r"k must be in \[1, vocab size 12\]"),
    ],
)
def test_settings_that_cannot_be_honoured_are_refused_in_one_line(kw, match):
    model = _model("llama", 0)
    kw = {"num_beams": 2, "max_new_tokens": 3, **kw}
    with pytest.raises(GencraftError, match=match) as err:
        beam_search_batch(model, torch.tensor([[3, 4]]), **kw)
    assert "\n" not in str(err.value)


class _Streamer:
    def put(self, value):
        pass

    def end(self):
        pass


@pytest.mark.parametrize("name", ["beam_search", "conditional_beam_search", "exact_mode"])
@pytest.mark.parametrize("what", ["streamer", "synced_gpus", "do_sample"])
def test_custom_generate_refuses_a_streamer_synced_gpus_and_sampling(name, what):
    """Called directly, and through the Hub folder (generate itself drops a streamer and
    synced_gpus before calling a callable, so the folder checks them first)."""
    model = _model("llama", 0)
    ids, mask = _batch([[3, 4], [5]])
    gc = model.generation_config.__class__(
        num_beams=2, max_new_tokens=3, eos_token_id=2, pad_token_id=0
    )
    value = {"streamer": _Streamer(), "synced_gpus": True, "do_sample": True}[what]
    fn = getattr(cg, name)
    extra = {"classifier": _scorer(model)} if name == "conditional_beam_search" else {}
    if what == "do_sample":
        gc.do_sample = True
        call = dict(generation_config=gc, attention_mask=mask, **extra)
    else:
        call = dict(generation_config=gc, attention_mask=mask, **{what: value}, **extra)
    with pytest.raises(GencraftError, match=what):
        fn(model, ids, **call)
    if what != "do_sample":
        with pytest.raises(GencraftError, match=what):
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                num_beams=2,
                max_new_tokens=3,
                custom_generate=str(HUB / name),
                trust_remote_code=True,
                **{what: value},
                **extra,
            )


# -- mutmut's survivors in gencraft/search/beam.py (docs/core.md, "The automatic tool") ------
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(finished="all"), "finished must be one of 'aside', 'on_beam', got 'all'"),
        (dict(forced_eos="none"), "forced_eos must be one of 'model', 'free', got 'none'"),
        (dict(forced_ranking="x"), "forced_ranking must be one of 'score', 'selection'"),
        (dict(early_stopping=1), "early_stopping must be one of True, False, 'never', got 1"),
        (dict(max_new_tokens=[3, 4, 5]), "max_new_tokens gives 3 values for 2 rows"),
        (dict(force_length=[1]), "force_length gives 1 values for 2 rows"),
        (dict(length_penalty=1e4), "length_penalty must be a finite number in"),
        (dict(length_penalty=-1e4), "length_penalty must be a finite number in"),
        (dict(length_penalty=float("nan")), "length_penalty must be a finite number in"),
    ],
    ids=str,
)
def test_a_bad_setting_is_named_with_its_value(setting, message):
    model, _ = load_model("tiny-llama", seed=0)
    kw = {"num_beams": 2, "max_new_tokens": 3, **setting}
    ids, mask = torch.tensor([[3, 4], [0, 5]]), torch.tensor([[1, 1], [0, 1]])
    with pytest.raises(GencraftError, match=re.escape(message)):
        beam_search_batch(model, ids, mask, **kw)


def test_edge_settings_that_are_allowed_change_nothing_they_should_not():
    """length_penalty just inside the range runs (its power overflows to inf, not to an
    error); ``k`` without a classifier keeps the K best
    continuations of each beam, which is all beam search needs (k = K equals no k); a
    disabled classifier is plain search; a classifier of another shape is named with both."""
    model, _ = load_model("tiny-llama", seed=0)
    ids = torch.tensor([[3, 4, 5]])
    kw = dict(num_beams=3, max_new_tokens=4, eos_token_id=[2])
    plain = beam_search(model, ids, **kw)
    assert beam_search(model, ids, length_penalty=9999.0, **kw)
    assert _tokens(beam_search(model, ids, k=3, **kw)) == _tokens(plain)
    layers = model.config.num_hidden_layers
    off = _scorer(model)
    off.enabled = False
    assert _tokens(beam_search(model, ids, classifier=off, **kw)) == _tokens(plain)
    assert all(h.conditional_score is None for h in beam_search(model, ids, classifier=off, **kw))
    wrong = TokenScorer(layers, model.config.hidden_size)
    with pytest.raises(GencraftError, match=f"reads {layers} layers x "):
        beam_search(model, ids, classifier=wrong, **kw)
    with pytest.raises(GencraftError, match=f"model gives {layers + 1} x "):
        beam_search(model, ids, classifier=wrong, **kw)


def _tokens(hyps):
    return [(h.tokens, h.finished) for h in hyps]


def test_the_three_entries_share_their_defaults_and_settings_compare_by_value():
    """beam_search, beam_search_batch and beam_search_tensors take BeamSettings' defaults; a
    setting equal to an allowed value but built at run time is accepted; force_length=1
    counting the EOS is the EOS alone; a processor with several beams warns of nothing."""
    import inspect
    import warnings

    from transformers import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    for f in (beam_search, beam_search_batch, beam_search_tensors):  # defaults: BeamSettings'
        params = inspect.signature(f).parameters
        assert list(params)[-3:] == ["settings", "eos_token_id", "overrides"], f.__name__
        assert params["overrides"].kind is inspect.Parameter.VAR_KEYWORD
    model, _ = load_model("tiny-llama", seed=0)
    ids = torch.tensor([[3, 4, 5]])
    kw = dict(num_beams=2, max_new_tokens=3, eos_token_id=[2])
    aside = "".join(["as", "ide"])  # equal to "aside", not the same object
    assert _tokens(beam_search(model, ids, finished=aside, **kw)) == _tokens(
        beam_search(model, ids, **kw)
    )
    alone = beam_search(model, ids, force_length=1, length_includes_eos=True, **kw)
    assert alone and all(h.tokens == [] and h.finished for h in alone)
    odd = [RepetitionPenaltyLogitsProcessor(1.5)]  # not shift-invariant: one beam warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        beam_search(model, ids, logits_processor=[NoRepeatNGramLogitsProcessor(2), *odd], **kw)
    with pytest.warns(UserWarning, match="RepetitionPenaltyLogitsProcessor"):
        beam_search(model, ids, logits_processor=odd, **{**kw, "num_beams": 1})
