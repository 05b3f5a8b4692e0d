"""Training and evaluating DASP variants on data-to-text (E2E, DART) and summarisation (XSum):
prefix-tuning (any :class:`~gencraft.prefix.PrefixConfig`) or full fine-tuning (optionally with
a sparse normaliser, the paper's control rows), through the shared :func:`gencraft.training.fit`
(accelerate, resumable).

Rows for a causal LM are ``source + SEPARATOR + target + EOS`` with the loss on the target
only (Li & Liang's GPT-2 format); an encoder-decoder reads the source and is trained on the
target. Generation continues ``source + SEPARATOR``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from gencraft.config import check, option
from gencraft.data.tasks import (
    Pair,
    pick_examples,
    references_of,
    source_of,
    task_examples,
    training_pairs,
)
from gencraft.errors import ConfigError
from gencraft.models.introspect import eos_ids, is_encoder_decoder, pad_id
from gencraft.models.persistence import load_saved_model
from gencraft.models.prompts import pad_batch
from gencraft.prefix.config import PrefixConfig
from gencraft.training import LoadedRun, save_run

SEPARATOR = "\nText:"
TASKS = ("e2e", "dart", "xsum")


@dataclass
class PrefixTrainConfig:
    """``gencraft prefix train``: what to train on and how (the prefix settings are the
    :class:`~gencraft.prefix.PrefixConfig` flags)."""

    model: str = option("smollm2-135m", "base model (registered name or local path)")
    task: Literal["e2e", "dart", "xsum"] = option("e2e", "dataset: e2e, dart (dev split) or xsum")
    method: Literal["prefix", "peft", "finetune"] = option(
        "prefix",
        "prefix-tuning (base frozen), the same through peft's PrefixTuning (same start), or "
        "full fine-tuning (all weights)",
    )
    lr: float = option(5e-5, "AdamW learning rate (paper: 5e-5)")
    epochs: int = option(10, "passes over the training pairs (paper: 10 for E2E/DART)")
    batch_size: int = option(16, "pairs per batch (paper: 16 data-to-text, 8 summarisation)")
    grad_accum: int = option(1, "batches per optimizer step")
    max_steps: int | None = option(None, "stop after this many optimizer steps")
    max_time: float | None = option(None, "stop after this many seconds")
    warmup: float = option(0.0, "linear warm-up (fraction of the steps), then linear decay")
    train_examples: int | None = option(None, "use the first N training pairs (after shuffle)")
    valid_examples: int = option(200, "validation pairs for the loss")
    max_source_tokens: int = option(256, "source tokens kept (summaries: the document's head)")
    max_target_tokens: int = option(64, "target tokens kept")
    seed: int = option(0, "seed of the shuffle, the prefix draws and SoftSA's noise")

    def __post_init__(self) -> None:
        check(self.task in TASKS, f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        check(
            self.method in ("prefix", "peft", "finetune"),
            f"method: prefix, peft or finetune, not {self.method}",
        )
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        for name in (
            "epochs",
            "batch_size",
            "grad_accum",
            "max_source_tokens",
            "max_target_tokens",
        ):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")


def encode_pairs(
    pairs: list[Pair], tokenizer: Any, model: nn.Module, cfg: PrefixTrainConfig
) -> list[dict[str, list[int]]]:
    """Token rows: causal LM ``input_ids``/``labels`` (-100 on the source), encoder-decoder
    ``input_ids`` and ``labels``."""
    eos = eos_ids(model)[0]
    rows = []
    for p in pairs:
        src = tokenizer(p.source, add_special_tokens=False)["input_ids"][: cfg.max_source_tokens]
        tgt = tokenizer(" " + p.target.strip(), add_special_tokens=False)["input_ids"]
        tgt = [*tgt[: cfg.max_target_tokens], eos]
        if is_encoder_decoder(model):
            rows.append({"input_ids": [*src, eos], "labels": tgt})
        else:
            sep = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
            rows.append({"input_ids": src + sep + tgt, "labels": [-100] * len(src + sep) + tgt})
    return rows


def collate_rows(rows: list[dict[str, list[int]]], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded training batch; encoder-decoder labels padded separately."""
    if "labels" in rows[0] and len(rows[0]["labels"]) != len(rows[0]["input_ids"]):
        enc = pad_batch([{"input_ids": r["input_ids"]} for r in rows], pad)
        lab = pad_batch([{"input_ids": r["labels"]} for r in rows], -100)["input_ids"]
        return {**enc, "labels": lab}
    return pad_batch(rows, pad)


