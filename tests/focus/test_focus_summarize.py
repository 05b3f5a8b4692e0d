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
    ed = model.is_encoder_decoder
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
        model, tok, DOCS, decoding=decoding, max_new_tokens=NEW, batch_size=3, progress=False,
        max_source=SOURCE,
    )  # fmt: skip
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
        model, tok, DOCS, decoding=decoding, samples=2, seed=7, max_new_tokens=NEW,
        batch_size=2, progress=False, max_source=SOURCE,
    )  # fmt: skip
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
        model, tok, DOCS, decoding="top_k", samples=2, max_new_tokens=2, batch_size=2,
        progress=progress, on_batch=lambda j, s: seen.append((j, s)),
    )  # fmt: skip
    (bar,) = RecordingBar.made
    assert bar.kw == dict(total=10, desc="summarize (top_k)", disable=not progress)
    assert bar.updates == 10 and bar.closed
    assert [j for j, _ in seen] == [0, 2, 4]
    assert [x for _, s in seen for x in s] == out and all(len(x) == 2 for x in out)
