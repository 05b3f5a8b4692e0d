"""What gencraft reads about a model (``gencraft.models.introspect``), checked against what the
model does: its sizes against the attentions, hidden states, key/value cache and logits of a
forward pass, on families whose configs spell them differently and whose decoder differs
from the encoder; its special ids against each place a config may hold them; and the token
budgets and refusals word for word."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
import transformers as T
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from gencraft.errors import ConfigError, GencraftError
from gencraft.models.introspect import (
    check_generator,
    check_token_budget,
    context_size,
    decoder_body,
    decoder_config,
    decoder_start_id,
    encoder_context_size,
    eos_ids,
    fingerprint,
    hf_model,
    is_causal_lm,
    is_encoder_decoder,
    model_name,
    model_shape,
    pad_id,
    same_model_name,
    special_ids,
    target_eos_id,
)

V = 50  # every size below differs from the others, and each decoder from its encoder


def _bert(**kw) -> T.BertConfig:
    sizes = {"hidden_size": 24, "intermediate_size": 32, "vocab_size": V}
    return T.BertConfig(**sizes, **kw)


def build(name: str) -> nn.Module:
    """A tiny model of family ``name`` with 3 decoder layers, hidden 24 and 6 heads."""
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = T.GPT2Config(vocab_size=V, n_embd=24, n_layer=3, n_head=6, n_positions=40, n_inner=32)
        return T.GPT2LMHeadModel(cfg)
    if name == "llama":  # grouped key/values and a head_dim that is not hidden / heads
        cfg = T.LlamaConfig(
            vocab_size=V,
            hidden_size=24,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=6,
            max_position_embeddings=40,
        )
        return T.LlamaForCausalLM(cfg)
    if name == "opt":
        cfg = T.OPTConfig(
            vocab_size=V,
            hidden_size=24,
            num_hidden_layers=3,
            num_attention_heads=6,
            ffn_dim=32,
            max_position_embeddings=40,
            word_embed_proj_dim=24,
        )
        return T.OPTForCausalLM(cfg)
    return _build_seq2seq(name)


def _build_seq2seq(name: str) -> nn.Module:
    """:func:`build`'s encoder-decoders, each decoder unlike its encoder."""
    if name == "bart":  # the generic names are the encoder's (1 layer, 2 heads)
        cfg = T.BartConfig(
            vocab_size=V,
            d_model=24,
            encoder_layers=1,
            decoder_layers=3,
            encoder_attention_heads=2,
            decoder_attention_heads=6,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=40,
        )
        return T.BartForConditionalGeneration(cfg)
    if name == "t5":  # num_layers is the encoder's; d_kv is not hidden / heads
        cfg = T.T5Config(
            vocab_size=V,
            d_model=24,
            d_kv=5,
            d_ff=32,
            num_layers=1,
            num_decoder_layers=3,
            num_heads=6,
            decoder_start_token_id=0,
        )
        return T.T5ForConditionalGeneration(cfg)
    assert name == "bert2bert"
    enc = _bert(num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=60)
    dec = _bert(
        num_hidden_layers=3,
        num_attention_heads=6,
        max_position_embeddings=40,
        is_decoder=True,
        add_cross_attention=True,
    )
    model = T.EncoderDecoderModel(
        encoder=T.BertModel(enc, add_pooling_layer=False), decoder=T.BertLMHeadModel(dec)
    )
    model.config.decoder_start_token_id, model.config.pad_token_id = 1, 0
    return model


FAMILIES = ["gpt2", "llama", "opt", "bart", "t5", "bert2bert"]
#: positions of the decoder and the encoder (None: relative positions, no limit)
CONTEXT = {"gpt2": 40, "llama": 40, "opt": 40, "bart": 40, "t5": None, "bert2bert": 40}
ENCODER_CONTEXT = {**CONTEXT, "bert2bert": 60}


