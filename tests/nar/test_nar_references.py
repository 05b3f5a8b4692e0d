"""The NAR decoders against references written from their papers' descriptions (a mutation
triage): Mask-Predict (Ghazvininejad et al. 2019) as a plain loop over one length,
one SUNDAE step as decode + draw from the documented random numbers, the greedy baseline's
score as ``transformers``' transition scores, and the length limits at their boundary."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.nar import SamplingConfig, load_mlm_seq2seq
from gencraft.nar.decoding import (
    autoregressive_generate,
    least_confident,
    mask_predict_generate,
    sundae_draw,
    sundae_generate,
    sundae_step,
    sundae_update,
)
from gencraft.nar.functional import noise_ids

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SOURCES = ["name : Aromi | area : riverside", "x", "a b c d e f"]


@pytest.fixture(scope="module")
def nar():
    model, tok = load_mlm_seq2seq("tiny-bert", seed=3, max_target_length=12)
    with torch.no_grad():  # peaked predictions
        model.decoder.get_output_embeddings().weight.mul_(6.0)
    return model.eval(), tok


def _source(tok, text: str):
    enc = tok([text], return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def _mask_predict_reference(model, enc, src_mask, length: int, steps: int, mask_id: int):
    """Mask-Predict for one length: predict every masked position, keep the prediction's
    log-probability, re-mask the n = ⌊L·(T−t)/T⌋ least confident (ties leftmost), stop at T
    iterations or when n reaches 0. Returns (tokens, mean log-probability, iterations)."""
    tokens = torch.full((1, length), mask_id)
    logp = torch.zeros(1, length)
    todo = torch.ones(1, length, dtype=torch.bool)
    ones = torch.ones(1, length, dtype=torch.long)
    for t in range(steps):
        lp, tok = torch.log_softmax(model.decode_logits(tokens, enc, src_mask, ones), -1).max(-1)
        tokens = torch.where(todo, tok, tokens)
        logp = torch.where(todo, lp, logp)
        n = length * (steps - 1 - t) // steps
        if t + 1 == steps or n == 0:
            return tokens[0].tolist(), float(logp.mean()), t + 1
        order = sorted(range(length), key=lambda i: (float(logp[0, i]), i))[:n]
        todo = torch.zeros(1, length, dtype=torch.bool)
        todo[0, order] = True
        tokens = tokens.masked_fill(todo, mask_id)
    raise AssertionError("unreachable")


@settings(max_examples=12, **SETTINGS)
@given(src=st.integers(0, 2), length=st.integers(1, 12), steps=st.integers(1, 6))
def test_mask_predict_equals_the_papers_loop(nar, src, length, steps):
    model, tok = nar
    ids, mask = _source(tok, SOURCES[src])
    cfg = SamplingConfig(steps=steps, length_candidates=1)
    out = mask_predict_generate(
        model, ids, mask, cfg, mask_id=tok.mask_token_id, lengths=torch.tensor([[length]])
    )
    enc = model.encode(ids, mask).last_hidden_state
    tokens, score, iterations = _mask_predict_reference(
        model, enc, mask, length, steps, tok.mask_token_id
    )
    assert out.sequences[0] == tokens
    assert out.scores[0] == pytest.approx(score, abs=1e-5)
    assert out.model_calls == [iterations] and out.steps == [iterations]


def test_least_confident_breaks_ties_leftmost_and_skips_padding():
    logp = torch.tensor([[-1.0, -2.0, -2.0, -2.0, -2.0, -0.5, -2.0, -2.0, -3.0] * 4])
    mask = logp != -3.0  # the lowest scores are padding: never re-masked
    chosen = least_confident(logp, mask, torch.tensor([5]))
    low = [i for i in range(logp.shape[1]) if mask[0, i] and logp[0, i] == -2.0][:5]
    assert chosen[0].nonzero().flatten().tolist() == low


def _draws(seed: int, shape, argmax: bool):
    g = torch.Generator().manual_seed(seed)
    uniforms = None if argmax else torch.rand(shape, generator=g)
    return uniforms, torch.rand(shape, generator=g)


@pytest.mark.parametrize("argmax", [False, True])
def test_one_sundae_step_is_decode_then_update_from_the_documented_draws(nar, argmax):
    """The generator draws the sampling uniforms [N, L] (none with argmax), then the coins;
    the decoder sees the encoder states, the source mask and the target mask."""
    model, tok = nar
    enc_in = tok(SOURCES[:2], padding=True, return_tensors="pt")
    src_mask = enc_in["attention_mask"]
    enc = model.encode(enc_in["input_ids"], src_mask).last_hidden_state
    target = torch.tensor([[1] * 6, [1] * 3 + [0] * 3], dtype=torch.bool)
    noise = noise_ids(tok)
    tokens = noise[torch.randint(noise.numel(), (2, 6), generator=torch.Generator().manual_seed(1))]
    kw = dict(temperature=0.7, proportion=0.6, argmax=argmax)
    torch.manual_seed(123)  # the global generator must not be the one drawn from
    new, logits = sundae_step(
        model, tokens, target, enc, src_mask, generator=torch.Generator().manual_seed(5), **kw
    )
    with torch.no_grad():
        want_logits = model.decode_logits(tokens, enc, src_mask, target.long())
    assert torch.equal(logits, want_logits)
    uniforms, coins = _draws(5, tokens.shape, argmax)
    assert torch.equal(new, sundae_update(want_logits, tokens, target, uniforms, coins, **kw))
    alone = sundae_draw(
        want_logits, tokens, target, generator=torch.Generator().manual_seed(5), **kw
    )
    assert torch.equal(alone, new)


def test_sundae_steps_defaults_are_temperature_1_replace_all_and_sampling(nar):
    model, tok = nar
    ids, mask = _source(tok, SOURCES[0])
    enc = model.encode(ids, mask).last_hidden_state
    target = torch.ones(1, 8, dtype=torch.bool)
    tokens = torch.full((1, 8), tok.mask_token_id)
    plain = sundae_step(
        model, tokens, target, enc, mask, generator=torch.Generator().manual_seed(2)
    )
    given = sundae_step(
        model,
        tokens,
        target,
        enc,
        mask,
        temperature=1.0,
        proportion=1.0,
        argmax=False,
        generator=torch.Generator().manual_seed(2),
    )
    assert torch.equal(plain[0], given[0])
    logits = plain[1] * 0.2  # flat: sampling differs from the argmax
    g = torch.Generator().manual_seed(4)
    want = sundae_update(logits, tokens, target, *_draws(4, tokens.shape, False))
    assert torch.equal(sundae_draw(logits, tokens, target, generator=g), want)
    for bad in (-0.1, 1.5):
        with pytest.raises(GencraftError, match=rf"proportion must lie in \[0, 1\], got {bad}"):
            sundae_step(model, tokens, target, enc, mask, proportion=bad)


def test_a_target_length_at_the_limit_is_accepted_and_one_past_it_refused(nar):
    model, tok = nar
    ids, mask = _source(tok, SOURCES[1])
    top = model.max_target_length
    cfg = SamplingConfig(steps=1, samples=1, length_candidates=1)
    out = sundae_generate(model, ids, mask, cfg, noise=noise_ids(tok), lengths=torch.tensor([top]))
    assert len(out.sequences[0]) <= top
    with pytest.raises(GencraftError, match=rf"target length {top + 1} is outside \[1, {top}\]"):
        sundae_generate(
            model, ids, mask, cfg, noise=noise_ids(tok), lengths=torch.tensor([top + 1])
        )


def test_the_greedy_baselines_score_is_its_tokens_log_probability_eos_included():
    model, tok = load_mlm_seq2seq("tiny-bert", seed=0, max_target_length=16, bidirectional=False)
    end = model.generation_config.eos_token_id
    with torch.no_grad():  # EOS is likely, so outputs end before the limit
        model.get_output_embeddings().weight.mul_(10.0)
        model.get_output_embeddings().bias[end] += 3.0
    ended = 0
    for src in SOURCES:
        ids, mask = _source(tok, src)
        out = autoregressive_generate(model, ids, mask, num_beams=1, max_new_tokens=8)
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            num_beams=1,
            do_sample=False,
            max_new_tokens=8,
            output_logits=True,
            return_dict_in_generate=True,
        )
        made = gen.sequences[0, 1:].tolist()
        own = made.index(end) + 1 if end in made else len(made)
        ended += end in made
        lp = model.compute_transition_scores(gen.sequences, gen.logits, normalize_logits=True)
        assert out.scores[0] == pytest.approx(float(lp[0, :own].sum()), abs=1e-4)
    assert ended  # the EOS step was scored at least once


def test_length_candidates_offer_every_length_but_0_and_no_more(nar):
    from gencraft.nar.decoding import length_candidates

    model, tok = nar
    ids, mask = _source(tok, SOURCES[0])
    enc = model.encode(ids, mask).last_hidden_state
    top = model.max_target_length
    for k in (top, top + 5):  # asking for more lengths than exist gets them all, once
        cands, logp = length_candidates(model, enc, mask, k)
        assert sorted(cands[0].tolist()) == list(range(1, top + 1))
        assert torch.isfinite(logp).all() and (logp[0, :-1] >= logp[0, 1:]).all()
    assert torch.logsumexp(logp, -1).item() <= 1e-6  # a share of a distribution over lengths


def test_sundae_scores_follow_each_rerank_rule(nar):
    """With one sample of one length candidate every rule picks the same sample; its score is
    the mean token log-probability, the sum (mean × L), or the mean plus log P(L)."""
    from gencraft.nar.decoding import length_candidates

    model, tok = nar
    ids, mask = _source(tok, SOURCES[2])
    out = {
        how: sundae_generate(
            model,
            ids,
            mask,
            SamplingConfig(steps=3, samples=1, length_candidates=1, rerank=how),
            noise=noise_ids(tok),
        )
        for how in ("mean-logprob", "sum-logprob", "mean-logprob+length")
    }
    seq = out["mean-logprob"].sequences[0]
    assert all(o.sequences[0] == seq for o in out.values())
    cands, len_lp = length_candidates(model, model.encode(ids, mask).last_hidden_state, mask, 1)
    assert len(seq) == int(cands[0, 0]) > 1
    mean = out["mean-logprob"].scores[0]
    assert out["sum-logprob"].scores[0] == pytest.approx(mean * len(seq), rel=1e-5)
    assert out["mean-logprob+length"].scores[0] == pytest.approx(mean + float(len_lp[0, 0]))


def test_a_proportion_of_0_keeps_every_token_even_at_a_coin_of_0():
    logits = torch.randn(1, 4, 7)
    tokens = torch.tensor([[1, 2, 3, 4]])
    coins = torch.tensor([[0.0, 0.5, 0.0, 0.99]])
    target = torch.ones(1, 4, dtype=torch.bool)
    kept = sundae_update(logits, tokens, target, None, coins, proportion=0.0, argmax=True)
    assert torch.equal(kept, tokens)
    all_new = sundae_update(logits, tokens, target, None, coins, proportion=1.0, argmax=True)
    assert torch.equal(all_new, logits.argmax(-1))


def test_batches_calls_seconds_and_the_progress_bar(nar, capsys, monkeypatch):
    """``batch_size`` chunks the rows (one decoder call per chunk and step), a row's seconds
    are its chunk's wall time shared out, and the bar shows only when asked, named and sized."""
    import time

    model, tok = nar
    enc = tok(SOURCES, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    sizes = []
    real = model.decode_logits
    monkeypatch.setattr(
        model, "decode_logits", lambda t, *a: sizes.append(t.shape[0]) or real(t, *a)
    )
    cfg = SamplingConfig(steps=2, length_candidates=1)
    kw = dict(mask_id=tok.mask_token_id, lengths=torch.tensor([[4], [4], [4]]))
    capsys.readouterr()
    t0 = time.perf_counter()
    out = mask_predict_generate(model, ids, mask, cfg, batch_size=1, progress=True, **kw)
    wall = time.perf_counter() - t0
    assert sizes == [1] * 6 and out.model_calls == [2, 2, 2]
    assert all(s >= 0 for s in out.seconds) and sum(out.seconds) <= wall
    err = capsys.readouterr().err
    assert "mask-predict" in err and "3/3" in err
    sizes.clear()
    t0 = time.perf_counter()
    together = mask_predict_generate(model, ids, mask, cfg, **kw)
    wall = time.perf_counter() - t0
    assert sizes == [3, 3] and together.sequences == out.sequences
    assert len(set(together.seconds)) == 1 and 0 < sum(together.seconds) <= wall  # one share
    assert capsys.readouterr().err == ""


def test_nar_decoders_refuse_bad_input_word_for_word(nar):
    model, tok = nar
    ids = torch.tensor([[5, 6, 7, 8]])
    cfg = SamplingConfig(steps=1, length_candidates=1)
    noise = noise_ids(tok)

    def refused(message, call):
        with pytest.raises(GencraftError) as info:
            call()
        assert str(info.value) == message

    refused(
        "this decoding needs a NARSeq2Seq (mlm_to_seq2seq), got Linear",
        lambda: sundae_generate(torch.nn.Linear(2, 2), ids, None, cfg, noise=noise),
    )
    causal, _ = load_mlm_seq2seq("tiny-bert", seed=0, max_target_length=8, bidirectional=False)
    refused(
        "non-autoregressive decoding needs a bidirectional decoder; this model's is causal "
        "(decode it with beam search)",
        lambda: mask_predict_generate(causal, ids, None, cfg, mask_id=tok.mask_token_id),
    )
    refused(
        "autoregressive decoding needs a model converted with bidirectional=False",
        lambda: autoregressive_generate(model, ids),
    )
    for bad in (ids[0], ids.float(), [[5, 6]]):
        refused(
            "input_ids must be a LongTensor of shape [B, S]",
            lambda bad=bad: sundae_generate(model, bad, None, cfg, noise=noise),
        )
    refused(
        "input_ids has no source tokens",
        lambda: sundae_generate(model, ids[:, :0], None, cfg, noise=noise),
    )
    refused(
        "attention_mask [1, 3] does not match input_ids [1, 4]",
        lambda: sundae_generate(model, ids, torch.ones(1, 3, dtype=torch.long), cfg, noise=noise),
    )
    refused(
        "batch_size must be >= 1, got 0",
        lambda: sundae_generate(model, ids, None, cfg, noise=noise, batch_size=0),
    )


def test_nar_eval_writes_one_line_per_output_whatever_the_output_holds(shared_data, tmp_path):
    """A tiny model's outputs hold line breaks (\\n, \\x0b, \\x1c...): the .txt file still has
    exactly one line per input, read back as gencraft reads predictions, each the output with
    its breaks as spaces."""
    from gencraft.cli.main import main
    from gencraft.data import read_lines

    args = ["nar", "eval", "tiny-bert", "--limit", "5", "--batch-size", "2", "--steps", "2"]
    args += ["--data-dir", str(shared_data), "--quiet", "--output"]
    assert main([*args, str(tmp_path / "p.jsonl")]) == 0
    assert main([*args, str(tmp_path / "p.txt")]) == 0
    outputs = [
        json.loads(x)["prediction"] for x in (tmp_path / "p.jsonl").read_text().split("\n") if x
    ]
    assert any(len(o.splitlines()) > 1 for o in outputs)  # the case this guards
    assert read_lines(tmp_path / "p.txt") == [" ".join(o.splitlines()) for o in outputs]
