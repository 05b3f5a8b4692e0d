"""``summarize``, the decoding FAME's scores read: a padded batch's summaries against each
document's own ``generate`` call written from the docstrings (the encoder's layout, the
decoding's arguments, one seed per sample and batch), the bar and ``on_batch``."""

from __future__ import annotations

import pytest
import torch
from recording_bar import RecordingBar
from test_focus_model import _wrapped

from gencraft.focus.data import SummaryEncoder, collate
from gencraft.focus.evaluate import summarize

DOCS = [
    "the council said the bridge will open next year",
    "a dog ran",
    "rain fell on the city all night and the river rose above its banks by the morning",
    "markets closed higher",
    "the team won its third title in a row on sunday",
]
NEW = 5
SOURCE = 64  # bytes of the tiny tokenizer: the third document is cut


def _generate(model, tok, docs: list[str], seed: int | None, **kw) -> list[str]:
    """``docs`` as one batch: the encoder's rows, left-padded for a causal LM, then the model's
    ``generate``; the prompt cut off, special tokens skipped, stripped."""
    ed = bool(getattr(model, "base", model).config.is_encoder_decoder)
    enc = SummaryEncoder(tok, ed, max_source=SOURCE)
    pad = tok.pad_token_id if tok.pad_token_id is not None else enc.eos_id
    batch = collate([enc.encode(d) for d in docs], pad, left=not ed)
    if seed is not None:
        torch.manual_seed(seed)
    ids = model.generate(**batch, max_new_tokens=NEW, pad_token_id=pad, **kw)
    new = ids if ed else ids[:, batch["input_ids"].shape[1] :]
    return [t.strip() for t in tok.batch_decode(new, skip_special_tokens=True)]


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-gpt2"])
@pytest.mark.parametrize("decoding", ["beam", "focus_top"])
def test_deterministic_decodings_give_each_document_its_own_summary(name, decoding):
    model, tok = _wrapped(name, seed=2)  # a head whose summaries differ between documents
    got = summarize(
        model,
        tok,
        DOCS,
        decoding=decoding,
        max_new_tokens=NEW,
        batch_size=3,
        progress=False,
        max_source=SOURCE,
    )
    kw = dict(do_sample=False, num_beams=4)
    if decoding == "focus_top":  # |V_k| the whole (small) vocabulary unless told
        kw.update(focus_k=model.embedding_weight.shape[0], focus_mode="top")
        kw.update(focus_renormalize=True)
    want = [_generate(model, tok, [d], None, **kw)[0] for d in DOCS]
    assert [g for (g,) in got] == want
    assert len(set(want)) > 1  # the summaries read their documents


@pytest.mark.parametrize(
    ("decoding", "kw"),
    [
        ("top_k", dict(do_sample=True, top_k=640, num_beams=1)),
        ("nucleus", dict(do_sample=True, top_p=0.95, top_k=0, num_beams=1)),
    ],
)
def test_samples_draw_under_one_seed_per_sample_and_batch(decoding, kw):
    model, tok = _wrapped("tiny-gpt2")
    got = summarize(
        model,
        tok,
        DOCS,
        decoding=decoding,
        samples=2,
        seed=7,
        max_new_tokens=NEW,
        batch_size=2,
        progress=False,
        max_source=SOURCE,
    )
    for j in range(0, len(DOCS), 2):
        for s in range(2):
            want = _generate(model, tok, DOCS[j : j + 2], 7 + 1000 * s + j, **kw)
            assert [got[j + i][s] for i in range(len(want))] == want
    assert any(a != b for a, b in got)  # the two samples differ somewhere


@pytest.mark.parametrize("progress", [True, False])
def test_the_bar_and_on_batch(monkeypatch, progress):
    import gencraft.focus.evaluate as fe

    model, tok = _wrapped("tiny-t5")
    monkeypatch.setattr(fe, "tqdm", RecordingBar.reset())
    seen = []
    out = summarize(
        model,
        tok,
        DOCS,
        decoding="top_k",
        samples=2,
        max_new_tokens=2,
        batch_size=2,
        progress=progress,
        on_batch=lambda j, s: seen.append((j, s)),
    )
    (bar,) = RecordingBar.made
    assert bar.kw == dict(total=10, desc="summarize (top_k)", disable=not progress)
    assert bar.updates == 10 and bar.closed
    assert [j for j, _ in seen] == [0, 2, 4]
    assert [x for _, s in seen for x in s] == out and all(len(x) == 2 for x in out)


