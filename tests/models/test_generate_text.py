"""``generate_text`` and MBR's candidates against ``generate`` and the batched
sampler themselves: the new tokens only, decoded without special tokens; a seed is
``generate``'s own draw; beam candidates are ``generate``'s N best under every ``num_beams``;
sampled candidates are the sampler's under ``generate``'s warpers; every refusal word for
word."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import (
    EpsilonLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.models.generate import build_inputs, generate_text, prepared_inputs
from gencraft.models.introspect import eos_ids, pad_id
from gencraft.models.prompts import encode_user_turn, left_padded_batches, pad_batch
from gencraft.models.sampling import sample_batch
from gencraft.search.mbr import mbr_batch_text, mbr_candidates, mbr_generate_text
from tests.models.test_mbr_generate import _brute_force

PROMPTS = ["hi", "the cat sat on", "a much longer prompt than the others"]
_LOADED: dict = {}


def _load(name: str):
    if name not in _LOADED:
        _LOADED[name] = load_model(name, seed=3)
    return _LOADED[name]


def _enc(model, tok) -> dict:
    return prepared_inputs(model, tok, PROMPTS, None, None, {})


def _new(model, enc, out: torch.Tensor) -> list[list[int]]:
    """``generate``'s output without the prompt (a causal LM) or the decoder start."""
    start = 1 if model.config.is_encoder_decoder else enc["input_ids"].shape[1]
    return out[:, start:].tolist()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart", "tiny-t5"])
def test_generate_text_is_generates_new_tokens_without_special_tokens(name):
    model, tok = _load(name)
    kw = dict(max_new_tokens=6, do_sample=False)
    got = generate_text(model, tok, PROMPTS, **kw)
    enc = _enc(model, tok)
    out = model.generate(**enc, **kw, pad_token_id=pad_id(model, tok))
    rows = out.tolist() if model.config.is_encoder_decoder else _new(model, enc, out)
    assert got == [tok.decode(r, skip_special_tokens=True).strip() for r in rows]
    if model.config.is_encoder_decoder:  # each output opens with a special token, left out
        assert all(r[0] in tok.all_special_ids for r in rows)


def test_a_seed_is_generates_own_draw_after_seeding():
    model, tok = _load("tiny-llama")
    kw = dict(max_new_tokens=6, do_sample=True, top_k=0)
    got = generate_text(model, tok, PROMPTS, seed=11, **kw)
    torch.manual_seed(11)
    enc = _enc(model, tok)
    out = model.generate(**enc, **kw, pad_token_id=pad_id(model, tok))
    assert got == [tok.decode(r, skip_special_tokens=True).strip() for r in _new(model, enc, out)]
    assert got == generate_text(model, tok, PROMPTS, seed=11, **kw)
    assert got != generate_text(model, tok, PROMPTS, seed=12, **kw)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
@pytest.mark.parametrize(("n", "beams"), [(1, "absent"), (1, None), (1, 0), (2, 5), (3, 1)])
def test_beam_candidates_are_generates_n_best(name, n, beams):
    """``num_beams`` absent, None or 0 is one beam; fewer beams than N are raised to N."""
    model, tok = _load(name)
    enc = _enc(model, tok)
    kw = {} if beams == "absent" else {"num_beams": beams}
    got = mbr_candidates(model, enc, n=n, max_new_tokens=6, pad_token_id=0, **kw)
    want = model.generate(
        **enc,
        max_new_tokens=6,
        pad_token_id=0,
        num_beams=max(beams or 1, n) if beams != "absent" else n,
        num_return_sequences=n,
    )
    assert got == _new(model, enc, want) and len(got) == n * len(PROMPTS)


WARPED = [
    ({}, [TemperatureLogitsWarper(1.0)]),
    ({"temperature": 0.6, "top_p": 0.8}, [TemperatureLogitsWarper(0.6), TopPLogitsWarper(0.8)]),
    (
        {"top_k": 4, "epsilon": 0.05},
        [TemperatureLogitsWarper(1.0), TopKLogitsWarper(4), EpsilonLogitsWarper(0.05)],
    ),
]


