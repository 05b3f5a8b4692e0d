"""The recurrent model (thesis ch. 2) against references: window 1 is the unmodified model; a
hand-written loop whose insert layer computes attention over [h_prev; the window] by hand;
bottleneck checkpointing equal to none, with memory that grows by O(H) per window; BPTT;
eq. 2.1 by hand; save/load; bad input."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from gencraft.errors import ConfigError, GencraftError
from gencraft.metrics import window_schedule, windowed_nll
from gencraft.models import load_model
from gencraft.recurrence import RecurrenceConfig, RecurrentLM

CFG = dict(window=8, overlap=2, insert_layer=1, ffn_hidden=(16, 16))


def _model(seed: int = 0, **over) -> RecurrentLM:
    base, _ = load_model("tiny-llama", seed=seed)
    torch.manual_seed(seed)
    return RecurrentLM(base, RecurrenceConfig(**{**CFG, **over}))


def _ids(b: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 200, (b, n), generator=torch.Generator().manual_seed(seed))


def test_window_one_is_the_unmodified_model():
    m = _model().eval()
    ids = _ids(2, 30)
    with torch.no_grad():
        plain = m.base(ids).logits
        out = m(ids).logits
        short = m(ids[:, :8]).logits  # one window: the base model exactly
    torch.testing.assert_close(out[:, :8], plain[:, :8], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(short, plain[:, :8], atol=1e-6, rtol=1e-6)
    assert (out[:, 8:] - plain[:, 8:]).abs().max() > 1e-3  # h_prev changes later windows
    # the baseline runs the same windows with no state: the plain overlap evaluation
    base = _model(recurrent=False).eval()
    torch.testing.assert_close(
        windowed_nll(base, ids[:1], window=8, overlap=2),
        windowed_nll(base.base, ids[:1], window=8, overlap=2),
        atol=1e-5,
        rtol=1e-5,
    )


def _reference_token_nll(m: RecurrentLM, ids: torch.Tensor) -> torch.Tensor:
    """The recurrence written out: each window runs the base with a hook that replaces the
    insert layer's attention by q·[k_h; k] softmax over [h_prev; causal] · [v_h; v]."""
    base, cfg = m.base, m.config
    attn = base.model.layers[cfg.insert_layer].self_attn
    norm = base.model.layers[cfg.insert_layer].input_layernorm
    state = {"h": None}

    def hook(module, args, kwargs, output):
        h = state["h"]
        if h is None:
            return output
        x = kwargs["hidden_states"]
        b, t, _ = x.shape
        d = module.head_dim
        q = module.q_proj(x).view(b, t, -1, d).transpose(1, 2)
        k = module.k_proj(x).view(b, t, -1, d).transpose(1, 2)
        v = module.v_proj(x).view(b, t, -1, d).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        hn = norm(h[:, None, :])
        kh = module.k_proj(hn).view(b, 1, -1, d).transpose(1, 2)  # no rotation
        vh = module.v_proj(hn).view(b, 1, -1, d).transpose(1, 2)
        k = repeat_kv(torch.cat([kh, k], 2), module.num_key_value_groups)
        v = repeat_kv(torch.cat([vh, v], 2), module.num_key_value_groups)
        scores = q @ k.transpose(2, 3) * module.scaling
        allowed = torch.ones(t, t + 1, dtype=torch.bool).tril(1)  # column 0: h_prev
        p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        out = (p @ v).transpose(1, 2).reshape(b, t, -1)
        return module.o_proj(out), p

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    nll = []
    try:
        for w in window_schedule(ids.shape[1], cfg.window, cfg.overlap):
            out = base(ids[:, w.start : w.end], output_hidden_states=True)
            rows = out.logits[0, w.first - 1 - w.start :]
            nll.append(
                nn.functional.cross_entropy(rows, ids[0, w.first : w.end + 1], reduction="none")
            )
            layers = torch.stack(out.hidden_states[1:])  # [L, 1, t, H]
            n = min(cfg.window - cfg.overlap, layers.shape[2])
            weights = torch.softmax(m.layer_logits, 0)
            z = sum(weights[i] * layers[i, :, :n].mean(1) for i in range(len(weights)))
            state["h"] = m.ffn(z)
    finally:
        handle.remove()
    return torch.cat(nll)


