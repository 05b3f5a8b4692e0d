"""Exact search's reported counts and its seed (mutmut's survivors in search/exact.py, issue
41): ``nodes`` is the number of model calls, the seed's steps included, and the seed is
scored with the processors seeing exactly the tokens before each step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import NoRepeatNGramLogitsProcessor

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.search.exact import exact_mode

EOS = [3]


@pytest.fixture(scope="module")
def counted():
    model, _ = load_model("tiny-llama", seed=0)
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return model.eval(), calls


@settings(max_examples=20, deadline=None)
@given(
    prompt=st.lists(st.integers(4, 200), min_size=1, max_size=5),
    seed=st.none() | st.lists(st.integers(4, 200), min_size=1, max_size=3),
    max_nodes=st.none() | st.integers(1, 30),
)
def test_nodes_are_the_model_calls_seed_steps_included(counted, prompt, seed, max_nodes):
    model, calls = counted
    calls[0] = 0
    got = exact_mode(
        model,
        torch.tensor([prompt]),
        eos_token_id=EOS,
        max_new_tokens=3,
        initial=seed,
        max_nodes=max_nodes,
    )
    assert got.nodes == calls[0]
    if max_nodes is not None and not got.exact:
        assert got.nodes >= max_nodes


def _processed_score(model, prompt: list[int], output: list[int]) -> float:
    """log P(output + EOS | prompt) with NoRepeatNGram(2) applied at each step to the
    log-probabilities, given the prompt and the output so far (written out step by step)."""
    proc = NoRepeatNGramLogitsProcessor(2)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    score = 0.0
    for i in range(len(output) + 1):
        seen = torch.tensor([prompt + output[:i]])
        lp = proc(seen, logp[len(prompt) - 1 + i][None].clone())[0]
        score += lp[output[i]].item() if i < len(output) else lp[EOS].logsumexp(0).item()
    return score


@pytest.mark.parametrize("seed", [[11, 12, 11, 12], [11, 12, 13, 11], [20, 21, 20, 22]])
def test_a_seed_is_scored_with_the_processors_seeing_the_tokens_before_each_step(counted, seed):
    """A budget of the root and the seed's steps stops the search at the seed, so its score
    is what comes back. [11, 12, 11, 12] repeats a bigram: the processor bans its last token."""
    model, _ = counted
    prompt = [5, 9, 13, 7]
    got = exact_mode(
        model,
        torch.tensor([prompt]),
        eos_token_id=EOS,
        max_new_tokens=4,
        length=4,  # the empty output (scored at the root for free) is no candidate
        initial=seed,
        max_nodes=len(seed) + 1,
        logits_processor=[NoRepeatNGramLogitsProcessor(2)],
    )
    assert not got.exact and got.tokens == seed
    assert got.log_prob == pytest.approx(_processed_score(model, prompt, seed), abs=1e-6)


def test_a_batch_given_to_exact_mode_is_named_word_for_word(counted):
    model, _ = counted
    with pytest.raises(GencraftError) as e:
        exact_mode(model, torch.tensor([[5, 6], [7, 8]]), eos_token_id=EOS, max_new_tokens=2)
    assert str(e.value) == (
        "exact_mode takes one input [1, P], got [2, 2]; use exact_mode_batch for a batch"
    )


def test_seeds_are_checked_at_their_bounds(counted):
    model, _ = counted
    vocab = model.config.vocab_size
    ids = torch.tensor([[5, 9, 13]])
    for seed in ([0, 7], [vocab - 1]):  # both ends of the vocabulary are tokens
        got = exact_mode(model, ids, eos_token_id=EOS, max_new_tokens=2, initial=seed)
        assert got.exact
    rule = (
        "initial must be at most max_new_tokens=2 tokens (exactly length={} with length), "
        "inside the vocabulary and without EOS"
    )
    for seed, length in [([vocab], None), ([-1], None), ([3], None), ([5, 6, 7], None)]:
        with pytest.raises(GencraftError) as e:
            exact_mode(model, ids, eos_token_id=EOS, max_new_tokens=2, initial=seed)
        assert str(e.value) == rule.format(length), seed
    with pytest.raises(GencraftError) as e:
        exact_mode(model, ids, eos_token_id=EOS, max_new_tokens=2, length=2, initial=[5])
    assert str(e.value) == rule.format(2)
    from gencraft.search.exact import exact_mode_batch

    with pytest.raises(GencraftError) as e:
        exact_mode_batch(
            model,
            torch.tensor([[5, 9], [6, 7]]),
            eos_token_id=EOS,
            max_new_tokens=2,
            initial=[[5]],
        )
    assert str(e.value) == "initial must give one seed (or None) per row: 2, got 1"


def test_peak_kv_bytes_holds_at_least_the_prompts_cache(counted):
    """The search keeps the prompt's keys and values (2 per layer, float32 here) all along."""
    model, _ = counted
    cfg = model.config
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    for n_prompt, new in [(3, 1), (6, 3)]:
        ids = torch.arange(5, 5 + n_prompt)[None]
        got = exact_mode(model, ids, eos_token_id=EOS, max_new_tokens=new)
        assert per_position * n_prompt <= got.peak_kv_bytes
        assert got.peak_kv_bytes <= per_position * (n_prompt + new) * (got.nodes + 1)
        assert got.peak_kv_bytes % (cfg.num_key_value_heads * cfg.head_dim * 4) == 0


class _SetMax:
    """Sets token 4's score to ``value``: a processor whose output is not a log-probability
    once ``value`` > 0."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, 4] = self.value
        return scores


def test_processed_scores_above_zero_are_refused_past_a_rounding_margin(counted):
    model, _ = counted
    ids = torch.tensor([[5, 9, 13]])
    for value in (0.0, 1e-6):  # a renormalised score may round a hair above 0
        exact_mode(
            model, ids, eos_token_id=EOS, max_new_tokens=1, logits_processor=[_SetMax(value)]
        )
    with pytest.raises(GencraftError) as e:
        exact_mode(model, ids, eos_token_id=EOS, max_new_tokens=1, logits_processor=[_SetMax(0.5)])
    assert str(e.value) == (
        "exact search needs processed scores <= 0 (log-probabilities, masked or renormalised) "
        "for its pruning; a logits processor returned 0.5"
    )
