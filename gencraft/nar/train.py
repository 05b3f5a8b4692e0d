"""Training and evaluating RUM-SUNDAE, SUNDAE from scratch, Mask-Predict and the
autoregressive BERT2BERT baseline on a seq2seq task, through the shared :func:`fit`
(``accelerate``, resumable).

Presets (``--preset``) follow Appendix A of the thesis. A pretrained start uses no weight decay
and no label smoothing, so as not to damage what the MLM learned. A random start (``scratch``)
uses weight decay 0.01 and label smoothing 0.1, a common transformer recipe; the thesis
follows Savinov et al. there, and their values are not in the thesis text. Both use AdamW with
linear warm-up and decay.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from gencraft.config import check, option
from gencraft.data.tasks import pick_examples, references_of, source_of, task_examples
from gencraft.errors import ConfigError, GencraftError
from gencraft.nar.config import ConvertConfig, ObjectiveConfig, SamplingConfig
from gencraft.nar.decoding import (
    NAROutput,
    autoregressive_generate,
    mask_predict_generate,
    sundae_generate,
)
from gencraft.nar.model import NARSeq2Seq, load_mlm_seq2seq, target_token_ids
from gencraft.nar.objectives import collate, make_loss, noise_ids

NAR_TASKS = ("e2e", "webnlg", "dart")
PRESETS: dict[str, dict[str, float]] = {
    "pretrained": {"lr": 1e-4, "weight_decay": 0.0, "label_smoothing": 0.0},
    "scratch": {"lr": 5e-4, "weight_decay": 0.01, "label_smoothing": 0.1},
}


@dataclass
class NARTrainConfig:
    """``gencraft nar train``: the data and the optimisation (with the
    :class:`ConvertConfig` and :class:`ObjectiveConfig` flags)."""

    model: str = option("minilm-l6", "the masked LM (registered name or local path)")
    task: Literal["e2e", "webnlg", "dart"] = option("e2e", "seq2seq task: e2e, webnlg or dart")
    preset: Literal["auto", "pretrained", "scratch"] = option(
        "auto", "Appendix A's settings: auto picks pretrained or scratch by --pretrained"
    )
    lr: float | None = option(None, "AdamW learning rate (default: the preset's)")
    weight_decay: float | None = option(None, "AdamW weight decay (default: the preset's)")
    batch_size: int = option(32, "pairs per batch")
    grad_accum: int = option(1, "batches per optimizer step")
    epochs: int = option(1, "passes over the training pairs")
    max_steps: int | None = option(None, "stop after this many optimizer steps")
    max_time: float | None = option(None, "stop after this many seconds")
    warmup: float = option(0.05, "linear warm-up (a fraction of the steps below 1), then decay")
    eval_every: int | None = option(None, "validate every N steps (default: each epoch)")
    train_examples: int | None = option(None, "the first N training pairs")
    valid_examples: int = option(256, "validation pairs for the loss")
    max_source_tokens: int = option(128, "source tokens kept")
    seed: int = option(0, "seed of the initialisation, the shuffle and the corruption")

    def __post_init__(self) -> None:
        check(self.task in NAR_TASKS, f"task must be one of {NAR_TASKS}, got {self.task!r}")
        check(self.preset in ("auto", *PRESETS), f"unknown preset {self.preset!r}")
        check(self.lr is None or self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.weight_decay is None or self.weight_decay >= 0, "weight_decay must be >= 0")
        for name in ("batch_size", "grad_accum", "epochs", "max_source_tokens", "valid_examples"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")

    def resolved(self, convert: ConvertConfig, objective: ObjectiveConfig):
        """(lr, weight decay, objective with its label smoothing) after the preset."""
        name = (
            self.preset
            if self.preset != "auto"
            else ("pretrained" if convert.pretrained else "scratch")
        )
        p = PRESETS[name]
        ls = objective.label_smoothing
        objective = replace(objective, label_smoothing=p["label_smoothing"] if ls is None else ls)
        lr = self.lr if self.lr is not None else p["lr"]
        wd = self.weight_decay if self.weight_decay is not None else p["weight_decay"]
        return lr, wd, objective


def encode_pairs(
    task: str,
    split: str,
    tok: Any,
    *,
    max_source: int,
    max_target: int,
    limit: int | None = None,
    data_dir: str | None = None,
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(source ids, target ids) for every reference of ``split`` (targets without special
    tokens), and how many pairs were dropped for a target longer than ``max_target``."""
    pairs, dropped = [], 0
    for e in task_examples(task, split, data_dir):
        src = tok(source_of(e), truncation=True, max_length=max_source)["input_ids"]
        for ref in references_of(e):
            tgt = tok(ref, add_special_tokens=False)["input_ids"]
            if not 1 <= len(tgt) <= max_target:
                dropped += 1
                continue
            pairs.append((src, tgt))
            if limit is not None and len(pairs) >= limit:
                return pairs, dropped
    return pairs, dropped