@pytest.mark.parametrize(("kw", "warpers"), WARPED)
def test_sampled_candidates_are_the_samplers_under_generates_warpers(kw, warpers):
    """Input b seeded 0 + b by default, 20 new tokens by default, as ``generate``."""
    model, tok = _load("tiny-llama")
    enc = _enc(model, tok)
    kw = dict(kw)
    got = mbr_candidates(model, enc, n=3, do_sample=True, epsilon=kw.pop("epsilon", None), **kw)
    want = sample_batch(
        model,
        enc["input_ids"],
        enc["attention_mask"],
        n=3,
        max_new_tokens=20,
        seeds=[0, 1, 2],
        eos_token_id=eos_ids(model),
        processors=warpers,
    )
    assert got == want
    if len(warpers) > 1:  # the warpers change what is drawn
        plain = sample_batch(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            n=3,
            max_new_tokens=20,
            seeds=[0, 1, 2],
            eos_token_id=eos_ids(model),
        )
        assert got != plain


@pytest.mark.parametrize("epsilon", [None, 0.05])
def test_mbr_defaults_to_chrf_and_seed_0_and_passes_epsilon_on(epsilon):
    model, tok = _load("tiny-llama")
    enc = _enc(model, tok)
    kw = dict(do_sample=True, max_new_tokens=8)
    got = mbr_batch_text(model, tok, enc, n=4, epsilon=epsilon, **kw)
    cands = mbr_candidates(model, enc, n=4, seed=0, epsilon=epsilon, **kw)
    assert got == _brute_force(tok, cands, 4, "chrf")
    one = mbr_batch_text(model, tok, enc, n=1, seed=5, **kw)  # one candidate: itself
    single = mbr_candidates(model, enc, n=1, seed=5, **kw)
    assert one == [t.strip() for t in tok.batch_decode(single, skip_special_tokens=True)]


def test_epsilon_changes_the_mbr_output_it_is_passed_to():
    model, tok = _load("tiny-llama")
    enc = _enc(model, tok)
    kw = dict(do_sample=True, max_new_tokens=8)
    assert mbr_batch_text(model, tok, enc, n=4, epsilon=0.05, **kw) != mbr_generate_text(
        model, tok, enc, n=4, **kw
    )


def test_refusals_are_named_word_for_word():
    model, tok = _load("tiny-llama")
    enc = _enc(model, tok)
    with pytest.raises(GencraftError, match=r"^epsilon applies to sampled candidates; add "):
        mbr_candidates(model, enc, n=2, epsilon=0.1, max_new_tokens=3)
    with pytest.raises(GencraftError, match=r"^mbr \(candidates per input\) must be >= 1, got 0$"):
        mbr_batch_text(model, tok, enc, n=0, max_new_tokens=3)
    for kw in (dict(epsilon=0.1), dict(mbr=4, mbr_utility="bleu")):
        with pytest.raises(GencraftError) as err:
            generate_text(model, tok, PROMPTS, max_new_tokens=3, **kw)
        assert str(err.value) == (
            f"generate_text does no MBR ({', '.join(sorted(kw))}): use gencraft.search.mbr."
            "mbr_generate_text(model, tokenizer, prompts, n=N, utility=..., epsilon=...)"
        )
    with pytest.raises(GencraftError, match=r"^negative_prompts: one per prompt \(3, got 2\)$"):
        generate_text(model, tok, PROMPTS, negative_prompts=["a", "b"], max_new_tokens=3)


def test_left_padding_falls_back_to_the_models_pad_id():
    model, _ = load_model("tiny-llama", seed=3)
    model.generation_config.pad_token_id = 7

    class NoPad:
        pad_token_id = None

    ((_, ids, mask),) = left_padded_batches(model, NoPad(), [[5], [4, 4, 4]], 2)
    assert ids.tolist() == [[7, 7, 5], [4, 4, 4]] and mask.tolist() == [[0, 0, 1], [1, 1, 1]]