def _observed(model: nn.Module) -> tuple[int, int, int, int, int, int]:
    """(layers, hidden, heads, kv_heads, head_dim, vocab) as a forward pass shows them."""
    model.eval().set_attn_implementation("eager")
    ids = torch.tensor([[3, 4, 5, 6]])
    kw = {"output_attentions": True, "output_hidden_states": True, "use_cache": True}
    with torch.no_grad():
        if is_encoder_decoder(model):
            out = model(input_ids=ids, decoder_input_ids=ids[:, :3], **kw)
            att, states = out.decoder_attentions, out.decoder_hidden_states
            cache = out.past_key_values.self_attention_cache
        else:
            out = model(input_ids=ids, **kw)
            att, states, cache = out.attentions, out.hidden_states, out.past_key_values
    keys = cache.layers[0].keys  # [B, kv_heads, T, head_dim]
    return (
        len(att),
        states[-1].shape[-1],
        att[0].shape[1],
        keys.shape[1],
        keys.shape[3],
        out.logits.shape[-1],
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_the_shape_is_what_a_forward_pass_shows(name):
    model = build(name)
    shape = model_shape(model)
    got = (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.vocab)
    assert got == _observed(model)
    assert shape.context == context_size(model) == CONTEXT[name]
    assert encoder_context_size(model) == ENCODER_CONTEXT[name]


def test_a_config_without_sizes_is_refused_naming_it():
    model = build("gpt2")
    model.config.n_head = 0  # not a size
    with pytest.raises(GencraftError) as err:
        model_shape(model)
    assert str(err.value) == "cannot read layers/hidden size/heads from GPT2Config"


def test_the_vocabulary_is_the_output_layers_rows_else_the_configs():
    model = build("gpt2")
    model.resize_token_embeddings(57)
    assert model_shape(model).vocab == 57
    model.get_output_embeddings = lambda: None
    model.config.vocab_size = 61
    assert model_shape(model).vocab == 61


# -- kinds of model ------------------------------------------------------------------------


class Wrapper(nn.Module):
    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base


@pytest.mark.parametrize("depth", [0, 1, 5])
def test_a_wrapped_model_is_found_under_up_to_five_wrappers(depth):
    model = build("gpt2")
    outer = model
    for _ in range(depth):
        outer = Wrapper(outer)
    assert hf_model(outer) is model
    assert model_shape(outer) == model_shape(model)


def test_six_wrappers_or_none_with_no_base_are_refused():
    outer = build("gpt2")
    for _ in range(6):
        outer = Wrapper(outer)
    with pytest.raises(GencraftError) as err:
        hf_model(outer)
    assert str(err.value) == "Wrapper is not a Hugging Face model and wraps none (no .base)"
    with pytest.raises(GencraftError, match=r"^Linear is not a Hugging Face model"):
        hf_model(nn.Linear(2, 2))
    stub = Wrapper(SimpleNamespace(config=SimpleNamespace()))  # a config without to_dict
    with pytest.raises(GencraftError, match=r"^SimpleNamespace is not"):
        hf_model(stub)


@pytest.mark.parametrize(
    ("model", "causal", "seq2seq"),
    [
        (lambda: build("gpt2"), True, False),
        (lambda: build("bart"), False, True),
        (lambda: build("bert2bert"), False, True),
        (lambda: T.BertForMaskedLM(_bert()), False, False),
        (lambda: T.BertLMHeadModel(_bert(is_decoder=True)), True, False),
        (lambda: T.GPT2Model(T.GPT2Config(n_embd=24, n_layer=1, n_head=2)), False, False),
    ],
)
def test_which_models_generate(model, causal, seq2seq):
    model = model()
    assert (is_causal_lm(model), is_encoder_decoder(model)) == (causal, seq2seq)
    if causal or seq2seq:
        check_generator(model, "sampling")
    else:
        with pytest.raises(GencraftError) as err:
            check_generator(model, "sampling")
        cls = type(model).__name__
        assert str(err.value) == (
            f"sampling needs a model that generates (a causal LM or an encoder-decoder); "
            f"{cls} is a {cls}, an encoder"
        )


def test_a_class_of_its_own_is_a_causal_lm_when_its_config_says_decoder():
    class MyLM(T.GPT2LMHeadModel):
        pass

    model = MyLM(build("gpt2").config)
    assert not is_causal_lm(model)
    model.config.is_decoder = True
    assert is_causal_lm(model)


def test_the_decoder_config_and_body_are_the_generating_parts():
    b2b = build("bert2bert")
    assert decoder_config(b2b) is b2b.config.decoder
    gpt2 = build("gpt2")
    assert decoder_config(gpt2) is gpt2.config
    assert decoder_body(gpt2) is gpt2.transformer
    opt = build("opt")
    assert decoder_body(opt) is opt.model.decoder  # OPTForCausalLM calls it directly
    llama = build("llama")
    assert decoder_body(Wrapper(llama)) is llama.model


def test_a_get_decoder_that_fails_or_returns_the_model_falls_back_to_the_base_model():
    for fail in (AttributeError, NotImplementedError):
        model = build("gpt2")

        def broken(fail=fail):
            raise fail("no decoder")

        model.get_decoder = broken
        assert decoder_body(model) is model.transformer
    model = build("gpt2")
    model.get_decoder = lambda: model
    assert decoder_body(model) is model.transformer
    model.get_decoder = "not callable"
    assert decoder_body(model) is model.transformer


# -- names ---------------------------------------------------------------------------------


def test_the_name_is_the_loaded_name_else_the_configs_else_none():
    model = build("gpt2")
    assert model_name(model) is None
    model.config._name_or_path = "org/model"
    assert model_name(Wrapper(model)) == "org/model"
    model.gencraft_name = "tiny-gpt2"
    assert model_name(model) == "tiny-gpt2"


def test_same_model_name_needs_two_names():
    assert not same_model_name(None, "tiny-gpt2")
    assert not same_model_name("tiny-gpt2", "")
    assert same_model_name("tiny-gpt2", "tiny-gpt2")
    assert not same_model_name("tiny-gpt2", "tiny-bart")


def test_the_fingerprint_follows_the_weights_and_architecture_not_the_name():
    a, b = build("gpt2"), build("gpt2")
    assert fingerprint(a) == fingerprint(b) and len(fingerprint(a)) == 16
    int(fingerprint(a), 16)  # hexadecimal
    b.config._name_or_path, b.config.torch_dtype = "/somewhere/else", "bfloat16"
    assert fingerprint(a) == fingerprint(b)
    with torch.no_grad():
        b.get_input_embeddings().weight[63 % V, 0] += 0.01
    assert fingerprint(a) != fingerprint(b)
    c = build("gpt2")
    c.config.n_inner = 31  # the architecture, not the weights read
    assert fingerprint(a) != fingerprint(c)


# -- token budgets -------------------------------------------------------------------------


GPT2 = build("gpt2")
GPT2.gencraft_name = "tiny"


BART = build("bart")
BART.gencraft_name = "b"


@settings(max_examples=60, deadline=None)
@example(ctx=10, reserve=2, source=5, target=8)  # no room left: refused, not cut to 0
@example(ctx=10, reserve=2, source=5, target=7)  # one position left
@given(
    ctx=st.integers(4, 40),
    reserve=st.integers(0, 6),
    source=st.integers(1, 50),
    target=st.integers(1, 50),
)
def test_a_causal_lm_budget_is_kept_cut_or_refused(ctx, reserve, source, target):
    """One sequence of prompt + source + target: kept when it fits, cut with a note when the
    source is at most the positions and leaves room, refused otherwise."""
    model = GPT2
    model.config.n_positions = ctx
    kw = {"reserve": reserve}
    room = ctx - reserve - target
    if reserve + source + target <= ctx:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert check_token_budget(model, source, target, **kw) == source
    elif room < 1 or source > ctx:
        with pytest.raises(ConfigError) as err:
            check_token_budget(model, source, target, **kw)
        assert str(err.value) == (
            f"--max-source-tokens {source} + --max-target-tokens {target} (+ {reserve} prompt "
            f"tokens) exceed the {ctx} positions of tiny; make them sum to at most "
            f"{ctx - reserve}"
        )
    else:
        with pytest.warns(UserWarning) as record:
            assert check_token_budget(model, source, target, **kw) == room
        prompt = f" and {reserve} for the prompt" if reserve else ""
        assert str(record[0].message) == (
            f"--max-source-tokens {source} cut to {room}: tiny holds {ctx} positions, "
            f"{target} of them for --max-target-tokens{prompt}"
        )


@settings(max_examples=40, deadline=None)
@given(source=st.integers(1, 60), target=st.integers(1, 60))
@example(source=40, target=39)  # the boundaries: the start token takes a position
@example(source=1, target=40)
@example(source=41, target=1)
def test_an_encoder_decoder_budget_is_checked_against_each_side(source, target):
    model = BART
    flags = ("--src", "--tgt")
    if source > 40:
        with pytest.raises(ConfigError) as err:
            check_token_budget(model, source, target, flags)
        assert str(err.value) == (
            f"--src {source} exceeds the 40 encoder positions of b; use at most 40"
        )
    elif target + 1 > 40:
        with pytest.raises(ConfigError) as err:
            check_token_budget(model, source, target, flags)
        assert str(err.value) == (
            f"--tgt {target} exceeds the 40 decoder positions of b (with its start token); "
            "use at most 39"
        )
    else:
        assert check_token_budget(model, source, target, flags) == source


def test_models_without_a_position_limit_keep_any_budget():
    t5 = build("t5")
    assert check_token_budget(t5, 10_000, 10_000) == 10_000
    llama = build("llama")
    llama.config.max_position_embeddings = 0  # not a limit
    assert check_token_budget(llama, 10_000, 10_000, reserve=5) == 10_000


# -- special ids ---------------------------------------------------------------------------


def _ids_model(config: dict, generation: dict | None) -> nn.Module:
    model = build("gpt2")
    for k in ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id"):
        setattr(model.config, k, config.get(k))
        setattr(model.generation_config, k, (generation or {}).get(k))
    if generation is None:
        model.generation_config = None
    return model


ID = st.one_of(st.none(), st.integers(0, 9), st.lists(st.integers(0, 9), min_size=1, max_size=3))


def _as_list(v):
    return [] if v is None else [v] if isinstance(v, int) else list(v)


@settings(max_examples=60, deadline=None)
@given(
    cfg_eos=ID,
    gen_eos=ID,
    cfg_pad=st.one_of(st.none(), st.integers(0, 9)),
    gen_pad=st.one_of(st.none(), st.integers(0, 9)),
    has_generation=st.booleans(),
)
def test_special_ids_come_from_the_generation_config_first(
    cfg_eos, gen_eos, cfg_pad, gen_pad, has_generation
):
    gen = {"eos_token_id": gen_eos, "pad_token_id": gen_pad} if has_generation else None
    model = _ids_model({"eos_token_id": cfg_eos, "pad_token_id": cfg_pad}, gen)
    eos = gen_eos if has_generation and gen_eos is not None else cfg_eos
    if eos is None:
        with pytest.raises(GencraftError, match=r"^no eos_token_id given and the model"):
            eos_ids(model)
    else:
        assert eos_ids(model) == _as_list(eos)
    pad = gen_pad if has_generation and gen_pad is not None else cfg_pad
    if pad is not None:
        assert pad_id(model) == pad
    elif eos is not None:
        assert pad_id(model) == _as_list(eos)[0]
    assert pad_id(model, SimpleNamespace(pad_token_id=7)) == 7
    want = set(_as_list(cfg_eos) + _as_list(cfg_pad))
    if has_generation:
        want |= set(_as_list(gen_eos) + _as_list(gen_pad))
    assert special_ids(model) == want


def test_given_eos_ids_win_and_an_empty_list_is_refused():
    model = _ids_model({"eos_token_id": 2}, {"eos_token_id": 3})
    assert eos_ids(model, 5) == [5]
    assert eos_ids(model, (5, 6)) == [5, 6]
    with pytest.raises(GencraftError) as err:
        eos_ids(model, [])
    assert str(err.value) == "eos_token_id is an empty list"


def test_special_ids_include_the_decoder_start():
    model = _ids_model({"decoder_start_token_id": 4}, {"decoder_start_token_id": 8})
    assert special_ids(model) == {4, 8}


def test_the_target_eos_is_the_generation_configs_and_a_different_tokenizer_eos_is_said():
    model = _ids_model({"eos_token_id": 2}, {"eos_token_id": [3, 2]})
    model.gencraft_name = "m"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert target_eos_id(model, SimpleNamespace(eos_token_id=3)) == 3
    with pytest.warns(UserWarning) as record:
        assert target_eos_id(model, SimpleNamespace(eos_token_id=None, sep_token_id=9)) == 3
    assert str(record[0].message) == (
        "m: the tokenizer's EOS is id 9, the generation config's is 3; training targets end "
        "with 3, the id generation stops on"
    )
    bare = _ids_model({}, None)
    assert target_eos_id(bare, SimpleNamespace(eos_token_id=6, sep_token_id=9)) == 6
    assert target_eos_id(bare, SimpleNamespace(sep_token_id=9)) == 9
    with pytest.raises(GencraftError) as err:
        target_eos_id(bare, SimpleNamespace())
    assert str(err.value) == "neither the model's configs nor its tokenizer define an EOS"


def test_the_decoder_start_is_read_from_each_place_in_turn():
    model = build("bart")
    model.generation_config.decoder_start_token_id, model.config.decoder_start_token_id = 5, 6
    assert decoder_start_id(model) == 5
    model.generation_config.decoder_start_token_id = None
    assert decoder_start_id(model) == 6
    b2b = build("bert2bert")
    b2b.generation_config.decoder_start_token_id = None
    b2b.config.decoder_start_token_id = None
    b2b.config.decoder.bos_token_id = 7
    assert decoder_start_id(b2b) == 7
    b2b.config.decoder.bos_token_id = None
    with pytest.raises(GencraftError) as err:
        decoder_start_id(b2b)
    assert str(err.value) == (
        "this encoder-decoder defines no decoder_start_token_id; set "
        "model.generation_config.decoder_start_token_id"
    )
    model.config.decoder_start_token_id = None
    with pytest.raises(GencraftError, match="defines no decoder_start_token_id"):
        decoder_start_id(model)  # no decoder config to fall back on


# -- configs without transformers' aliases ---------------------------------------------------


class RawConfig(T.PretrainedConfig):
    """A config that holds only what is set on it: no aliases, no default ids."""

    model_type = "gencraft-raw"


class RawLM(nn.Module):
    """A model of a config spelled one way (remote code, older families): only what
    ``introspect`` reads, an output layer of ``vocab`` rows and input embeddings."""

    def __init__(self, config: RawConfig, vocab: int = 70) -> None:
        super().__init__()
        self.config = config
        self.head = nn.Linear(4, vocab, bias=False)
        self.embed = nn.Embedding(vocab, 4)

    def get_output_embeddings(self) -> nn.Module | None:
        return self.head

    def get_input_embeddings(self) -> nn.Module:
        return self.embed


class PlainConfig:
    """A config that is no ``PretrainedConfig`` at all (no ``get_text_config``): what
    remote code may bring, and a flat encoder-decoder config that no release remaps."""

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if not isinstance(v, PlainConfig)}


