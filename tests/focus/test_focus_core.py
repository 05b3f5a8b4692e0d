"""FAME's pieces on tensors: the focus head against a loop over source positions, the topic
loss against eq. 3 by hand, focus vocabularies and the logits processor inside generate()."""

from __future__ import annotations

import math

import pytest
import torch

from gencraft.focus import (
    FocusHead,
    FocusLogitsProcessor,
    focus_vocabulary,
    frequent_token_ids,
    oracle_vocabulary,
    peakiness,
    topic_loss,
)
from gencraft.models import load_model


def _head_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, s, t, h, v, n = 2, 5, 3, 8, 11, 4
    x = torch.randn(b, s, h, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    att = torch.rand(b, n, t, s, generator=g).masked_fill(~mask.bool()[:, None, None], 0)
    att = att / att.sum(-1, keepdim=True)
    e = torch.randn(v, h, generator=g)
    return x, mask, att, e


def test_focus_bias_and_topic_logits_equal_a_loop_over_source_positions():
    torch.manual_seed(0)
    head = FocusHead(8, 16)
    x, mask, att, e = _head_inputs()
    out = head(x, mask, e, att, return_token_logits=True)
    a = att.mean(1)
    for b in range(2):
        real = [i for i in range(5) if mask[b, i]]
        tx = {
            i: torch.nn.functional.gelu(x[b, i] @ head.w1.weight.T + head.w1.bias)
            @ head.w2.weight.T
            + head.w2.bias
            for i in real
        }
        tx = {i: v @ e.T for i, v in tx.items()}
        torch.testing.assert_close(out.topic_logits[b], sum(tx.values()) / len(real))
        for t in range(3):
            ref = sum(a[b, t, i] * tx[i] for i in real)
            torch.testing.assert_close(out.focus_bias[b, t], ref, atol=1e-5, rtol=1e-5)
        for i in real:
            torch.testing.assert_close(out.token_logits[b, i], tx[i], atol=1e-5, rtol=1e-5)


def test_padded_source_positions_get_zero_weight():
    torch.manual_seed(0)
    head = FocusHead(8, heads=1)
    x, mask, att, e = _head_inputs()
    ref = head(x, mask, e, att)
    x2, att2 = x.clone(), att.clone()
    x2[1, 3:] = 1e3  # garbage under the padding
    att2[1, :, :, 3:] = 0.7  # and attention mass placed on it
    out = head(x2, mask, e, att2)
    torch.testing.assert_close(out.topic_logits, ref.topic_logits)
    torch.testing.assert_close(out.focus_bias[0], ref.focus_bias[0])
    a = att2[1, 1].masked_fill(~mask[1].bool(), 0)
    g = head.project(x2[1]).masked_fill(~mask[1].bool()[:, None], 0)
    torch.testing.assert_close(out.focus_bias[1], (a @ g) @ e.T, atol=1e-4, rtol=1e-5)


def test_head_rejects_bad_shapes_and_empty_sources():
    head = FocusHead(8)
    x, mask, att, e = _head_inputs()
    with pytest.raises(ValueError, match="no non-padding token"):
        head(x, torch.zeros_like(mask), e, att)
    with pytest.raises(ValueError, match="embedding_weight"):
        head(x, mask, e[:, :4], att)
    with pytest.raises(ValueError, match="encoder_states"):
        head(x[..., :4], mask, e, att)
    with pytest.raises(ValueError, match="attention"):
        head(x, mask, e, att[:, :, :, :3])


@pytest.mark.parametrize("reading", ["negative", "ignore"])
def test_topic_loss_equals_eq3_by_hand(reading):
    v = 10
    logits = torch.linspace(-2, 3, 2 * v).view(2, v)
    targets = torch.tensor([[3, 4, 4, 1, 0], [7, 1, 0, 0, 0]])  # 0 = pad
    frequent = torch.tensor([1, 2])
    got = topic_loss(logits, targets, frequent, pad_token_id=0, frequent=reading)
    total = 0.0
    for b in range(2):
        summary = {int(t) for t in targets[b] if t != 0} - {1, 2}
        terms = []
        for i in range(v):
            if reading == "ignore" and i in (1, 2):
                continue
            p = 1 / (1 + math.exp(-float(logits[b, i])))
            terms.append(-math.log(p) if i in summary else -math.log(1 - p))
        total += sum(terms) / len(terms)
    assert got.item() == pytest.approx(total / 2, rel=1e-5)


def test_frequent_token_ids_and_oracle():
    seqs = [[5, 6, 6, 7], [6, 7, 9, 1], [1, 1]]
    assert frequent_token_ids(seqs, 2, exclude=[1]).tolist() == [6, 7]
    assert frequent_token_ids(seqs, 10).tolist() == [1, 6, 7, 5, 9]
    assert oracle_vocabulary([9, 3, 3, -100, 1], torch.tensor([4]), exclude=[1]).tolist() == [
        3,
        4,
        9,
    ]


def test_focus_vocabulary_modes_and_errors():
    t = torch.arange(20.0)
    f = torch.tensor([0, 1])
    assert focus_vocabulary(t, 3, mode="top", frequent_ids=f).tolist() == [0, 1, 17, 18, 19]
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = focus_vocabulary(t, 6, generator=g1)
    assert a.numel() == 6 and torch.equal(a, focus_vocabulary(t, 6, generator=g2))
    assert focus_vocabulary(t, 20).tolist() == list(range(20))  # without replacement
    for k in (0, 21):
        with pytest.raises(ValueError, match="k must lie"):
            focus_vocabulary(t, k)
    with pytest.raises(ValueError, match="one document"):
        focus_vocabulary(t.view(2, 10), 3)


def test_peakiness_matches_footnote_12_reading():
    t = torch.zeros(200)
    t[:100] = torch.linspace(123.75, 0.0, 100)  # slope 1.25 per rank
    slope, angle = peakiness(t)
    assert slope == pytest.approx(1.25) and angle == pytest.approx(51.34, abs=0.01)


def test_logits_processor_masks_rows_and_shares_sets_across_beams():
    proc = FocusLogitsProcessor([torch.tensor([1, 3]), torch.tensor([2])], always_allowed=[0])
    scores = proc(torch.zeros(4, 1, dtype=torch.long), torch.zeros(4, 5))  # 2 docs x 2 beams
    allowed = torch.isfinite(scores)
    assert (
        allowed.tolist()
        == [[True, True, False, True, False]] * 2 + [[True, False, True, False, False]] * 2
    )
    with pytest.raises(ValueError, match="cannot be split"):
        proc(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 5))
    with pytest.raises(ValueError, match="non-empty"):
        FocusLogitsProcessor([torch.tensor([], dtype=torch.long)])


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-llama"])
def test_generate_never_leaves_the_focus_vocabulary(name):
    model, tok = load_model(name)
    enc = tok(["the cat sat on the mat", "a dog"], return_tensors="pt", padding=True)
    g = torch.Generator().manual_seed(0)
    special = {tok.eos_token_id, tok.pad_token_id}
    for seed in range(6):
        sets = [
            focus_vocabulary(torch.randn(len(tok), generator=g), 12, generator=g) for _ in range(2)
        ]
        proc = FocusLogitsProcessor(sets, always_allowed=special)
        torch.manual_seed(seed)
        kw = [
            dict(do_sample=True, top_k=640),
            dict(do_sample=True, top_p=0.95),
            dict(num_beams=3, do_sample=False),
        ][seed % 3]
        out = model.generate(**enc, max_new_tokens=10, logits_processor=[proc], **kw)
        new = out if model.config.is_encoder_decoder else out[:, enc["input_ids"].shape[1] :]
        for row, allowed in zip(new, sets, strict=True):
            ok = set(allowed.tolist()) | special | {model.generation_config.decoder_start_token_id}
            assert set(row.tolist()) <= ok


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-llama"])
def test_full_vocabulary_focus_equals_plain_decoding(name):
    model, tok = load_model(name)
    enc = tok(["the cat sat"], return_tensors="pt")
    everything = focus_vocabulary(torch.randn(len(tok)), len(tok), mode="top")
    plain = model.generate(**enc, max_new_tokens=8, num_beams=3)
    focused = model.generate(
        **enc, max_new_tokens=8, num_beams=3, logits_processor=[FocusLogitsProcessor([everything])]
    )
    assert torch.equal(plain, focused)


