"""Training RUM-SUNDAE, SUNDAE from scratch, Mask-Predict and the
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
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gencraft.config import check
from gencraft.data.tasks import references_of, source_of, task_examples
from gencraft.errors import ConfigError
from gencraft.nar.config import (
    ConvertConfig,
    NARTrainConfig,
    ObjectiveConfig,
)
from gencraft.nar.functional import collate, make_loss
from gencraft.nar.model import NARSeq2Seq, load_mlm_seq2seq, target_token_ids


def encode_pairs(
    task: str,
    split: str,
    tok: Any,
    *,
    max_source: int,
    max_target: int,
    limit: int | None = None,
    data_dir: str | None = None,
    source_field: str = "source",
    target_field: str = "target",
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(source ids, target ids) for every reference of ``split`` (targets without special
    tokens), and how many pairs were dropped for a target longer than ``max_target``."""
    pairs, dropped = [], 0
    fields = {"source_field": source_field, "target_field": target_field}
    for e in task_examples(task, split, data_dir, **fields):
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


def _pairs(
    cfg: NARTrainConfig, tok: Any, max_target: int, data_dir: str | None
) -> tuple[list, list, int]:
    """(train pairs, validation pairs, training targets dropped as too long) of the task,
    encoded for a decoder of ``max_target`` positions; refuses a task with no training pair."""
    enc = dict(max_source=cfg.max_source_tokens, max_target=max_target, data_dir=data_dir)
    enc.update(source_field=cfg.source_field, target_field=cfg.target_field)
    train_pairs, dropped = encode_pairs(cfg.task, "train", tok, limit=cfg.train_examples, **enc)
    valid_pairs, _ = encode_pairs(cfg.task, "validation", tok, limit=cfg.valid_examples, **enc)
    check(bool(train_pairs), "no training pairs")
    return train_pairs, valid_pairs, dropped


def _validation(objective: ObjectiveConfig, tok: Any, acc: Any) -> Any:
    """The validation loss: the objective's mean loss with the same random draws (masks,
    noise) at every validation."""

    def evaluate_fn(m: NARSeq2Seq, loader: Any) -> dict[str, float]:
        from gencraft.training import mean_loss

        gen = torch.Generator(device=acc.device).manual_seed(1234)
        return mean_loss(make_loss(objective, tok, gen), acc)(m, loader)

    return evaluate_fn


def train(
    cfg: NARTrainConfig,
    convert: ConvertConfig,
    objective: ObjectiveConfig,
    output: str | Path,
    *,
    data_dir: str | None = None,
    progress: bool = True,
    restart: bool = False,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Convert ``cfg.model`` and train it with ``objective``; ``best/`` and ``last/`` load with
    :func:`gencraft.training.load_run`. ``callbacks`` go to :func:`~gencraft.training.fit`."""
    from gencraft.training import fit, make_accelerator, save_run, settings_of

    if objective.objective == "autoregressive" and convert.bidirectional:
        raise ConfigError("--objective autoregressive needs --no-bidirectional (a causal decoder)")
    if objective.objective != "autoregressive" and not convert.bidirectional:
        raise ConfigError(f"--objective {objective.objective} needs a bidirectional decoder")
    lr, wd, objective = cfg.resolved(convert, objective)
    out = Path(output)
    model, tok = load_mlm_seq2seq(
        cfg.model, seed=cfg.fit.seed, dtype=cfg.fit.dtype, **asdict(convert)
    )
    train_pairs, valid_pairs, dropped = _pairs(cfg, tok, model.max_target_length, data_dir)
    acc = make_accelerator(
        cfg.fit.mixed_precision, cfg.fit.device, gradient_accumulation_steps=cfg.fit.grad_accum
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    settings = {"train": settings_of(cfg), "convert": asdict(convert)}
    settings.update(objective=asdict(objective), lr=lr, weight_decay=wd, pairs=len(train_pairs))
    pad = target_token_ids(tok)["pad"]
    model.train()
    t0 = time.perf_counter()
    result = fit(
        model,
        optimizer,
        train_pairs,
        loss_fn=make_loss(objective, tok),
        config=cfg.fit,
        output_dir=out,
        valid=valid_pairs or None,
        collate_fn=lambda rows: collate(rows, pad),
        evaluate_fn=_validation(objective, tok, acc),
        save_fn=lambda m, d: save_run(d, m, tok, settings),
        settings=settings,
        accelerator=acc,
        progress=progress,
        restart=restart,
        callbacks=callbacks,
    )
    return result.write_summary(out, t0, pairs=len(train_pairs), dropped_long_targets=dropped)
