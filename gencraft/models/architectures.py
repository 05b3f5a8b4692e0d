"""Tiny random models of many ``transformers`` architectures, built from their config classes:
the test bed of the architecture matrix (``tests/test_architectures.py``) and a quick way to
try a method on a family before loading real weights::

    model = tiny_architecture("opt", vocab_size=16, seed=0)

Every model has 2 layers, hidden size 32, 4 attention heads (2 key/value heads where the
family has GQA), ids 0/1/2 as pad/BOS/EOS, and builds in milliseconds on a CPU. The global
torch RNG is left untouched. An architecture missing from the installed ``transformers``
raises :class:`~gencraft.errors.GencraftError`.
"""

from __future__ import annotations

from typing import Any

import torch

from gencraft.errors import GencraftError

#: name -> (config class, model class, config arguments); decoder-only causal LMs
DECODER_ONLY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_inner": 64}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8, "sliding_window": 4}),
    # the last layer full, as in Gemma-2 and in most of Gemma-3's layer pattern
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 8,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "falcon": ("FalconConfig", "FalconForCausalLM", {}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {}),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", {"rotary_dim": 4}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {"num_experts": 4, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32},
    ),
}

#: encoder-decoders (``bert2bert``: an ``EncoderDecoderModel`` of two BERTs)
ENCODER_DECODER: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bart": ("BartConfig", "BartForConditionalGeneration", {}),
    "t5": ("T5Config", "T5ForConditionalGeneration", {"decoder_start_token_id": 0}),
    "mt5": ("MT5Config", "MT5ForConditionalGeneration", {}),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", {}),
    "marian": ("MarianConfig", "MarianMTModel", {}),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", {}),
    "bert2bert": ("BertConfig", "EncoderDecoderModel", {}),
}

#: masked LMs (the NAR method's starting points)
MASKED_LM: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertConfig", "BertForMaskedLM", {}),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", {}),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM", {}),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", {"embedding_size": 16}),
    "deberta-v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", {}),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", {}),
}

ARCHITECTURES = {**DECODER_ONLY, **ENCODER_DECODER, **MASKED_LM}

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, POSITIONS = 32, 2, 4, 2, 64, 128
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

# every spelling of the sizes across the families' configs
_SIZES = {
    ("hidden_size", "d_model", "n_embd", "dim"): HIDDEN,
    (
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "num_decoder_layers",
        "encoder_layers",
        "decoder_layers",
    ): LAYERS,
    (
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
    ): HEADS,
    ("num_key_value_heads",): KV_HEADS,
    (
        "intermediate_size",
        "d_ff",
        "hidden_dim",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
    ): FFN,
    ("max_position_embeddings", "n_positions"): POSITIONS,
}


def _config(config_cls: type, vocab_size: int, extra: dict[str, Any]) -> Any:
    probe = config_cls()
    kw: dict[str, Any] = {"vocab_size": vocab_size, **SPECIAL}
    for names, value in _SIZES.items():
        for n in names:
            if hasattr(probe, n):
                kw[n] = value
    if hasattr(probe, "d_kv"):
        kw["d_kv"] = HIDDEN // HEADS
    if hasattr(probe, "decoder_start_token_id"):
        kw["decoder_start_token_id"] = SPECIAL["eos_token_id"]
    if hasattr(probe, "forced_eos_token_id"):
        kw["forced_eos_token_id"] = None
    # ModernBERT names its special ids separately
    for n in ("cls_token_id", "sep_token_id"):
        if hasattr(probe, n):
            kw[n] = SPECIAL["bos_token_id" if n == "cls_token_id" else "eos_token_id"]
    kw.update(extra)
    return config_cls(**kw)


def tiny_architecture(name: str, *, vocab_size: int = 64, seed: int = 0) -> Any:
    """A tiny random model of architecture ``name`` (a key of :data:`ARCHITECTURES`) in eval
    mode, its weights drawn from ``seed``."""
    import transformers

    if name not in ARCHITECTURES:
        raise GencraftError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    cfg_name, model_name, extra = ARCHITECTURES[name]
    cfg_cls = getattr(transformers, cfg_name, None)
    model_cls = getattr(transformers, model_name, None)
    if cfg_cls is None or model_cls is None:
        raise GencraftError(
            f"the installed transformers {transformers.__version__} has no {model_name}"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "bert2bert":
            enc = _config(cfg_cls, vocab_size, {})
            dec = _config(cfg_cls, vocab_size, {"is_decoder": True, "add_cross_attention": True})
            model = transformers.EncoderDecoderModel(
                encoder=transformers.BertModel(enc, add_pooling_layer=False),
                decoder=transformers.BertLMHeadModel(dec),
            )
            model.config.decoder_start_token_id = SPECIAL["bos_token_id"]
            model.config.pad_token_id = SPECIAL["pad_token_id"]
            model.config.eos_token_id = SPECIAL["eos_token_id"]
            model.config.vocab_size = vocab_size
        else:
            model = model_cls(_config(cfg_cls, vocab_size, extra))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id, gen.bos_token_id = SPECIAL["pad_token_id"], SPECIAL["bos_token_id"]
        gen.eos_token_id = SPECIAL["eos_token_id"]
        if model.config.is_encoder_decoder:
            gen.decoder_start_token_id = model.config.decoder_start_token_id
        for n in ("forced_eos_token_id", "forced_bos_token_id"):
            if getattr(gen, n, None) is not None:
                setattr(gen, n, None)
    return model.eval()
