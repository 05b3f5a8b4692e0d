"""Behaviours a held-out list of plausible bugs found unguarded, each tested
against a reference over drawn cases where one exists: layer indices, position limits, model
shapes and special ids, tiny models' seeds, damaged files, resumable settings, fractional
epochs, and an export that shares its submodule's name."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError

FAST = settings(max_examples=30, deadline=None)


# -- layer indices: -n <= i < n, never wrapped from n to 0 ------------------------------------
@FAST
@given(n=st.integers(1, 6), picks=st.lists(st.integers(-13, 13), min_size=1, max_size=4))
def test_prefix_layer_sets_accept_exactly_the_python_indices(n, picks):
    from gencraft.errors import ConfigError
    from gencraft.prefix.config import resolve_layers

    if all(-n <= i < n for i in picks):
        assert resolve_layers(picks, n) == sorted({range(n)[i] for i in picks})
    else:
        with pytest.raises(ConfigError, match="out of range"):
            resolve_layers(picks, n)


@pytest.fixture(scope="module")
def llama():
    from gencraft.models import load_model

    return load_model("tiny-llama")[0]


@settings(max_examples=20, deadline=None)
@given(picks=st.lists(st.integers(-5, 5), min_size=1, max_size=3))
def test_attention_sites_by_layer_index(llama, picks):
    from gencraft.models.attention import select_sites

    n = llama.config.num_hidden_layers
    if all(-n <= i < n for i in picks):
        got = [s.layer for s, _ in select_sites(llama, layers=picks)]
        assert got == sorted({range(n)[i] for i in picks})
    else:
        with pytest.raises(GencraftError, match="out of range"):
            select_sites(llama, layers=picks)


@pytest.mark.parametrize("layer", [-1, "n"])
def test_recurrence_refuses_an_insert_layer_past_the_last(llama, layer):
    from gencraft.errors import ConfigError
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM

    n = llama.config.num_hidden_layers
    if layer == "n":
        with pytest.raises(ConfigError, match=f"in \\[0, {n}\\)"):
            RecurrentLM(llama, RecurrenceConfig(window=8, insert_layer=n))
    else:
        RecurrentLM(llama, RecurrenceConfig(window=8, insert_layer=n - 1))


# -- windowed_nll at and around the position limit --------------------------------------------
@pytest.fixture(scope="module")
def short_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=40, n_positions=12, n_embd=16, n_layer=1, n_head=2)
    return GPT2LMHeadModel(cfg).eval()


@FAST
@given(n=st.integers(2, 30), delta=st.integers(-3, 3), seed=st.integers(0, 2**16))
def test_windowed_nll_at_the_position_limit(short_gpt2, n, delta, seed):
    from gencraft.errors import ConfigError
    from gencraft.metrics import windowed_nll

    positions = short_gpt2.config.n_positions
    window = max(1, positions + delta)
    ids = torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(seed))
    fed = min(window, n - 1)  # the tokens one pass actually takes
    if fed > positions:
        with pytest.raises(ConfigError, match="positions"):
            windowed_nll(short_gpt2, ids, window=window)
        return
    got = windowed_nll(short_gpt2, ids, window=window)
    if n - 1 <= window:  # one window: the plain forward's NLL
        with torch.no_grad():
            logits = short_gpt2(input_ids=ids[None, :-1]).logits[0]
        want = torch.nn.functional.cross_entropy(logits.double(), ids[1:], reduction="none")
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert got.shape == (n - 1,) and bool(torch.isfinite(got).all())


# -- model shapes and special ids --------------------------------------------------------------
@FAST
@given(heads=st.sampled_from([1, 2, 4]), head_dim=st.sampled_from([4, 8, 12]), kv=st.booleans())
def test_model_shape_reads_head_dim_from_the_config(heads, head_dim, kv):
    from transformers import LlamaConfig, LlamaForCausalLM

    from gencraft.models.introspect import model_shape

    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=1 if kv else heads,
        head_dim=head_dim,  # not hidden / heads
        max_position_embeddings=32,
    )
    shape = model_shape(LlamaForCausalLM(cfg))
    assert (shape.heads, shape.head_dim, shape.kv_heads) == (heads, head_dim, 1 if kv else heads)


@FAST
@given(config_eos=st.integers(0, 20), generation_eos=st.one_of(st.none(), st.integers(0, 20)))
def test_eos_ids_prefer_the_generation_config(llama, config_eos, generation_eos):
    from gencraft.models.introspect import eos_ids

    old = (llama.config.eos_token_id, llama.generation_config.eos_token_id)
    try:
        llama.config.eos_token_id = config_eos
        llama.generation_config.eos_token_id = generation_eos
        want = config_eos if generation_eos is None else generation_eos
        assert eos_ids(llama) == [want]
        assert eos_ids(llama, [7, 8]) == [7, 8]  # given ids win
    finally:
        llama.config.eos_token_id, llama.generation_config.eos_token_id = old


@pytest.mark.parametrize("name", ["llama", "bart", "t5", "bert2bert"])
def test_tiny_architectures_differ_by_seed_and_pin_the_decoder_start(name):
    from gencraft.models.architectures import SPECIAL, tiny_architecture

    a, b = tiny_architecture(name, seed=0), tiny_architecture(name, seed=1)
    same = tiny_architecture(name, seed=0)
    wa, wb = a.get_input_embeddings().weight, b.get_input_embeddings().weight
    assert not torch.equal(wa, wb)
    assert torch.equal(wa, same.get_input_embeddings().weight)
    if a.config.is_encoder_decoder:
        assert a.config.decoder_start_token_id is not None
        assert a.config.decoder_start_token_id in SPECIAL.values()


# -- damaged files, resumable settings, fractional epochs ---------------------------------------
@pytest.mark.parametrize("damaged", ["tokenizer_config.json", "method_config.json"])
def test_a_damaged_json_file_of_a_run_is_one_line(tmp_path, damaged, capsys):
    from gencraft.cli.main import main
    from gencraft.models import load_model
    from gencraft.prefix import PrefixConfig, PrefixModel
    from gencraft.training import save_run

    base, tok = load_model("tiny-llama")
    run = tmp_path / "run"
    settings_ = {"train": {"model": "tiny-llama", "task": "e2e", "max_source_tokens": 32}}
    save_run(run, PrefixModel(base, PrefixConfig(num_virtual_tokens=2)), tok, settings_)
    path = run / damaged
    path.write_text(path.read_text()[:20])
    assert main(["prefix", "generate", str(run), "--source", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and damaged in err[0] and "damaged or truncated" in err[0]


def _fit(tmp_path, **cfg):
    from gencraft.training import FitConfig, fit

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    data = [torch.randn(2) for _ in range(8)]

    def loss_fn(m, batch):
        return m(batch).pow(2).mean()

    return fit(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        loss_fn=loss_fn,
        config=FitConfig(**cfg),
        valid=data[:2],
        output_dir=tmp_path / "run",
        save_fn=lambda m, d: torch.save(m.state_dict(), d / "m.pt"),
        progress=False,
    )


def test_a_resume_may_change_how_often_it_saves_and_where(tmp_path):
    _fit(tmp_path, batch_size=2, max_steps=1, save_every=300.0)
    r = _fit(tmp_path, batch_size=2, max_steps=2, save_every=5.0, device="cpu")
    assert r.steps == 2 and r.resumed


@FAST
@given(batches=st.integers(2, 8), every=st.integers(1, 3))
def test_mid_epoch_history_rows_have_fractional_epochs(tmp_path_factory, batches, every):
    tmp = tmp_path_factory.mktemp("fit")
    r = _fit(tmp, batch_size=8 // batches if 8 % batches == 0 else 1, eval_every=every, epochs=1)
    per_epoch = 8 // (8 // batches if 8 % batches == 0 else 1)
    for row in r.history:
        assert row["epoch"] == pytest.approx(round(row["step"] / per_epoch, 4))


def test_save_every_counts_seconds(tmp_path, monkeypatch):
    """A checkpoint is written once ``save_every`` seconds have passed, however few steps."""
    import importlib

    fit_module = importlib.import_module("gencraft.training.fit")  # the module, not fit()
    clock = iter(float(i) * 10.0 for i in range(10_000))  # each reading: 10 s later
    monkeypatch.setattr(fit_module, "_now", lambda: next(clock))
    saves = []
    cls = fit_module._Loop
    real = cls.save_checkpoint

    def counted(self):
        saves.append(self.st.step)
        real(self)

    monkeypatch.setattr(cls, "save_checkpoint", counted)
    _fit(tmp_path, batch_size=2, epochs=1, save_every=15.0, eval_every=100)
    periodic = [s for s in saves[:-1] if 0 < s < 4]  # before the end-of-run saves
    assert periodic, saves  # every step is 10+ s apart here: 15 s passes within the epoch


def test_an_export_keeps_its_name_after_its_submodule_is_imported():
    import importlib

    import gencraft.pointer as pointer

    importlib.import_module("gencraft.pointer.evaluate")
    assert callable(pointer.evaluate) and pointer.evaluate.__name__ == "evaluate"


# -- attention discovery: a refusal at construction that names the model ------------------------
@pytest.mark.parametrize("multi_query", [True, False])
def test_a_fused_multi_query_projection_is_refused_by_name(multi_query):
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    from gencraft.recurrence import RecurrenceConfig, RecurrentLM

    torch.manual_seed(0)
    cfg = GPTBigCodeConfig(
        vocab_size=32,
        n_embd=16,
        n_layer=2,
        n_head=4,
        n_positions=32,
        multi_query=multi_query,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = GPTBigCodeForCausalLM(cfg).eval()
    if multi_query:
        with pytest.raises(GencraftError) as err:
            RecurrentLM(model, RecurrenceConfig(window=8))
        assert "GPTBigCodeForCausalLM (gpt_bigcode)" in str(err.value)
        assert "multi-query" in str(err.value)
    else:  # the same class with separate heads attaches and runs
        rec = RecurrentLM(model, RecurrenceConfig(window=8)).eval()
        with torch.no_grad():
            assert torch.isfinite(rec(torch.randint(3, 32, (1, 20))).loss)


def test_no_site_in_a_stack_names_the_architecture(llama):
    from gencraft.models.attention import AttentionPlugin, attach

    with pytest.raises(GencraftError, match=r"LlamaForCausalLM \(llama\): no cross-attention"):
        attach(llama, AttentionPlugin(), kind="cross")


# -- NAR conversions ---------------------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(wanted=st.integers(1, 1200))
def test_nar_max_target_length_is_capped_by_the_decoder_positions(wanted):
    from gencraft.nar import mlm_to_seq2seq

    model = mlm_to_seq2seq("tiny-bert", seed=0, max_target_length=wanted)
    positions = model.config.decoder.max_position_embeddings
    assert model.max_target_length == min(wanted, positions)


@pytest.mark.parametrize(("cls", "bos", "pad"), [("Roberta", 0, 1), ("Electra", None, 0)])
def test_nar_decoder_start_is_the_mlms_bos_where_it_has_one(cls, bos, pad):
    import transformers

    from gencraft.nar import mlm_to_seq2seq

    cfg = getattr(transformers, f"{cls}Config")(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
        bos_token_id=bos,
        pad_token_id=pad,
        eos_token_id=2,
        **({"embedding_size": 16} if cls == "Electra" else {}),
    )
    torch.manual_seed(0)
    mlm = getattr(transformers, f"{cls}ForMaskedLM")(cfg).eval()
    model = mlm_to_seq2seq(mlm, seed=0)
    want = bos if bos is not None else pad
    assert model.config.decoder_start_token_id == want
    assert model.generation_config.decoder_start_token_id == want


@pytest.fixture(scope="module")
def short_models():
    from transformers import BartConfig, BartForConditionalGeneration, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=40,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
        )
    ).eval()
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=40,
            n_positions=16,
            n_embd=16,
            n_layer=1,
            n_head=2,
            bos_token_id=1,
            eos_token_id=2,
        )
    ).eval()
    return {"bart": bart, "gpt2": gpt2}


@FAST
@given(kind=st.sampled_from(["bart", "gpt2"]), prompt=st.integers(1, 16), new=st.integers(1, 20))
def test_the_stepper_counts_what_each_stack_holds(short_models, kind, prompt, new):
    """A decoder-only model holds prompt + new tokens; an encoder-decoder's decoder holds its
    start token + new tokens, whatever the source's length (the encoder holds that)."""
    from gencraft.models.stepping import HFStepper

    model = short_models[kind]
    ids = torch.randint(3, 40, (1, prompt))
    need = 1 + new if kind == "bart" else prompt + new
    if need <= 16:
        HFStepper(model, ids, max_new_tokens=new)
    else:
        with pytest.raises(GencraftError, match="exceeds the model's context of 16"):
            HFStepper(model, ids, max_new_tokens=new)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gemma3_text", "qwen2", "olmo2"])