def test_equals_a_hand_written_loop():
    m = _model().eval()
    ids = _ids(1, 29, 1)
    with torch.no_grad():
        want = _reference_token_nll(m, ids)
        got = m.token_nll(ids)
        via_eval = windowed_nll(m, ids, window=8, overlap=2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(via_eval, want, atol=1e-5, rtol=1e-5)
    out = m(ids)  # the loss is the mean of the same per-target NLL
    torch.testing.assert_close(out.loss, want.mean(), atol=1e-5, rtol=1e-5)


def test_pooling_is_eq_2_1():
    m = _model(pooling="sum", pool_positions="all")
    with torch.no_grad():
        m.layer_logits.copy_(torch.tensor([0.3, -1.0]))
    hs = tuple(torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))
    w = torch.softmax(torch.tensor([0.3, -1.0]), 0)
    want = sum(w[j] * hs[j + 1][:, i] for i in range(5) for j in range(2))  # no embeddings
    torch.testing.assert_close(m.pool(hs, 5), want)
    # mean pooling over the first 3 positions, α = 0 at the start: equal layer weights
    want = 0.5 * (hs[1][:, :3].mean(1) + hs[2][:, :3].mean(1))
    torch.testing.assert_close(_model().pool(hs, 3), want)


def _grads(m: RecurrentLM, ids: torch.Tensor, labels=None) -> tuple[float, dict[str, torch.Tensor]]:
    m.zero_grad()
    loss = m(ids, labels, return_logits=False).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_checkpointing_gives_the_same_loss_and_gradients():
    ids = _ids(2, 40, 2)
    m = _model().train()
    loss_c, g_c = _grads(m, ids)
    m.config.checkpoint = False
    loss_n, g_n = _grads(m, ids)
    assert loss_c == pytest.approx(loss_n, abs=1e-6)
    assert g_c.keys() == g_n.keys() and "ffn.0.weight" in g_c and "layer_logits" in g_c
    for k in g_c:
        torch.testing.assert_close(g_c[k], g_n[k], atol=1e-6, rtol=1e-5)


def _saved_bytes(m: RecurrentLM, ids: torch.Tensor) -> int:
    from gencraft.studies.timing import saved_tensor_bytes

    return saved_tensor_bytes(lambda: m(ids, return_logits=False).loss)


def test_checkpointed_memory_grows_by_the_bottleneck_only():
    m = _model(overlap=0, ffn_hidden=(16,)).train()
    short, long = _ids(1, 33, 3), _ids(1, 65, 3)  # 4 and 8 windows of 8
    per_window_ckpt = (_saved_bytes(m, long) - _saved_bytes(m, short)) / 4
    m.config.checkpoint = False
    per_window_full = (_saved_bytes(m, long) - _saved_bytes(m, short)) / 4
    # kept per window with checkpointing: ids, h_prev and the FFN's activations (O(H + widths))
    assert per_window_ckpt <= 4 * (32 + 16 + 32) * 4 + 8 * 8
    assert per_window_full > 20 * per_window_ckpt


def test_bptt_reaches_earlier_windows():
    # the loss is on window 3's targets only: it reaches window 1's inputs through h_prev
    ids = _ids(1, 25, 5)
    labels = ids.clone()
    labels[:, :17] = -100
    for recurrent in (True, False):
        m = _model(overlap=0, recurrent=recurrent, checkpoint=False).train()
        seen: list[torch.Tensor] = []

        def keep(module, args, out, seen=seen):
            out.retain_grad()
            seen.append(out)

        handle = m.base.model.embed_tokens.register_forward_hook(keep)
        m(ids, labels, return_logits=False).loss.backward()
        handle.remove()
        first = seen[0].grad  # window 1's input embeddings [1, 8, H]
        assert (first is not None and first.abs().sum() > 0) == recurrent


def test_save_and_load(tmp_path):
    m = _model().eval()
    ids = _ids(1, 30, 4)
    m.save_pretrained(tmp_path / "r", base_name_or_path="tiny-llama")
    assert (tmp_path / "r" / "base").is_dir()  # the base trains: saved with it
    again = RecurrentLM.from_pretrained(tmp_path / "r").eval()
    torch.testing.assert_close(again.token_nll(ids), m.token_nll(ids))
    with pytest.raises(GencraftError, match="is not a saved RecurrentLM"):
        RecurrentLM.from_pretrained(tmp_path)