def _raw(plain: bool = False, **sizes) -> RawConfig | PlainConfig:
    cfg = PlainConfig() if plain else RawConfig()
    for name, value in sizes.items():
        setattr(cfg, name, value)
    return cfg


SIZE = st.integers(1, 9)
MAYBE = st.one_of(st.none(), SIZE)


@settings(max_examples=80, deadline=None)
@given(
    spell=st.tuples(
        st.sampled_from(["num_hidden_layers", "n_layer"]),
        st.sampled_from(["hidden_size", "d_model", "n_embd"]),
        st.sampled_from(["num_attention_heads", "num_heads", "n_head"]),
        st.sampled_from(["head_dim", "d_kv"]),
        st.sampled_from(["max_position_embeddings", "n_positions", "max_target_positions"]),
    ),
    layers=SIZE,
    hidden=st.integers(1, 40),
    heads=SIZE,
    head_dim=MAYBE,
    kv=MAYBE,
    context=MAYBE,
    seq2seq=st.booleans(),
    plain=st.booleans(),
    decoder_names=st.sampled_from(["num_decoder_layers", "decoder_layers"]),
)
def test_each_spelling_of_each_size_is_read(
    spell, layers, hidden, heads, head_dim, kv, context, seq2seq, plain, decoder_names
):
    """Sizes of 1 and up under every name ``model_shape`` accepts; an encoder-decoder's
    decoder names win over generic ones that hold its encoder's sizes (set to 99 here)."""
    sizes = {spell[1]: hidden}
    if seq2seq:
        sizes |= {spell[0]: 99, spell[2]: 99, "is_encoder_decoder": True}
        sizes |= {decoder_names: layers, "decoder_attention_heads": heads}
    else:
        sizes |= {spell[0]: layers, spell[2]: heads}
    if head_dim is not None:
        sizes[spell[3]] = head_dim
    if kv is not None:
        sizes["num_key_value_heads"] = kv
    if context is not None:
        sizes[spell[4]] = context
    shape = model_shape(RawLM(_raw(plain, **sizes)))
    assert (shape.layers, shape.hidden, shape.heads) == (layers, hidden, heads)
    assert shape.kv_heads == (kv or heads) and shape.context == context and shape.vocab == 70
    assert shape.head_dim == (head_dim or hidden // heads)
    assert type(shape.head_dim) is int


@pytest.mark.parametrize("plain", [False, True])
def test_a_nested_decoder_config_is_read_only_for_an_encoder_decoder(plain):
    """``config.decoder`` (EncoderDecoderModel's layout) holds the generating stack's sizes
    when the model is an encoder-decoder; a plain config's is ignored otherwise (a
    ``PretrainedConfig``'s ``get_text_config`` takes it either way)."""
    inner = _raw(plain, num_hidden_layers=3, hidden_size=12, num_attention_heads=4)
    inner.max_position_embeddings = 30
    outer = _raw(plain, num_hidden_layers=1, hidden_size=8, num_attention_heads=2)
    outer.decoder, outer.max_position_embeddings = inner, 50
    model = RawLM(outer)
    if plain:
        shape = model_shape(model)
        assert (shape.layers, shape.hidden, shape.heads, shape.context) == (1, 8, 2, 50)
    outer.is_encoder_decoder = True
    shape = model_shape(model)
    assert (shape.layers, shape.hidden, shape.heads, shape.context) == (3, 12, 4, 30)
    assert decoder_config(model) is inner and is_encoder_decoder(model)


@pytest.mark.parametrize("missing", ["num_hidden_layers", "hidden_size", "num_attention_heads"])
def test_a_config_missing_any_one_size_is_refused(missing):
    sizes = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    del sizes[missing]
    with pytest.raises(GencraftError, match=r"^cannot read layers/hidden size/heads from Raw"):
        model_shape(RawLM(_raw(**sizes)))


def test_without_an_output_layer_the_vocabulary_is_the_configs():
    model = RawLM(_raw(n_layer=1, n_embd=4, n_head=1, vocab_size=61))
    assert model_shape(model).vocab == 70  # the output layer's rows, not the config's
    model.get_output_embeddings = lambda: None
    assert model_shape(model).vocab == 61


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        ({"n_positions": 30}, 30),
        ({"max_source_positions": 20, "max_target_positions": 30}, 20),
        ({"max_position_embeddings": 0, "n_positions": 25}, 25),
        ({}, None),
    ],
)
def test_the_encoder_positions_under_each_name(sizes, want):
    assert encoder_context_size(RawLM(_raw(**sizes))) == want


