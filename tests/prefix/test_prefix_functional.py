"""DASP's functional core against hand computations: the UniBlock mask written out by hand,
TruncSA (eq. 2) by loops over columns and a hand nucleus, SoftSA (eqs. 3-4) with the same
uniform draws, and the invariants (rows sum to 1, masked stays 0, no NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from gencraft.errors import GencraftError
from gencraft.prefix import prefix_block_mask, soft_sparse_attention, trunc_sparse_attention


def test_block_mask_written_out_by_hand():
    # P = 5 prefixes in S = 2 groups: tensor_split gives {0, 1, 2} and {3, 4}
    seg = torch.tensor([[0, 0, 1, 1], [1, 0, 0, 0]])
    m = prefix_block_mask(seg, 5, 2)
    g0, g1 = [True, True, True, False, False], [False, False, False, True, True]
    assert m.tolist() == [[g0, g0, g1, g1], [g1, g0, g0, g0]]
    # S = 1: every query sees every prefix; S = P: one prefix each
    assert prefix_block_mask(seg.clamp(max=0), 5, 1).all()
    eye = prefix_block_mask(torch.arange(4)[None], 4, 4)[0]
    assert torch.equal(eye, torch.eye(4, dtype=torch.bool))


@pytest.mark.parametrize(
    ("seg", "p", "s", "match"),
    [
        (torch.zeros(1, 3, dtype=torch.long), 2, 3, "cannot be split"),
        (torch.tensor([[0, 2]]), 4, 2, r"lie in \[0, 2\)"),
        (torch.tensor([[0, -1]]), 4, 2, r"lie in \[0, 2\)"),
        (torch.zeros(3, dtype=torch.long), 4, 2, r"\[B, T\]"),
        (torch.zeros(1, 3), 4, 2, "integer"),
    ],
)
def test_block_mask_bad_input_is_named(seg, p, s, match):
    with pytest.raises(GencraftError, match=match):
        prefix_block_mask(seg, p, s)


def _trunc_by_hand(a: torch.Tensor, top_p: float) -> torch.Tensor:
    """[T, K] one head: eq. 2 with loops."""
    t, k = a.shape
    col = [sum(float(a[i, j]) for i in range(t)) for j in range(k)]
    imp = [c / sum(col) for c in col]
    order = sorted(range(k), key=lambda j: -imp[j])
    kept, mass = set(), 0.0
    for j in order:
        if mass >= top_p and kept:
            break
        kept.add(j)
        mass += imp[j]
    out = torch.zeros_like(a)
    for i in range(t):
        z = sum(float(a[i, j]) for j in kept)
        for j in kept:
            out[i, j] = a[i, j] / z if z > 0 else 0.0
    return out


@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.95, 1.0])
def test_trunc_sparse_attention_is_eq_2_by_hand(top_p):
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 3, 4, 7, generator=g) * 2, dim=-1)  # [B, n, T, K]
    got = trunc_sparse_attention(probs, top_p)
    for b in range(2):
        for h in range(3):
            torch.testing.assert_close(got[b, h], _trunc_by_hand(probs[b, h], top_p))
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 3, 4))
    # the same columns are zeroed in every row of a head
    zero = got == 0
    assert torch.equal(zero, zero[..., :1, :].expand_as(zero))
    raw = trunc_sparse_attention(probs, top_p, renormalize=False)
    assert torch.equal(raw == 0, zero) and torch.equal(raw[~zero], probs[~zero])
    if top_p == 1.0:
        torch.testing.assert_close(got, probs)


def test_trunc_sparse_attention_query_mask_and_empty_rows():
    probs = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.0, 1.0]])
    # the padded second query does not count: only key 0 remains at top_p 0.5
    got = trunc_sparse_attention(probs, 0.5, query_mask=torch.tensor([True, False]))
    assert got.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # an emptied row stays 0
    assert torch.isfinite(got).all()
    for bad in (0.0, 1.5):
        with pytest.raises(GencraftError, match="top_p"):
            trunc_sparse_attention(probs, bad)


@pytest.mark.parametrize("tau", [1.0, 0.1, 0.01])
def test_soft_sparse_attention_is_eqs_3_4_with_the_same_draws(tau):
    scores = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    scores[1, 3] = -math.inf  # a masked key
    got = soft_sparse_attention(scores, tau, generator=torch.Generator().manual_seed(7))
    u = torch.rand(scores.shape, generator=torch.Generator().manual_seed(7))
    log_pi = torch.log_softmax(scores, -1)
    for r in range(2):
        num = [
            math.exp((float(log_pi[r, i]) - math.log(-math.log(float(u[r, i])))) / tau)
            if math.isfinite(float(log_pi[r, i]))
            else 0.0
            for i in range(5)
        ]
        want = torch.tensor([x / sum(num) for x in num])
        torch.testing.assert_close(got[r], want, atol=1e-5, rtol=1e-4)
    assert got[1, 3] == 0 and torch.allclose(got.sum(-1), torch.ones(2))
    noiseless = soft_sparse_attention(scores, tau, noise=False)
    torch.testing.assert_close(noiseless, torch.softmax(log_pi / tau, -1))


def test_soft_sparse_attention_samples_follow_the_attention():
    """τ → 0 gives one-hot rows whose argmax is drawn from π = softmax(scores)."""
    scores = torch.tensor([0.0, 1.0, 2.0])
    g = torch.Generator().manual_seed(0)
    picks = torch.stack(
        [soft_sparse_attention(scores, 0.01, generator=g).argmax() for _ in range(4000)]
    )
    freq = torch.bincount(picks, minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.softmax(scores, 0), atol=0.03, rtol=0)


def test_soft_sparse_attention_fully_masked_rows_and_bad_tau():
    scores = torch.full((2, 3), -math.inf)
    assert torch.equal(soft_sparse_attention(scores, 1.0), torch.zeros(2, 3))
    for bad in (0.0, -1.0):
        with pytest.raises(GencraftError, match="tau"):
            soft_sparse_attention(scores, bad)


# ---------------------------------------------------------------------------- gradchecks
def _scores(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(2, 5, 7, generator=g, dtype=torch.float64)).requires_grad_(True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("renormalize", [False, True])
def test_truncsa_gradcheck_in_float64(causal, renormalize):
    """TruncSA's gradient (the nucleus held fixed, as it is almost everywhere) against
    finite differences in float64."""

    def fn(scores):
        return trunc_sparse_attention(
            torch.softmax(scores, -1), 0.6, renormalize=renormalize, causal=causal
        )

    x = _scores(1)
    assert (fn(x) == 0).any()  # the nucleus does cut keys here
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_softsa_gradcheck_in_float64(tau):
    """SoftSA with its Gumbel noise held fixed (one seeded generator per call)."""

    def fn(scores):
        return soft_sparse_attention(scores, tau, torch.Generator().manual_seed(0))

    x = _scores(2)
    assert fn(x).dtype == torch.float64
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-5)


def test_prefix_groups_when_p_is_not_a_multiple_of_s():
    """P = 10 prefixes over S = 4 segments: groups of 3, 3, 2, 2 contiguous columns (the first
    P mod S groups one longer); every segment has a prefix and no column is shared."""
    from gencraft.prefix.functional import prefix_block_mask

    mask = prefix_block_mask(torch.tensor([[0, 1, 2, 3]]), 10, 4)[0]  # [T, P]
    assert mask.sum(-1).tolist() == [3, 3, 2, 2]
    assert mask.sum(0).tolist() == [1] * 10  # each column in exactly one group
    columns = [row.nonzero().flatten().tolist() for row in mask]
    assert columns == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    seven = prefix_block_mask(torch.tensor([[0, 1, 2, 3]]), 7, 4)[0]
    assert seven.sum(-1).tolist() == [2, 2, 2, 1]  # 4 groups of 7: none left empty
