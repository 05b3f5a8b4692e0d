"""The beam search's defaults in force, not only in its signatures (a signature can say one
value while the body uses another), its tensor result's fields, and per-row limits on the
thesis's Alg. 1 (mutmut's survivors on search/beam.py)."""

from __future__ import annotations

import pytest
import torch
from method_testing import small_llama
from test_batch import TokenScorer

from gencraft.errors import GencraftError
from gencraft.search import beam_search, beam_search_batch, beam_search_tensors

V = 12
# seed 2 and this prompt: each setting below changes the outputs when set to another value
MODEL = small_llama(2, vocab=V)
PROMPT = torch.tensor([[5, 6, 7]])
LAYERS, HIDDEN = MODEL.config.num_hidden_layers + 1, MODEL.config.hidden_size
DEFAULTS = {
    "length_penalty": 0.0,
    "early_stopping": True,
    "alpha": 1.0,
    "length_includes_eos": False,
}
OTHER = {"length_penalty": 1.0, "early_stopping": False, "alpha": 2.0, "length_includes_eos": True}


def _outputs(fn, **kw):
    kw = dict(num_beams=3, max_new_tokens=6, eos_token_id=0, **kw)
    if fn is beam_search_tensors:
        r = fn(MODEL, PROMPT, **kw)
        return r.tokens.tolist(), r.length.tolist(), r.score.round(decimals=4).tolist()
    hyps = fn(MODEL, PROMPT, **kw)
    hyps = hyps[0] if fn is beam_search_batch else hyps
    return [(h.tokens, round(h.score, 4), h.finished) for h in hyps]


@pytest.mark.parametrize("fn", [beam_search, beam_search_batch, beam_search_tensors])
@pytest.mark.parametrize("name", list(DEFAULTS))
def test_an_omitted_setting_is_its_documented_default(fn, name):
    extra = {}
    if name == "alpha":
        extra["classifier"] = TokenScorer(LAYERS, HIDDEN)
    if name == "length_includes_eos":
        extra["force_length"] = 3
    omitted = _outputs(fn, **extra)
    assert omitted == _outputs(fn, **extra, **{name: DEFAULTS[name]})
    assert omitted != _outputs(fn, **extra, **{name: OTHER[name]})  # the example can tell


def test_the_result_marks_cut_outputs_with_eos_minus_one():
    """An output cut at the limit has ``eos`` -1 and ``finished`` False; one that ended has the
    EOS id (0 here, the smallest) and ``finished`` True; ``eos`` is a long tensor."""
    for finished in ("aside", "on_beam"):
        r = beam_search_tensors(
            MODEL, PROMPT, num_beams=3, max_new_tokens=2, eos_token_id=0, finished=finished
        )
        assert r.eos.dtype == torch.long
        assert r.valid.all()
        assert torch.equal(r.finished, r.eos == 0)
        assert set(r.eos.flatten().tolist()) == {-1, 0}, finished


def test_alg_1_stops_each_row_at_its_own_limit():
    """On the beam, rows with limits 2 and 5 in one batch: each row equals its search alone."""
    ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
    kw = dict(num_beams=3, eos_token_id=0, finished="on_beam")
    batch = beam_search_batch(MODEL, ids, max_new_tokens=[2, 5], **kw)
    for row, limit in ((0, 2), (1, 5)):
        alone = beam_search(MODEL, PROMPT, max_new_tokens=limit, **kw)
        assert [(h.tokens, round(h.score, 4), h.finished) for h in batch[row]] == [
            (h.tokens, round(h.score, 4), h.finished) for h in alone
        ]
        assert max(len(h.tokens) for h in batch[row]) <= limit


def test_the_row_count_comes_from_a_2d_prompt_only():
    """A 1-D prompt is one row for the per-row settings, so the stepper names the prompt's shape
    (not a per-row count); a prompt of two rows to ``beam_search``, or a Stepper of two
    inputs, is refused word for word."""
    with pytest.raises(GencraftError) as err:
        beam_search_tensors(MODEL, PROMPT[0], num_beams=2, max_new_tokens=[3])
    assert str(err.value) == "input_ids must have shape [B, P] with B, P >= 1, got [3]"
    with pytest.raises(GencraftError) as err:
        beam_search(MODEL, PROMPT.repeat(2, 1), num_beams=2, max_new_tokens=3)
    assert str(err.value) == (
        "beam_search takes one input [1, P], got [2, 3]; use beam_search_batch for a batch"
    )
    two = type("Two", (), {"vocab_size": V, "batch_size": 2})()
    with pytest.raises(GencraftError) as err:
        beam_search(two, num_beams=2, max_new_tokens=3, eos_token_id=0)
    assert str(err.value) == "beam_search takes a Stepper of one input; use beam_search_batch"
