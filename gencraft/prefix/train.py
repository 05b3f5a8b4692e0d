"""Training DASP variants on data-to-text (E2E, DART) and summarisation (XSum): prefix-tuning
(any :class:`~gencraft.prefix.PrefixConfig`) or full fine-tuning (optionally with a sparse
normaliser, the paper's control rows), through the shared :func:`gencraft.training.fit`
(accelerate, resumable). The rows are :mod:`gencraft.prefix.data`'s; the variants
:mod:`gencraft.prefix.variants`'.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.data.tasks import training_pairs
from gencraft.models.introspect import check_token_budget, pad_id
from gencraft.prefix.config import PrefixConfig, PrefixTrainConfig
from gencraft.prefix.data import SEPARATOR, collate_rows, encode_pairs
from gencraft.prefix.variants import build_model, save_trained
from gencraft.training import fit, settings_of


def _shuffled(pairs: list, seed: int, limit: int | None) -> list:
    """``pairs`` in a seeded order, the first ``limit`` of them when a limit is set."""
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
    pairs = [pairs[i] for i in order.tolist()]
    return pairs[:limit] if limit else pairs


def _loss(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return m(**batch).loss


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

    out = Path(output_dir)
    cfg = replace(cfg, lr=cfg.learning_rate(prefix))  # the run records the rate it used
    fields = {"source_field": cfg.source_field, "target_field": cfg.target_field}
    train_pairs = training_pairs(cfg.task, "train", data_dir, **fields)  # data errors first
    base, tok = load_model(cfg.model, dtype=cfg.fit.dtype)
    reserve = len(tok(SEPARATOR, add_special_tokens=False)["input_ids"]) + 1  # + EOS
    budget = (cfg.max_source_tokens, cfg.max_target_tokens)
    fitting = check_token_budget(base, *budget, reserve=reserve)
    cfg = replace(cfg, max_source_tokens=fitting)  # the run records the budget it used
    torch.manual_seed(cfg.fit.seed)
    train_pairs = _shuffled(train_pairs, cfg.fit.seed, cfg.train_examples)
    valid_pairs = training_pairs(cfg.task, "validation", data_dir, **fields)[: cfg.valid_examples]
    if prefix.decoder_segments > 1 and prefix.output_length is None:
        lengths = [len(tok(p.target)["input_ids"]) for p in train_pairs[:2000]]
        prefix.output_length = max(1, round(sum(lengths) / len(lengths)))
    model, _ = build_model(base, tok, prefix, cfg.method)
    limits = (cfg.max_source_tokens, cfg.max_target_tokens)
    train_rows = encode_pairs(train_pairs, tok, base, *limits)
    valid_rows = encode_pairs(valid_pairs, tok, base, *limits)
    pad = pad_id(base, tok)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)

    settings = {"train": settings_of(cfg), "prefix": prefix.to_dict(), "pairs": len(train_rows)}
    start = time.perf_counter()
    result = fit(
        model,
        optimizer,
        train_rows,
        loss_fn=_loss,
        config=cfg.fit,
        output_dir=out,
        valid=valid_rows or None,
        collate_fn=lambda items: collate_rows(items, pad),
        save_fn=lambda m, directory: save_trained(m, directory, cfg, prefix, tok),
        settings=settings,
        progress=progress,
        restart=restart,
    )
    return result.write_summary(out, start, trainable_parameters=sum(p.numel() for p in params))
