"""Dynamic evaluation over a batch (the slot campaign's slowest unit): each row of
``dynamic_eval_last_logits`` equals ``dynamically_evaluated`` on that row alone, over drawn
batch sizes, lengths, padding sides, windows and optimisers, on a Llama and on a GPT-2 whose
output embedding is tied to its input embedding; the few-shot classifier gives the same labels
with any ``de_batch_size``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hso_batch import SETTINGS, _padded

from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig, HSOConfig
from gencraft.hso.dynamic import dynamic_eval_last_logits, dynamically_evaluated
from gencraft.hso.fewshot import classify_batch
from gencraft.models import load_model

_MODELS: dict[str, torch.nn.Module] = {}


def _model(name: str) -> torch.nn.Module:
    if name not in _MODELS:
        _MODELS[name] = load_model(name, seed=0)[0].eval()
    return _MODELS[name]


def _alone(model, row: list[int], cfg: DynamicEvalConfig) -> torch.Tensor:
    ids = torch.tensor([row])
    with dynamically_evaluated(model, ids, cfg):
        return model(input_ids=ids).logits[0, -1].float()


@settings(max_examples=25, **SETTINGS)
@given(
    name=st.sampled_from(["tiny-llama", "tiny-gpt2"]),
    lengths=st.lists(st.integers(2, 13), min_size=1, max_size=4),
    left=st.lists(st.booleans(), min_size=4, max_size=4),
    window=st.integers(1, 5),
    optimizer=st.sampled_from(["sgd", "adam"]),
    seed=st.integers(0, 99),
)
def test_each_row_is_adapted_as_it_would_be_alone(name, lengths, left, window, optimizer, seed):
    model = _model(name)
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, 60, (n,), generator=g).tolist() for n in lengths]
    cfg = DynamicEvalConfig(
        window=window, lr=0.05 if optimizer == "sgd" else 0.01, optimizer=optimizer
    )
    before = [p.detach().clone() for p in model.parameters()]
    ids, mask = _padded(rows, left[: len(rows)])
    got = dynamic_eval_last_logits(model, ids, mask, cfg)
    assert got.shape == (len(rows), model.config.vocab_size) and got.dtype == torch.float32
    for b, row in enumerate(rows):
        ref = _alone(model, row, cfg)
        plain = model(input_ids=torch.tensor([row])).logits[0, -1].float()
        assert (ref - plain).abs().max() > 1e-3  # the adaptation shows
        # Adam divides by the gradients' scale, so float32 rounding in tiny gradients shows
        tol = 5e-5 if optimizer == "sgd" else 5e-4
        torch.testing.assert_close(got[b], ref, atol=tol, rtol=1e-4)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_the_classifier_gives_the_same_labels_in_batches_of_any_size(monkeypatch):
    import gencraft.hso.fewshot as fewshot

    model = _model("tiny-llama")
    batches: list[int] = []

    def spy(model, ids, mask, cfg):
        batches.append(ids.shape[0])
        return dynamic_eval_last_logits(model, ids, mask, cfg)

    monkeypatch.setattr(fewshot, "dynamic_eval_last_logits", spy)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 60, (1, n), generator=g) for n in (9, 4, 15, 7, 12)]
    # the labels move (3 of 5), and every label's lead is >= 0.047 where batched and alone
    # differ by < 1e-6 at 1 and 2 threads (lr 0.5 was chaotic: a label flipped with the load)
    de = DynamicEvalConfig(window=3, lr=0.1)
    hso = HSOConfig()
    labels = [5, 17, 40]
    one = classify_batch(model, prompts, labels, "dynamic eval", hso, de, de_batch_size=1)
    plain = classify_batch(model, prompts, labels, "baseline", hso, de)
    assert one != plain
    assert batches == []  # one prompt at a time: the weights themselves adapted
    for size, rows in ((2, [2, 2, 1]), (3, [3, 2]), (5, [5]), (8, [5])):
        batches.clear()
        got = classify_batch(model, prompts, labels, "dynamic eval", hso, de, de_batch_size=size)
        assert got == one and batches == rows
    with pytest.raises(GencraftError, match=r"^de_batch_size must be >= 1, got 0$"):
        classify_batch(model, prompts, labels, "dynamic eval", hso, de, de_batch_size=0)
