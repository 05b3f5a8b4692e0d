"""RUM: one pretrained masked LM initialises both the encoder and the decoder of a
non-autoregressive encoder-decoder (Yoshida 2023, ch. 4).

The encoder is the MLM's transformer. The decoder is the same transformer (an unshared copy)
with its MLM head as the output layer, plus a cross-attention block per layer, which an MLM
never had. That block starts random (BERT's initialisation) or as a copy of the same layer's
self-attention (``cross_attention="copy"``). The thesis's own choice is lost with its chapter
body. The decoder has no causal mask: every position sees the whole target sequence, which is
what SUNDAE and Mask-Predict refine. A length predictor (a linear layer on the encoder's
masked mean) gives the target length's distribution.

The result is a ``transformers`` :class:`~transformers.EncoderDecoderModel` (the subclass
:class:`NARSeq2Seq`). Its ``forward(input_ids, attention_mask, decoder_input_ids,
decoder_attention_mask, labels)`` is unchanged: ``labels`` score the decoder's output at the
same positions, with no shift. It saves and loads with ``save_pretrained`` /
``from_pretrained``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import EncoderDecoderConfig, EncoderDecoderModel, PreTrainedModel

from gencraft.errors import GencraftError
from gencraft.models.method import FORMAT_VERSION, METHOD_CLASSES, METHOD_CONFIG, MethodModel
from gencraft.nar.config import ConvertConfig

_SCRATCH_SEED_OFFSET = 10_000


class NARSeq2Seq(EncoderDecoderModel, MethodModel):
    """An encoder-decoder made from a masked LM, with a target-length predictor.

    ``config.gencraft_nar`` holds the :class:`ConvertConfig` it was made with; with
    ``bidirectional`` the decoder attends to every target position.

    Of the :class:`~gencraft.models.method.MethodModel` contract it keeps ``save_pretrained``
    (``transformers``' files, plus ``method_config.json``), ``from_pretrained`` and
    ``method_config``. It is the converted network itself, not a wrapper: there is no base to
    switch back to, so ``disable`` and ``remove`` refuse, saying so.
    """

    method = "nar"

    def __init__(
        self,
        config: EncoderDecoderConfig | None = None,
        encoder: PreTrainedModel | None = None,
        decoder: PreTrainedModel | None = None,
    ) -> None:
        if config is not None:
            # a saved bidirectional decoder says is_decoder=False; BERT builds cross-attention
            # only for a decoder, so build as one and drop the causal mask after
            config.decoder.is_decoder = True
            config.decoder.add_cross_attention = True
        super().__init__(config=config, encoder=encoder, decoder=decoder)
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler = None  # unused (AutoModel adds one when loading)
        settings = ConvertConfig(**getattr(self.config, "gencraft_nar", {}))
        self.config.gencraft_nar = asdict(settings)
        self.length_head = nn.Linear(
            self.config.encoder.hidden_size, settings.max_target_length + 1
        )
        self.length_head.weight.data.normal_(0.0, self.config.encoder.initializer_range)
        self.length_head.bias.data.zero_()
        if settings.bidirectional:
            _drop_causal_mask(self.decoder)

    @property
    def nar_settings(self) -> ConvertConfig:
        return ConvertConfig(**self.config.gencraft_nar)

    # the method contract -------------------------------------------------------------------
    @property
    def method_config(self) -> ConvertConfig:
        return self.nar_settings

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> None:
        """``transformers``' ``config.json`` and ``model.safetensors``, and the shared
        ``method_config.json`` that names this class."""
        super().save_pretrained(save_directory, *args, **kwargs)
        (Path(save_directory) / METHOD_CONFIG).write_text(
            json.dumps(
                {
                    "method": self.method,
                    "class": type(self).__name__,
                    "format": FORMAT_VERSION,
                    "config": asdict(self.nar_settings),
                    "weights": "model.safetensors (transformers' format)",
                },
                indent=2,
            )
        )

    @classmethod
    def from_pretrained(cls, directory: str | Path, base: Any = None, **kwargs: Any) -> Any:
        if base is not None:
            raise GencraftError("a NARSeq2Seq holds its whole network: it takes no base=")
        from gencraft.models.method import place

        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        return place(super().from_pretrained(directory, **kwargs), device, dtype)

    def use_tokenizer(self, tokenizer: Any) -> Any:
        configure_special_ids(self, tokenizer)
        return tokenizer

    def _set_enabled(self, on: bool) -> None:
        if not on:
            raise GencraftError(
                "a NARSeq2Seq is the masked LM converted and trained as a whole: there is no "
                "base model to switch back to"
            )

    def remove(self) -> nn.Module:
        raise GencraftError(
            "a NARSeq2Seq is the converted model itself, not a wrapper: load the masked LM by "
            "its name for the untouched original"
        )

    @property
    def max_target_length(self) -> int:
        """The longest target: the length head's range, within the decoder's positions."""
        positions = getattr(self.config.decoder, "max_position_embeddings", None) or 10**9
        return min(self.nar_settings.max_target_length, positions)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """``transformers``' autoregressive ``generate``, for a causal decoder only: a
        bidirectional decoder decodes with :func:`~gencraft.nar.decoding.sundae_generate` or
        :func:`~gencraft.nar.decoding.mask_predict_generate`."""
        if self.nar_settings.bidirectional:
            raise GencraftError(
                "this decoder is bidirectional (non-autoregressive): decode with "
                "gencraft.nar.decoding.sundae_generate or mask_predict_generate, not generate()"
            )
        return super().generate(*args, **kwargs)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        """The encoder's output for ``input_ids`` [B, S]."""
        return self.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask, return_dict=True
        )

    def length_logits(
        self, encoder_hidden: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, max_target_length + 1]: scores of target lengths 0..max from the encoder's
        states ``encoder_hidden`` [B, S, H] (masked mean over the source; length 0 is never
        a training target but keeps index = length)."""
        if attention_mask is None:
            pooled = encoder_hidden.mean(1)
        else:
            m = attention_mask.to(encoder_hidden.dtype).unsqueeze(-1)
            pooled = (encoder_hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
        return self.length_head(pooled)

    def decode_logits(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, L, V]: the decoder's scores for every position of ``decoder_input_ids`` [B, L]
        given the encoder's states [B, S, H] (one model call)."""
        out = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_hidden,
            encoder_attention_mask=attention_mask,
            use_cache=False,
            return_dict=True,
        )
        return out.logits