@pytest.mark.parametrize("epsilon", [None, 0.05])
def test_mbr_generate_text_is_mbr_of_the_batch_generate_text_encodes(epsilon):
    """The text-level entry encodes the prompts as generate_text does and is MBR of that
    batch, seeded 0 by default."""
    model, tok = _load("tiny-llama")
    kw = dict(do_sample=True, max_new_tokens=8, pad_token_id=0)
    got = mbr_generate_text(model, tok, PROMPTS, n=4, epsilon=epsilon, **kw)
    assert got == mbr_batch_text(model, tok, _enc(model, tok), n=4, epsilon=epsilon, **kw)
    seeded = mbr_generate_text(model, tok, PROMPTS, n=4, seed=9, epsilon=epsilon, **kw)
    assert seeded == mbr_batch_text(
        model, tok, _enc(model, tok), n=4, seed=9, **kw, epsilon=epsilon
    )


def _templated():
    """tiny-llama with a chat template on its own tokenizer (the cached one stays plain)."""
    model, tok = load_model("tiny-llama", seed=3)
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    return model, tok


@pytest.mark.parametrize("chat", [False, True])
def test_prompts_and_negative_prompts_are_encoded_alike(monkeypatch, chat):
    """Both through the chat setting and the input budget; an empty negative prompt (CAD's
    empty source) allowed; generate receives the negatives as ids and mask."""
    model, tok = _templated()
    seen: dict = {}
    real = model.generate

    def spy(**kw):
        seen.update(kw)
        return real(**{k: v for k, v in kw.items() if not k.startswith("negative_")})

    monkeypatch.setattr(model, "generate", spy)
    negatives = ["", "the dog", "x"]
    got = generate_text(
        model,
        tok,
        PROMPTS,
        chat=chat,
        max_input_tokens=6,
        negative_prompts=negatives,
        max_new_tokens=4,
        do_sample=False,
    )
    enc = prepared_inputs(model, tok, PROMPTS, chat, 6, {})
    neg = prepared_inputs(model, tok, negatives, chat, 6, {}, True)
    assert torch.equal(seen["input_ids"], enc["input_ids"])
    assert torch.equal(seen["negative_input_ids"], neg["input_ids"])
    assert torch.equal(seen["negative_attention_mask"], neg["attention_mask"])
    assert enc["input_ids"].shape[1] == 6 and seen["pad_token_id"] == pad_id(model, tok)
    opened = tok.apply_chat_template([{"role": "user", "content": "x"}], return_dict=False)
    assert (neg["input_ids"][2, -len(opened) :].tolist() == list(opened)) == chat
    assert len(got) == len(PROMPTS)


TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}:{{ m['content'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant:{% endif %}"
)


def _tokenizer(template: bool, pad: bool, eos: bool):
    """The tiny byte-level tokenizer, with or without a chat template, a pad and an EOS."""
    from gencraft.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TEMPLATE if template else None
    if not pad:
        tok.pad_token = None
    if not eos:
        tok.eos_token = None
    return tok


def _reference_inputs(tok, prompts, chat, k, left, pad):
    """Each prompt as one user turn opened for the assistant (the template when asked or
    present), a blank one as the tokenizer's encoding of "" (else EOS), cut to its last (left)
    or first k ids, padded with the given id, else the tokenizer's pad, else EOS, else 0."""
    rows = []
    for p in prompts:
        if not p.strip():
            ids = list(tok("")["input_ids"]) or [tok.eos_token_id]
        elif chat or (chat is None and tok.chat_template):
            msgs = [{"role": "user", "content": p}]
            ids = list(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))
        else:
            ids = list(tok(p)["input_ids"])
        rows.append(ids if k is None else ids[-k:] if left else ids[:k])
    pad = next((v for v in (pad, tok.pad_token_id, tok.eos_token_id) if v is not None), 0)
    width = max(map(len, rows))
    ids = [[pad] * (width - len(r)) + r if left else r + [pad] * (width - len(r)) for r in rows]
    mask = [
        [int(i >= width - len(r)) if left else int(i < len(r)) for i in range(width)] for r in rows
    ]
    return ids, mask


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    prompts=st.lists(st.text("ab c", max_size=6), min_size=1, max_size=4),
    template=st.booleans(),
    chat=st.sampled_from([None, False, True]),
    k=st.sampled_from([None, 1, 3, 9]),
    left=st.booleans(),
    pad=st.sampled_from([None, 9]),
    tok_pad=st.booleans(),
    tok_eos=st.booleans(),
)
def test_build_inputs_is_the_reference_encoding(
    prompts, template, chat, k, left, pad, tok_pad, tok_eos
):
    tok = _tokenizer(template, tok_pad, tok_eos)
    if chat and not template:
        with pytest.raises(
            GencraftError, match=r"^chat=True but this tokenizer has no chat template$"
        ):
            build_inputs(tok, [p or "x" for p in prompts], chat=True)
        return
    kw = dict(chat=chat, max_input_tokens=k, left=left, pad_token_id=pad)
    blank = [i for i, p in enumerate(prompts) if not p.strip()]
    if blank:
        with pytest.raises(
            GencraftError,
            match="^" + re.escape(f"prompt(s) {blank} are empty; give text to continue") + "$",
        ):
            build_inputs(tok, prompts, **kw)
    if blank and not tok("")["input_ids"] and tok.eos_token_id is None:  # nothing to stand in
        with pytest.raises(
            GencraftError, match=rf"^prompt {blank[0]} is empty and this tokenizer "
        ):
            build_inputs(tok, prompts, allow_empty=True, **kw)
        return
    got = build_inputs(tok, prompts, allow_empty=True, **kw)
    ids, mask = _reference_inputs(tok, prompts, chat, k, left, pad)
    assert got["input_ids"].tolist() == ids and got["attention_mask"].tolist() == mask


def test_build_inputs_defaults_to_left_padding_without_empty_prompts():
    tok = _tokenizer(False, True, True)
    got = build_inputs(tok, ["a", "abc"])
    ids, mask = _reference_inputs(tok, ["a", "abc"], None, None, True, None)
    assert got["input_ids"].tolist() == ids and got["attention_mask"].tolist() == mask
    with pytest.raises(
        GencraftError, match=r"^prompt\(s\) \[0\] are empty; give text to continue$"
    ):
        build_inputs(tok, [" ", "abc"])


@pytest.mark.parametrize("prompts", ["a string", []])
def test_prompts_that_are_not_a_list_of_text_are_refused(prompts):
    with pytest.raises(GencraftError, match=r"^prompts must be a non-empty list of strings$"):
        build_inputs(_tokenizer(False, True, True), prompts)


@pytest.mark.parametrize("text", ["", "  ", None, 5])
def test_a_user_turn_needs_text(text):
    with pytest.raises(GencraftError, match=r"^a prompt must be a non-empty string$"):
        encode_user_turn(_tokenizer(True, True, True), text)


class _NoHead(torch.nn.Module):
    """Has ``generate`` but no language-model head (an encoder's shape)."""

    def generate(self, **kw):
        raise AssertionError("never called")

    def get_output_embeddings(self):
        return None


class _NoHeadGetter(torch.nn.Module):
    def generate(self, **kw):
        raise AssertionError("never called")


@pytest.mark.parametrize("model", [_NoHead(), _NoHeadGetter(), torch.nn.Linear(2, 2)])
def test_a_model_without_a_language_model_head_is_refused_by_name(model):
    _, tok = _load("tiny-llama")
    msg = (
        f"{type(model).__name__} cannot generate text: it is an encoder without a language-model "
        "head; use a causal LM or an encoder-decoder (e.g. smollm2-135m, minilm-l6-bert2bert)"
    )
    with pytest.raises(GencraftError, match="^" + re.escape(msg) + "$"):
        generate_text(model, tok, PROMPTS, max_new_tokens=2)


