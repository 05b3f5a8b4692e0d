"""PointerSentinelHead on Hugging Face causal LMs (tiny-llama, tiny-gpt2)."""

from __future__ import annotations

import pytest
import torch

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.pointer import PointerSentinelHead, pointer_sentinel_log_probs

BASES = ["tiny-llama", "tiny-gpt2"]


def make(name: str, **kw) -> PointerSentinelHead:
    base, _ = load_model(name, seed=0)
    torch.manual_seed(0)
    return PointerSentinelHead(base, kw.pop("window", 6), base_name_or_path=name, **kw)


@pytest.mark.parametrize("name", BASES)
def test_head_matches_the_functional_core_and_sums_to_one(name):
    head = make(name)
    ids = torch.randint(5, 12, (2, 10))  # few distinct ids: repeats inside each window
    out = head(ids, return_log_probs=True, return_attention=True)
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(2, 10))
    base = head.base(input_ids=ids, output_hidden_states=True)
    h = base.hidden_states[-1]
    for t in range(10):
        lo = max(0, t - head.window + 1)
        q = torch.tanh(head.query(h[:, t]))
        ref, gate = pointer_sentinel_log_probs(
            base.logits[:, t], q, h[:, lo : t + 1], ids[:, lo : t + 1], head.sentinel
        )
        torch.testing.assert_close(out.log_probs[:, t], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.gate[:, t], gate)
        if t < 9:
            torch.testing.assert_close(out.nll[:, t], -ref.gather(1, ids[:, t + 1 :][:, :1])[:, 0])
    assert head.num_pointer_parameters() == head.query.in_features**2 + 2 * head.query.in_features


@pytest.mark.parametrize("name", BASES)
def test_frozen_base_gets_no_gradient_and_trainable_base_does(name):
    head = make(name)
    head(torch.randint(5, 60, (2, 9))).loss.backward()
    assert head.query.weight.grad is not None and head.sentinel.grad is not None
    assert all(p.grad is None for p in head.base.parameters())
    head = make(name, freeze_base=False).train()
    head(torch.randint(5, 60, (2, 9))).loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in head.base.parameters())


def test_left_padding_is_masked_exactly():
    head = make("tiny-llama")
    ids = torch.randint(5, 12, (1, 8))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], 1)
    a = head(ids, return_log_probs=True)
    b = head(padded, attention_mask=mask, return_log_probs=True)
    torch.testing.assert_close(b.log_probs[:, 3:], a.log_probs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(b.nll[:, 3:], a.nll, atol=1e-5, rtol=1e-4)
    assert (b.nll[:, :3] == 0).all()  # pad targets are not scored


@pytest.mark.parametrize("name", BASES)
def test_save_load_round_trip(name, tmp_path):
    head = make(name)
    with torch.no_grad():
        head.sentinel.normal_()
    ids = torch.randint(5, 60, (2, 12))
    head.save_pretrained(tmp_path / "h")
    again = PointerSentinelHead.from_pretrained(tmp_path / "h")
    torch.testing.assert_close(again(ids).nll, head(ids).nll)
    trainable = make(name, freeze_base=False)
    with torch.no_grad():
        next(trainable.base.parameters()).add_(0.5)  # weights the registry can't rebuild
    trainable.save_pretrained(tmp_path / "t")
    assert (tmp_path / "t" / "base").is_dir()
    again = PointerSentinelHead.from_pretrained(tmp_path / "t")
    torch.testing.assert_close(again(ids).nll, trainable(ids).nll)


def test_training_the_head_learns_to_copy():
    """On sequences that repeat a random prefix, a frozen random base cannot predict the second
    half; the head learns to point at the earlier copy."""
    head = make("tiny-llama", window=16)
    opt = torch.optim.Adam(head.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(0)

    def batch():
        x = torch.randint(5, 200, (16, 8), generator=g)
        return torch.cat([x, x], 1)

    first = head(batch()).nll[:, 8:].mean().item()
    for _ in range(60):
        opt.zero_grad()
        head(batch()).nll[:, 7:].mean().backward()
        opt.step()
    out = head(batch())
    assert out.nll[:, 8:].mean().item() < 0.75 * first
    assert out.gate[:, 8:15].mean() < 0.5  # mass moved to the pointer on the copied half


def test_head_rejects_bad_input():
    base, _ = load_model("tiny-bart")
    with pytest.raises(GencraftError, match="decoder-only"):
        PointerSentinelHead(base)
    base, _ = load_model("tiny-llama")
    with pytest.raises(ValueError, match="window must be"):
        PointerSentinelHead(base, window=0)
    head = PointerSentinelHead(base, 4)
    with pytest.raises(ValueError, match="attention_mask"):
        head(torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))


def test_the_loss_ignores_padding_and_minus_100_labels():
    """The loss is the mean NLL over scored positions only: labels of -100 and positions of
    padding neither add to it nor count in its denominator."""
    head = make("tiny-llama")
    ids = torch.randint(5, 60, (1, 9), generator=torch.Generator().manual_seed(1))
    full = head(ids)
    labels = ids.clone()
    labels[0, 1:4] = -100  # the first three predictions are not scored
    part = head(ids, labels=labels)
    torch.testing.assert_close(part.loss, full.nll[0, 3:].mean())
    assert (part.nll[0, :3] == 0).all()
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)  # right padding
    mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 4, dtype=torch.long)], 1)
    torch.testing.assert_close(head(padded, attention_mask=mask).loss, full.loss)
