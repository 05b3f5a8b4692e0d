"""The precision contract: every method in float32, bfloat16 and float16 (``.to(dtype)`` on
the method model), on the CPU and, with ``pytest -m gpu``, on CUDA. Each run checks that loss
and gradients are finite, that the method's outputs (log-probabilities, or its own scores) are
within the stated tolerance of float32, and that generation or decoding runs.

Tolerance: max |out - out_fp32| / max |out_fp32| over the method's outputs (log-probabilities;
the classifier's class log-probabilities; the recurrent LM's windowed NLL), about twice what
each method measured on these tiny peaked models (:data:`TOLERANCE`, docs/core.md). The
methods' float32 parts are listed in docs/core.md.
"""

from __future__ import annotations

import pytest
import torch
from test_methods import (
    ClassifierCase,
    FocusCase,
    NARCase,
    PointerHeadCase,
    PointerLSTMCase,
    PrefixCase,
    RecurrenceCase,
)

from gencraft.nar.config import SamplingConfig
from gencraft.nar.decoding import sundae_generate
from gencraft.search import beam_search

#: (bfloat16, float16) relative tolerance per method; measured on the CPU (2026-11-25):
#: focus 0.012/0.0022, pointer-head 0.029/0.0019, pointer-lstm 0.0012/0.0002, prefix
#: 0.078/0.0022, recurrence 0.016/0.0013, nar 0.0005/0.0001, search-classifier 0.005/0.0004
TOLERANCE = {
    "focus": (0.025, 0.005),
    "pointer-head": (0.06, 0.004),
    "pointer-lstm": (0.003, 0.0005),
    "prefix": (0.15, 0.005),
    "recurrence": (0.035, 0.003),
    "nar": (0.002, 0.0003),
    "search-classifier": (0.01, 0.001),
}
CASES = {
    c.name: c
    for c in (
        FocusCase(),
        PointerHeadCase(),
        PointerLSTMCase(),
        PrefixCase(),
        RecurrenceCase(),
        NARCase(),
        ClassifierCase(),
    )
}
DTYPES = [torch.bfloat16, torch.float16]


def _generate(case, model, device) -> None:
    prompt = torch.tensor([[1, 3, 4]], device=device)
    if case.name in ("focus", "pointer-head"):
        hyps = beam_search(case.search_model(model), prompt, num_beams=2, max_new_tokens=3)
        assert hyps and all(torch.isfinite(torch.tensor(h.score)) for h in hyps)
    elif case.name == "prefix":
        out = model.generate(prompt, max_new_tokens=3, do_sample=False)
        assert out.shape[1] > 0
    elif case.name == "nar":
        noise = torch.arange(5, 40, device=device)
        out = sundae_generate(model, prompt, config=SamplingConfig(steps=2, samples=2), noise=noise)
        assert len(out.sequences) == 1
    elif case.name == "search-classifier":
        base = model.__dict__["_test_base"]
        hyps = beam_search(base, prompt, num_beams=2, max_new_tokens=3, classifier=model, k=3)
        assert hyps and all(h.conditional_score is not None for h in hyps)
    elif case.name == "recurrence":
        out = model(torch.tensor([[1, 3, 4, 2, 3, 1, 4, 2]], device=device))
        assert torch.isfinite(out.logits).all()
    # pointer-lstm scores text; its forward is its decoding


def _to(case, model, dtype, device):
    model = model.to(device=device, dtype=dtype)
    if case.name == "search-classifier":
        model.__dict__["_test_base"].to(device=device, dtype=dtype)
    return model


def _contract(name: str, dtype: torch.dtype, device: str) -> None:
    case = CASES[name]
    ids = case.inputs(0).to(device)
    ref_model, _ = case.make(0)
    ref = case.outputs(_to(case, ref_model, torch.float32, device), ids).float()
    model, _ = case.make(0)
    model = _to(case, model, dtype, device)
    out = case.outputs(model, ids).float()
    assert torch.isfinite(out).all()
    diff = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    tol = {torch.float32: 1e-3, torch.bfloat16: TOLERANCE[name][0]}.get(dtype, TOLERANCE[name][1])
    assert diff <= tol, f"{name} in {dtype}: relative difference {diff:.5f} > {tol}"
    model.train()
    loss = case.loss(model, ids)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in case.method_parameters(model)]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    model.eval()
    with torch.no_grad():
        _generate(case, model, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_precision_contract_on_cpu(name, dtype):
    _contract(name, dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_precision_contract_on_cuda(name, dtype):
    _contract(name, dtype, "cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hso_in_half_precision_keeps_float32_states(dtype):
    """HSO on a half-precision model (its optimised states kept in float32, the model fed a
    cast copy): finite, close to float32, and the updates move the scores."""
    from gencraft.hso import HSOConfig, hso_nll
    from gencraft.models.architectures import tiny_architecture

    ids = torch.randint(3, 16, (1, 30), generator=torch.Generator().manual_seed(0))[0]
    cfg = HSOConfig(window=5, lr=1e-3)
    ref = hso_nll(tiny_architecture("llama", vocab_size=16), ids, cfg).token_nll
    model = tiny_architecture("llama", vocab_size=16).to(dtype)
    got = hso_nll(model, ids, cfg).token_nll
    plain = hso_nll(model, ids, HSOConfig(window=5, lr=0.0)).token_nll
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() / ref.abs().max() < {torch.bfloat16: 0.05}.get(dtype, 0.01)
    assert not torch.equal(got, plain)  # lr 1e-3 still moves a half-precision model


def measured() -> str:
    """The relative differences to float32 on the CPU, per method (docs/core.md's table)."""
    lines = ["| method | bfloat16 | float16 |", "|---|---|---|"]
    for name, case in CASES.items():
        ids = case.inputs(0)
        ref = case.outputs(_to(case, case.make(0)[0], torch.float32, "cpu"), ids).float()
        row = []
        for dtype in DTYPES:
            out = case.outputs(_to(case, case.make(0)[0], dtype, "cpu"), ids).float()
            row.append(f"{((out - ref).abs().max() / ref.abs().max()).item():.4f}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(measured())
