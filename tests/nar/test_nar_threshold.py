"""Confidence-threshold decoding (Fast-dLLM's rule) for Mask-Predict and SUNDAE:
each row equals a plain one-row reference written from the rule, a batch equals its rows
alone, and the call counts follow their definition (τ = 0: one call; τ = 1: one per
position)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.nar import SamplingConfig, load_mlm_seq2seq
from gencraft.nar.decoding import (
    inverse_cdf,
    mask_predict_generate,
    most_confident,
    row_seed,
    sundae_generate,
)
from gencraft.nar.functional import noise_ids

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SOURCES = ["name : Aromi | area : riverside", "x", "a b c", "Blue Spice pub near the river"]
#: thresholds drawn as integers / 20 (hypothesis floats trip flush-to-zero in CI)
TAUS = st.integers(0, 20).map(lambda i: i / 20)


@pytest.fixture(scope="module")
def nar():
    model, tok = load_mlm_seq2seq("tiny-bert", seed=3, max_target_length=12)
    with torch.no_grad():  # peaked predictions: some positions pass a threshold, some not
        model.decoder.get_output_embeddings().weight.mul_(4.0)
    return model.eval(), tok


def _encode(tok, sources):
    enc = tok(sources, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def _choose(lp: list[float], todo: set[int], tau: float, last: bool) -> set[int]:
    """The rule, one position at a time: everything at the last call; else the undecided
    positions with p >= τ (none by that rule at τ = 1) and the most confident (leftmost)."""
    if last:
        return set(todo)
    chosen = {i for i in todo if tau < 1 and torch.tensor(lp[i]).exp() >= tau}
    chosen.add(max(sorted(todo), key=lambda i: lp[i]))  # max keeps the first (leftmost) tie
    return chosen


def _mask_predict_reference(model, ids, mask, length, tau, steps, mask_id):
    """One source, one given length: (tokens, mean log-prob at unmasking, calls)."""
    enc = model.encode(ids, mask).last_hidden_state
    toks, lps, todo, calls = [mask_id] * length, [0.0] * length, set(range(length)), 0
    for t in range(steps):
        if not todo:
            break
        logits = model.decode_logits(torch.tensor([toks]), enc, mask, torch.ones(1, length))
        calls += 1
        lp, tk = torch.log_softmax(logits[0].float(), -1).max(-1)
        for i in _choose(lp.tolist(), todo, tau, t + 1 == steps):
            toks[i], lps[i] = int(tk[i]), float(lp[i])
            todo.discard(i)
    return toks, sum(lps) / length, calls


@settings(max_examples=12, **SETTINGS)
@given(
    picks=st.lists(st.integers(0, len(SOURCES) - 1), min_size=1, max_size=4),
    lengths=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    tau=TAUS,
    steps=st.integers(1, 10),
)
def test_threshold_mask_predict_equals_the_rule_on_each_row(nar, picks, lengths, tau, steps):
    """A batch of rows with different sources and lengths: each row's tokens, score and calls
    are the one-row reference's."""
    model, tok = nar
    sources = [SOURCES[i] for i in picks]
    given = torch.tensor([[lengths[j]] for j in range(len(picks))])
    ids, mask = _encode(tok, sources)
    cfg = SamplingConfig(steps=steps, length_candidates=1)
    with torch.no_grad():
        out = mask_predict_generate(
            model, ids, mask, cfg, mask_id=tok.mask_token_id, lengths=given, threshold=tau
        )
        for r, src in enumerate(sources):
            one_ids, one_mask = _encode(tok, [src])
            ref = _mask_predict_reference(
                model, one_ids, one_mask, lengths[r], tau, steps, tok.mask_token_id
            )
            assert out.sequences[r] == ref[0]
            assert out.scores[r] == pytest.approx(ref[1], abs=1e-4)
            assert out.model_calls[r] == out.steps[r] == ref[2]


