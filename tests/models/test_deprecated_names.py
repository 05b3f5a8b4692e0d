"""gencraft's own calls never use a name the installed ``transformers`` deprecates: from 5.24
a model's cache is ``cache`` (``past_key_values`` and ``cache_params`` are deprecated, and on
5.25 even asking an output for them logs a warning). FAME's forward and generate (an
encoder-decoder and a causal LM), the hidden-state-optimised cache given back to ``generate``
as the docs show, and :func:`gencraft.models.compat.output_cache` are run with transformers'
logger recorded. Part of the compatibility tests (``make test-compat``), so it runs on the
newest release too."""

from __future__ import annotations

import pytest
import torch
import transformers.utils.generic as generic

from gencraft.models.compat import CACHE_ARG, cache_kwargs, output_cache


class _Recording:
    """transformers' logger, with every warning recorded."""

    def __init__(self, real) -> None:
        self.real, self.seen = real, []

    def warning_once(self, message, *args, **kwargs) -> None:
        self.seen.append(str(message))

    def warning(self, message, *args, **kwargs) -> None:
        self.seen.append(str(message))

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def warnings_of_transformers(monkeypatch):
    recording = _Recording(generic.logger)
    monkeypatch.setattr(generic, "logger", recording)
    return recording.seen


def _deprecated(seen: list[str]) -> list[str]:
    return [m for m in seen if "deprecated" in m and "cache" in m]


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-llama"])
def test_fame_forward_and_generate_use_the_current_cache_name(name, warnings_of_transformers):
    from gencraft.focus import FocusConfig, FocusForConditionalGeneration
    from gencraft.models import load_model

    base, tok = load_model(name, seed=0)
    model = FocusForConditionalGeneration(base, FocusConfig()).eval()
    enc = tok(["the cat sat on the mat", "a dog"], return_tensors="pt", padding=True)
    with torch.no_grad():
        model.generate(**enc, max_new_tokens=3, num_beams=2)
        model.generate(**enc, max_new_tokens=3, do_sample=True, focus_k=5)
    assert _deprecated(warnings_of_transformers) == []


def test_an_optimised_cache_goes_back_to_generate_as_the_docs_show(warnings_of_transformers):
    from gencraft.hso import HSOConfig, hso_prefill
    from gencraft.models import load_model

    model, tok = load_model("tiny-llama", seed=0)
    ids = tok("some long text to read here", return_tensors="pt").input_ids
    cache = hso_prefill(model, ids, HSOConfig(window=3, lr=0.01))
    with torch.no_grad():
        model.generate(ids, **cache_kwargs(cache), max_new_tokens=3)
    assert _deprecated(warnings_of_transformers) == []


def test_output_cache_reads_the_current_name_without_asking_for_the_old(
    warnings_of_transformers,
):
    from gencraft.models import load_model

    model, tok = load_model("tiny-llama", seed=0)
    ids = tok("a b c", return_tensors="pt").input_ids
    with torch.no_grad():
        with_cache = model(ids, use_cache=True)
        without = model(ids, use_cache=False)
    assert output_cache(with_cache) is with_cache[CACHE_ARG]
    assert output_cache(without) is None
    assert output_cache({"past_key_values": 1}) == 1  # a plain dict under the old name
    assert _deprecated(warnings_of_transformers) == []