def _spy(monkeypatch, model) -> list[dict]:
    """Records each ``generate`` call's arguments and answers with its inputs (no decoding)."""
    seen: list[dict] = []

    def generate(**kw):
        seen.append(kw)
        return kw["input_ids"]

    monkeypatch.setattr(model, "generate", generate)
    return seen


def test_defaults(monkeypatch):
    """Beam 4, 64 new tokens, batches of 8, the tokenizer's pad, a bar; a causal LM's source
    cut to fit 512 positions, with the note naming both flags."""
    import gencraft.focus.evaluate as fe

    model, tok = _wrapped("tiny-gpt2")
    seen = _spy(monkeypatch, model)
    monkeypatch.setattr(fe, "tqdm", RecordingBar.reset())
    want = (
        "--max-source 512 cut to 387: tiny-gpt2 holds 512 positions, 64 of them for "
        "--max-new-tokens"
    )
    with pytest.warns(UserWarning, match=want):
        summarize(model, tok, DOCS * 2)
    assert [len(c["input_ids"]) for c in seen] == [8, 2]
    for call in seen:
        assert call["num_beams"] == 4 and call["do_sample"] is False
        assert call["max_new_tokens"] == 64 and call["pad_token_id"] == tok.pad_token_id
        assert "focus_k" not in call and "focus_seed" not in call
    (bar,) = RecordingBar.made
    assert bar.kw == dict(total=10, desc="summarize (beam)", disable=False)
    seen.clear()
    for decoding, mode in (("focus_sample+top_k", "sample"), ("focus_top", "top")):
        summarize(model, tok, DOCS[:1], decoding=decoding, max_new_tokens=2, progress=False)
        call = seen.pop()
        assert (call["focus_k"], call["focus_mode"]) == (model.embedding_weight.shape[0], mode)
        assert call["focus_renormalize"] is True and call["focus_seed"] == 0  # seed 0
    assert call["num_beams"] == 4 and "top_k" not in call
    summarize(model, tok, DOCS[:1], decoding="top_k", max_new_tokens=2, progress=False)
    assert seen[-1]["top_k"] == 640 and seen[-1]["do_sample"] is True


def test_a_tokenizer_without_pad_pads_with_eos(monkeypatch):
    import copy

    model, tok = _wrapped("tiny-t5")
    tok = copy.deepcopy(tok)
    tok.pad_token = None
    seen = _spy(monkeypatch, model)
    summarize(model, tok, DOCS[:2], max_new_tokens=2, progress=False)
    assert seen[0]["pad_token_id"] == SummaryEncoder(tok, True).eos_id


@pytest.mark.parametrize("renormalize", [True, False])
def test_focus_decodings_pass_their_vocabulary_mode_and_seed(renormalize):
    """``focus_k`` below |V| and the re-normalisation as given; ``focus_sample`` draws V_k with
    the batch's seed."""
    model, tok = _wrapped("tiny-gpt2", seed=3)  # a head whose V_k changes the summaries
    args = dict(max_new_tokens=NEW, progress=False, max_source=SOURCE, seed=3)
    beam = summarize(model, tok, DOCS[:3], decoding="beam", **args)
    for decoding, mode in (("focus_top", "top"), ("focus_sample", "sample")):
        got = summarize(
            model,
            tok,
            DOCS[:3],
            decoding=decoding,
            focus_k=3,
            focus_renormalize=renormalize,
            **args,
        )
        kw = dict(do_sample=False, num_beams=4, focus_k=3, focus_mode=mode)
        kw.update(focus_renormalize=renormalize, focus_seed=3)
        assert [g for (g,) in got] == _generate(model, tok, DOCS[:3], 3, **kw)
        assert got != beam


def test_a_plain_model_samples_with_its_own_generate():
    """A plain HF model (no FAME head): top-k sampling with the given k, no focus arguments."""
    from gencraft.models import load_model

    base, tok = load_model("tiny-gpt2", seed=0)
    got = summarize(
        base,
        tok,
        DOCS[:3],
        decoding="top_k",
        top_k=5,
        seed=4,
        max_new_tokens=NEW,
        progress=False,
        max_source=SOURCE,
    )
    want = _generate(base, tok, DOCS[:3], 4, do_sample=True, top_k=5, num_beams=1)
    assert [g for (g,) in got] == want