def test_generate_text_refuses_an_empty_prompt_that_cad_alone_may_give():
    model, tok = _load("tiny-llama")
    with pytest.raises(
        GencraftError, match=r"^prompt\(s\) \[1\] are empty; give text to continue$"
    ):
        generate_text(model, tok, ["a", " "], max_new_tokens=2)


def _prompt_of(tok, n: int, left: bool = True) -> str:
    """A prompt that encodes to exactly ``n`` ids."""
    extra = build_inputs(tok, ["a"], left=left)["input_ids"].shape[1] - 1
    return "a" * (n - extra)


@pytest.mark.parametrize("new", [None, 7])
def test_a_causal_prompt_plus_new_tokens_fills_the_context_and_no_more(new):
    """``max_new_tokens`` absent counts as generate's 20."""
    model, tok = _load("tiny-llama")
    kw = {} if new is None else {"max_new_tokens": new}
    fits = 512 - (new or 20)
    prepared_inputs(model, tok, [_prompt_of(tok, fits)], None, None, dict(kw))
    msg = (
        "the prompt plus max_new_tokens (513 tokens) exceeds the model's context of 512 "
        "positions; shorten the prompt or lower max_new_tokens"
    )
    with pytest.raises(GencraftError, match="^" + re.escape(msg) + "$"):
        prepared_inputs(model, tok, [_prompt_of(tok, fits + 1)], None, None, dict(kw))


def test_an_encoder_decoders_input_and_output_each_fill_their_context_and_no_more():
    model, tok = _load("tiny-bart")
    prepared_inputs(model, tok, [_prompt_of(tok, 512, False)], None, None, {"max_new_tokens": 511})
    msg = "the input (513 tokens) exceeds the model's context of 512 positions; shorten "
    with pytest.raises(GencraftError, match="^" + re.escape(msg)):
        prepared_inputs(
            model, tok, [_prompt_of(tok, 513, False)], None, None, {"max_new_tokens": 5}
        )
    msg = "max_new_tokens=512 exceeds the decoder's context of 512 positions"
    with pytest.raises(GencraftError, match="^" + re.escape(msg) + "$"):
        prepared_inputs(model, tok, ["a"], None, None, {"max_new_tokens": 512})


@pytest.mark.parametrize("tok_pad", [True, False])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
def test_the_tokenizers_pad_id_else_the_models_pads_the_batch_and_generate(name, tok_pad):
    """A causal LM's prompts padded on the left, an encoder's inputs on the right."""
    model, tok = load_model(name, seed=3)
    model.generation_config.pad_token_id = 7
    if not tok_pad:
        tok.pad_token = None
    pad = 0 if tok_pad else 7  # the tiny tokenizer's pad id is 0
    kw: dict = {"max_new_tokens": 2}
    enc = prepared_inputs(model, tok, ["a", "abc"], None, None, kw)
    mask = enc["attention_mask"][0].tolist()
    assert enc["input_ids"][0][enc["attention_mask"][0] == 0].tolist() == [pad, pad]
    assert kw["pad_token_id"] == pad
    assert mask == sorted(mask, reverse=model.config.is_encoder_decoder)
    kept = {"max_new_tokens": 2, "pad_token_id": 4}  # the caller's own pad id stays
    prepared_inputs(model, tok, ["a"], None, None, kept)
    assert kept["pad_token_id"] == 4


def test_pad_batch_pads_right_by_default_and_names_what_is_missing():
    rows = [{"input_ids": [5], "labels": [5]}, {"input_ids": [6, 7, 8], "labels": [6, 7, 8]}]
    got = pad_batch(rows, 0)
    assert got["input_ids"].tolist() == [[5, 0, 0], [6, 7, 8]]
    assert got["labels"].tolist() == [[5, -100, -100], [6, 7, 8]]
    assert all(v.dtype == torch.long for v in got.values())
    with pytest.raises(GencraftError, match=r"^cannot pad an empty batch$"):
        pad_batch([], 0)
    with pytest.raises(GencraftError, match=r"^each row needs input_ids$"):
        pad_batch([{"labels": [1]}], 0)


