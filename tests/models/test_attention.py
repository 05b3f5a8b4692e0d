"""The shared attention dispatcher: pass-through, observation, extra key/value columns,
normalisers, per-call context, on every tiny architecture and both mask formats."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from gencraft.errors import GencraftError
from gencraft.models import attention as A
from gencraft.models import load_model

ALL = ["tiny-llama", "tiny-gpt2", "tiny-bart", "tiny-t5", "tiny-bert2bert"]
CAUSAL = ["tiny-llama", "tiny-gpt2"]


def _model(name: str, impl: str):
    model, _ = load_model(name, seed=0)
    model.set_attn_implementation(impl)
    return model.eval()


def _inputs(model, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding in row 0
    kw = {"input_ids": ids, "attention_mask": mask}
    if model.config.is_encoder_decoder:
        kw["decoder_input_ids"] = torch.randint(5, 200, (2, 4), generator=g)
        keep = torch.ones(2, 4, dtype=torch.bool)
    else:
        keep = mask.bool()
    return kw, keep


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ALL)
def test_no_plugin_is_bit_identical_and_softmax_normaliser_matches(name, impl):
    model = _model(name, impl)
    kw, keep = _inputs(model)
    with torch.no_grad():
        ref = model(**kw).logits
    A.install(model)
    assert model.config._attn_implementation == A.IMPL
    with torch.no_grad():
        assert torch.equal(model(**kw).logits, ref)
        obs = A.Observer()
        with A.attach(model, obs, kind="any"):
            assert torch.equal(model(**kw).logits, ref)  # observing changes nothing
        assert len(obs.probs) == len(A.attention_sites(model))
        soft = A.Normalizer(fn=lambda s, a: torch.softmax(s, -1))
        with A.attach(model, soft, kind="any"):
            out = model(**kw).logits  # gencraft's eager path
    torch.testing.assert_close(out[keep], ref[keep], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ALL)
def test_observed_probabilities_equal_eager_attention_weights(name):
    model = _model(name, "eager")
    kw, _ = _inputs(model)
    with torch.no_grad():
        ref = model(**kw, output_attentions=True)
    obs = A.Observer()
    A.attach(model, obs, kind="self", stack="decoder", layers=[-1])
    with torch.no_grad():
        model(**kw)
    expected = ref.decoder_attentions[-1] if model.config.is_encoder_decoder else ref.attentions[-1]
    assert len(obs.probs) == 1
    got, expected = obs.probs[0].transpose(1, 2), expected.float().transpose(1, 2)  # [B, T, n, S]
    if not model.config.is_encoder_decoder:  # padded query rows are arbitrary in eager too
        real = kw["attention_mask"].bool()
        got, expected = got[real], expected[real]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(obs.probs[0].sum(-1), torch.ones_like(obs.probs[0].sum(-1)))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_normaliser_sees_the_causal_and_padding_pattern(impl):
    """A uniform normaliser over allowed keys: row t of a left-padded causal sequence must be
    1 / (#real keys up to t) exactly on those keys, 0 elsewhere."""
    model = _model("tiny-llama", impl)
    kw, _ = _inputs(model)
    seen = []

    def uniform(scores, allowed):
        p = allowed.expand_as(scores).float()
        p = p / p.sum(-1, keepdim=True).clamp_min(1)
        seen.append(p)
        return p

    A.attach(model, A.Normalizer(fn=uniform), layers=[0])
    with torch.no_grad():
        model(**kw)
    p = seen[0]  # [2, n, 7, 7]
    mask = kw["attention_mask"].bool()
    for b in range(2):
        for t in range(7):
            if not mask[b, t]:
                continue
            allowed = mask[b] & (torch.arange(7) <= t)
            expected = allowed.float() / allowed.sum()
            torch.testing.assert_close(p[b, :, t], expected.expand_as(p[b, :, t]))


def _prefix_cache(model, batch: int, p: int, seed: int = 1):
    """Random prefix keys/values [B, n_kv, P, d] for every layer."""
    cfg = model.config
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    d = cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(1, n_kv, p, d, generator=g), torch.randn(1, n_kv, p, d, generator=g))
        for _ in range(cfg.num_hidden_layers)
    ]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", CAUSAL)