def test_ids_from_a_model_without_a_generation_config_or_ids():
    """No ``generation_config`` attribute and a config without id attributes: the config's
    ids, else the refusals (never an AttributeError)."""
    model = RawLM(_raw())
    with pytest.raises(GencraftError, match=r"^no eos_token_id given"):
        eos_ids(model)
    with pytest.raises(GencraftError, match=r"^this encoder-decoder defines no"):
        decoder_start_id(model)
    model.config.decoder = RawConfig()  # a decoder config without a BOS
    with pytest.raises(GencraftError, match=r"^this encoder-decoder defines no"):
        decoder_start_id(model)
    assert special_ids(model) == set()
    model.config.eos_token_id, model.config.pad_token_id = 4, 5
    model.config.decoder_start_token_id = 6
    assert eos_ids(model) == [4] and pad_id(model) == 5 and decoder_start_id(model) == 6
    assert special_ids(model) == {4, 5, 6}
    assert pad_id(model, SimpleNamespace(pad_token_id=None)) == 5  # the tokenizer has none
    del model.config.pad_token_id
    assert pad_id(model) == 4


def test_the_fingerprint_ignores_the_release_the_order_and_rows_past_64():
    def raw_lm(**extra):
        torch.manual_seed(0)
        return RawLM(_raw(n_layer=1, **extra))

    a = raw_lm(a=1, b=2)
    fp = fingerprint(a)
    assert fingerprint(raw_lm(b=2, a=1)) == fp  # the same settings in another order
    b = raw_lm(a=1, b=2)
    b.config.transformers_version = "0.0.1"
    assert fingerprint(b) == fp
    with torch.no_grad():
        b.embed.weight[64:].add_(1.0)  # past the 64 rows read
    assert fingerprint(b) == fp
    assert fingerprint(raw_lm(a=1, b=2, dtype_seen=torch.float16)) != fp  # not JSON: as text