def test_fame_reads_the_last_decoder_layer_that_sees_the_whole_source(name):
    """A sliding-window last layer (Gemma-2/3) is passed over for the last full-attention
    one; elsewhere FAME reads the last layer."""
    from gencraft.focus.capture import find_attention_module
    from gencraft.models.architectures import tiny_architecture
    from gencraft.models.attention import attention_sites

    model = tiny_architecture(name)
    sites = [(s, m) for s, m in attention_sites(model) if s.kind == "self" and s.stack == "decoder"]
    full = [s.name for s, m in sites if not getattr(m, "sliding_window", None)]
    got, module = find_attention_module(model, "self")
    assert got == full[-1] and not getattr(module, "sliding_window", None)
    if name.startswith("gemma"):
        assert getattr(sites[-1][1], "sliding_window", None) or got == sites[-1][0].name


def test_olmo2_post_norm_blocks_give_h_prev_no_input_norm():
    from gencraft.models.architectures import tiny_architecture
    from gencraft.models.attention import input_norm, select_sites

    for name, post in (("olmo2", True), ("llama", False)):
        model = tiny_architecture(name)
        site, _ = select_sites(model, kind="self", layers=[0])[0]
        assert isinstance(input_norm(model, site), torch.nn.Identity) == post


@pytest.mark.parametrize("types", [("full", "full", "sliding"), ("sliding", "sliding", "sliding")])
def test_fame_passes_over_a_sliding_last_layer_or_refuses(types):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from gencraft.focus.capture import find_attention_module

    cfg = Gemma2Config(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
        layer_types=[f"{t}_attention" for t in types],
    )
    model = Gemma2ForCausalLM(cfg)
    if "full" in types:
        assert find_attention_module(model, "self")[0] == "model.layers.1.self_attn"
    else:
        with pytest.raises(GencraftError, match=r"Gemma2ForCausalLM \(gemma2\) is not supported"):
            find_attention_module(model, "self")


def test_a_plugin_on_both_stacks_still_refuses_when_its_decoder_bypasses_the_dispatcher():
    """``generate`` runs the encoder once, then the decoder with ``encoder_outputs``: the
    guard must still check the decoder's modules, not skip the check as for an encoder-only
    plug-in."""
    from gencraft.models.attention import AttentionPlugin, attach
    from gencraft.models.tiny import build_tiny_model

    model = build_tiny_model("tiny-bart", 0)
    ids = torch.tensor([[5, 6, 7, 2]])
    with torch.no_grad():
        enc = model.get_encoder()(input_ids=ids)
    for layer in model.model.decoder.layers:  # a decoder whose attention skips the registry
        layer.self_attn.forward = lambda hidden_states, *a, **k: (hidden_states, None)
    handle = attach(model, AttentionPlugin(), kind="self", stack="any")
    with pytest.raises(
        GencraftError, match=r"BartForConditionalGeneration \(bart\) is not supported"
    ):
        model(encoder_outputs=enc, decoder_input_ids=torch.tensor([[2, 5]]))
    handle.remove()
