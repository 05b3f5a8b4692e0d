"""Generation and scoring for DASP runs: beam search (beam 5, as the paper) over a task's
split, scored by :func:`gencraft.metrics.score_task`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.data.tasks import pick_examples, references_of, source_of, task_examples
from gencraft.metrics import score_task
from gencraft.models.introspect import eos_ids, is_encoder_decoder, pad_id
from gencraft.models.prompts import pad_batch
from gencraft.prefix.data import SEPARATOR
from gencraft.progress import tqdm


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
    partial_dir: str | Path | None = None,
    **generate_kw: Any,
) -> list[str]:
    """Outputs for ``sources`` (beam 5 as the paper); batches are left-padded for causal LMs.
    Under several processes each decodes its share of the batches
    (:func:`gencraft.distributed.map_sharded`; the outputs, gathered in input order on every
    process, are one process's). ``partial_dir``: each process's finished batches are kept
    there, so an interrupted run resumes."""
    from gencraft.distributed import map_sharded

    base = getattr(model, "base", model)
    ed = is_encoder_decoder(base)
    eos = eos_ids(base)[0]
    pad = pad_id(base, tokenizer)
    sep = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    dev = next(model.parameters()).device

    def batch_outputs(indices: list[int]) -> list[str]:
        rows = []
        for i in indices:
            ids = tokenizer(sources[i], add_special_tokens=False)["input_ids"][:max_source_tokens]
            rows.append({"input_ids": ids + ([eos] if ed else sep)})
        batch = pad_batch(rows, pad, left=not ed)
        seq = model.generate(
            input_ids=batch["input_ids"].to(dev),
            attention_mask=batch["attention_mask"].to(dev),
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            pad_token_id=pad,
            eos_token_id=eos,
            **generate_kw,
        )
        if not ed:
            seq = seq[:, batch["input_ids"].shape[1] :]
        return [t.strip() for t in tokenizer.batch_decode(seq, skip_special_tokens=True)]

    bar = tqdm(total=len(sources), desc="generate", disable=not progress)
    outs = map_sharded(
        batch_outputs, len(sources), batch_size, partial_dir=partial_dir, on_batch=bar.update
    )
    bar.close()
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
    lowercase: bool = False,
    source_field: str = "source",
    target_field: str = "target",
    partial_dir: str | Path | None = None,
    metrics: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Generate for a task's split and score: data-to-text metrics (E2E/DART, all references)
    or ROUGE-1/2/L (XSum). ``limit`` inputs are the split's first ones, or with ``spread``
    ones evenly spaced over it (DART's test file is ordered by source corpus). ``lowercase``:
    outputs and references lower-cased (:func:`gencraft.metrics.score_task`). ``task`` may be
    a path to your own data, whose fields ``source_field`` and ``target_field`` name.
    ``partial_dir``: finished batches kept there (see :func:`generate_outputs`).
    ``metrics``: the scores computed (default: all of the task's)."""
    fields = {"source_field": source_field, "target_field": target_field}
    examples = pick_examples(task_examples(task, split, data_dir, **fields), limit, spread)
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
        partial_dir=partial_dir,
    )
    seconds = time.time() - start
    kw = {} if not metrics else {"metrics": tuple(metrics)}
    scores = score_task(task, outputs, refs, lowercase=lowercase, **kw)
    return {
        "task": task,
        "split": split,
        "examples": len(examples),
        "num_beams": num_beams,
        "max_new_tokens": new,
        "scores": scores,
        "generate_seconds": seconds,
        "outputs": outputs,
        "references": refs,
    }