def _at_caller(warning) -> None:
    """The note points at the line that called (under mutmut, its trampoline adds a frame)."""
    name = warning.filename
    assert name == __file__ or name.endswith("mutmut/mutation/trampoline.py"), name


def test_budget_notes_point_at_the_caller_and_name_an_unnamed_model_by_class():
    model = build("gpt2")  # n_positions 40, no name
    assert check_token_budget(model, 30, 10) == 30  # no prompt reserved by default
    with pytest.warns(UserWarning) as record:
        check_token_budget(model, 35, 10)
    _at_caller(record[0])
    assert "GPT2LMHeadModel holds 40 positions" in str(record[0].message)
    with pytest.raises(ConfigError, match=r"the 40 positions of GPT2LMHeadModel;"):
        check_token_budget(model, 50, 10)


def test_the_eos_note_points_at_the_caller_and_names_an_unnamed_model_by_class():
    model = _ids_model({"eos_token_id": 2}, {"eos_token_id": 3})
    with pytest.warns(UserWarning) as record:
        target_eos_id(model, SimpleNamespace(eos_token_id=9))
    _at_caller(record[0])
    assert str(record[0].message).startswith("GPT2LMHeadModel: the tokenizer's EOS is id 9")


def test_a_composite_configs_text_part_holds_the_sizes():
    """A multimodal config (``text_config``, as Llava's): its text part generates."""
    text = _raw(num_hidden_layers=3, hidden_size=12, num_attention_heads=4)
    outer = _raw(num_hidden_layers=1, hidden_size=8, num_attention_heads=2)
    outer.text_config = text
    shape = model_shape(RawLM(outer))
    assert (shape.layers, shape.hidden, shape.heads) == (3, 12, 4)