def build_model(
    base: nn.Module, tokenizer: Any, prefix: PrefixConfig, method: str
) -> tuple[nn.Module, Any]:
    """(model to train, handle): a PrefixModel, or the base itself for fine-tuning (with
    :func:`~gencraft.prefix.sparse_attention` when the normaliser is not softmax)."""
    from gencraft.prefix.model import PrefixModel, sparse_attention

    if method == "prefix":
        return PrefixModel(base, prefix, tokenizer=tokenizer), None
    if method == "peft":
        return peft_prefix_model(base, prefix), None
    for p in base.parameters():
        p.requires_grad_(True)
    handle = sparse_attention(base, prefix) if prefix.normalizer != "softmax" else None
    return base, handle


def peft_prefix_model(base: nn.Module, prefix: PrefixConfig) -> nn.Module:
    """peft's prefix-tuning of ``base`` starting from the prefixes a dense ``PrefixModel``
    with the same settings starts from (so the two train alike); decoder-only models."""
    from peft import PrefixTuningConfig, TaskType, get_peft_model

    from gencraft.prefix.model import PrefixModel

    if is_encoder_decoder(base) or prefix.blocking or prefix.normalizer != "softmax":
        raise ConfigError("--method peft is dense prefix-tuning of a causal LM")
    start = PrefixModel(base, prefix)
    weights = {k: v.detach().clone() for k, v in start.prefix["decoder"].state_dict().items()}
    start.remove()
    model = get_peft_model(
        base,
        PrefixTuningConfig(
            task_type=TaskType.CAUSAL_LM,
            num_virtual_tokens=prefix.num_virtual_tokens,
            prefix_projection=prefix.prefix_projection,
            encoder_hidden_size=prefix.encoder_hidden_size,
        ),
    )
    model.prompt_encoder["default"].load_state_dict(weights)
    return model


def train(
    cfg: PrefixTrainConfig,
    prefix: PrefixConfig,
    output_dir: str | Path,
    *,
    data_dir: str | None = None,
    progress: bool = True,
    restart: bool = False,
) -> dict[str, Any]:
    """Train, keep ``best/`` (lowest validation loss) and ``last/``; returns the fit summary.
    A re-run with the same settings resumes from ``output_dir/checkpoint``."""
    from gencraft.models import load_model
    from gencraft.training import FitConfig, fit

    out = Path(output_dir)
    base, tok = load_model(cfg.model)
    torch.manual_seed(cfg.seed)
    train_pairs = training_pairs(cfg.task, "train", data_dir)
    order = torch.randperm(len(train_pairs), generator=torch.Generator().manual_seed(cfg.seed))
    train_pairs = [train_pairs[i] for i in order.tolist()]
    if cfg.train_examples:
        train_pairs = train_pairs[: cfg.train_examples]
    valid_pairs = training_pairs(cfg.task, "validation", data_dir)[: cfg.valid_examples]
    if prefix.decoder_segments > 1 and prefix.output_length is None:
        lengths = [len(tok(p.target)["input_ids"]) for p in train_pairs[:2000]]
        prefix.output_length = max(1, round(sum(lengths) / len(lengths)))
    model, _ = build_model(base, tok, prefix, cfg.method)
    train_rows = encode_pairs(train_pairs, tok, base, cfg)
    valid_rows = encode_pairs(valid_pairs, tok, base, cfg)
    pad = pad_id(base, tok)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return m(**batch).loss

    def save_fn(m: nn.Module, directory: Path) -> None:
        save_trained(m, directory, cfg, prefix, tok)

    fit_cfg = FitConfig(
        epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        max_time=cfg.max_time,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        warmup=cfg.warmup,
        seed=cfg.seed,
    )
    budget = ("epochs", "max_steps", "max_time")  # fit's own settings carry these (resumable)
    run = {k: v for k, v in asdict(cfg).items() if k not in budget}
    settings = {"train": run, "prefix": prefix.to_dict(), "pairs": len(train_rows)}
    start = time.time()
    result = fit(
        model,
        optimizer,
        train_rows,
        loss_fn=loss_fn,
        config=fit_cfg,
        output_dir=out,
        valid=valid_rows or None,
        collate_fn=lambda items: collate_rows(items, pad),
        save_fn=save_fn,
        settings=settings,
        progress=progress,
        restart=restart,
    )
    return result.write_summary(out, start, trainable_parameters=sum(p.numel() for p in params))


