"""PrefixModel against independent references: peft's prefix-tuning (logits and generate),
the base run with ``past_key_values=prefix_cache(B)``, the dispatcher's extra columns, a
hand-written 4-D block mask, the normalisers by hand, gradients only into the prefixes."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import PrefixTuningConfig, TaskType, get_peft_model

from gencraft.errors import ConfigError, GencraftError
from gencraft.models.attention import StaticKeyValues, attach
from gencraft.models.tiny import build_tiny_model
from gencraft.prefix import (
    PrefixConfig,
    PrefixModel,
    prefix_block_mask,
    soft_sparse_attention,
    sparse_attention,
)

P = 4
CAUSAL = ["tiny-llama", "tiny-gpt2"]
SEQ2SEQ = ["tiny-bart", "tiny-t5", "tiny-bert2bert"]


def _batch(seed: int = 0, b: int = 2, t: int = 7, pad_left: int = 2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 250, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    if pad_left:
        mask[1, :pad_left] = 0
        ids[1, :pad_left] = 0
    return ids, mask


def _peft(name: str, p: int = P, seed: int = 0, projection: bool = False):
    base = build_tiny_model(name)
    tt = TaskType.SEQ_2_SEQ_LM if base.config.is_encoder_decoder else TaskType.CAUSAL_LM
    cfg = PrefixTuningConfig(task_type=tt, num_virtual_tokens=p, prefix_projection=projection)
    torch.manual_seed(seed)
    pm = get_peft_model(copy.deepcopy(base), cfg)
    with torch.no_grad():
        for prm in pm.parameters():
            if prm.requires_grad:
                prm.normal_()
    return pm.eval()


def _model(name: str, seed: int = 0, **cfg) -> PrefixModel:
    cfg.setdefault("num_virtual_tokens", P)
    cfg.setdefault("init_seed", seed)
    return PrefixModel(build_tiny_model(name, seed=seed), PrefixConfig(**cfg)).eval()


# ---------------------------------------------------------------------------- peft and cache
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bart", "tiny-t5"])
@pytest.mark.parametrize("projection", [False, True])
def test_from_peft_equal_logits(name, projection):
    pm = _peft(name, projection=projection)
    model = PrefixModel.from_peft(pm)
    ids, mask = _batch(pad_left=0 if pm.config.is_encoder_decoder else 2)
    kw = {}
    if pm.config.is_encoder_decoder:
        kw["labels"] = torch.randint(5, 250, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, **kw).logits
        out = model(ids, mask, **kw).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert model.config.encoder_prefix is False  # peft's seq2seq prefix is decoder-only


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("settings", [{"num_beams": 1}, {"num_beams": 3}])
def test_generate_equals_peft(name, settings):
    pm = _peft(name)
    model = PrefixModel.from_peft(pm)
    ids, mask = _batch()
    ref = pm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **settings)
    greedy = pm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=1)
    if not _greedy_is_forward_argmax(pm, ids, mask, greedy):
        import peft
        import transformers

        pytest.skip(
            f"peft {peft.__version__}'s generate disagrees with its own forward under "
            f"transformers {transformers.__version__}: no reference"
        )
    out = model.generate(ids, mask, max_new_tokens=6, **settings)
    assert out.tolist() == ref.tolist()


def _greedy_is_forward_argmax(model, ids, mask, out) -> bool:
    n = out.shape[1] - ids.shape[1]
    full = torch.cat([mask, torch.ones(mask.shape[0], n, dtype=mask.dtype)], 1)
    with torch.no_grad():
        logits = model(input_ids=out[:, :-1], attention_mask=full[:, :-1]).logits
    return logits[:, -n:].argmax(-1).tolist() == out[:, -n:].tolist()


@pytest.mark.parametrize("name", CAUSAL)
def test_dense_equals_base_with_prefix_cache_and_extra_columns(name):
    model = _model(name)
    ids, mask = _batch(pad_left=0)
    b, t = ids.shape
    with torch.no_grad():
        out = model(ids, mask).logits
        full = torch.cat([torch.ones(b, P, dtype=torch.long), mask], 1)
        ref = model.base(input_ids=ids, attention_mask=full, past_key_values=model.prefix_cache(b))
        assert torch.equal(out, ref.logits)
        # an independent path: the same prefixes as extra columns of the dispatcher, positions
        # shifted by P by hand
        kv = model.prefix["decoder"].layer_kv()
        handles = [
            attach(model.base, StaticKeyValues(key=k, value=v), kind="self", layers=[i])
            for i, (k, v) in enumerate(kv)
        ]
        try:
            pos = torch.arange(P, P + t)[None].expand(b, -1)
            ext = model.base(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        finally:
            for h in handles:
                h.remove()
    torch.testing.assert_close(out, ext, rtol=1e-5, atol=1e-5)


def test_prefix_cache_shapes_and_projection():
    model = _model("tiny-llama", prefix_projection=True, encoder_hidden_size=16)
    cache = model.prefix_cache(3)
    assert cache.get_seq_length() == P
    assert tuple(cache.layers[0].keys.shape) == (3, 2, P, 8)  # GQA: 2 key/value heads of 8
    kv = model.prefix["decoder"]()
    torch.testing.assert_close(cache.layers[1].values[0], kv[3])


# ---------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("name", CAUSAL + SEQ2SEQ)
def test_gradients_only_into_prefixes(name):
    model = _model(name, cross_prefix=True, encoder_segments=2, blocked_layers="lower")
    model.train()
    ids, mask = _batch(pad_left=0)
    labels = ids.clone() if not model.is_encoder_decoder else ids[:, :5].clone()
    if not model.is_encoder_decoder:
        labels[:, :3] = -100
    out = model(ids, mask, labels=labels)
    out.loss.backward()
    assert all(p.grad is None for p in model.base.parameters())
    grads = {n: p.grad for n, p in model.prefix.named_parameters()}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())
    assert set(model.prefix) == ({"decoder"} if name in CAUSAL else {"decoder", "encoder", "cross"})


# ---------------------------------------------------------------------------- blocking
def _hand_block_mask(model, ids, mask, seg, output_mask, s_in, s_out):
    """A 4-D additive mask [B, 1, T, P + T] written out by hand: causal and padding on the
    real columns, prefix column j allowed iff j is in the query's segment group."""
    b, t = ids.shape
    neg = torch.finfo(torch.float32).min
    m = torch.full((b, 1, t, P + t), neg)
    for bi in range(b):
        for i in range(t):
            s = int(seg[bi, i])
            groups = torch.arange(P).tensor_split(s_out if output_mask[bi, i] else s_in)
            for j in groups[s].tolist():
                m[bi, 0, i, j] = 0.0
            for j in range(i + 1):
                if mask[bi, j]:
                    m[bi, 0, i, P + j] = 0.0
    return m