METHOD_CLASSES[NARSeq2Seq.__name__] = NARSeq2Seq  # transformers' __init_subclass__ runs first


def _drop_causal_mask(decoder: nn.Module) -> None:
    """Make a BERT decoder bidirectional: its mask builder and its attention modules
    (``is_causal``, which sdpa reads when no mask is passed) stop being causal."""
    for module in decoder.modules():
        config = getattr(module, "config", None)
        if config is not None:  # the decoder's and its body's configs may be two objects
            config.is_decoder = False  # BertModel then builds a bidirectional mask, no cache
        if hasattr(module, "is_causal"):
            module.is_causal = False


def _mlm(name_or_model: str | nn.Module, seed: int) -> tuple[nn.Module, Any]:
    """(masked LM, its tokenizer or None for a model passed in)."""
    if isinstance(name_or_model, str):
        from gencraft.models import load_model

        try:
            return load_model(name_or_model, task="masked-lm", seed=seed)
        except GencraftError as err:
            raise GencraftError(f"cannot use {name_or_model!r} as a masked LM: {err}") from err
    if not isinstance(name_or_model, nn.Module):
        raise GencraftError(
            f"expected a masked-LM name or model, got {type(name_or_model).__name__}"
        )
    return name_or_model, None


def mlm_to_seq2seq(
    name_or_model: str | nn.Module,
    *,
    seed: int = 0,
    cross_attention: str = "random",
    pretrained: bool = True,
    bidirectional: bool = True,
    max_target_length: int = 128,
) -> NARSeq2Seq:
    """A :class:`NARSeq2Seq` whose encoder and decoder both start from one masked LM.

    Args:
        name_or_model: a registered masked LM (``tiny-bert``, ``minilm-l6``), a path or hub id
            of one, or a masked-LM model of a family in :data:`SUPPORTED_MLMS` (BERT,
            RoBERTa and CodeBERT, XLM-R, CamemBERT, ELECTRA); others are refused by name.
        seed: seeds the MLM's load (``load_model(name, task="masked-lm", seed=seed)``: the
            same weights) and then the new parameters (cross-attention, length head).
        cross_attention: ``"random"`` or ``"copy"`` (from each layer's self-attention).
        pretrained: False keeps the shapes and draws every weight at random, the encoder
            and decoder independently, from seed + 10000 (the thesis's SUNDAE-from-scratch
            baseline).
        bidirectional: False keeps the decoder causal (the autoregressive BERT2BERT baseline).
        max_target_length: the length predictor's range.
    """
    settings = ConvertConfig(cross_attention, pretrained, bidirectional, max_target_length)
    return _convert(_mlm(name_or_model, seed)[0], seed, settings)


