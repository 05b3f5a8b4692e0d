"""Counts are outputs: gencraft's beam search stops at the step where ``generate``'s beam search
stops, under each stopping rule and length penalty, for a batch whose prompts differ."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from method_testing import small_llama
from test_batch import SETTINGS, _batch, _model, prompts_st

from gencraft.search import beam_search_tensors


@settings(max_examples=25, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "bart"]),
    seed=st.integers(0, 1),
    prompts=prompts_st,
    beams=st.integers(2, 3),
    max_new=st.integers(2, 9),
    early_stopping=st.sampled_from([True, False, "never"]),
    length_penalty=st.sampled_from([0.0, 1.5, -0.7, 3.0]),
)
# "never" with a positive penalty runs on where False stops (2 calls against 9, 3 against 7)
@example("peaked-llama", 1, [[9, 3, 6], [4, 11, 3, 5]], 2, 9, "never", 1.5)
@example("peaked-llama", 1, [[9, 3, 6], [4, 11, 3, 5]], 2, 9, False, 1.5)
def test_beam_search_makes_generate_s_model_calls_and_outputs(
    kind, seed, prompts, beams, max_new, early_stopping, length_penalty
):
    """The model calls of ``beam_search_tensors`` equal those of ``generate(num_beams=K)`` on the
    same batch (the stopping rule decides them: a full finished set with ``True``, the best
    live score against the worst finished one with ``False``, and the limit's length with
    ``"never"``), and so do the best outputs and their scores."""
    model = _model(kind, seed)
    ids, mask = _batch(prompts, left=not model.config.is_encoder_decoder)
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    kw = dict(num_beams=beams, max_new_tokens=max_new, early_stopping=early_stopping)
    kw["length_penalty"] = length_penalty
    try:
        g = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **kw,
        )
        theirs = len(calls)
        calls.clear()
        res = beam_search_tensors(model, ids, mask, eos_token_id=[2], **kw)
        ours = len(calls)
    finally:
        handle.remove()
    assert ours == theirs
    start = 1 if model.config.is_encoder_decoder else ids.shape[1]
    for row, (seq, score) in enumerate(zip(g.sequences, g.sequences_scores, strict=True)):
        mine = res.tokens[row, 0, : res.length[row, 0]].tolist()
        mine += [2] if res.finished[row, 0] else []
        assert seq[start : start + len(mine)].tolist() == mine
        assert float(res.sequence_score[row, 0]) == pytest.approx(float(score), abs=1e-4)


def test_counts_differ_between_the_stopping_rules():
    """The rules differ in calls: on this prompt ``True`` stops before ``False`` with a
    positive length penalty."""
    model = small_llama(3, vocab=8)
    ids, mask = _batch([[5, 6]])
    counts = {}
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        for rule in (True, False):
            calls.clear()
            beam_search_tensors(
                model,
                ids,
                mask,
                num_beams=3,
                max_new_tokens=5,
                early_stopping=rule,
                length_penalty=1.5,
            )
            counts[rule] = len(calls)
    finally:
        handle.remove()
    assert counts[True] < counts[False], counts