@pytest.mark.parametrize("name", CAUSAL)
def test_uniblock_equals_hand_written_mask(name):
    model = _model(name, encoder_segments=2, decoder_segments=2, blocked_layers="all")
    ids, mask = _batch(pad_left=0, t=8)
    labels = ids.clone()
    labels[:, :5] = -100  # 5 prompt tokens, 3 output tokens
    output_mask = labels != -100
    seg = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 1]] * 2)  # uniform: 5 -> 3 + 2, 3 -> 2 + 1
    with torch.no_grad():
        out = model(ids, mask, labels=labels).logits
        given = model(ids, mask, segment_ids=seg, labels=labels).logits
        hand = _hand_block_mask(model, ids, mask, seg, output_mask, 2, 2)
        pos = torch.arange(P, P + ids.shape[1])[None].expand(2, -1)
        model.base.config._attn_implementation = "eager"
        for m in model.base.modules():
            if hasattr(m, "_gencraft_original_attention"):
                m._gencraft_original_attention = "eager"
        ref = model.base(
            input_ids=ids,
            attention_mask=hand,
            position_ids=pos,
            past_key_values=model.prefix_cache(2),
        ).logits
    torch.testing.assert_close(out, given, rtol=0, atol=0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_blocked_group_equals_removing_the_other_prefixes():
    """Every token in segment 0 of 2: the same as a dense model holding only group 0."""
    model = _model("tiny-llama", encoder_segments=2, blocked_layers="all")
    ids, mask = _batch(pad_left=0)
    seg = torch.zeros_like(ids)
    small = _model("tiny-llama", num_virtual_tokens=P // 2, encoder_segments=1)
    with torch.no_grad():
        kv = model.prefix["decoder"]()
        small.prefix["decoder"].embedding.weight.copy_(
            kv[:, :, : P // 2].permute(2, 0, 1, 3).reshape(P // 2, -1)
        )
        pos = torch.arange(P, P + ids.shape[1])[None].expand(2, -1)
        out = model(ids, mask, segment_ids=seg, position_ids=pos).logits
        ref = small(ids, mask, position_ids=pos).logits
        dense = _model("tiny-llama")(ids, mask, position_ids=pos).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, dense, atol=1e-3)


def test_hierblock_blocks_lower_layers_only():
    model = _model("tiny-llama", encoder_segments=2, blocked_layers="lower")
    ids, mask = _batch(pad_left=0)
    with model.recording() as rec, torch.no_grad():
        model(ids, mask)
    seg = torch.tensor([[0] * 4 + [1] * 3] * 2)
    allowed = prefix_block_mask(seg, P, 2)  # [B, T, P]
    low, top = rec[("decoder", "self", 0)], rec[("decoder", "self", 1)]
    assert (low[..., :P][~allowed[:, None].expand_as(low[..., :P])] == 0).all()
    assert (top[..., :P] > 0).all()  # dense on top
    torch.testing.assert_close(low.sum(-1), torch.ones_like(low.sum(-1)))


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_encoder_decoder_blocking_and_generate(name):
    model = _model(name, encoder_segments=2, decoder_segments=2, cross_prefix=True)
    ids, mask = _batch(pad_left=0)
    with model.recording() as rec, torch.no_grad():
        model(ids, mask, labels=ids[:, :4].contiguous())
    enc = rec[("encoder", "self", 0)]
    seg = torch.tensor([[0] * 4 + [1] * 3] * 2)
    blocked = ~prefix_block_mask(seg, P, 2)[:, None].expand_as(enc[..., :P])
    assert (enc[..., :P][blocked] == 0).all() and (enc[..., :P][~blocked] > 0).all()
    assert ("decoder", "cross", 0) in rec and rec[("decoder", "cross", 0)].shape[-1] == P + 7
    # greedy generate == greedy by teacher-forced forward calls (the output segment rule)
    out = model.generate(ids, mask, max_new_tokens=4, min_new_tokens=4)
    dec = out[:, :1]
    with torch.no_grad():
        for _ in range(4):
            pos = torch.arange(dec.shape[1])
            idx = (pos - 1).clamp(min=0) * 2 // 4
            dseg = torch.where(pos == 0, 0, idx.clamp(max=1))[None].expand(2, -1)
            logits = model(ids, mask, decoder_input_ids=dec, decoder_segment_ids=dseg).logits
            logits[:, -1, model.base.generation_config.eos_token_id] = -float("inf")
            dec = torch.cat([dec, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert out.tolist() == dec.tolist()
    beams = model.generate(ids, mask, max_new_tokens=4, num_beams=3)
    assert beams.shape[0] == 2


def test_decoder_only_generate_follows_output_segments():
    """generate's logits at every step == one teacher-forced forward whose output tokens
    carry the segments of the rule min(S-1, i*S // L) (here L = 4, S = 2: 0, 0, 1)."""
    model = _model("tiny-llama", encoder_segments=2, decoder_segments=2, output_length=4)
    ids, mask = _batch(pad_left=2)
    gen = model.generate(
        ids,
        mask,
        max_new_tokens=4,
        min_new_tokens=4,
        return_dict_in_generate=True,
        output_logits=True,
    )
    out, steps = gen.sequences, torch.stack(gen.logits, dim=1)  # [B, 4, V]
    seq = out[:, :-1]
    t = ids.shape[1]
    full_mask = torch.cat([mask, torch.ones(2, 3, dtype=torch.long)], 1)
    out_mask = torch.zeros_like(seq, dtype=torch.bool)
    out_mask[:, t:] = True
    seg = torch.zeros_like(seq)
    seg[0, :t] = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    seg[1, 2:t] = torch.tensor([0, 0, 0, 1, 1])
    pos = (full_mask.cumsum(-1) - 1).clamp(min=0) + P
    for tail, same in (([0, 0, 1], True), ([0, 1, 1], False)):
        seg[:, t:] = torch.tensor(tail)
        with torch.no_grad():
            logits = model(
                seq, full_mask, segment_ids=seg, output_mask=out_mask, position_ids=pos
            ).logits
        assert torch.allclose(logits[:, t - 1 :], steps, atol=1e-5) == same


# ---------------------------------------------------------------------------- normalisers
def test_softsa_without_noise_at_tau_one_is_dense():
    dense = _model("tiny-llama")
    soft = _model("tiny-llama", normalizer="softsa", tau=1.0)
    ids, mask = _batch()
    with torch.no_grad():
        torch.testing.assert_close(soft(ids, mask).logits, dense(ids, mask).logits)
    soft.train()
    torch.manual_seed(0)
    with torch.no_grad():
        noisy = soft(ids, mask).logits
    assert not torch.allclose(noisy, dense(ids, mask).logits, atol=1e-3)


def test_softsa_layer_equals_eq_3_by_hand():
    model = _model("tiny-llama", normalizer="softsa", tau=0.5, sparse_layers=[0])
    model.train()
    ids, mask = _batch(pad_left=0)
    with model.recording() as dense_rec, torch.no_grad():
        model.config.normalizer = "softmax"
        model(ids, mask)
    model.config.normalizer = "softsa"
    torch.manual_seed(3)
    with model.recording() as rec, torch.no_grad():
        model(ids, mask)
    a = dense_rec[("decoder", "self", 0)]  # the layer's softmax attention, same inputs
    torch.manual_seed(3)
    hand = soft_sparse_attention(torch.log(a), 0.5)  # eq. 3 with π = a
    allowed = a > 0
    hand = hand * allowed
    torch.testing.assert_close(rec[("decoder", "self", 0)], hand, rtol=1e-4, atol=1e-6)


def test_truncsa_layers_zero_whole_key_columns():
    model = _model("tiny-llama", normalizer="truncsa", top_p=0.5, sparse_layers="lower")
    ids, mask = _batch(pad_left=0)
    with model.recording() as rec, torch.no_grad():
        model(ids, mask)
    low, top = rec[("decoder", "self", 0)], rec[("decoder", "self", 1)]
    dead = (low == 0).all(dim=-2)  # [B, n, K]: a column zero for every query
    assert dead.any() and (top[..., :P] > 0).all()
    rows = low.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
def test_entmax_extensions_sum_to_one_and_are_sparse(normalizer):
    model = _model("tiny-llama", normalizer=normalizer)
    ids, mask = _batch()
    with model.recording() as rec, torch.no_grad():
        model(ids, mask)
    probs = rec[("decoder", "self", 0)]
    real = probs[0]  # the unpadded row
    torch.testing.assert_close(real.sum(-1), torch.ones_like(real.sum(-1)))
    assert not torch.isnan(probs).any()


def test_sparse_attention_for_full_finetuning():
    base = build_tiny_model("tiny-llama")
    ids, mask = _batch()
    with torch.no_grad():
        before = base(input_ids=ids, attention_mask=mask).logits
    handle = sparse_attention(base, PrefixConfig(num_virtual_tokens=1, normalizer="truncsa"))
    with torch.no_grad():
        sparse = base(input_ids=ids, attention_mask=mask).logits
    handle.remove()
    with torch.no_grad():
        after = base(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(sparse[0], before[0], atol=1e-4)
    assert torch.equal(before, after)
    assert not torch.isnan(sparse).any()


# ---------------------------------------------------------------------------- persistence
def test_save_and_load_round_trip(tmp_path):
    model = _model("tiny-llama", encoder_segments=2, blocked_layers="lower", seed=1)
    model.save_pretrained(tmp_path / "p")
    files = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert files == ["method_config.json", "method_model.safetensors"]  # only the prefixes
    loaded = PrefixModel.from_pretrained(tmp_path / "p", build_tiny_model("tiny-llama", seed=1))
    ids, mask = _batch()
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids, mask).logits, model(ids, mask).logits)
    assert loaded.config.blocked_layers == "lower"
    with pytest.raises(GencraftError, match="trained on"):
        PrefixModel.from_pretrained(tmp_path / "p", build_tiny_model("tiny-gpt2"))


# ---------------------------------------------------------------------------- bad input
def test_bad_input_errors():
    with pytest.raises(ConfigError, match="cannot be split"):
        PrefixConfig(num_virtual_tokens=2, encoder_segments=3)
    with pytest.raises(ConfigError, match="top_p"):
        PrefixConfig(top_p=0.0)
    with pytest.raises(ConfigError, match="tau"):
        PrefixConfig(tau=0)
    with pytest.raises(ConfigError, match="normalizer"):
        PrefixConfig(normalizer="gumbel")
    model = _model("tiny-llama", encoder_segments=2)
    ids, mask = _batch()
    with pytest.raises(ConfigError, match=r"\[0, 2\)"):
        model(ids, mask, segment_ids=torch.full_like(ids, 2))
    with pytest.raises(ConfigError, match="shape"):
        model(ids, mask, segment_ids=torch.zeros(2, 3, dtype=torch.long))
    from transformers import BertConfig, BertModel

    with pytest.raises(GencraftError, match="BertModel"):
        PrefixModel(
            BertModel(
                BertConfig(
                    hidden_size=8, num_attention_heads=2, num_hidden_layers=1, intermediate_size=8
                )
            ),
            PrefixConfig(num_virtual_tokens=2),
        )


def test_entmax_missing_names_the_pip_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "entmax", None)
    from gencraft.extras import MissingExtraError

    with pytest.raises(MissingExtraError, match=r"pip install 'gencraft\[sparse\]'"):
        PrefixConfig(normalizer="sparsemax")


def test_fully_masked_rows_give_no_nan():
    model = _model("tiny-llama", encoder_segments=2, normalizer="truncsa")
    ids, mask = _batch(pad_left=3)
    with torch.no_grad():
        out = model(ids, mask).logits
    assert not torch.isnan(out).any()


# ----------------------------------------------------------------------------
def _sharpen(model: PrefixModel) -> PrefixModel:
    """Peaked attention (query weights x 8), so that TruncSA's nucleus drops columns."""
    with torch.no_grad():
        for n, w in model.base.named_parameters():
            if n.endswith("q_proj.weight"):
                w.mul_(8.0)
    return model


def test_encoder_decoder_segments_from_labels_are_shifted_right():
    """Decoder input j holds label j - 1: the segments the segmenter gives the labels reach
    the decoder shifted right, exactly as explicit shifted ``decoder_segment_ids`` do."""
    model = _model("tiny-bart", decoder_segments=2, blocked_layers="all")
    src, _ = _batch(pad_left=0)
    labels = torch.randint(5, 250, (2, 8), generator=torch.Generator().manual_seed(1))
    seg = torch.tensor([[0] * 4 + [1] * 4] * 2)  # the uniform segmenter on 8 labels
    shifted = torch.cat([seg[:, :1] * 0, seg[:, :-1]], dim=1)
    with torch.no_grad():
        auto = model(src, labels=labels).logits
        given = model(src, labels=labels, decoder_segment_ids=shifted).logits
        unshifted = model(src, labels=labels, decoder_segment_ids=seg).logits
    torch.testing.assert_close(auto, given)
    assert (auto - unshifted).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-llama"])
def test_truncsa_ignores_padding_queries(name):
    """Padding added to an input (right of a BART source, left of a Llama prompt) changes no
    real position's output: padded queries do not count in TruncSA's column sums."""
    model = _sharpen(_model(name, normalizer="truncsa", top_p=0.5, sparse_stack="both"))
    ids = torch.randint(5, 250, (1, 7), generator=torch.Generator().manual_seed(2))
    pad = torch.zeros(1, 4, dtype=torch.long)
    ones, zeros = torch.ones_like(ids), torch.zeros_like(pad)
    with torch.no_grad():
        if name == "tiny-bart":
            dec = torch.tensor([[2, 9, 11, 13]])
            alone = model(ids, ones, decoder_input_ids=dec).logits
            padded = model(
                torch.cat([ids, pad], 1), torch.cat([ones, zeros], 1), decoder_input_ids=dec
            ).logits
        else:
            alone = model(ids, ones).logits
            # the real tokens keep their positions (after the P prefix positions)
            pos = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.arange(7)[None]], 1) + P
            padded = model(
                torch.cat([pad, ids], 1), torch.cat([zeros, ones], 1), position_ids=pos
            ).logits[:, 4:]
    torch.testing.assert_close(alone, padded, rtol=1e-4, atol=1e-4)