def load_mlm_seq2seq(
    name: str, *, seed: int = 0, device: Any = None, dtype: Any = None, **convert: Any
) -> tuple[NARSeq2Seq, Any]:
    """(:func:`mlm_to_seq2seq` model, its tokenizer) with the special ids set from the
    tokenizer ([CLS] starts an autoregressive decoder, [SEP] ends it), on ``device`` in
    ``dtype`` (:func:`gencraft.models.method.place`)."""
    from gencraft.models.method import place

    mlm, tok = _mlm(name, seed)
    model = _convert(mlm, seed, ConvertConfig(**convert))
    return place(configure_special_ids(model, tok), device, dtype), tok


def _nar_classes(mlm: nn.Module) -> tuple[type, type, str]:
    """(body class, decoder class with cross-attention, body attribute) for a masked LM, or a
    GencraftError naming the architecture and why it cannot be converted."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    config = getattr(mlm, "config", None)
    kind = getattr(config, "model_type", None)
    arch = f"{type(mlm).__name__} ({kind})" if kind else type(mlm).__name__
    if config is None or kind is None:
        raise GencraftError(f"{arch} is not a transformers masked LM: mlm_to_seq2seq needs one")
    masked = set(MODEL_FOR_MASKED_LM_MAPPING_NAMES.values())
    if (
        getattr(config, "is_encoder_decoder", False)
        or getattr(config, "is_decoder", False)
        or type(mlm).__name__ not in masked
    ):
        raise GencraftError(
            f"{arch} is not supported by mlm_to_seq2seq: it is not a masked LM (a "
            "*ForMaskedLM model with its MLM head)"
        )
    prefix = getattr(mlm, "base_model_prefix", "")
    body_name, dec_name = MODEL_MAPPING_NAMES.get(kind), MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind)
    if not prefix or not isinstance(getattr(mlm, prefix, None), nn.Module):
        raise GencraftError(
            f"{arch} is not supported by mlm_to_seq2seq: it has no transformer body "
            f"(.{prefix or 'base_model_prefix'}) beside its MLM head"
        )
    if body_name is None or dec_name is None:
        raise GencraftError(
            f"{arch} is not supported by mlm_to_seq2seq: transformers has no decoder form of "
            f"{kind} (a causal-LM class that takes cross-attention), which the NAR decoder is "
            f"built from; supported: {', '.join(SUPPORTED_MLMS)}"
        )
    return getattr(transformers, body_name), getattr(transformers, dec_name), prefix


#: masked-LM families mlm_to_seq2seq converts (a BERT-style body whose causal-LM class
#: takes ``add_cross_attention``); others are refused by name
SUPPORTED_MLMS = ("bert", "roberta", "xlm-roberta", "camembert", "electra")


def _convert(mlm: nn.Module, seed: int, settings: ConvertConfig) -> NARSeq2Seq:
    body_cls, dec_cls, prefix = _nar_classes(mlm)
    config = mlm.config
    arch = f"{type(mlm).__name__} ({config.model_type})"
    with torch.random.fork_rng(devices=[]):
        # from scratch: another stream than the seed's (a tiny MLM is itself drawn from it)
        torch.manual_seed(seed if settings.pretrained else seed + _SCRATCH_SEED_OFFSET)
        enc_config = copy.deepcopy(config)
        dec_config = copy.deepcopy(config)
        dec_config.is_decoder, dec_config.add_cross_attention = True, True
        try:
            encoder = body_cls(enc_config, add_pooling_layer=False)
        except TypeError:  # bodies without a pooler (ELECTRA)
            encoder = body_cls(enc_config)
        decoder = dec_cls(dec_config)
        if getattr(decoder, "base_model_prefix", None) != prefix or not any(
            "crossattention" in k for k in decoder.state_dict()
        ):
            raise GencraftError(
                f"{arch} is not supported by mlm_to_seq2seq: its decoder form "
                f"{dec_cls.__name__} builds no cross-attention blocks"
            )
        if settings.pretrained:  # from scratch, the two stacks keep their own random draws
            encoder.load_state_dict(getattr(mlm, prefix).state_dict())
            missing, unexpected = decoder.load_state_dict(mlm.state_dict(), strict=False)
            if unexpected or any("crossattention" not in k for k in missing):
                raise GencraftError(
                    f"{arch}: unexpected MLM layout: missing {missing}, unexpected {unexpected}"
                )
        ed_config = EncoderDecoderConfig.from_encoder_decoder_configs(enc_config, dec_config)
        ed_config.gencraft_nar = asdict(settings)
        model = NARSeq2Seq(ed_config, encoder=encoder, decoder=decoder)
    if settings.cross_attention == "copy":
        for layer in getattr(model.decoder, prefix).encoder.layer:
            layer.crossattention.load_state_dict(layer.attention.state_dict())
    model.tie_weights()
    _set_special_ids(model, mlm)
    return model.eval()


def _set_special_ids(model: NARSeq2Seq, mlm: nn.Module) -> None:
    cfg = mlm.config
    start = cfg.bos_token_id if cfg.bos_token_id is not None else cfg.pad_token_id
    for c in (model.config, model.generation_config):
        c.pad_token_id = cfg.pad_token_id
        c.decoder_start_token_id = start
        c.eos_token_id = cfg.eos_token_id


def target_token_ids(tokenizer: Any) -> dict[str, int]:
    """The ids a model uses around its targets: ``start`` (the autoregressive decoder's first
    input, [CLS]), ``end`` (its EOS, [SEP]), ``pad`` and ``mask``."""
    ids = {
        "start": tokenizer.cls_token_id
        if tokenizer.cls_token_id is not None
        else tokenizer.bos_token_id,
        "end": tokenizer.sep_token_id
        if tokenizer.sep_token_id is not None
        else tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
        "mask": tokenizer.mask_token_id,
    }
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise GencraftError(f"the tokenizer has no {', '.join(missing)} token")
    return ids


def configure_special_ids(model: NARSeq2Seq, tokenizer: Any) -> NARSeq2Seq:
    """Point the model's generation config at the tokenizer's [CLS]/[SEP]/[PAD]."""
    ids = target_token_ids(tokenizer)
    for c in (model.config, model.generation_config):
        c.decoder_start_token_id, c.eos_token_id, c.pad_token_id = (
            ids["start"],
            ids["end"],
            ids["pad"],
        )
    return model
