"""``collect_attention``: each real input's attention, cut out of a padded batch, is the
attention of that input run alone; the stack it reads, the mode it leaves, no graph."""

from __future__ import annotations

import pytest
import torch
from test_prefix_model import P, _model

from gencraft.prefix.analysis import collect_attention


def _rows(lengths: list[int], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 250, (n,), generator=g) for n in lengths]


def _padded(rows: list[torch.Tensor], left: bool, encoder_decoder: bool) -> dict:
    t = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    mask = torch.zeros(len(rows), t, dtype=torch.long)
    for b, r in enumerate(rows):
        cols = slice(t - len(r), t) if left else slice(0, len(r))
        ids[b, cols], mask[b, cols] = r, 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if left:  # each row the positions it has alone: after the P prefix positions
        batch["position_ids"] = P + (mask.cumsum(1) - 1).clamp(min=0)
    if encoder_decoder:  # a decoder input of its own; the encoder's attention ignores it
        batch["labels"] = torch.full((len(rows), 3), 7)
    return batch


def _alone(model, row: torch.Tensor, stack: str, encoder_decoder: bool) -> dict[int, torch.Tensor]:
    batch = _padded([row], False, encoder_decoder)
    with model.recording() as rec, torch.no_grad():
        model(**batch)
    return {k[2]: v[0] for k, v in rec.items() if k[0] == stack and k[1] == "self"}


CASES = [
    ("tiny-bart", False, {}),
    ("tiny-bart", False, {"encoder_segments": 2, "blocked_layers": "lower"}),
    ("tiny-llama", False, {}),
    ("tiny-llama", True, {}),
    ("tiny-gpt2", False, {"decoder_segments": 2, "blocked_layers": "lower"}),
]


@pytest.mark.parametrize(("name", "left", "cfg"), CASES, ids=str)
@pytest.mark.parametrize("training", [True, False])
def test_each_input_is_its_attention_alone(name, left, cfg, training):
    model = _model(name, **cfg)
    ed = model.is_encoder_decoder
    stack = "encoder" if ed else "decoder"
    rows = _rows([7, 4, 6, 3], seed=1)
    batches = [_padded(rows[:3], left, ed), _padded(rows[3:], left, ed)]
    model.train(training)
    grad = []  # whether each forward builds a graph
    hook = model.register_forward_hook(lambda *a: grad.append(torch.is_grad_enabled()))
    got = collect_attention(model, batches)
    hook.remove()
    assert model.training is training and grad == [False, False]
    model.eval()
    refs = [_alone(model, r, stack, ed) for r in rows]
    assert sorted(got) == sorted(refs[0]) and len(got) >= 2
    for layer, items in got.items():
        assert len(items) == len(rows)
        for r, item in enumerate(items):
            t = len(rows[r])
            assert item.shape == (refs[r][layer].shape[0], t, P + t)
            assert item.dtype == torch.float32 and not item.requires_grad
            torch.testing.assert_close(item, refs[r][layer].float(), atol=1e-5, rtol=1e-4)


def test_the_stack_can_be_named():
    """An encoder-decoder's decoder: its own mask's real positions, all without one."""
    model = _model("tiny-bart")
    rows = _rows([5, 3, 4, 6, 2], seed=2)  # more rows than heads (4)
    batch = _padded(rows, False, True)
    enc = collect_attention(model, [batch])
    dec = collect_attention(model, [batch], stack="decoder")
    named = collect_attention(model, [batch], "encoder")
    assert sorted(named) == sorted(enc)
    assert all(torch.equal(a, b) for k in enc for a, b in zip(enc[k], named[k], strict=True))
    assert len(dec) == model.base.config.decoder_layers and len(enc) > 0
    for items in dec.values():  # the decoder's 3 positions, all real
        assert [tuple(x.shape[1:]) for x in items] == [(3, P + 3)] * 5
    batch["decoder_attention_mask"] = torch.tensor([[1, 1, 1], [1, 1, 0], *[[1, 1, 1]] * 3])
    dec2 = collect_attention(model, [batch], stack="decoder")
    assert len(dec2) == len(dec)
    for layer, items in dec2.items():
        assert [tuple(x.shape[1:]) for x in items] == [(3, P + 3), (2, P + 2), *[(3, P + 3)] * 3]
        keep = [*range(P + 2)]
        torch.testing.assert_close(items[1], dec[layer][1][:, :2][:, :, keep])
    assert collect_attention(model, [batch], stack="nowhere") == {}
