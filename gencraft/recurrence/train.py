"""Training the recurrent model (Yoshida 2023, §2.5) on a word-level corpus
read as one subword stream, through the shared ``fit`` (resumable, ``accelerate``).

The thesis's recipe: Adam, the learning rate warmed up linearly over 100 steps, validation
every fixed number of tokens with early stopping, training sequences of ``bptt_windows``
windows, training and evaluation at the same overlap. ``recurrent=False`` trains the baseline:
the same model on the same windows with no state between them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from gencraft.config import check
from gencraft.data import subword_stream
from gencraft.recurrence.config import RecurrenceConfig, RecurrenceTrainConfig
from gencraft.recurrence.model import RecurrentLM
from gencraft.training import fit, save_run, settings_of


def sequences(ids: torch.Tensor, length: int) -> list[torch.Tensor]:
    """Non-overlapping pieces of ``length`` tokens of ``ids`` [N] (the remainder dropped)."""
    return [ids[i : i + length] for i in range(0, ids.numel() - length + 1, length)]


def _loss(model: RecurrentLM, batch: torch.Tensor) -> torch.Tensor:
    return model(batch, return_logits=False).loss


def train(
    cfg: RecurrenceTrainConfig,
    rec: RecurrenceConfig,
    output: str | Path,
    *,
    data_dir: str | None = None,
    progress: bool = True,
    restart: bool = False,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` with (or, ``rec.recurrent=False``, without) recurrence;
    ``best/`` and ``last/`` are loadable with :func:`gencraft.training.load_run`.
    ``callbacks`` go to :func:`~gencraft.training.fit`."""
    from gencraft.models import load_model

    out = Path(output)
    base, tok = load_model(cfg.model, dtype=cfg.fit.dtype)
    torch.manual_seed(cfg.fit.seed)
    model = RecurrentLM(base, rec)
    n = rec.sequence_tokens()
    train_ids, _ = subword_stream(
        cfg.corpus, "train", tok, data_dir=data_dir, max_words=cfg.train_words
    )
    valid_ids, _ = subword_stream(
        cfg.corpus, "valid", tok, data_dir=data_dir, max_words=cfg.valid_words
    )
    train_rows, valid_rows = sequences(train_ids, n), sequences(valid_ids, n)
    check(bool(train_rows), f"the training text has fewer than the {n} tokens of one sequence")
    per_step = n * cfg.fit.batch_size * cfg.fit.grad_accum
    fit_cfg = replace(cfg.fit, eval_every=max(1, math.ceil(cfg.eval_every_tokens / per_step)))
    new = [p for n, p in model.named_parameters() if not n.startswith("base.")]
    old = [p for n, p in model.named_parameters() if n.startswith("base.") and p.requires_grad]
    optimizer = torch.optim.Adam(
        [{"params": old, "lr": cfg.lr}, {"params": new, "lr": cfg.recurrence_lr or cfg.lr}]
    )
    settings = {"train": settings_of(cfg), "recurrence": asdict(rec), "sequences": len(train_rows)}

    def save_fn(m: RecurrentLM, d: Path) -> None:
        save_run(d, m, tok, settings, base_name_or_path=cfg.model)

    t0 = time.perf_counter()
    result = fit(
        model,
        optimizer,
        train_rows,
        loss_fn=_loss,
        config=fit_cfg,
        output_dir=out,
        valid=valid_rows or None,
        collate_fn=torch.stack,
        save_fn=save_fn,
        settings=settings,
        progress=progress,
        restart=restart,
        callbacks=callbacks,
    )
    return result.write_summary(out, t0, tokens_per_step=per_step)