def test_extra_key_values_equal_a_prefix_cache(name, impl):
    """Static extra columns on every self-attention layer = the same keys/values given as
    ``past_key_values`` (positions shifted by P, mask extended), GQA included (tiny-llama)."""
    model = _model(name, impl)
    kw, keep = _inputs(model)
    b, t = kw["input_ids"].shape
    p = 3
    kv = _prefix_cache(model, b, p)
    cache = DynamicCache([(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
    full_mask = torch.cat([torch.ones(b, p, dtype=torch.long), kw["attention_mask"]], 1)
    # real tokens continue after the P prefix positions (left padding shifts them per row)
    pos = (kw["attention_mask"].cumsum(1) - 1).clamp_min(0) + p
    with torch.no_grad():
        ref = model(
            input_ids=kw["input_ids"],
            attention_mask=full_mask,
            past_key_values=cache,
            position_ids=pos,
        ).logits
    handles = [
        A.attach(model, A.StaticKeyValues(key=k, value=v), layers=[i])
        for i, (k, v) in enumerate(kv)
    ]
    with torch.no_grad():
        out = model(**kw, position_ids=pos).logits
    torch.testing.assert_close(out[keep], ref[keep], atol=2e-5, rtol=1e-4)
    # blocked columns equal removing them: keep only column 1 of the prefix
    for h in handles:
        h.remove()
    allowed = torch.zeros(1, t, p, dtype=torch.bool)
    allowed[..., 1] = True
    for i, (k, v) in enumerate(kv):
        A.attach(model, A.StaticKeyValues(key=k, value=v, allowed=allowed), layers=[i])
    with torch.no_grad():
        blocked = model(**kw, position_ids=pos).logits
    cache1 = DynamicCache(
        [(k[:, :, 1:2].expand(b, -1, -1, -1), v[:, :, 1:2].expand(b, -1, -1, -1)) for k, v in kv]
    )
    mask1 = torch.cat([torch.ones(b, 1, dtype=torch.long), kw["attention_mask"]], 1)
    for _, m in A.attention_sites(model):  # the reference runs without plug-ins
        for plugin in A.plugins_of(m):
            A.PluginHandle(plugin, [m]).remove()
    with torch.no_grad():
        ref1 = model(
            input_ids=kw["input_ids"],
            attention_mask=mask1,
            past_key_values=cache1,
            position_ids=pos,
        ).logits
    torch.testing.assert_close(blocked[keep], ref1[keep], atol=2e-5, rtol=1e-4)


def test_gradients_reach_extra_key_values_and_generate_runs():
    model = _model("tiny-llama", "sdpa")
    model.requires_grad_(False)
    kv = _prefix_cache(model, 1, 2)
    params = [(k.clone().requires_grad_(True), v.clone().requires_grad_(True)) for k, v in kv]
    for i, (k, v) in enumerate(params):
        A.attach(model, A.StaticKeyValues(key=k, value=v), layers=[i])
    ids = torch.randint(5, 200, (1, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(k.grad is not None and k.grad.abs().sum() > 0 for k, _ in params)
    assert all(v.grad is not None and v.grad.abs().sum() > 0 for _, v in params)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 10)


def test_attention_context_nests_and_plugins_read_it():
    seen = []

    class Reader(A.AttentionPlugin):
        def active(self, call):
            seen.append(dict(A.current_context().extra))
            return False

    model = _model("tiny-gpt2", "sdpa")
    A.attach(model, Reader(), layers=[0])
    ids = torch.randint(5, 200, (1, 4))
    with torch.no_grad(), A.attention_context(extra={"segment_ids": 1, "tag": "outer"}):
        model(ids)
        with A.attention_context(extra={"tag": "inner"}):
            model(ids)
    model(ids)
    assert seen == [{"segment_ids": 1, "tag": "outer"}, {"segment_ids": 1, "tag": "inner"}, {}]


def test_attention_context_refuses_an_unknown_name_in_one_line():
    with pytest.raises(GencraftError) as err, A.attention_context(segment_ids=1):
        pass
    assert str(err.value) == (
        "attention_context takes prefix, row_state, memory and extra, not ['segment_ids']; "
        "pass your own plug-in's values as extra={name: value}"
    )
    with A.attention_context(memory={1: 2}) as ctx:
        assert ctx.memory == {1: 2} and ctx.extra == {}


def test_site_selection_and_errors():
    model = _model("tiny-bart", "sdpa")
    sites = A.select_sites(model, kind="cross")
    assert [(s.stack, s.layer) for s, _ in sites] == [("decoder", 0), ("decoder", 1)]
    assert [s.layer for s, _ in A.select_sites(model, stack="encoder", layers=[-1])] == [1]
    assert len(A.select_sites(model, kind="any", layers=lambda i, n: i < n // 2)) == 3
    with pytest.raises(GencraftError, match="out of range"):
        A.select_sites(model, layers=[5])
    norm = A.Normalizer(fn=lambda s, a: torch.softmax(s, -1))
    A.attach(model, norm, layers=[0])
    with pytest.raises(GencraftError, match="already has a normaliser"):
        A.attach(model, A.Normalizer(fn=lambda s, a: s), layers=[0])
    with pytest.raises(GencraftError, match="Linear is not supported: no attention module"):
        A.attention_sites(torch.nn.Linear(2, 2))


def test_extra_columns_of_the_wrong_shape_are_named():
    model = _model("tiny-llama", "sdpa")
    A.attach(model, A.StaticKeyValues(key=torch.zeros(1, 2, 3, 5), value=torch.zeros(1, 2, 3, 5)))
    with pytest.raises(GencraftError, match=r"extra key columns .* must be \[B, n_kv, P, d\]"):
        model(torch.randint(5, 200, (1, 4)))


# ------------------------------------------------------------------ other architectures
def test_softcap_is_honoured_on_gencrafts_path():
    """Gemma-2 soft-caps its attention logits; gencraft's eager computation (here forced by a
    softmax normaliser) must give the model's own logits."""
    from gencraft.models.architectures import tiny_architecture

    model = tiny_architecture("gemma2", vocab_size=16, seed=0)
    model.config.attn_logit_softcapping = 0.5
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = 0.5
    ids = torch.tensor([[1, 5, 7, 9, 4, 6, 3]])
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(20.0)  # logits beyond the cap
        ref = model(ids).logits
        with A.attach(model, A.Normalizer(fn=lambda s, a: torch.softmax(s, -1))):
            got = model(ids).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "arch", ["llama", "gpt2", "gpt_neox", "phi3", "olmo2", "qwen3", "opt", "gemma2"]
)
def test_project_key_value_equals_the_modules_own_keys(arch):
    """At position 0 rotary embeddings are the identity: the keys/values a module computes
    from its (normed) input equal project_key_value of that input, for fused (Phi-3,
    GPT-NeoX), per-head-normed (Qwen3) and all-head-normed (OLMo-2) projections."""
    from gencraft.models.architectures import tiny_architecture

    model = tiny_architecture(arch, vocab_size=16, seed=0)
    projected, seen = projected_and_own_keys(model)
    torch.testing.assert_close(projected[0], seen["key"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(projected[1], seen["value"], atol=1e-5, rtol=1e-5)


def projected_and_own_keys(model) -> tuple[tuple[torch.Tensor, torch.Tensor], dict]:
    """Layer 1's ``project_key_value`` of its input at position 0, and the keys and values
    the module itself computed there (``seen["key"]``, ``seen["value"]``)."""
    _, module = A.select_sites(model, layers=[1])[0]
    seen = {}

    def grab(m, args, kw):
        seen.setdefault("x", kw.get("hidden_states", args[0] if args else None))

    module.register_forward_pre_hook(grab, with_kwargs=True)
    obs = A.AttentionPlugin()
    obs.observes = True
    obs.observe = lambda probs, call: seen.update(key=call.key, value=call.value)
    with torch.no_grad(), A.attach(model, obs, layers=[1]):
        model(torch.tensor([[5]]))
        return A.project_key_value(module, seen["x"]), seen


def test_a_plugin_whose_module_never_runs_through_the_dispatcher_raises():
    model = _model("tiny-llama", "sdpa")
    A.attach(model, A.Normalizer(fn=lambda s, a: torch.softmax(s, -1)), layers=[0])
    model.config._attn_implementation = "sdpa"  # the model now bypasses gencraft's function
    with pytest.raises(GencraftError, match="not supported: a forward ran without calling"):
        model(torch.tensor([[5, 6, 7]]))


def test_sites_are_the_innermost_attention_modules():
    """BERT's `attention` (a wrapper) holds `attention.self`: the site is the inner module,
    one per layer; GPT-NeoX's `attention` has no inner match and is the site."""
    from gencraft.models.architectures import tiny_architecture

    sites = A.attention_sites(tiny_architecture("bert2bert", vocab_size=16))
    selfs = [s for s, _ in sites if s.kind == "self"]
    assert [s.name.endswith("attention.self") for s in selfs] == [True] * 4
    assert [(s.stack, s.layer) for s in selfs] == [
        ("encoder", 0),
        ("encoder", 1),
        ("decoder", 0),
        ("decoder", 1),
    ]
    neox = A.attention_sites(tiny_architecture("gpt_neox", vocab_size=16))
    assert [s.name for s, _ in neox] == [
        "gpt_neox.layers.0.attention",
        "gpt_neox.layers.1.attention",
    ]