def train(
    cfg: NARTrainConfig,
    convert: ConvertConfig,
    objective: ObjectiveConfig,
    output: str | Path,
    *,
    data_dir: str | None = None,
    progress: bool = True,
    restart: bool = False,
) -> dict[str, Any]:
    """Convert ``cfg.model`` and train it with ``objective``; ``best/`` and ``last/`` load with
    :func:`gencraft.training.load_run`."""
    from gencraft.training import FitConfig, fit, make_accelerator, save_run

    if objective.objective == "autoregressive" and convert.bidirectional:
        raise ConfigError("--objective autoregressive needs --no-bidirectional (a causal decoder)")
    if objective.objective != "autoregressive" and not convert.bidirectional:
        raise ConfigError(f"--objective {objective.objective} needs a bidirectional decoder")
    lr, wd, objective = cfg.resolved(convert, objective)
    out = Path(output)
    model, tok = load_mlm_seq2seq(cfg.model, seed=cfg.seed, **asdict(convert))
    top = model.max_target_length
    enc = dict(max_source=cfg.max_source_tokens, max_target=top, data_dir=data_dir)
    train_pairs, dropped = encode_pairs(cfg.task, "train", tok, limit=cfg.train_examples, **enc)
    valid_pairs, _ = encode_pairs(cfg.task, "validation", tok, limit=cfg.valid_examples, **enc)
    check(bool(train_pairs), "no training pairs")
    acc = make_accelerator(gradient_accumulation_steps=cfg.grad_accum)
    fit_cfg = FitConfig(
        epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        max_time=cfg.max_time,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        warmup=cfg.warmup,
        decay="linear",
        eval_every=cfg.eval_every,
        seed=cfg.seed,
        clip=1.0,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    budget = ("epochs", "max_steps", "max_time")
    settings = {
        "train": {k: v for k, v in asdict(cfg).items() if k not in budget},
        "convert": asdict(convert),
        "objective": asdict(objective),
        "lr": lr,
        "weight_decay": wd,
        "pairs": len(train_pairs),
    }
    pad = target_token_ids(tok)["pad"]

    def collate_fn(rows: list) -> dict[str, torch.Tensor]:
        return collate(rows, pad)

    def evaluate_fn(m: NARSeq2Seq, loader: Any) -> dict[str, float]:
        from gencraft.training import mean_loss

        gen = torch.Generator(device=acc.device).manual_seed(1234)  # the same draws each time
        return mean_loss(make_loss(objective, tok, gen), acc)(m, loader)

    def save_fn(m: NARSeq2Seq, d: Path) -> None:
        save_run(d, m, tok, settings)

    model.train()
    t0 = time.time()
    result = fit(
        model,
        optimizer,
        train_pairs,
        loss_fn=make_loss(objective, tok),
        config=fit_cfg,
        output_dir=out,
        valid=valid_pairs or None,
        collate_fn=collate_fn,
        evaluate_fn=evaluate_fn,
        save_fn=save_fn,
        settings=settings,
        accelerator=acc,
        progress=progress,
        restart=restart,
    )
    return result.write_summary(out, t0, pairs=len(train_pairs), dropped_long_targets=dropped)


def decode(
    model: NARSeq2Seq,
    tok: Any,
    sources: list[str],
    sampling: SamplingConfig,
    *,
    method: str = "auto",
    num_beams: int = 4,
    max_source_tokens: int = 128,
    progress: bool = False,
) -> tuple[list[str], NAROutput]:
    """Texts for ``sources`` by ``method``: ``sundae``, ``mask-predict``, ``beam`` (a causal
    decoder) or ``auto`` (beam for a causal decoder, else SUNDAE)."""
    if method == "auto":
        method = "sundae" if model.nar_settings.bidirectional else "beam"
    if method not in ("sundae", "mask-predict", "beam"):
        raise GencraftError(f"method must be sundae, mask-predict, beam or auto, got {method!r}")
    if not sources:
        raise GencraftError("no inputs to decode")
    enc = tok(
        sources, truncation=True, max_length=max_source_tokens, padding=True, return_tensors="pt"
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if method == "sundae":
        out = sundae_generate(model, ids, mask, sampling, noise=noise_ids(tok), progress=progress)
    elif method == "mask-predict":
        mask_id = target_token_ids(tok)["mask"]
        out = mask_predict_generate(model, ids, mask, sampling, mask_id=mask_id, progress=progress)
    else:
        out = autoregressive_generate(
            model,
            ids,
            mask,
            num_beams=num_beams,
            max_new_tokens=model.max_target_length,
            progress=progress,
        )
    texts = [tok.decode(s, skip_special_tokens=True).strip() for s in out.sequences]
    return texts, out


def evaluate(
    model: NARSeq2Seq,
    tok: Any,
    *,
    task: str,
    split: str = "test",
    limit: int | None = None,
    sampling: SamplingConfig | None = None,
    method: str = "auto",
    num_beams: int = 4,
    data_dir: str | None = None,
    lowercase: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """BLEU and ROUGE-L of decoded outputs by the task's one convention
    (:func:`gencraft.metrics.score_task`; ``lowercase``: references lower-cased like the
    outputs of an uncased tokenizer), with decoding time and model calls per output."""
    from gencraft.metrics import score_task

    examples = pick_examples(task_examples(task, split, data_dir), limit, spread=True)
    sources = [source_of(e) for e in examples]
    refs = [references_of(e) for e in examples]
    texts, out = decode(
        model,
        tok,
        sources,
        sampling or SamplingConfig(),
        method=method,
        num_beams=num_beams,
        progress=progress,
    )
    n = len(texts)
    scores = score_task(task, texts, refs, lowercase=lowercase, metrics=("BLEU", "ROUGE-L"))
    return {
        "outputs": n,
        **scores,
        "seconds/output": sum(out.seconds) / n,
        "calls/output": sum(out.model_calls) / n,
        "steps/output": sum(out.steps) / n,
        "predictions": texts,
    }