def test_what_a_plain_model_and_config_lack_reads_as_absent():
    """No ``is_encoder_decoder``, ``_name_or_path``, ``get_decoder`` or ``base_model``,
    and a tokenizer without ``pad_token_id``: absent, never an AttributeError."""
    model = RawLM(_raw(True, eos_token_id=3))
    assert not is_encoder_decoder(model)
    assert model_name(model) is None
    assert decoder_body(model) is None
    assert pad_id(model, SimpleNamespace()) == 3


def test_a_plain_configs_release_and_dtype_do_not_change_the_fingerprint():
    torch.manual_seed(0)
    a = RawLM(_raw(True, n_layer=1, transformers_version="4.0", torch_dtype="float32"))
    torch.manual_seed(0)
    b = RawLM(_raw(True, n_layer=1, transformers_version="5.0", torch_dtype="bfloat16"))
    b.config.dtype = "bfloat16"
    assert fingerprint(a) == fingerprint(b)
    b.config.n_layer = 2
    assert fingerprint(a) != fingerprint(b)


def test_the_search_classifier_reads_the_decoders_states():
    """What an attribute classifier reads from T5 (1 encoder layer, 3 decoder layers):
    the decoder's 3 layers' states and the embeddings', as a forward pass returns them."""
    from gencraft.search.classifier import state_dims

    model = build("t5")
    _observed(model)  # eager attention, so that the states below are returned
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        out = model(input_ids=ids, decoder_input_ids=ids, output_hidden_states=True)
    assert state_dims(model) == (len(out.decoder_hidden_states), 24, 24) == (4, 24, 24)
    assert state_dims(RawLM(_raw())) == (None, None, 4)  # sizes the config does not name