def test_bad_input():
    base, _ = load_model("tiny-llama")
    for kw, msg in [
        (dict(window=0), "window must be >= 1"),
        (dict(window=8, overlap=8), r"overlap must be in \[0, window=8\)"),
        (dict(pooling="max"), "pooling"),
        (dict(ffn_hidden=(0,)), "ffn_hidden"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            RecurrenceConfig(**kw)
    with pytest.raises(ConfigError, match=r"insert_layer must be in \[0, 2\)"):
        RecurrentLM(base, RecurrenceConfig(insert_layer=2))
    bart, _ = load_model("tiny-bart")
    with pytest.raises(GencraftError, match="BartForConditionalGeneration is not one"):
        RecurrentLM(bart, RecurrenceConfig(insert_layer=0))
    bert, _ = load_model("tiny-bert")  # a masked LM would be trained as if it were causal
    with pytest.raises(GencraftError, match="RecurrentLM needs a causal LM; BertForMaskedLM"):
        RecurrentLM(bert, RecurrenceConfig(insert_layer=0))
    m = _model()
    with pytest.raises(GencraftError, match="at least 2 tokens"):
        m(torch.tensor([[5]]))
    with pytest.raises(GencraftError, match="windows of 8 tokens, not 10"):
        windowed_nll(m, _ids(1, 20), window=10)


def test_flops_per_token_is_table_2_1():
    """GPT-2 small (``GPT2Config()``) at T = 300: the thesis's FLOPs/token column, which needs
    the attention products (2 T^2 H per layer) besides two FLOPs per weight."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gencraft.recurrence.evaluate import flops_per_token

    model = GPT2LMHeadModel(GPT2Config())
    got = [round(flops_per_token(model, 300, o) / 1e8, 3) for o in (0, 5, 10, 30, 50)]
    assert got == [1.754, 1.784, 1.814, 1.949, 2.105]


def test_a_frozen_unnamed_base_is_saved_beside_the_method(tmp_path):
    """A frozen base saved without its name goes under base/, so the directory reloads on its
    own; with its name it is left out (rebuilt from the name)."""
    base, _ = load_model("tiny-llama", seed=3)
    m = RecurrentLM(base, RecurrenceConfig(window=8, train_base=False)).eval()
    ids = _ids(1, 30, 5)
    m.save_pretrained(tmp_path / "unnamed")
    assert (tmp_path / "unnamed" / "base").is_dir()
    again = RecurrentLM.from_pretrained(tmp_path / "unnamed").eval()
    torch.testing.assert_close(again.token_nll(ids), m.token_nll(ids))
    m.save_pretrained(tmp_path / "named", base_name_or_path="tiny-llama")
    assert not (tmp_path / "named" / "base").exists()


def test_the_ffn_ends_on_a_linear_layer():
    """Eq. 2.2's FFN: activations between its layers, none after the last (h_prev may be
    negative, as the hidden states it joins are)."""
    for act in ("gelu", "relu", "tanh"):
        m = _model(activation=act, ffn_hidden=(16, 16))
        kinds = [type(layer) for layer in m.ffn]
        assert kinds[-1] is nn.Linear and kinds[0] is nn.Linear
        assert len(kinds) == 5 and kinds[1] is kinds[3] is not nn.Linear


def test_token_nll_takes_one_text_keeps_no_graph_and_reads_its_overlap():
    """[N] and [1, N] alike, scored without a graph even where gradients are on; ``overlap``
    replaces the configured one for that call only (the reference of a model built with it);
    any other shape refused word for word."""
    m = _model().eval()
    ids = _ids(1, 29, 3)
    got = m.token_nll(ids)
    assert got.shape == (28,) and not got.requires_grad and got.device.type == "cpu"
    torch.testing.assert_close(m.token_nll(ids[0]), got)
    other = _model(overlap=0).eval()  # the same weights, another overlap
    with torch.no_grad():
        want = _reference_token_nll(other, ids)
    torch.testing.assert_close(m.token_nll(ids, overlap=0), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m.token_nll(ids), got)  # the configured overlap again
    for bad in (_ids(2, 29), ids[None]):
        msg = f"ids must be [1, N] or [N], got shape {tuple(bad.shape)}"
        with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
            m.token_nll(bad)
