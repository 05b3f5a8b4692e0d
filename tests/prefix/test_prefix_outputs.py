"""``generate_outputs``, the decoding DASP's scores read: each output of a padded batch is its
source decoded alone by the prefix model's own ``generate``, written from the docstring (the
source's first ``max_source_tokens`` tokens, then EOS for an encoder-decoder or the separator
for a causal LM; the prompt cut off; special tokens skipped), with and without CAD; no graph;
the bar; a rerun from ``partial_dir`` decodes nothing."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from recording_bar import RecordingBar

from gencraft.models import load_model
from gencraft.models.cad import CADSettings, paired_contrast_generate
from gencraft.prefix import PrefixConfig, PrefixModel
from gencraft.prefix.data import SEPARATOR

# the package may re-export a function under the module's name
po = importlib.import_module("gencraft.prefix.evaluate")
EOS, PAD = 2, 0
_MODELS: dict = {}


def _model(name: str):
    if name not in _MODELS:
        base, tok = load_model(name, seed=1)
        cfg = PrefixConfig(
            num_virtual_tokens=3, init_seed=1, encoder_segments=2, blocked_layers="lower"
        )
        _MODELS[name] = (PrefixModel(base, cfg).eval(), tok)
    return _MODELS[name]


def _sources(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    words = ["name", "area", "food", "price", "near", "the", "Eagle", "city"]
    out = []
    for _ in range(n):
        k = int(torch.randint(1, 7, (1,), generator=g))
        out.append(" ".join(words[int(i)] for i in torch.randint(0, 8, (k,), generator=g)))
    return out


def _alone(model, tok, source: str, cad_alpha=None, **kw) -> str:
    ed = bool(getattr(model, "base", model).config.is_encoder_decoder)
    end = [EOS] if ed else tok(SEPARATOR, add_special_tokens=False)["input_ids"]
    ids = tok(source, add_special_tokens=False)["input_ids"][: kw.pop("max_source_tokens")]
    x = torch.tensor([ids + end])
    kw.update(eos_token_id=EOS, pad_token_id=PAD)
    with torch.no_grad():
        if cad_alpha is None:
            seq = model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw)
        else:
            free = torch.tensor([end])
            seq = paired_contrast_generate(
                model.generate,
                x,
                torch.ones_like(x),
                free,
                torch.ones_like(free),
                cad=CADSettings(cad_alpha),
                left_padding=not ed,
                **kw,
            )
    if not ed:
        seq = seq[:, x.shape[1] :]
    return tok.batch_decode(seq, skip_special_tokens=True)[0].strip()


# (model, beams, CAD's alpha): cases whose outputs differ between sources (tiny Llama's and
# T5's greedy and CAD outputs here ignore the source)
CASES = [
    ("tiny-gpt2", 1, None),
    ("tiny-gpt2", 3, None),
    ("tiny-gpt2", 1, 0.5),
    ("tiny-gpt2", 3, 0.5),
    ("tiny-t5", 3, None),
]


@pytest.mark.parametrize(("name", "num_beams", "cad_alpha"), CASES)
def test_each_output_is_its_source_decoded_alone(name, num_beams, cad_alpha):
    model, tok = _model(name)
    sources = _sources(6, seed=1)
    kw = dict(max_source_tokens=12, max_new_tokens=4, num_beams=num_beams)
    got = po.generate_outputs(
        model, tok, sources, batch_size=4, progress=False, cad_alpha=cad_alpha, **kw
    )
    assert len(got) == len(sources) and any(len(s) > 12 for s in sources)
    assert len(set(got)) > 1  # the outputs read their sources
    for source, out in zip(sources, got, strict=True):
        assert out == _alone(model, tok, source, cad_alpha, **kw)


def test_defaults(monkeypatch):
    """Beam 5, 64 new tokens, batches of 16, sources cut to 256 tokens, a bar."""
    model, tok = _model("tiny-gpt2")
    seen = []

    def generate(**kw):  # records the call and answers with its inputs
        seen.append(kw)
        return kw["input_ids"]

    monkeypatch.setattr(model, "generate", generate)
    monkeypatch.setattr(po, "tqdm", RecordingBar.reset())
    sources = ["x" * 300, *_sources(16, 0)]
    po.generate_outputs(model, tok, sources)
    assert [len(c["input_ids"]) for c in seen] == [16, 1]
    sep = len(tok(SEPARATOR, add_special_tokens=False)["input_ids"])
    assert seen[0]["input_ids"].shape[1] == 256 + sep  # the 300-byte source, cut
    for call in seen:
        assert (call["num_beams"], call["max_new_tokens"], call["eos_token_id"]) == (5, 64, EOS)
    (bar,) = RecordingBar.made
    assert bar.kw == dict(total=17, desc="generate", disable=False)


def test_a_plain_model_decodes_with_its_own_generate():
    """A model without prefixes (the fine-tuned baseline): each output as alone."""
    base, tok = load_model("tiny-gpt2", seed=1)
    sources = _sources(4, 3)
    kw = dict(max_source_tokens=12, max_new_tokens=4, num_beams=1)
    got = po.generate_outputs(base, tok, sources, batch_size=4, progress=False, **kw)
    assert got == [_alone(base, tok, s, **kw) for s in sources] and len(set(got)) > 1


@pytest.mark.parametrize("progress", [True, False])
def test_no_graph_one_bar_of_sources(monkeypatch, progress):
    model, tok = _model("tiny-t5")
    monkeypatch.setattr(po, "tqdm", RecordingBar.reset())
    grad = []
    hook = model.base.register_forward_hook(lambda *a: grad.append(torch.is_grad_enabled()))
    po.generate_outputs(
        model, tok, _sources(5, 1), batch_size=2, num_beams=1, max_new_tokens=2, progress=progress
    )
    hook.remove()
    assert grad and not any(grad)
    (bar,) = RecordingBar.made
    assert bar.kw == dict(total=5, desc="generate", disable=not progress)
    assert bar.updates == 5 and bar.closed


def test_a_rerun_from_partial_dir_decodes_nothing(tmp_path):
    model, tok = _model("tiny-gpt2")
    sources = _sources(5, 2)
    kw = dict(batch_size=2, num_beams=1, max_new_tokens=3, progress=False)
    first = po.generate_outputs(model, tok, sources, partial_dir=tmp_path, **kw)
    calls = []
    hook = model.base.register_forward_hook(lambda *a: calls.append(1))
    again = po.generate_outputs(model, tok, sources, partial_dir=tmp_path, **kw)
    hook.remove()
    assert again == first and not calls


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-t5"])
def test_sources_are_encoded_without_the_tokenizers_special_tokens(name):
    """With a tokenizer that wraps every encoding in <s> ... </s>, the sources and the
    separator are still encoded bare (the docstring's input: source, then EOS or the
    separator), as decoding each alone with them shows."""
    from tokenizers import processors

    model, tok = _model(name)
    tok = copy.deepcopy(tok)
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    assert tok("ab")["input_ids"] == [1, 69, 70, 2]  # the wrapper is on
    sources = _sources(5, seed=4)
    kw = dict(max_source_tokens=12, max_new_tokens=4, num_beams=3)
    got = po.generate_outputs(model, tok, sources, batch_size=3, progress=False, **kw)
    assert len(set(got)) > 1
    assert got == [_alone(model, tok, s, **kw) for s in sources]


@pytest.mark.parametrize(("pad_token", "want"), [("<unk>", 3), (None, PAD)])
def test_the_pad_is_the_tokenizers_else_the_models(monkeypatch, pad_token, want):
    """The batch is padded with, and ``generate`` given, the tokenizer's pad (here <unk>, not
    the model's), else the model's."""
    model, tok = _model("tiny-gpt2")
    tok = copy.deepcopy(tok)
    tok.pad_token = pad_token
    seen = []

    def generate(**kw):  # records the call and answers with its inputs
        seen.append(kw)
        return kw["input_ids"]

    monkeypatch.setattr(model, "generate", generate)
    po.generate_outputs(model, tok, ["a", "much longer"], progress=False)
    (call,) = seen
    assert call["pad_token_id"] == want
    assert call["input_ids"][0, 0] == want and call["attention_mask"][0, 0] == 0
