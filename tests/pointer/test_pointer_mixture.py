"""The pointer sentinel mixture against a loop over eqs. 5-8, invariants and gradients."""

import math

import pytest
import torch

from gencraft.pointer import pointer_attention, pointer_sentinel_log_probs


def reference_mixture(vocab_logits, query, states, ids, sentinel, mask):
    """Eqs. 3, 5-8 written out with Python loops, in float64."""
    b_size, v = vocab_logits.shape
    out = torch.zeros(b_size, v, dtype=torch.float64)
    gates = []
    for b in range(b_size):
        q = query[b].double()
        positions = [i for i in range(states.shape[1]) if mask[b, i]]
        scores = [float(q @ states[b, i].double()) for i in positions] + [
            float(q @ sentinel.double())
        ]
        top = max(scores)
        expd = [math.exp(x - top) for x in scores]
        a = [e / sum(expd) for e in expd]
        g = a[-1]
        p_vocab = torch.softmax(vocab_logits[b].double(), -1)
        for w in range(v):
            ptr = sum(a[k] for k, i in enumerate(positions) if int(ids[b, i]) == w)
            out[b, w] = g * p_vocab[w] + ptr
        gates.append(g)
    return out, torch.tensor(gates, dtype=torch.float64)


def random_case(seed, b=3, length=7, h=5, v=10):
    g = torch.Generator().manual_seed(seed)
    vocab_logits = torch.randn(b, v, generator=g)
    query = torch.tanh(torch.randn(b, h, generator=g))
    states = torch.randn(b, length, h, generator=g)
    ids = torch.randint(0, 4, (b, length), generator=g)  # few distinct words: many repeats
    sentinel = torch.randn(h, generator=g)
    mask = torch.rand(b, length, generator=g) > 0.3
    if b >= 3:
        mask[0] = False  # an empty window
        mask[1] = True  # a full window
    return vocab_logits, query, states, ids, sentinel, mask


@pytest.mark.parametrize("seed", range(5))
def test_matches_loop_reference_and_sums_to_one(seed):
    args = random_case(seed)
    log_probs, gate = pointer_sentinel_log_probs(*args)
    ref, ref_gate = reference_mixture(*args)
    assert torch.allclose(log_probs.exp().double(), ref, atol=1e-6)
    assert torch.allclose(gate.double(), ref_gate, atol=1e-6)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(3), atol=1e-5)
    # words 4..9 never occur in the window: only the softmax component, scaled by g
    p_vocab = torch.softmax(args[0], -1)
    assert torch.allclose(log_probs.exp()[:, 4:], gate[:, None] * p_vocab[:, 4:], atol=1e-6)


def test_empty_window_is_the_plain_softmax():
    vocab_logits, query, states, ids, sentinel, mask = random_case(0)
    log_probs, gate = pointer_sentinel_log_probs(vocab_logits, query, states, ids, sentinel, mask)
    assert gate[0] == 1.0
    assert torch.allclose(log_probs[0], torch.log_softmax(vocab_logits[0], -1))
    # a window of length 0 (first token of a stream) too
    lp, g = pointer_sentinel_log_probs(
        vocab_logits, query, states[:, :0], ids[:, :0], sentinel, mask[:, :0]
    )
    assert torch.equal(g, torch.ones(3))
    assert torch.allclose(lp, torch.log_softmax(vocab_logits, -1))


def test_masking_equals_removing_positions():
    vocab_logits, query, states, ids, sentinel, _ = random_case(1, b=1)
    keep = torch.tensor([[True, False, True, True, False, False, True]])
    masked, _ = pointer_sentinel_log_probs(vocab_logits, query, states, ids, sentinel, keep)
    cols = keep[0].nonzero().squeeze(1)
    removed, _ = pointer_sentinel_log_probs(
        vocab_logits, query, states[:, cols], ids[:, cols], sentinel
    )
    assert torch.allclose(masked, removed, atol=1e-6)
    # garbage ids at masked positions change nothing
    ids2 = ids.clone()
    ids2[~keep] = -1
    again, _ = pointer_sentinel_log_probs(vocab_logits, query, states, ids2, sentinel, keep)
    assert torch.equal(again, masked)


def test_attention_plus_gate_sums_to_one():
    _, query, states, _, sentinel, mask = random_case(2)
    log_attn, log_gate = pointer_attention(query, states, sentinel, mask)
    total = log_attn.exp().sum(-1) + log_gate.exp()
    assert torch.allclose(total, torch.ones(3), atol=1e-6)
    assert (log_attn.exp()[~mask] == 0).all()


def test_gradcheck_float64():
    vocab_logits, query, states, ids, sentinel, mask = (
        t.double() if t.is_floating_point() else t for t in random_case(3, b=2, length=4, h=3, v=6)
    )
    mask[0] = torch.tensor([True, False, True, True])
    inputs = [x.clone().requires_grad_() for x in (vocab_logits, query, states, sentinel)]

    def f(vl, q, st, s):
        return pointer_sentinel_log_probs(vl, q, st, ids, s, mask)[0]

    assert torch.autograd.gradcheck(f, inputs)


