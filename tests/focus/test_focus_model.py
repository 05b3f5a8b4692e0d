"""FocusForConditionalGeneration on every supported family: the hooked forward equals the base's
eager outputs plus f_t computed by hand, generate() equals a step-by-step loop over forward(),
focus decoding stays inside V_k ∪ F, save -> load gives identical outputs."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

from gencraft.errors import GencraftError
from gencraft.focus import FocusConfig, FocusForConditionalGeneration
from gencraft.models import load_model

ENC_DEC = ["tiny-bart", "tiny-t5", "tiny-bert2bert"]
CAUSAL = ["tiny-llama", "tiny-gpt2"]
ALL = ENC_DEC + CAUSAL


def _wrapped(name: str, seed: int = 0, **cfg):
    base, tok = load_model(name)
    torch.manual_seed(seed)
    model = FocusForConditionalGeneration(
        base, FocusConfig(**cfg), frequent_ids=torch.tensor([5, 6, 7])
    )
    with torch.no_grad():  # a head far from zero, so that f_t matters
        for p in model.head.parameters():
            p.normal_(0, 0.5)
    return model, tok


def _eager(name: str):
    ref, _ = load_model(name)
    ref.set_attn_implementation("eager")
    return ref


@pytest.mark.parametrize("name", ENC_DEC)
def test_seq2seq_forward_is_base_logits_plus_focus_bias(name):
    model, tok = _wrapped(name)
    enc = tok(["the cat sat on the mat", "a dog"], return_tensors="pt", padding=True)
    labels = tok(["cat mat", "dog barks"], return_tensors="pt", padding=True)["input_ids"]
    out = model(**enc, labels=labels, return_focus=True)
    ref = _eager(name)(**enc, labels=labels, output_attentions=True)
    head = model.head(
        ref.encoder_last_hidden_state,
        enc["attention_mask"],
        model.embedding_weight,
        ref.cross_attentions[-1],
    )
    torch.testing.assert_close(out.logits, ref.logits + head.focus_bias, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.focus_bias, head.focus_bias, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.topic_logits, head.topic_logits, atol=2e-5, rtol=1e-4)
    assert float(out.focus_bias.detach().abs().max()) > 1e-2
    lam = model.config.mle_weight
    torch.testing.assert_close(out.loss, lam * out.mle_loss + (1 - lam) * out.topic_loss)


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("source_attention", ["raw", "renormalized"])
def test_causal_forward_uses_self_attention_over_the_source_span(name, source_attention):
    model, tok = _wrapped(name, source_attention=source_attention)
    ids = tok(["summarize: the cat sat on the mat. summary: cat"], return_tensors="pt")
    n_src = len(tok("summarize: the cat sat on the mat. summary:")["input_ids"])
    t = ids["input_ids"].shape[1]
    source = torch.zeros(1, t, dtype=torch.bool)
    source[:, :n_src] = True
    out = model(**ids, source_mask=source, return_focus=True)
    ref = _eager(name)(**ids, output_attentions=True, output_hidden_states=True)
    a = ref.attentions[-1].mean(1)  # [1, T, T]
    if source_attention == "renormalized":
        a = a.masked_fill(~source[:, None], 0.0)
        a = a / a.sum(-1, keepdim=True)
    head = model.head(ref.hidden_states[-1], source, model.embedding_weight, a)
    torch.testing.assert_close(out.logits, ref.logits + head.focus_bias, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.topic_logits, head.topic_logits, atol=2e-5, rtol=1e-4)


def _loop_greedy(model, enc, steps: int) -> torch.Tensor:
    """Greedy decoding by full recomputation with forward(): no cache, no generate()."""
    if model.is_encoder_decoder:
        start = model.base.generation_config.decoder_start_token_id
        dec = torch.full((enc["input_ids"].shape[0], 1), start)
        for _ in range(steps):
            logits = model(**enc, decoder_input_ids=dec, use_cache=False).logits[:, -1]
            dec = torch.cat([dec, logits.argmax(-1, keepdim=True)], 1)
        return dec
    ids = enc["input_ids"]
    p = ids.shape[1]
    for _ in range(steps):
        src = torch.zeros_like(ids, dtype=torch.bool)
        src[:, :p] = True
        logits = model(ids, use_cache=False, source_mask=src).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


@pytest.mark.parametrize("name", ALL)
def test_generate_with_cache_equals_a_loop_over_forward(name):
    model, tok = _wrapped(name)
    enc = tok(["the cat sat on the mat"], return_tensors="pt")
    steps = 6
    gen = model.generate(
        **enc, max_new_tokens=steps, do_sample=False, num_beams=1, min_new_tokens=steps
    )
    ref = _loop_greedy(model, dict(enc), steps)
    assert torch.equal(gen, ref)


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-llama"])
def test_a_forward_on_one_batch_does_not_leak_into_generate_on_another(name):
    model, tok = _wrapped(name)
    big = tok(["the cat sat on the mat", "a dog", "x"], return_tensors="pt", padding=True)
    small = tok(["a dog ran"], return_tensors="pt")
    extra = {"decoder_input_ids": big["input_ids"][:, :2]} if model.is_encoder_decoder else {}
    model(**big, **extra)
    kw = dict(max_new_tokens=5, min_new_tokens=5, num_beams=2, do_sample=False)
    after = model.generate(**small, **kw)
    fresh, _ = _wrapped(name)
    assert torch.equal(after, fresh.generate(**small, **kw))


@pytest.mark.parametrize("name", ALL)
def test_focus_bias_changes_generation_and_can_be_switched_off(name):
    model, tok = _wrapped(name)
    enc = tok(["the cat sat on the mat", "a dog ran"], return_tensors="pt", padding=True)
    kw = dict(max_new_tokens=8, min_new_tokens=8, num_beams=3, do_sample=False)
    with_focus = model.generate(**enc, **kw)
    model.enabled = False
    without = model.generate(**enc, **kw)
    model.enabled = True
    plain = _eager(name).generate(**enc, **kw)
    assert torch.equal(without, plain)
    assert not torch.equal(with_focus, plain)


@pytest.mark.parametrize("name", ALL)
def test_focus_decoding_never_leaves_the_focus_vocabulary(name):
    model, tok = _wrapped(name)
    enc = tok(["the cat sat on the mat", "a dog"], return_tensors="pt", padding=True)
    special = model.special_ids()
    for seed in range(4):
        proc = model.focus_processor(
            15, mode="sample", generator=torch.Generator().manual_seed(seed)
        )
        torch.manual_seed(seed)
        kw = [
            dict(do_sample=True, top_k=640),
            dict(do_sample=True, top_p=0.95),
            dict(num_beams=3, do_sample=False),
            dict(num_beams=2, do_sample=True),
        ][seed]
        out = model.generate(**enc, max_new_tokens=10, logits_processor=[proc], **kw)
        new = out if model.is_encoder_decoder else out[:, enc["input_ids"].shape[1] :]
        assert len(proc.vocabularies) == 2
        for row, allowed in zip(new, proc.vocabularies, strict=True):
            assert {5, 6, 7} <= set(allowed.tolist())  # F is always in
            assert set(row.tolist()) <= set(allowed.tolist()) | special


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-llama"])
def test_focus_sampling_is_seeded_and_full_top_k_equals_plain(name):
    model, tok = _wrapped(name)
    enc = tok(["the cat sat on the mat"], return_tensors="pt")
    kw = dict(max_new_tokens=8, num_beams=3, do_sample=False)
    v = model.embedding_weight.shape[0]
    assert torch.equal(
        model.generate(**enc, **kw), model.generate(**enc, focus_k=v, focus_mode="top", **kw)
    )
    a = model.generate(**enc, focus_k=20, focus_seed=3, **kw)
    b = model.generate(**enc, focus_k=20, focus_seed=3, **kw)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", ALL)
def test_save_and_load_give_identical_outputs(name, tmp_path):
    model, tok = _wrapped(name, heads=0, frequent="ignore")
    enc = tok(["the cat sat on the mat", "a dog"], return_tensors="pt", padding=True)
    kw = dict(max_new_tokens=6, num_beams=2, do_sample=False)
    before = model.generate(**enc, **kw)
    logits = model(**enc, **({"decoder_input_ids": before} if model.is_encoder_decoder else {}))
    model.save_pretrained(tmp_path / "m")
    loaded = FocusForConditionalGeneration.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    assert torch.equal(loaded.frequent_ids, model.frequent_ids)
    assert torch.equal(loaded.generate(**enc, **kw), before)
    again = loaded(**enc, **({"decoder_input_ids": before} if model.is_encoder_decoder else {}))
    torch.testing.assert_close(again.logits, logits.logits)


def test_frozen_base_saves_only_the_head_and_reloads_by_name(tmp_path):
    base, tok = load_model("tiny-bart")
    model = FocusForConditionalGeneration(
        base, FocusConfig(freeze_base=True, base_name_or_path="tiny-bart")
    )
    assert not any(p.requires_grad for p in model.base.parameters())
    assert all(p.requires_grad for p in model.head.parameters())
    model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m" / "base").exists()
    loaded = FocusForConditionalGeneration.from_pretrained(tmp_path / "m")
    enc = tok(["a dog"], return_tensors="pt")
    torch.testing.assert_close(
        loaded(**enc, decoder_input_ids=enc["input_ids"]).logits,
        model(**enc, decoder_input_ids=enc["input_ids"]).logits,
    )


def test_gradients_reach_the_head_and_the_base():
    model, tok = _wrapped("tiny-bart")
    enc = tok(["the cat sat on the mat"], return_tensors="pt")
    labels = tok(["cat mat"], return_tensors="pt")["input_ids"]
    model(**enc, labels=labels).loss.backward()
    assert model.head.w1.weight.grad.abs().sum() > 0
    assert model.base.get_encoder().layers[0].fc1.weight.grad.abs().sum() > 0


def test_bad_input_gives_clear_errors():
    model, tok = _wrapped("tiny-bart")
    enc = tok(["the cat sat"], return_tensors="pt")
    with pytest.raises(GencraftError, match="focus_k must lie"):
        model.generate(**enc, focus_k=0)
    with pytest.raises(GencraftError, match="focus_k must lie"):
        model.generate(**enc, focus_k=model.embedding_weight.shape[0] + 1)
    with pytest.raises(GencraftError, match="no non-padding token"):
        model(
            enc["input_ids"], torch.zeros_like(enc["input_ids"]), decoder_input_ids=enc["input_ids"]
        )
    with pytest.raises(GencraftError, match="focus_k or focus_vocabularies"):
        model.generate(**enc, focus_k=3, focus_vocabularies=[torch.tensor([1])])
    with pytest.raises(GencraftError, match="frequent_ids must lie"):
        FocusForConditionalGeneration(model.base, frequent_ids=torch.tensor([10_000]))
    with pytest.raises(ValueError, match="mle_weight"):
        FocusConfig(mle_weight=1.5)
    with pytest.raises(GencraftError, match="unsupported architecture"):
        FocusForConditionalGeneration(
            BertModel(
                BertConfig(
                    vocab_size=50,
                    hidden_size=8,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=16,
                )
            )
        )
