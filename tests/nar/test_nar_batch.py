"""Batched non-autoregressive decoding: Mask-Predict on a batch equals each row
decoded alone; a source's SUNDAE output is the same in any batch, of any size or order; the
autoregressive baseline's one batched ``generate`` equals its rows alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gencraft.nar import SamplingConfig, load_mlm_seq2seq
from gencraft.nar.decoding import (
    autoregressive_generate,
    mask_predict_generate,
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
SOURCES = [
    "name : Aromi | area : riverside",
    "x",
    "name : The Eagle | food : French | price : cheap | near : Burger King",
    "a b c",
    "Blue Spice pub",
]


@pytest.fixture(scope="module")
def nar():
    model, tok = load_mlm_seq2seq("tiny-bert", seed=3, max_target_length=12)
    with torch.no_grad():  # peaked predictions: decoding differs between sources
        model.decoder.get_output_embeddings().weight.mul_(6.0)
    return model.eval(), tok


def _encode(tok, sources):
    enc = tok(sources, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@settings(max_examples=25, **SETTINGS)
@given(
    picks=st.lists(st.integers(0, len(SOURCES) - 1), min_size=1, max_size=5),
    steps=st.integers(1, 5),
    k=st.integers(1, 3),
    given_lengths=st.booleans(),
)
def test_mask_predict_on_a_batch_equals_each_row_alone(nar, picks, steps, k, given_lengths):
    model, tok = nar
    sources = [SOURCES[i] for i in picks]
    ids, mask = _encode(tok, sources)
    cfg = SamplingConfig(steps=steps, length_candidates=k)
    lengths = None
    if given_lengths:  # lengths differ between rows and candidates: the rows are ragged
        lengths = torch.tensor([[1 + (i + j) % 9 for j in range(k)] for i in picks])
    batch = mask_predict_generate(model, ids, mask, cfg, mask_id=tok.mask_token_id, lengths=lengths)
    for r, src in enumerate(sources):
        one_ids, one_mask = _encode(tok, [src])
        alone = mask_predict_generate(
            model,
            one_ids,
            one_mask,
            cfg,
            mask_id=tok.mask_token_id,
            lengths=None if lengths is None else lengths[r : r + 1],
        )
        assert batch.sequences[r] == alone.sequences[0]
        assert batch.scores[r] == pytest.approx(alone.scores[0], abs=1e-4)
        assert batch.model_calls[r] == alone.model_calls[0]


@settings(max_examples=20, **SETTINGS)
@given(
    picks=st.lists(st.integers(0, len(SOURCES) - 1), min_size=2, max_size=5, unique=True),
    order=st.randoms(use_true_random=False),
    samples=st.integers(1, 4),
    steps=st.integers(1, 6),
    proportion=st.sampled_from([0.5, 1.0]),
    argmax=st.booleans(),
    batch_size=st.sampled_from([None, 1, 2]),
)
def test_a_sources_sundae_output_is_the_same_in_any_batch(
    nar, picks, order, samples, steps, proportion, argmax, batch_size
):
    model, tok = nar
    sources = [SOURCES[i] for i in picks]
    noise = noise_ids(tok)
    cfg = SamplingConfig(
        steps=steps,
        samples=samples,
        length_candidates=2,
        proportion=proportion,
        argmax_unrolled=argmax,
        seed=7,
    )

    def decode(srcs, **kw):
        ids, mask = _encode(tok, srcs)
        out = sundae_generate(model, ids, mask, cfg, noise=noise, **kw)
        return {
            s: (q, sc, c, st_)
            for s, q, sc, c, st_ in zip(
                srcs, out.sequences, out.scores, out.model_calls, out.steps, strict=True
            )
        }

    together = decode(sources)
    shuffled = list(sources)
    order.shuffle(shuffled)
    again = decode(shuffled, batch_size=batch_size)
    for s in sources:
        alone = decode([s])[s]
        for got in (together[s], again[s]):
            assert got[0] == alone[0]
            assert got[1] == pytest.approx(alone[1], abs=1e-4)
            assert got[2:] == alone[2:]


def test_sundae_rows_draw_from_their_own_seeds(nar):
    """Two different sources decode differently from the same start seed, and the row seed
    depends on the source tokens and the seed, never on padding."""
    assert row_seed(0, [5, 6]) != row_seed(0, [5, 7]) != row_seed(1, [5, 7])
    model, tok = nar
    ids, mask = _encode(tok, ["x", "x"])
    cfg = SamplingConfig(steps=3, samples=2, length_candidates=1)
    out = sundae_generate(model, ids, mask, cfg, noise=noise_ids(tok))
    assert out.sequences[0] == out.sequences[1]  # the same source, the same draws


def test_each_mask_predict_row_stops_by_its_own_rule(nar):
    """Length 1 over 5 iterations re-masks ⌊1·4/5⌋ = 0 tokens: that row is done after one
    call, while a row of length 9 iterates 5 times, in the same batch."""
    model, tok = nar
    ids, mask = _encode(tok, SOURCES[:2])
    cfg = SamplingConfig(steps=5, length_candidates=1)
    out = mask_predict_generate(
        model, ids, mask, cfg, mask_id=tok.mask_token_id, lengths=torch.tensor([[1], [9]])
    )
    assert out.model_calls == [1, 5]


def eos_prone_decoder():
    """A tiny causal BERT2BERT whose source matters and whose EOS is likely: rows end at
    different steps."""
    model, tok = load_mlm_seq2seq("tiny-bert", seed=0, max_target_length=16, bidirectional=False)
    end = model.generation_config.eos_token_id
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and ("crossattention" in name or "encoder" in name):
                p.mul_(4.0)
        model.get_output_embeddings().weight.mul_(10.0)
        model.get_output_embeddings().bias[end] += 2.0
    return model.eval(), tok


@pytest.mark.parametrize("beams", [1, 3])
def test_the_autoregressive_baseline_in_one_generate_equals_each_row_alone(beams):
    model, tok = eos_prone_decoder()
    ids, mask = _encode(tok, SOURCES)
    kw = dict(num_beams=beams, max_new_tokens=8)
    batch = autoregressive_generate(model, ids, mask, **kw)
    assert len({len(s) for s in batch.sequences}) > 1
    for r, src in enumerate(SOURCES):
        one = autoregressive_generate(model, *_encode(tok, [src]), **kw)
        assert batch.sequences[r] == one.sequences[0]
        assert batch.scores[r] == pytest.approx(one.scores[0], abs=1e-4)
    assert batch.tokens_per_call == [
        len(s) / c for s, c in zip(batch.sequences, batch.model_calls, strict=True)
    ]


def test_sundae_token_scores_are_float32_for_half_precision_logits():
    """The precision island of reranking: half-precision logits are scored in float32."""
    from gencraft.nar.decoding import _token_logp

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 3, 50, generator=g) * 4).bfloat16()
    tokens = torch.randint(0, 50, (2, 3), generator=g)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    got = _token_logp(logits, tokens, mask)
    want = torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0] * mask
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-6)


# -- SUNDAE's draws batched across rows -------------------------------------------
@settings(max_examples=60, **SETTINGS)
@given(
    probs=st.lists(
        st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0, 3.0]), min_size=1, max_size=6).filter(
            lambda row: sum(row) > 0
        ),
        min_size=1,
        max_size=5,
    ).filter(lambda rows: len({len(r) for r in rows}) == 1),
    uniforms=st.lists(
        # float32 as torch.rand draws them: a float64 just below 1 would round to 1.0 in the tensor
        st.floats(0.0, 1.0, exclude_max=True, allow_subnormal=False, width=32),
        min_size=5,
        max_size=5,
    ),
)
@example(probs=[[1.0, 2.0, 0.0]], uniforms=[0.99999994] * 5)  # the largest u below 1
@example(probs=[[0.0, 1.0]], uniforms=[0.0] * 5)  # u = 0 past a leading zero
@example(probs=[[1.0, 0.0, 1.0]], uniforms=[0.5] * 5)  # u·total on a boundary
@example(probs=[[0.1]], uniforms=[0.99999994] * 5)  # one token, u at its largest
def test_inverse_cdf_draws_the_token_whose_interval_holds_u(probs, uniforms):
    """Against the definition: token i such that cdf[i-1] <= u·total < cdf[i]; a token of
    probability 0 is never drawn (u·total rounded to the total included)."""
    from gencraft.nar.decoding import inverse_cdf

    p = torch.tensor(probs)
    u = torch.tensor(uniforms[: p.shape[0]])
    got = inverse_cdf(p, u).tolist()
    for row, ui, i in zip(probs, u.tolist(), got, strict=True):
        total, acc = sum(row), 0.0
        want = max(j for j, x in enumerate(row) if x > 0)  # u·total past the last boundary
        for j, x in enumerate(row):
            acc += x
            if x > 0 and ui * total < acc:
                want = j
                break
        assert row[i] > 0 and i == want


def test_inverse_cdf_sampling_follows_the_distribution():
    """10,000 seeded draws from one distribution: each token's share within 0.02 of p."""
    from gencraft.nar.decoding import inverse_cdf

    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = torch.rand(10_000, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(inverse_cdf(p.expand(10_000, 4), u), minlength=4) / 10_000
    assert counts.tolist() == pytest.approx(p.tolist(), abs=0.02)


def test_sundae_outputs_are_golden(nar):
    """Recorded after the random stream changed (uniforms and an inverse CDF in place
    of torch.multinomial): the same sources, seed and settings give these outputs and counts."""
    model, tok = nar
    ids, mask = _encode(tok, SOURCES[:3])
    cfg = SamplingConfig(steps=4, samples=3, length_candidates=2, proportion=0.5, seed=7)
    out = sundae_generate(model, ids, mask, cfg, noise=noise_ids(tok))
    assert out.sequences == [
        [164, 206, 142, 260, 110, 98, 103, 166, 147, 90, 26, 240],
        [219, 184, 88, 169, 153, 248, 224, 16, 35, 98, 128, 237],
        [191, 222, 229, 2, 80, 27, 58, 92, 222, 57, 128, 29],
    ]
    assert (out.model_calls, out.steps) == ([5, 5, 5], [4, 4, 4])
    assert out.scores == pytest.approx([-5.6384, -5.2149, -5.1033], abs=1e-3)


@settings(max_examples=12, **SETTINGS)
@given(
    picks=st.lists(st.integers(0, len(SOURCES) - 1), min_size=1, max_size=4),
    samples=st.integers(1, 3),
    budget=st.integers(2, 5),
    proportion=st.sampled_from([0.3, 1.0]),
    argmax=st.booleans(),
)
@example(picks=[0, 1, 2, 3, 4], samples=1, budget=6, proportion=0.3, argmax=True)  # row 4 stops
def test_sundae_counts_follow_their_definition(nar, picks, samples, budget, proportion, argmax):
    """Against the definition, over every step budget t <= T (a budget's run is a prefix of a
    longer one's: the same random stream): a row stops at step s_r, when its last sample
    stops changing; with budget t its steps are min(t, s_r) and its calls add one scoring call
    when a sample was still changing (t < s_r)."""
    model, tok = nar
    ids, mask = _encode(tok, [SOURCES[i] for i in picks])

    def counts(t):
        cfg = SamplingConfig(
            steps=t,
            samples=samples,
            length_candidates=2,
            proportion=proportion,
            argmax_unrolled=argmax,
            seed=3,
        )
        out = sundae_generate(model, ids, mask, cfg, noise=noise_ids(tok))
        return out.steps, out.model_calls

    steps_t, calls_t = counts(budget)
    if picks == [0, 1, 2, 3, 4] and budget == 6:  # the example's rows stop at different steps
        assert steps_t == [6, 6, 6, 6, 4]
    for r in range(len(picks)):
        stop = steps_t[r] if steps_t[r] < budget or calls_t[r] == budget else None
        for t in range(1, budget + 1):
            steps, calls = (x[r] for x in counts(t)) if t < budget else (steps_t[r], calls_t[r])
            if stop is None:  # still changing after the longest budget
                assert (steps, calls) == (t, t + 1)
            else:
                assert (steps, calls) == (min(t, stop), min(t, stop) + (t < stop))