@pytest.mark.parametrize("renormalize", [True, False])
def test_beam_scores_are_log_probabilities_over_the_focus_vocabulary(renormalize):
    """FAME eq. 5 under beam search: with length_penalty=0 a beam's score is the sum of its
    tokens' log-probabilities re-normalised over V_k ∪ F (renormalize=False: unrestricted)."""
    model, tok = load_model("tiny-llama")
    enc = tok(["the cat sat on"], return_tensors="pt")
    eos = tok.eos_token_id
    allowed = focus_vocabulary(torch.randn(len(tok), generator=torch.Generator().manual_seed(3)), 9)
    opts = {} if renormalize else {"renormalize": False}  # the default must re-normalise
    proc = FocusLogitsProcessor([allowed], always_allowed={eos}, **opts)
    out = model.generate(
        **enc,
        max_new_tokens=6,
        num_beams=3,
        num_return_sequences=3,
        length_penalty=0.0,
        do_sample=False,
        logits_processor=[proc],
        return_dict_in_generate=True,
        output_scores=True,
        pad_token_id=eos,
    )
    n = enc["input_ids"].shape[1]
    keep = torch.zeros(len(tok), dtype=torch.bool)
    keep[allowed] = True
    keep[eos] = True
    for seq, score in zip(out.sequences, out.sequences_scores, strict=True):
        new = seq[n:].tolist()
        if eos in new:
            new = new[: new.index(eos) + 1]
        ids = torch.tensor([enc["input_ids"][0].tolist() + new])
        with torch.no_grad():
            logits = model(ids).logits[0, n - 1 : -1].float()  # [len(new), V]
        full = logits.log_softmax(-1)
        restricted = logits.masked_fill(~keep, float("-inf")).log_softmax(-1)
        tgt = torch.tensor(new)[:, None]
        want = (restricted if renormalize else full).gather(1, tgt).sum()
        other = (full if renormalize else restricted).gather(1, tgt).sum()
        assert float(score) == pytest.approx(float(want), abs=1e-4)
        assert abs(float(score) - float(other)) > 1e-2


def test_focus_sample_draws_from_softmax_of_the_topic_logits():
    """Goodness of fit: with k = 1, V_k is one draw from softmax(T_X); Pearson's chi-square
    over 6,000 seeded draws stays below the 0.1% critical value (df = 5: 20.52). Uniform
    draws (or draws by rank) give a statistic in the thousands."""
    t = torch.tensor([0.0, 1.0, 2.0, 3.0, -1.0, -2.0])
    probs = torch.softmax(t, 0)
    g = torch.Generator().manual_seed(0)
    n = 6000
    counts = torch.zeros(6)
    for _ in range(n):
        counts[focus_vocabulary(t, 1, generator=g)] += 1
    expected = n * probs
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.52
    uniform = torch.full((6,), n / 6)
    assert float(((uniform - expected) ** 2 / expected).sum()) > 1000  # the test has power
