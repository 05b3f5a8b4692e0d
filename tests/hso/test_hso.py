"""HSO (thesis ch. 3) against independent references: a hand-written HSO with one
``torch.optim.Adam`` per block of states (so per-state moments and step counts), lr = 0 equal
to the plain model, no leakage, the prefill cache, and dynamic evaluation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from gencraft.errors import ConfigError, GencraftError
from gencraft.hso import (
    DynamicEvalConfig,
    HSOConfig,
    dynamic_eval_nll,
    dynamically_evaluated,
    hso_nll,
    hso_prefill,
)
from gencraft.hso.fewshot import FewShotTask, classify, draw_prompt, label_token_ids
from gencraft.metrics import windowed_nll
from gencraft.models import load_model


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 200, (1, n), generator=torch.Generator().manual_seed(seed))


def reference_hso(
    model, ids, *, k, lr, betas, eps=1e-8, max_blocks=None, present_only=False, sgd=False
):
    """HSO written block by block: each window's states become a block of leaf tensors with
    its own optimiser; gradients are read from the concatenated keys/values the attention
    used. Returns the recorded NLL [N - 1] and the final per-layer (keys, values)."""
    ids = ids[0]
    layers = model.config.num_hidden_layers
    blocks: list[dict] = []
    recorded = []
    for t in range(0, ids.numel() - 1, k):
        e = min(t + k, ids.numel() - 1)
        past = None
        if blocks:
            past = [
                tuple(torch.cat([b["kv"][i][j] for b in blocks], dim=-2) for j in range(2))
                for i in range(layers)
            ]
        cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
        start = blocks[0]["pos"] if blocks else 0
        logits = model(
            input_ids=ids[None, t:e], past_key_values=cache, position_ids=torch.arange(t, e)[None]
        ).logits[0]
        nll = nn.functional.cross_entropy(logits.float(), ids[t + 1 : e + 1], reduction="none")
        recorded.append(nll.detach())
        used = [t_ for layer in cache.layers for t_ in (layer.keys, layer.values)]
        grads = torch.autograd.grad(nll.sum(), used)
        s = used[0].shape[-2] - (e - t)  # cached positions
        new = {
            "pos": t,
            "kv": [
                [used[2 * i + j][..., s:, :].detach().clone().requires_grad_() for j in range(2)]
                for i in range(layers)
            ],
        }
        params = [p for pair in new["kv"] for p in pair]
        new["opt"] = (
            torch.optim.SGD(params, lr=lr)
            if sgd
            else torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)
        )
        blocks.append(new)
        offset = 0
        for b in blocks:
            n = b["kv"][0][0].shape[-2]
            if b is new or not present_only:
                for i in range(layers):
                    for j in range(2):
                        b["kv"][i][j].grad = grads[2 * i + j][..., offset : offset + n, :].clone()
                b["opt"].step()
            offset += n
        assert start <= t
        if max_blocks is not None and len(blocks) > max_blocks:
            blocks.pop(0)
    final = [
        tuple(torch.cat([b["kv"][i][j] for b in blocks], -2).detach() for j in range(2))
        for i in range(layers)
    ]
    return torch.cat(recorded), final


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(max_context=14),
        dict(present_only=True),
        dict(optimizer="sgd", lr=0.5),
        dict(optimizer="sgd", lr=1.0),  # lr = 1 is an update like any other
        dict(window=1, max_context=3),  # one cached state before the second window
    ],
    ids=["adam", "max_context", "present_only", "sgd", "sgd_lr1", "window1"],
)
def test_hso_equals_a_per_block_adam_reference(llama, kw):
    """In float64: Adam divides tiny gradients by their own size, so a float32 model's
    reduction order (the thread count) moved the float32 states by up to 4e-5; in float64
    both sides agree to the float32 rounding of HSO's master states, at any thread count."""
    llama = copy.deepcopy(llama).double()
    ids = _ids(40)
    k = kw.pop("window", 7)
    cfg = HSOConfig(window=k, lr=kw.pop("lr", 0.05), betas=(0.65, 0.9), **kw)
    want, want_kv = reference_hso(
        llama,
        ids,
        k=k,
        lr=cfg.lr,
        betas=cfg.betas,
        max_blocks=None if cfg.max_context is None else cfg.max_context // k,
        present_only=cfg.present_only,
        sgd=cfg.optimizer == "sgd",
    )
    got = hso_nll(llama, ids, cfg).token_nll
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    plain = windowed_nll(llama, ids, window=40)
    assert (got[k:] - plain[k:]).abs().max() > 1e-3  # the updates changed later predictions
    cache = hso_prefill(llama, ids, cfg) if cfg.max_context is None else None
    if cache is not None:  # the prefill keeps the same optimised states
        for layer, (wk, wv) in zip(cache.layers, want_kv, strict=True):
            torch.testing.assert_close(layer.keys, wk, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(layer.values, wv, atol=2e-5, rtol=1e-5)


def test_lr_zero_is_the_plain_model():
    for name in ("tiny-llama", "tiny-gpt2"):
        model, _ = load_model(name, seed=1)
        ids = _ids(33, 1)
        torch.testing.assert_close(
            hso_nll(model, ids, HSOConfig(window=5, lr=0.0)).token_nll,
            windowed_nll(model, ids, window=33),
            atol=1e-5,
            rtol=1e-5,
        )
        # non-overlapping contexts: the state resets as a disjoint window evaluation does
        torch.testing.assert_close(
            hso_nll(model, ids, HSOConfig(window=5, lr=0.0, reset_every=12, steps=2)).token_nll,
            windowed_nll(model, ids, window=12, overlap=0),
            atol=1e-5,
            rtol=1e-5,
        )
        torch.testing.assert_close(
            dynamic_eval_nll(model, ids, DynamicEvalConfig(window=5, lr=0.0)).token_nll,
            windowed_nll(model, ids, window=33),
            atol=1e-5,
            rtol=1e-5,
        )


@pytest.mark.parametrize("steps", [1, 2])
def test_no_leakage(llama, steps):
    # changing token p changes no prediction of a target before p, even inside p's window
    ids = _ids(30, 2)
    cfg = HSOConfig(window=6, lr=0.1, steps=steps)
    base = hso_nll(llama, ids, cfg).token_nll
    for p in (9, 14, 22):
        other = ids.clone()
        other[0, p] = (other[0, p] + 1) % 200 + 3
        got = hso_nll(llama, other, cfg).token_nll
        torch.testing.assert_close(got[: p - 1], base[: p - 1], atol=0, rtol=0)
        assert (got[p:] - base[p:]).abs().max() > 1e-4  # but later ones do change


def test_hso2_takes_a_second_step_at_the_updated_states(llama):
    ids = _ids(30, 3)
    one = hso_nll(llama, ids, HSOConfig(window=6, lr=0.05)).token_nll
    two = hso_nll(llama, ids, HSOConfig(window=6, lr=0.05, steps=2)).token_nll
    torch.testing.assert_close(two[:6], one[:6], atol=0, rtol=0)  # window 1: no update yet
    assert (two[6:] - one[6:]).abs().max() > 1e-4
    # a second step lowers the window's loss further on this text (an optimiser that works)
    assert two[6:].mean() < one[6:].mean()


def test_prefill_predicts_what_hso_nll_scores(llama):
    # after inputs 0..13 (two windows of 7), input 14 opens a new window: its prediction of
    # token 15 uses exactly the prefilled state
    ids = _ids(16, 4)
    cfg = HSOConfig(window=7, lr=0.05)
    want = hso_nll(llama, ids, cfg).token_nll[14]
    cache = hso_prefill(llama, ids[:, :15], cfg)
    assert cache.get_seq_length() == 14
    with torch.no_grad():
        logits = llama(ids[:, 14:15], past_key_values=cache).logits[0, -1]
    torch.testing.assert_close(
        -torch.log_softmax(logits, -1)[ids[0, 15]], want, atol=1e-5, rtol=1e-5
    )
    cache = hso_prefill(llama, ids[:, :15], cfg)
    out = llama.generate(ids[:, :15], past_key_values=cache, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 18)


def test_dynamic_evaluation_steps_the_weights_and_restores_them(llama):
    ids = _ids(20, 5)
    before = [p.detach().clone() for p in llama.parameters()]
    got = dynamic_eval_nll(llama, ids, DynamicEvalConfig(window=8, lr=0.05)).token_nll
    for p, b in zip(llama.parameters(), before, strict=True):
        assert torch.equal(p, b) and p.grad is None
    # by hand: window 2 is scored after one SGD step on window 1's summed loss
    import copy

    model = copy.deepcopy(llama)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    logits = model(ids[:, :8]).logits[0]
    nn.functional.cross_entropy(logits, ids[0, 1:9], reduction="sum").backward()
    opt.step()
    with torch.no_grad():
        logits = model(ids[:, :16]).logits[0, 8:]
    want = nn.functional.cross_entropy(logits, ids[0, 9:17], reduction="none")
    torch.testing.assert_close(
        got[:8], windowed_nll(llama, ids, window=20)[:8], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(got[8:16], want, atol=1e-5, rtol=1e-5)


def test_dynamic_evaluation_resets_the_weights_at_each_context(llama):
    """With ``reset_every``, each context is scored as dynamic evaluation of that context on
    its own: the weights (and the optimiser) start again from the model's."""
    ids = _ids(25, 6)
    cfg = dict(window=5, lr=0.05, optimizer="adam")
    got = dynamic_eval_nll(llama, ids, DynamicEvalConfig(reset_every=12, **cfg)).token_nll
    for c0, c1 in ((0, 12), (12, 24)):
        alone = dynamic_eval_nll(llama, ids[:, c0 : c1 + 1], DynamicEvalConfig(**cfg)).token_nll
        torch.testing.assert_close(got[c0:c1], alone, atol=1e-5, rtol=1e-5)
    carried = dynamic_eval_nll(llama, ids, DynamicEvalConfig(**cfg)).token_nll
    assert (got[12:] - carried[12:]).abs().max() > 1e-4  # the reset does change the scores


def test_hso_state_gradients_gradcheck_in_float64():
    """The gradients HSO steps on: the window's NLL with respect to the cached states and to
    the present states (the shifts of :class:`KVStates`), against finite differences. GPT-2,
    not Llama: Llama's RMSNorm computes in float32 even in a float64 model."""
    from gencraft.hso.functional import _window_nll
    from gencraft.models.caches import KVStates

    model, _ = load_model("tiny-gpt2", seed=0)
    model = model.double().eval()
    ids = _ids(9, 3)[0]
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        cache = KVStates(num_layers=layers)
        model(input_ids=ids[None, :5], past_key_values=cache, use_cache=True)
        past = [(k.detach(), v.detach()) for k, v in cache.states()]
    n_kv, d = past[0][0].shape[1], past[0][0].shape[-1]
    shift = torch.zeros(1, n_kv, 3, d, dtype=torch.float64)

    def nll(k0, v0, dk1, dv1):
        states = [(k0, v0), *past[1:]]
        shifts = [(shift, shift), *[(dk1, dv1)] * (layers - 1)]
        cache = KVStates(states, shifts)
        return _window_nll(
            model, ids[None, 5:8], ids[None, 6:9], cache, torch.arange(5, 8)[None]
        ).sum()

    inputs = (
        past[0][0].clone().requires_grad_(True),
        past[0][1].clone().requires_grad_(True),
        shift.clone().requires_grad_(True),
        shift.clone().requires_grad_(True),
    )
    assert torch.autograd.gradcheck(nll, inputs, eps=1e-6, atol=1e-6)


def test_bad_input(llama):
    for kw, msg in [
        (dict(window=0), "window"),
        (dict(lr=-1.0), "lr must be >= 0"),
        (dict(betas=(1.0, 0.9)), "betas"),
        (dict(steps=0), "steps"),
        (dict(optimizer="rmsprop"), "optimizer"),
        (dict(max_context=0), "max_context"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            HSOConfig(**kw)
    with pytest.raises(GencraftError, match="at least 2 tokens"):
        hso_nll(llama, torch.tensor([[5]]))
    with pytest.raises(GencraftError, match="vocabulary"):
        hso_nll(llama, torch.tensor([[5, 100000]]))
    bart, _ = load_model("tiny-bart")
    with pytest.raises(GencraftError, match="BartForConditionalGeneration is not one"):
        hso_nll(bart, _ids(10))
    from transformers import BertConfig, BertForMaskedLM

    bert = BertForMaskedLM(
        BertConfig(
            vocab_size=300,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    with pytest.raises(GencraftError, match="BertForMaskedLM is not one"):
        hso_nll(bert, _ids(10))
    with pytest.raises(GencraftError, match=r"window of tokens \d+\.\.\d+"):
        hso_nll(llama, _ids(30), HSOConfig(window=5, lr=1e30, optimizer="sgd"))
    with pytest.raises(GencraftError, match="reset_every"):
        hso_prefill(llama, _ids(10), HSOConfig(reset_every=4))


def test_dynamically_evaluated_predicts_what_dynamic_eval_scores(llama):
    # inputs 0..13 are two windows of 7; input 14 opens the next: the same adapted weights
    ids = _ids(16, 6)
    cfg = DynamicEvalConfig(window=7, lr=0.05)
    want = dynamic_eval_nll(llama, ids, cfg).token_nll[14]
    before = [p.detach().clone() for p in llama.parameters()]
    with dynamically_evaluated(llama, ids[:, :15], cfg) as model, torch.no_grad():
        logits = model(ids[:, :15]).logits[0, -1]
    torch.testing.assert_close(
        -torch.log_softmax(logits, -1)[ids[0, 15]], want, atol=1e-5, rtol=1e-5
    )
    for p, b in zip(llama.parameters(), before, strict=True):
        assert torch.equal(p, b)


def test_few_shot_prompts_and_classification(llama):
    import random

    from gencraft.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    task = FewShotTask(
        "toy", "Text", "Label", ("yes", "no"), [(f"a{i}", i % 2) for i in range(10)], []
    )
    shared, ids = label_token_ids(tok, task.labels)
    assert shared and len(set(ids)) == 2  # a byte tokenizer shares the space
    p1 = draw_prompt(task, tok, 4, "b", random.Random(0), shared=shared)
    p2 = draw_prompt(task, tok, 4, "b", random.Random(0), shared=shared)
    assert torch.equal(p1, p2)  # the seed fixes the draw
    text = tok.decode(p1[0])
    assert text.count("Label: yes") == 2 and text.count("Label: no") == 2  # class-balanced
    assert text.endswith("Text: b\nLabel: ")
    # lr = 0: HSO, HSO-2 and dynamic evaluation read the same label as the plain model
    zero = HSOConfig(window=5, lr=0.0)
    got = {
        m: classify(llama, p1, ids, m, zero, DynamicEvalConfig(window=5, lr=0.0))
        for m in ("baseline", "hso", "hso2", "dynamic eval")
    }
    assert len(set(got.values())) == 1
    with pytest.raises(GencraftError, match="not a multiple of the 2 classes"):
        draw_prompt(task, tok, 3, "b", random.Random(0))
    with pytest.raises(GencraftError, match="only 5 'yes' examples"):
        draw_prompt(task, tok, 12, "b", random.Random(0))
