"""``sequence_log_prob``, what the searches are compared on, against a full forward pass of
the prompt and the tokens: the summed log-softmax of each token after what precedes it, plus,
with ``end``, the log of the summed probabilities of the EOS ids after the last token; on a
causal LM and on encoder-decoders (the tokens after the decoder's start token)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.models.stepping import sequence_log_prob

_MODELS: dict[str, torch.nn.Module] = {}


def _model(name: str) -> torch.nn.Module:
    if name not in _MODELS:
        _MODELS[name] = load_model(name, seed=1)[0].eval()
    return _MODELS[name]


def _reference(model, prompt: list[int], tokens: list[int], eos: list[int], end: bool) -> float:
    """From one forward pass in float64 of the log-softmax."""
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            start = model.generation_config.decoder_start_token_id
            out = model(
                input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([[start, *tokens]])
            )
            lp = out.logits[0].double().log_softmax(-1)  # row i predicts tokens[i]
        else:
            out = model(input_ids=torch.tensor([prompt + tokens]))
            lp = out.logits[0, len(prompt) - 1 :].double().log_softmax(-1)
    total = sum(float(lp[i, t]) for i, t in enumerate(tokens))
    if end:
        total += float(torch.logsumexp(lp[len(tokens), eos], 0))
    return total


@pytest.mark.parametrize("end", [True, False])  # not drawn: each draw is seen both ways
@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(["tiny-llama", "tiny-gpt2", "tiny-bart", "tiny-t5"]),
    prompt=st.lists(st.integers(5, 260), min_size=1, max_size=6),
    tokens=st.lists(st.integers(0, 260), min_size=0, max_size=5),
    eos=st.lists(st.integers(0, 260), min_size=1, max_size=3, unique=True),
)
def test_the_score_is_one_full_forward_pass(end, name, prompt, tokens, eos):
    model = _model(name)
    got = sequence_log_prob(model, torch.tensor([prompt]), tokens, eos, end=end)
    assert isinstance(got, float)
    assert got == pytest.approx(_reference(model, prompt, tokens, eos, end), abs=1e-4)
    one = eos[0]  # one id, given as an int, is the list of it
    want = sequence_log_prob(model, torch.tensor([prompt]), tokens, [one], end=end)
    assert sequence_log_prob(model, torch.tensor([prompt]), tokens, one, end=end) == want


def test_by_default_the_end_is_scored_with_the_models_eos_ids():
    model = _model("tiny-llama")
    prompt, tokens = [5, 9, 14], [20, 7]
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    got = sequence_log_prob(model, torch.tensor([prompt]), tokens)
    assert got == pytest.approx(_reference(model, prompt, tokens, eos, True), abs=1e-4)
    assert got < sequence_log_prob(model, torch.tensor([prompt]), tokens, end=False)


def test_no_graph_is_kept_and_the_model_is_not_changed():
    model = _model("tiny-gpt2")
    before = [p.clone() for p in model.parameters()]
    sequence_log_prob(model, torch.tensor([[5, 6]]), [7, 8], [2])
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_model_needs_input_ids_and_eos_ids_in_the_vocabulary():
    model = _model("tiny-llama")
    with pytest.raises(GencraftError, match=r"^input_ids is required with a model$"):
        sequence_log_prob(model, None, [5])
    with pytest.raises(GencraftError, match=r"^eos_token_id \[261\] outside the vocabulary"):
        sequence_log_prob(model, torch.tensor([[5]]), [5], 261)


def test_an_ended_sequence_may_fill_the_context_with_its_eos():
    """The prompt, the tokens and the EOS whose probability ends them take at most the model's
    512 positions: 500 + 11 + 1 is scored, 500 + 12 + 1 refused word for word."""
    model = _model("tiny-gpt2")
    prompt = torch.randint(5, 200, (1, 500), generator=torch.Generator().manual_seed(0))
    tokens = list(range(20, 32))
    got = sequence_log_prob(model, prompt, tokens[:11], [2])
    assert got == pytest.approx(
        _reference(model, prompt[0].tolist(), tokens[:11], [2], True), abs=1e-3
    )
    msg = (
        "a prompt of 500 tokens plus max_new_tokens=13 exceeds the model's context of 512 positions"
    )
    with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
        sequence_log_prob(model, prompt, tokens, [2])