def _sundae_reference(model, ids, mask, length, tau, steps, noise, cfg):
    """One source, one sample of one given length, from the row's own generator: (tokens,
    mean log-prob at freezing, calls)."""
    src = ids[0][mask[0].bool()].tolist()
    gen = torch.Generator().manual_seed(row_seed(cfg.seed, src))
    toks = noise[torch.randint(noise.numel(), (1, length), generator=gen)]
    enc = model.encode(ids, mask).last_hidden_state
    lps, todo, calls = [0.0] * length, set(range(length)), 0
    for t in range(steps):
        if not todo:
            break
        logits = model.decode_logits(toks, enc, mask, torch.ones(1, length)).float()
        calls += 1
        if cfg.argmax_unrolled:
            new = logits.argmax(-1)
        else:
            u = torch.rand((1, length), generator=gen)
            new = inverse_cdf(torch.softmax(logits / cfg.temperature, -1), u)
        keep = torch.tensor([[i not in todo for i in range(length)]])
        new = torch.where(keep, toks, new)
        lp = torch.log_softmax(logits, -1).gather(-1, new[..., None])[0, :, 0]
        for i in _choose(lp.tolist(), todo, tau, t + 1 == steps):
            lps[i] = float(lp[i])
            todo.discard(i)
        toks = new
    return toks[0].tolist(), sum(lps) / length, calls


@settings(max_examples=12, **SETTINGS)
@given(
    picks=st.lists(st.integers(0, len(SOURCES) - 1), min_size=1, max_size=4, unique=True),
    lengths=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    tau=TAUS,
    steps=st.integers(1, 10),
    argmax=st.booleans(),
)
def test_threshold_sundae_equals_the_rule_on_each_row(nar, picks, lengths, tau, steps, argmax):
    """Each row's sample (its own seeded stream) freezes by the rule; frozen tokens never
    change, and a token's score is its log-probability when it froze."""
    model, tok = nar
    sources = [SOURCES[i] for i in picks]
    given = torch.tensor([[lengths[j]] for j in range(len(picks))])
    ids, mask = _encode(tok, sources)
    cfg = SamplingConfig(
        steps=steps,
        samples=1,
        length_candidates=1,
        argmax_unrolled=argmax,
        seed=5,
        temperature=0.7,
    )
    noise = noise_ids(tok)
    with torch.no_grad():
        out = sundae_generate(model, ids, mask, cfg, noise=noise, lengths=given, threshold=tau)
        for r, src in enumerate(sources):
            one_ids, one_mask = _encode(tok, [src])
            ref = _sundae_reference(model, one_ids, one_mask, lengths[r], tau, steps, noise, cfg)
            assert out.sequences[r] == ref[0]
            assert out.scores[r] == pytest.approx(ref[1], abs=1e-4)
            assert out.model_calls[r] == out.steps[r] == ref[2]


@settings(max_examples=6, **SETTINGS)
@given(
    picks=st.lists(st.integers(0, len(SOURCES) - 1), min_size=2, max_size=4),
    tau=TAUS,
    k=st.integers(1, 3),
    samples=st.integers(1, 4),
    batch_size=st.sampled_from([None, 1, 2]),
)
def test_a_threshold_batch_equals_its_rows_alone(nar, picks, tau, k, samples, batch_size):
    """Predicted lengths, several candidates and samples: each row of a batch decodes as it
    does alone (sequence, score and calls), for both decoders."""
    model, tok = nar
    sources = [SOURCES[i] for i in picks]
    cfg = SamplingConfig(steps=12, samples=samples, length_candidates=k, seed=2)
    noise, mask_id = noise_ids(tok), tok.mask_token_id

    def both(srcs, **kw):
        ids, mask = _encode(tok, srcs)
        a = mask_predict_generate(model, ids, mask, cfg, mask_id=mask_id, threshold=tau, **kw)
        b = sundae_generate(model, ids, mask, cfg, noise=noise, threshold=tau, **kw)
        outs = (a.sequences, a.model_calls, b.sequences, b.model_calls, a.scores, b.scores)
        return [(*r[:4], round(r[4], 4), round(r[5], 4)) for r in zip(*outs, strict=True)]

    together = both(sources, batch_size=batch_size)
    for r, src in enumerate(sources):
        alone = both([src])[0]
        assert together[r][:4] == alone[:4]
        assert together[r][4:] == pytest.approx(alone[4:], abs=2e-4)