def test_auto_sparse_stack_is_the_encoder_of_an_encoder_decoder():
    """sparse_stack="auto" (the paper): TruncSA in BART's encoder, softmax in its decoder."""
    model = _model("tiny-bart", normalizer="truncsa", top_p=0.5)
    src, _ = _batch(pad_left=0)
    dec = torch.tensor([[2, 9, 11, 13, 15]] * 2)
    with model.recording() as rec, torch.no_grad():
        model(src, decoder_input_ids=dec)
    enc, dec_probs = rec[("encoder", "self", 0)], rec[("decoder", "self", 0)]
    assert (enc == 0).any()  # whole key columns cut in the (unmasked) encoder
    causal = torch.ones(5, P + 5, dtype=torch.bool).tril(diagonal=P)
    assert (dec_probs[..., causal] > 0).all()  # a softmax: every allowed entry positive


def test_encoder_decoder_takes_non_contiguous_labels():
    model = _model("tiny-bart").eval()
    ids = torch.randint(5, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = ids[:, :8]
    assert not labels.is_contiguous()
    loss = model(ids, labels=labels).loss
    assert torch.isfinite(loss)
    assert loss == model(ids, labels=labels.contiguous()).loss


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5"])
def test_uniblock_beams_keep_their_own_examples_segment_table(name):
    """Batch 2 x 3 beams: each beam reads its own example's segment table (the tables are
    repeated per example, as generate repeats the inputs), so the batch gives what each
    example gives alone."""
    model = _model(name, num_virtual_tokens=6, encoder_segments=3)
    with torch.no_grad():
        for prm in model.parameters():
            if prm.requires_grad:
                prm.mul_(4.0)  # prefixes that dominate the attention: their blocks matter
    ids = torch.randint(5, 200, (2, 6), generator=torch.Generator().manual_seed(0))
    seg = torch.tensor([[0, 0, 0, 0, 1, 2], [0, 1, 1, 2, 2, 2]])
    kw = dict(num_beams=3, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    both = model.generate(ids, torch.ones_like(ids), segment_ids=seg, **kw)
    for i in range(2):
        alone = model.generate(
            ids[i : i + 1], torch.ones_like(ids[i : i + 1]), segment_ids=seg[i : i + 1], **kw
        )
        assert both[i, : alone.shape[1]].tolist() == alone[0].tolist()
    swapped = model.generate(ids, torch.ones_like(ids), segment_ids=seg.flip(0), **kw)
    assert not torch.equal(swapped, both)  # the tables matter to the output


def test_segment_tables_follow_generates_row_order():
    """generate lays out B examples x k beams (or samples) with each example's k copies
    contiguous (repeat_interleave): row i reads example i // k's table. Beam search alone
    cannot show a tiled table (every beam descends from beam 0 after the first step), but
    k sampled sequences per example would each read the wrong example's segments."""
    from gencraft.prefix.attention import _rows

    table = torch.arange(2)[:, None, None].expand(2, 4, 3)  # example e's table is all e
    assert _rows(table, 6)[:, 0, 0].tolist() == [0, 0, 0, 1, 1, 1]
    assert _rows(table, 2) is table
    with pytest.raises(RuntimeError, match="cannot come from 2 examples"):
        _rows(table, 5)