def save_trained(
    model: nn.Module, directory: Path, cfg: PrefixTrainConfig, prefix: Any, tokenizer: Any
) -> None:
    """One model directory of the run (:func:`gencraft.training.save_run`): the prefixes
    (a PrefixModel; peft's saved as the PrefixModel it equals) or the whole fine-tuned base."""
    from gencraft.prefix.model import PrefixModel

    model = getattr(model, "module", model)
    settings = {"train": asdict(cfg), "prefix": prefix.to_dict()}
    if hasattr(model, "peft_config"):
        as_prefix = PrefixModel.from_peft(model)
        save_run(directory, as_prefix, tokenizer, settings, base_name_or_path=cfg.model)
        as_prefix.remove()
    elif isinstance(model, PrefixModel):
        save_run(directory, model, tokenizer, settings, base_name_or_path=cfg.model)
    else:
        save_run(directory, model, tokenizer, settings)


def rebuild_finetuned(directory: Path, settings: dict[str, Any]) -> LoadedRun | None:
    """:func:`~gencraft.training.load_run`'s ``build`` for this package: a fine-tuned base
    gets its attention normaliser back (None for a prefix run, which loads as a method
    model)."""
    if settings.get("train", {}).get("method") != "finetune":
        return None
    from gencraft.models import load_model

    if (directory / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(directory)
    else:  # a run saved before the shared format: the named base's tokenizer
        tok = load_model(settings["train"]["model"])[1]
    saved = directory / "base" if (directory / "base").is_dir() else directory  # pre-format
    base = load_saved_model(saved)
    model, _ = build_model(base, tok, PrefixConfig(**settings["prefix"]), "finetune")
    return LoadedRun(model.eval(), tok, settings)


@torch.no_grad()
def generate_outputs(
    model: nn.Module,
    tokenizer: Any,
    sources: list[str],
    *,
    max_source_tokens: int = 256,
    max_new_tokens: int = 64,
    num_beams: int = 5,
    batch_size: int = 16,
    progress: bool = True,
    **generate_kw: Any,
) -> list[str]:
    """Outputs for ``sources`` (beam 5 as the paper); batches are left-padded for causal LMs."""
    base = getattr(model, "base", model)
    ed = is_encoder_decoder(base)
    eos = eos_ids(base)[0]
    pad = pad_id(base, tokenizer)
    sep = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    outs: list[str] = []
    chunks = [sources[i : i + batch_size] for i in range(0, len(sources), batch_size)]
    for chunk in tqdm(chunks, desc="generate", disable=not progress):
        rows = []
        for s in chunk:
            ids = tokenizer(s, add_special_tokens=False)["input_ids"][:max_source_tokens]
            rows.append({"input_ids": ids + ([eos] if ed else sep)})
        batch = pad_batch(rows, pad, left=not ed)
        seq = model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            pad_token_id=pad,
            eos_token_id=eos,
            **generate_kw,
        )
        if not ed:
            seq = seq[:, batch["input_ids"].shape[1] :]
        outs += [t.strip() for t in tokenizer.batch_decode(seq, skip_special_tokens=True)]
    return outs


def evaluate(
    model: nn.Module,
    tokenizer: Any,
    task: str,
    split: str = "test",
    *,
    data_dir: str | None = None,
    limit: int | None = None,
    spread: bool = False,
    num_beams: int = 5,
    max_source_tokens: int = 256,
    max_new_tokens: int | None = None,
    batch_size: int = 16,
    progress: bool = True,
) -> dict[str, Any]:
    """Generate for a task's split and score: data-to-text metrics (E2E/DART, all references)
    or ROUGE-1/2/L (XSum). ``limit`` inputs are the split's first ones, or with ``spread``
    ones evenly spaced over it (DART's test file is ordered by source corpus)."""
    examples = pick_examples(task_examples(task, split, data_dir), limit, spread)
    sources = [source_of(e) for e in examples]
    refs = [references_of(e) for e in examples]
    new = max_new_tokens or 64
    start = time.time()
    outputs = generate_outputs(
        model,
        tokenizer,
        sources,
        max_source_tokens=max_source_tokens,
        max_new_tokens=new,
        num_beams=num_beams,
        batch_size=batch_size,
        progress=progress,
    )
    seconds = time.time() - start
    from gencraft.metrics import score_task

    scores = score_task(task, outputs, refs)
    return {
        "task": task,
        "split": split,
        "examples": len(examples),
        "num_beams": num_beams,
        "max_new_tokens": new,
        "scores": scores,
        "generate_seconds": seconds,
        "outputs": outputs,
    }