def test_no_nan_gradients_for_empty_windows_and_absent_targets():
    vocab_logits, query, states, ids, sentinel, mask = random_case(4)
    params = [x.clone().requires_grad_() for x in (vocab_logits, query, states, sentinel)]
    log_probs, _ = pointer_sentinel_log_probs(params[0], params[1], params[2], ids, params[3], mask)
    targets = torch.tensor([2, 9, 0])  # row 0: empty window; row 1: word 9 absent from window
    (-log_probs.gather(1, targets[:, None])).sum().backward()
    for p in params:
        assert torch.isfinite(p.grad).all()
    assert params[1].grad.abs().sum() > 0 and params[3].grad.abs().sum() > 0


def test_half_inputs_are_computed_in_float32():
    args = list(random_case(0))
    args[0] = args[0].half()
    log_probs, _ = pointer_sentinel_log_probs(*args)
    assert log_probs.dtype == torch.float32


def test_bad_shapes_are_named():
    vocab_logits, query, states, ids, sentinel, mask = random_case(0)
    with pytest.raises(ValueError, match=r"window_states must be \[B, L, H\]"):
        pointer_sentinel_log_probs(vocab_logits, query, states[..., :2], ids, sentinel, mask)
    with pytest.raises(ValueError, match=r"sentinel must be \[H\]"):
        pointer_sentinel_log_probs(vocab_logits, query, states, ids, sentinel[:2], mask)
    with pytest.raises(ValueError, match="window_mask must be bool"):
        pointer_sentinel_log_probs(vocab_logits, query, states, ids, sentinel, mask.long())
    with pytest.raises(ValueError, match=r"window_ids at valid positions must lie in \[0, 10\)"):
        pointer_sentinel_log_probs(vocab_logits, query, states, ids + 20, sentinel, mask)
    with pytest.raises(ValueError, match=r"vocab_logits must be \[B, V\]"):
        pointer_sentinel_log_probs(vocab_logits[:1], query, states, ids, sentinel, mask)


def test_sequence_target_path_and_eq9_by_hand_with_finite_gradients():
    from gencraft.pointer import pointer_loss, pointer_target_log_probs, sequence_pointer_attention

    torch.manual_seed(0)
    q = torch.randn(2, 4, 3, requires_grad=True)
    states = torch.randn(2, 6, 3, requires_grad=True)
    s = torch.randn(3, requires_grad=True)
    ids = torch.tensor([[1, 2, 1, 3, 4, 1], [5, 5, 5, 5, 5, 5]])
    valid = torch.tensor([[True] * 6, [False, False, False, True, True, True]])
    y = torch.tensor([[1, 7, 4, 1], [5, 5, 0, 0]])  # repeated, absent, and masked-only targets
    lv = torch.randn(2, 4).log_softmax(-1).requires_grad_()
    la, lg = sequence_pointer_attention(q, states, s, 3, valid)
    lp = pointer_target_log_probs(lv, la, lg, ids, y)
    eq9 = pointer_loss(la, lg, ids, y)
    qd, sd, sn, lvd = q.detach(), states.detach(), s.detach(), lv.detach()
    for b in range(2):
        for t in range(4):
            pos = 2 + t
            z = {j: float(qd[b, t] @ sd[b, j]) for j in range(pos - 2, pos + 1) if valid[b, j]}
            zs = float(qd[b, t] @ sn)
            den = sum(math.exp(v) for v in z.values()) + math.exp(zs)
            g = math.exp(zs) / den
            ptr = sum(math.exp(v) / den for j, v in z.items() if ids[b, j] == y[b, t])
            assert math.isclose(
                float(lp.detach()[b, t]), math.log(g * math.exp(lvd[b, t]) + ptr), rel_tol=1e-5
            )
            e9 = float(eq9.detach()[b, t])
            assert math.isclose(e9, -math.log(g + ptr), rel_tol=1e-5, abs_tol=1e-6)
    (lp.sum() + eq9.sum()).backward()
    for t in (q, states, s, lv):
        assert torch.isfinite(t.grad).all()


def test_target_mass_gradient_is_finite_when_attention_underflows():
    """Large-magnitude states (SmolLM2's hidden states have norm ~45) push window weights to
    the edge of float32: a present target whose weight is exp(-89.6) ~ 1e-39 (denormal) made
    1 / mass overflow and the gradient NaN. Loss and gradient must stay finite and equal the
    float64 computation."""
    from gencraft.pointer.functional import pointer_target_log_probs

    # window of 3 and the sentinel (last, far below): the target (5) sits at position 0 only
    scores = torch.tensor([[[-89.6, 0.0, -300.0, -200.0], [0.0, 1.0, 2.0, 0.5]]])
    ids = torch.tensor([[5, 6, 7]])
    targets = torch.tensor([[5, 6]])
    lv = torch.tensor([[-3.0, -2.0]])
    for dtype in (torch.float32, torch.float64):
        x = scores.to(dtype).clone().requires_grad_(True)
        log_a = torch.log_softmax(x, -1)
        lp = pointer_target_log_probs(lv.to(dtype), log_a[..., :-1], log_a[..., -1], ids, targets)
        lp.sum().backward()
        assert torch.isfinite(lp).all() and torch.isfinite(x.grad).all(), dtype
        if dtype == torch.float32:
            lp32 = lp.detach().double()
    torch.testing.assert_close(lp32, lp.detach(), atol=1e-5, rtol=1e-6)
