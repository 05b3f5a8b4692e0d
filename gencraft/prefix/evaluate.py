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
from gencraft.models.cad import CADSettings, context_free_inputs, paired_contrast_generate
from gencraft.models.introspect import eos_ids, is_encoder_decoder, pad_id
from gencraft.models.prompts import pad_batch
from gencraft.prefix.data import SEPARATOR
from gencraft.progress import tqdm


def _made_by(model: nn.Module, sources: list[str], settings: dict) -> dict:
    """What makes a run of outputs (the weights, prefixes included; the sources; every
    setting), for its partial results: only the same run resumes them."""
    from gencraft.models.introspect import weights_digest

    return {"model": weights_digest(model), "inputs": sources, "settings": settings}


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
    cad_alpha: float | None = None,
    **generate_kw: Any,
) -> list[str]:
    """Outputs for ``sources`` (beam 5 as the paper); batches are left-padded for causal LMs.
    Under several processes each decodes its share of the batches
    (:func:`gencraft.distributed.map_sharded`; the outputs, gathered in input order on every
    process, are one process's). ``partial_dir``: each process's finished batches are kept
    there, and only a run of the same weights, sources and settings resumes them.
    ``cad_alpha``: context-aware decoding against the same model on the input without its
    source (the separator alone; an encoder-decoder's empty source), by paired rows
    (:func:`gencraft.models.cad.paired_contrast_generate`: both streams keep the
    prefixes, each its own block tables)."""
    from gencraft.distributed import map_sharded

    cad = None if cad_alpha is None else CADSettings(cad_alpha)  # refused before any work

    base = getattr(model, "base", model)
    ed = is_encoder_decoder(base)
    eos = eos_ids(base)[0]
    pad = pad_id(base, tokenizer)
    sep = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    dev = next(model.parameters()).device
    end = [eos] if ed else sep  # what follows the source; alone, the context-free input
    kw_base = dict(max_new_tokens=max_new_tokens, num_beams=num_beams, **generate_kw)

    def batch_outputs(indices: list[int]) -> list[str]:
        rows = []
        for i in indices:
            ids = tokenizer(sources[i], add_special_tokens=False)["input_ids"][:max_source_tokens]
            rows.append({"input_ids": ids + end})
        batch = pad_batch(rows, pad, left=not ed)
        free = None if cad is None else [end] * len(indices)
        with torch.no_grad():
            seq = _generate(model, batch, free, pad, cad, dev, {"eos_token_id": eos, **kw_base})
        if not ed:
            seq = seq[:, batch["input_ids"].shape[1] :]
        return [t.strip() for t in tokenizer.batch_decode(seq, skip_special_tokens=True)]

    settings = dict(max_source_tokens=max_source_tokens, cad_alpha=cad_alpha, **kw_base)
    made_by = None if partial_dir is None else _made_by(model, sources, settings)
    bar = tqdm(total=len(sources), desc="generate", disable=not progress)
    shard = {"partial_dir": partial_dir, "fingerprint": made_by, "on_batch": bar.update}
    outs = map_sharded(batch_outputs, len(sources), batch_size, **shard)
    bar.close()
    return outs


def _generate(
    model: nn.Module,
    batch: dict,
    free: list[list[int]] | None,
    pad: int,
    cad: CADSettings | None,
    dev: Any,
    kw: dict,
) -> torch.Tensor:
    """One batch's ``generate`` ([B, T] inputs, padded), or with ``free`` (the context-free
    inputs, one per input) CAD by paired rows."""
    ed = is_encoder_decoder(getattr(model, "base", model))
    ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
    if free is None:
        return model.generate(input_ids=ids, attention_mask=mask, pad_token_id=pad, **kw)
    neg_ids, neg_mask = context_free_inputs(free, pad, left=not ed, empty=kw["eos_token_id"])
    return paired_contrast_generate(
        model.generate,
        ids,
        mask,
        neg_ids.to(dev),
        neg_mask.to(dev),
        cad=cad,
        left_padding=not ed,
        pad_token_id=pad,
        **kw,
    )


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
    cad_alpha: float | None = None,
) -> dict[str, Any]:
    """Generate for a task's split and score: data-to-text metrics (E2E/DART, all references)
    or ROUGE-1/2/L (XSum). ``limit`` inputs: the split's first, or with ``spread`` evenly
    spaced (DART's test file is ordered by source corpus). ``lowercase``: outputs and references
    lower-cased (:func:`gencraft.metrics.score_task`). ``task`` may be a path to your own data,
    whose fields ``source_field`` and ``target_field`` name. ``partial_dir`` (finished batches
    kept there) and ``cad_alpha`` (context-aware decoding): see :func:`generate_outputs`.
    ``metrics``: the scores computed (default: all of the task's)."""
    fields = {"source_field": source_field, "target_field": target_field}
    examples = pick_examples(task_examples(task, split, data_dir, **fields), limit, spread)
    sources, refs = [source_of(e) for e in examples], [references_of(e) for e in examples]
    new = max_new_tokens or 64
    start = time.perf_counter()
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
        cad_alpha=cad_alpha,
    )
    seconds = time.perf_counter() - start
    kw = {} if not metrics else {"metrics": tuple(metrics)}
    scores = score_task(task, outputs, refs, lowercase=lowercase, **kw)
    return {
        "task": task,
        "split": split,
        "examples": len(examples),
        "num_beams": num_beams,
        "max_new_tokens": new,
        **({} if cad_alpha is None else {"cad_alpha": cad_alpha}),
        "scores": scores,
        "generate_seconds": seconds,
        "outputs": outputs,
        "references": refs,
    }
