"""Tiny randomly initialised models and a shared byte-level tokenizer, for tests and CPU demos.

Every tiny model shares one tokenizer: byte-level BPE with no merges (each UTF-8 byte is a
token) plus five special tokens, so any text round-trips and nothing needs downloading.
Models build in milliseconds and are seeded, so two builds with one seed are identical.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForMaskedLM,
    BertLMHeadModel,
    BertModel,
    EncoderDecoderModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = range(len(SPECIAL_TOKENS))
TINY_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

# Small enough to build and run in milliseconds, large enough to exercise GQA, multi-head
# reshapes and cross-attention.
HIDDEN, LAYERS, HEADS, FFN, MAX_POS = 32, 2, 4, 64, 512


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer shared by all tiny models (vocab size ``TINY_VOCAB_SIZE`` = 261).

    ids 0..4 are ``<pad> <s> </s> <unk> <mask>``; ids 5..260 are the 256 bytes. No special
    tokens are added on encode, so ``tok(text).input_ids`` is exactly the bytes of ``text``.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        cls_token="<s>",
        sep_token="</s>",
    )


_SPECIAL_IDS = {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}


def _tiny_llama() -> PreTrainedModel:
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,
        max_position_embeddings=MAX_POS,
        tie_word_embeddings=True,
        **_SPECIAL_IDS,
    )
    return LlamaForCausalLM(cfg)


def _tiny_gpt2() -> PreTrainedModel:
    cfg = GPT2Config(
        vocab_size=TINY_VOCAB_SIZE,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=FFN,
        n_positions=MAX_POS,
        **_SPECIAL_IDS,
    )
    return GPT2LMHeadModel(cfg)


def _tiny_bart() -> PreTrainedModel:
    cfg = BartConfig(
        vocab_size=TINY_VOCAB_SIZE,
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_position_embeddings=MAX_POS,
        decoder_start_token_id=EOS_ID,
        forced_eos_token_id=None,
        **_SPECIAL_IDS,
    )
    return BartForConditionalGeneration(cfg)


def _tiny_t5() -> PreTrainedModel:
    cfg = T5Config(
        vocab_size=TINY_VOCAB_SIZE,
        d_model=HIDDEN,
        d_kv=HIDDEN // HEADS,
        d_ff=FFN,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=PAD_ID,
    )
    return T5ForConditionalGeneration(cfg)


def _bert_config(**kw: object) -> BertConfig:
    return BertConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=MAX_POS,
        **_SPECIAL_IDS,
        **kw,
    )


def _tiny_bert2bert() -> PreTrainedModel:
    encoder = BertModel(_bert_config(), add_pooling_layer=False)
    decoder = BertLMHeadModel(_bert_config(is_decoder=True, add_cross_attention=True))
    model = EncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id = BOS_ID
    model.config.pad_token_id = PAD_ID
    model.config.eos_token_id = EOS_ID
    model.config.vocab_size = TINY_VOCAB_SIZE
    return model


def _tiny_bert() -> PreTrainedModel:
    # the output layer is tied to the word embeddings (BERT's default)
    return BertForMaskedLM(_bert_config())


TINY_BUILDERS: dict[str, Callable[[], PreTrainedModel]] = {
    "tiny-llama": _tiny_llama,
    "tiny-gpt2": _tiny_gpt2,
    "tiny-bart": _tiny_bart,
    "tiny-t5": _tiny_t5,
    "tiny-bert2bert": _tiny_bert2bert,
    "tiny-bert": _tiny_bert,
}


def build_tiny_model(name: str, seed: int = 0) -> PreTrainedModel:
    """Build tiny model ``name`` (a key of ``TINY_BUILDERS``) with weights drawn from ``seed``.

    The global torch RNG is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TINY_BUILDERS[name]()
    gen = getattr(model, "generation_config", None)
    if gen is None:  # a masked LM does not generate
        return model.eval()
    gen.pad_token_id = PAD_ID
    gen.eos_token_id = EOS_ID
    gen.bos_token_id = BOS_ID
    if model.config.is_encoder_decoder:
        gen.decoder_start_token_id = model.config.decoder_start_token_id
    return model.eval()