def test_threshold_call_counts_at_the_ends():
    """τ = 0 decides everything in one call; τ = 1 decides one position per call, so a row
    takes as many calls as its longest candidate (within the step budget), and the budget's
    last call decides the rest."""
    model, tok = load_mlm_seq2seq("tiny-bert", seed=4, max_target_length=12)
    ids, mask = _encode(tok, SOURCES[:3])
    lengths = torch.tensor([[2, 7], [5, 1], [9, 3]])
    noise = noise_ids(tok)
    for steps, expect in ((20, [7, 5, 9]), (4, [4, 4, 4])):
        cfg = SamplingConfig(steps=steps, length_candidates=2, samples=2)
        for tau, calls in ((0.0, [1, 1, 1]), (1.0, expect)):
            mp = mask_predict_generate(
                model, ids, mask, cfg, mask_id=tok.mask_token_id, lengths=lengths, threshold=tau
            )
            sd = sundae_generate(model, ids, mask, cfg, noise=noise, lengths=lengths, threshold=tau)
            assert mp.model_calls == sd.model_calls == calls, (steps, tau)
    # the fixed schedule (threshold None) is unchanged: Mask-Predict takes its T iterations
    fixed = mask_predict_generate(
        model,
        ids,
        mask,
        SamplingConfig(steps=4, length_candidates=2),
        mask_id=tok.mask_token_id,
        lengths=lengths,
    )
    assert fixed.model_calls == [4, 4, 4]


def test_most_confident_rule_and_refusals():
    logp = torch.log(torch.tensor([[0.5, 0.95, 0.95, 0.2], [0.1, 0.3, 0.2, 0.9]]))
    undecided = torch.tensor([[True, True, True, True], [True, True, True, False]])
    assert most_confident(logp, undecided, 0.9).tolist() == [
        [False, True, True, False],
        [False, True, False, False],  # none passes: the most confident undecided one
    ]
    assert most_confident(logp, undecided, 1.0).tolist() == [
        [False, True, False, False],  # the leftmost of a tie
        [False, True, False, False],
    ]
    assert most_confident(logp, undecided, 0.0).tolist() == undecided.tolist()
    assert not most_confident(logp, torch.zeros_like(undecided), 0.5).any()
    assert most_confident(logp, undecided, 0.99, last=True).tolist() == undecided.tolist()
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(GencraftError, match="threshold must lie in"):
            SamplingConfig(threshold=bad)
    with pytest.raises(GencraftError, match="proportion does not apply with threshold"):
        SamplingConfig(threshold=0.5, proportion=0.5)


@settings(max_examples=60, deadline=None)
@given(
    fixed=st.lists(
        st.tuples(st.integers(1, 20), st.integers(0, 100)),
        min_size=1,
        max_size=4,
        unique_by=lambda x: x[0],
    ),
    taus=st.lists(st.tuples(st.integers(0, 100), st.integers(1, 64)), min_size=1, max_size=4),
)
def test_the_threshold_target_is_the_cheapest_tau_reaching_the_most_steps_bleu(fixed, taus):
    from gencraft.studies.nar import threshold_target

    curve = [
        {"model": "mp", "max steps": n, "threshold": "-", "BLEU": b / 4, "calls/output": n}
        for n, b in fixed
    ]
    curve += [
        {"model": "mp", "max steps": 64, "threshold": i / 10, "BLEU": b / 4, "calls/output": c}
        for i, (b, c) in enumerate(taus)
    ]
    curve += [
        {"model": "fixed only", "max steps": 3, "threshold": "-", "BLEU": 1.0, "calls/output": 3}
    ]
    (row,) = threshold_target(curve)  # a model without threshold points has no row
    ref = max(fixed)[1] / 4  # the most steps' BLEU
    cheapest = sorted((c, i) for i, (b, c) in enumerate(taus) if b / 4 >= ref)
    assert (row["model"], row["fixed steps"], row["BLEU"]) == ("mp", max(fixed)[0], ref)
    if cheapest:
        assert row["its calls/output"] == cheapest[0][0] and row["its BLEU"] >= ref
    else:
        assert row["threshold reaching it"] == "none" and row["its BLEU"] < ref
