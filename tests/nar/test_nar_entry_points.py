"""The three NAR-task decoders' entry points (the RUM-SUNDAE comparison counts their
calls): each one's progress bar is off by default and named and sized when asked; the
autoregressive baseline passes its documented defaults to ``generate``, decodes by beam search
whatever the model's generation config says, holds EOS off for ``min_new_tokens`` and makes
one ``generate`` call per chunk of ``batch_size`` rows."""

from __future__ import annotations

import re

import pytest
import torch
from test_nar_batch import SOURCES, _encode, eos_prone_decoder

from gencraft.nar import SamplingConfig, load_mlm_seq2seq
from gencraft.nar.decoding import (
    autoregressive_generate,
    mask_predict_generate,
    sundae_generate,
)
from gencraft.nar.functional import noise_ids


@pytest.fixture(scope="module")
def nar():
    model, tok = load_mlm_seq2seq("tiny-bert", seed=3, max_target_length=12)
    return model.eval(), tok


@pytest.fixture(scope="module")
def ar():
    return eos_prone_decoder()


def _bars(err: str, name: str) -> list[str]:
    """The bar lines of ``name`` that tqdm wrote to stderr."""
    return [line for line in re.split(r"[\r\n]", err) if line.startswith(f"{name}: ")]


def _decoders(nar, ar):
    model, tok = nar
    ids, mask = _encode(tok, SOURCES)
    cfg = SamplingConfig(steps=2, samples=2, length_candidates=1)
    lengths = torch.full((len(SOURCES), 1), 4)
    noise = noise_ids(tok)
    a_model, a_tok = ar
    a_ids, a_mask = _encode(a_tok, SOURCES)
    return {
        "sundae": lambda **kw: sundae_generate(
            model, ids, mask, cfg, noise=noise, lengths=lengths, **kw
        ),
        "mask-predict": lambda **kw: mask_predict_generate(
            model, ids, mask, cfg, mask_id=tok.mask_token_id, lengths=lengths, **kw
        ),
        "beam": lambda **kw: autoregressive_generate(
            a_model, a_ids, a_mask, num_beams=2, max_new_tokens=6, **kw
        ),
    }


@pytest.mark.parametrize("name", ["sundae", "mask-predict", "beam"])
def test_each_decoder_shows_its_named_bar_only_when_asked(nar, ar, capsys, name):
    run = _decoders(nar, ar)[name]
    capsys.readouterr()
    quiet = run()
    assert capsys.readouterr().err == ""
    loud = run(progress=True, batch_size=2)
    bars = _bars(capsys.readouterr().err, name)
    assert bars and bars[-1].startswith(f"{name}: 100%") and "5/5" in bars[-1]
    assert loud.sequences == quiet.sequences


class _Spy:
    """Records each ``generate`` call's keywords and its batch rows."""

    def __init__(self, model, monkeypatch):
        self.calls: list[dict] = []
        real = model.generate

        def spy(**kw):
            self.calls.append(kw)
            return real(**kw)

        monkeypatch.setattr(model, "generate", spy)


def test_the_baseline_passes_its_documented_defaults_to_generate(ar, monkeypatch):
    model, tok = ar
    ids, mask = _encode(tok, SOURCES)
    spy = _Spy(model, monkeypatch)
    out = autoregressive_generate(model, ids, mask)
    (kw,) = spy.calls
    assert (kw["num_beams"], kw["max_new_tokens"], kw["min_new_tokens"]) == (4, 64, 0)
    assert kw["do_sample"] is False and kw["input_ids"].shape == ids.shape
    assert len(out.sequences) == len(SOURCES)


def test_the_baseline_is_beam_search_even_when_the_model_would_sample(ar):
    model, tok = ar
    ids, mask = _encode(tok, SOURCES)
    kw = dict(num_beams=3, max_new_tokens=8)
    want = autoregressive_generate(model, ids, mask, **kw)
    config = model.generation_config
    before = config.do_sample, config.top_k
    config.do_sample, config.top_k = True, 5
    try:
        for seed in (0, 1):
            torch.manual_seed(seed)
            got = autoregressive_generate(model, ids, mask, **kw)
            assert got.sequences == want.sequences and got.scores == want.scores
    finally:
        config.do_sample, config.top_k = before


def test_min_new_tokens_holds_eos_off_in_every_row(ar):
    model, tok = ar
    ids, mask = _encode(tok, SOURCES)
    free = autoregressive_generate(model, ids, mask, num_beams=2, max_new_tokens=8)
    assert min(len(s) for s in free.sequences) < 5  # some row ends early without it
    held = autoregressive_generate(
        model, ids, mask, num_beams=2, max_new_tokens=8, min_new_tokens=5
    )
    assert min(len(s) for s in held.sequences) >= 5


@pytest.mark.parametrize("size", [1, 2, 3, 5, None])
def test_the_baseline_makes_one_generate_call_per_chunk(ar, monkeypatch, size):
    model, tok = ar
    ids, mask = _encode(tok, SOURCES)
    assert ids.shape[0] != ids.shape[1]  # rows are counted on the batch axis
    whole = autoregressive_generate(model, ids, mask, num_beams=2, max_new_tokens=6)
    spy = _Spy(model, monkeypatch)
    out = autoregressive_generate(model, ids, mask, num_beams=2, max_new_tokens=6, batch_size=size)
    step = size or len(SOURCES)
    want = [min(step, len(SOURCES) - i) for i in range(0, len(SOURCES), step)]
    assert [kw["input_ids"].shape[0] for kw in spy.calls] == want
    assert out.sequences == whole.sequences and len(out.model_calls) == len(SOURCES)