_LIMIT = st.one_of(st.none(), st.integers(2, 14))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    name=st.sampled_from(["tiny-llama", "tiny-bart"]),
    width=st.integers(1, 6),
    call=st.fixed_dictionaries({"max_length": _LIMIT, "max_new_tokens": _LIMIT}),
    config=st.fixed_dictionaries({"max_length": _LIMIT, "max_new_tokens": _LIMIT}),
)
@example(  # max_length = the prompt: no new token
    name="tiny-llama",
    width=3,
    call={"max_length": 3, "max_new_tokens": None},
    config={"max_length": None, "max_new_tokens": None},
)
@example(
    name="tiny-bart",
    width=4,
    call={"max_length": None, "max_new_tokens": None},
    config={"max_length": 1, "max_new_tokens": None},
)
def test_lengths_as_new_tokens_are_generates_own(name, width, call, config):
    """The new tokens ``lengths_as_new_tokens`` counts are those ``generate`` makes (no EOS)
    under drawn limits in the call and the generation config, or its refusal."""
    from transformers import GenerationConfig

    from gencraft.models.generate import lengths_as_new_tokens

    model, _ = _load(name)
    cfg = GenerationConfig(eos_token_id=None, pad_token_id=0, **config)
    ids = torch.arange(5, 5 + width)[None]
    prompt = 1 if name == "tiny-bart" else width
    kw = {k: v for k, v in call.items() if v is not None}
    try:
        out = model.generate(ids, generation_config=cfg, **kw)
    except ValueError:  # generate's own refusal: max_length leaves no new token
        with pytest.raises(GencraftError, match="leaves no new token"):
            lengths_as_new_tokens(kw, cfg, prompt)
        return
    got = lengths_as_new_tokens(kw, cfg, prompt)
    assert "max_length" not in got and got["max_new_tokens"] == out.shape[1] - prompt


@pytest.mark.parametrize(
    ("kw", "config", "want"),
    [
        ({"min_length": 9}, {}, 4),
        ({}, {"min_length": 9}, 4),
        ({"min_length": 9, "min_new_tokens": 2}, {}, 2),
        ({"min_length": 9}, {"min_new_tokens": 3}, 3),
        ({"min_length": 6}, {}, 1),
        ({"min_length": 5}, {}, None),
        ({"min_length": 4}, {}, None),
        ({}, {}, None),
    ],
)
def test_min_length_as_new_tokens(kw, config, want):
    """``min_length`` counts the prompt (5 tokens): a positive remainder becomes
    ``min_new_tokens``, which wins when given; none is set otherwise."""
    from transformers import GenerationConfig

    from gencraft.models.generate import lengths_as_new_tokens

    got = lengths_as_new_tokens(kw, GenerationConfig(**config), 5)
    assert "min_length" not in got and got.get("min_new_tokens") == want
    assert got["max_new_tokens"] == 20


def test_generation_settings_merge_the_calls_config_over_the_models():
    from transformers import GenerationConfig

    from gencraft.models.generate import generation_settings

    model, _ = _load("tiny-llama")
    own = model.generation_config
    assert generation_settings(model, {"max_new_tokens": 3}) is own
    given = GenerationConfig(num_beams=3, max_new_tokens=7)
    merged = generation_settings(model, {"generation_config": given})
    assert (merged.num_beams, merged.max_new_tokens) == (3, 7)
    assert (merged.pad_token_id, merged.eos_token_id) == (own.pad_token_id, own.eos_token_id)
    assert own.pad_token_id is not None and given.pad_token_id is None  # neither is changed
    assert own.num_beams != 3
