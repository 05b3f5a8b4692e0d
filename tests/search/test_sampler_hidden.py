"""The classifier's training inputs: ``_Sampler.hidden`` gives each sample's decoder states
at every layer, from the last input position before its first token on; checked against the
sample run alone (no padding) on causal and encoder-decoder models, with no graph."""

from __future__ import annotations

import pytest
import torch

from gencraft.models import load_model
from gencraft.models.introspect import decoder_start_id
from gencraft.search.train import _Sampler


def _sampler(name: str) -> _Sampler:
    model, tok = load_model(name, seed=0)
    return _Sampler(model, tok, "length", lambda *a: True, censored=False, prompt_texts=None)


def _alone(sm: _Sampler, ids: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """[T, M + 1, H]: the prompt (or the decoder start) then the sample but its last token, in
    one unpadded call; the states from the position that predicts the sample's first token."""
    with torch.no_grad():
        if sm.encoder_decoder:
            dec = torch.cat([torch.tensor([decoder_start_id(sm.model)]), sample[:-1]])[None]
            hs = sm.model(input_ids=ids, decoder_input_ids=dec, output_hidden_states=True)
            states, first = hs.decoder_hidden_states, 0
        else:
            full = torch.cat([ids[0], sample[:-1]])[None]
            states, first = (
                sm.model(full, output_hidden_states=True).hidden_states,
                ids.shape[1] - 1,
            )
    return torch.stack(states, dim=2)[0, first : first + len(sample)]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bart", "tiny-t5"])
def test_each_samples_states_are_its_own_alone(name):
    sm = _sampler(name)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (1, 6), generator=g)
    samples = [torch.randint(5, 200, (n,), generator=g) for n in (4, 1, 7, 3)]
    calls = []
    hook = sm.model.register_forward_hook(lambda *a: calls.append(torch.is_grad_enabled()))
    got = sm.hidden(ids, samples)
    hook.remove()
    assert calls == [False]  # one call for all samples, without a graph
    layers = sm.model.config.num_hidden_layers + 1
    for sample, states in zip(samples, got, strict=True):
        assert states.dtype == torch.float16 and states.device.type == "cpu"
        assert states.shape == (len(sample), layers, sm.model.config.hidden_size)
        want = _alone(sm, ids, sample)
        torch.testing.assert_close(states.float(), want.half().float(), atol=2e-3, rtol=2e-3)
