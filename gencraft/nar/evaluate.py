"""Decoding and scoring a trained NAR model: SUNDAE, Mask-Predict or beam search (a causal
decoder) over a task's split, scored by :func:`gencraft.metrics.score_task`."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gencraft.data.tasks import pick_examples, references_of, source_of, task_examples
from gencraft.errors import GencraftError
from gencraft.metrics import score_task
from gencraft.nar.config import SamplingConfig
from gencraft.nar.decoding import (
    NAROutput,
    autoregressive_generate,
    mask_predict_generate,
    sundae_generate,
)
from gencraft.nar.functional import noise_ids
from gencraft.nar.model import NARSeq2Seq, target_token_ids

#: the :class:`SamplingConfig` settings each decoding method reads (beam search: none of them,
#: only ``num_beams``)
READS: dict[str, tuple[str, ...]] = {
    "sundae": tuple(f.name for f in fields(SamplingConfig)),
    "mask-predict": ("steps", "length_candidates", "threshold"),
    "beam": (),
}
DEFAULT_BEAMS = 4


def sampling_for(method: str, **values: Any) -> SamplingConfig:
    """A :class:`SamplingConfig` with those of ``values`` that ``method`` reads (an experiment
    that sets samples for SUNDAE can pass the same settings to Mask-Predict)."""
    return SamplingConfig(**{k: v for k, v in values.items() if k in READS[method]})


def resolve_method(model: NARSeq2Seq, method: str) -> str:
    """``auto`` made concrete: beam search for a causal decoder, else SUNDAE."""
    if method == "auto":
        method = "sundae" if model.nar_settings.bidirectional else "beam"
    if method not in READS:
        raise GencraftError(f"method must be sundae, mask-predict, beam or auto, got {method!r}")
    return method


def check_settings_apply(
    method: str,
    sampling: SamplingConfig,
    num_beams: int | None,
    given: set[str] | None = None,
) -> None:
    """Refuse settings the chosen decoding ignores, by name: ``--temperature`` with
    Mask-Predict, ``--num-beams`` with SUNDAE... ``given``: the settings the user wrote out
    (the CLI's flags); without it, those changed from their defaults."""
    default = SamplingConfig()
    unused = [
        f.name
        for f in fields(SamplingConfig)
        if f.name not in READS[method]
        and (
            f.name in given
            if given is not None
            else getattr(sampling, f.name) != getattr(default, f.name)
        )
    ]
    if method != "beam" and (num_beams is not None or (given and "num_beams" in given)):
        unused.append("num_beams")
    if unused:
        flags = ", ".join("--" + n.replace("_", "-") for n in unused)
        raise GencraftError(
            f"{flags} do{'es' if len(unused) == 1 else ''} not apply to {method} decoding; "
            f"leave {'it' if len(unused) == 1 else 'them'} out or choose another --method"
        )


def decode(
    model: NARSeq2Seq,
    tok: Any,
    sources: list[str],
    sampling: SamplingConfig,
    *,
    method: str = "auto",
    num_beams: int | None = None,
    max_source_tokens: int = 128,
    progress: bool = False,
    batch_size: int | None = 16,
) -> tuple[list[str], NAROutput]:
    """Texts for ``sources`` by ``method``: ``sundae``, ``mask-predict``, ``beam`` (a causal
    decoder) or ``auto`` (beam for a causal decoder, else SUNDAE). ``num_beams`` (default 4)
    is beam search's alone; a setting of ``sampling`` that ``method`` does not read is
    refused (:func:`check_settings_apply`). ``batch_size`` sources are decoded together (None:
    all at once)."""
    method = resolve_method(model, method)
    check_settings_apply(method, sampling, num_beams)
    if not sources:
        raise GencraftError("no inputs to decode")
    enc = tok(
        sources, truncation=True, max_length=max_source_tokens, padding=True, return_tensors="pt"
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if method == "sundae":
        out = sundae_generate(
            model,
            ids,
            mask,
            sampling,
            noise=noise_ids(tok),
            progress=progress,
            batch_size=batch_size,
        )
    elif method == "mask-predict":
        mask_id = target_token_ids(tok)["mask"]
        out = mask_predict_generate(
            model,
            ids,
            mask,
            sampling,
            mask_id=mask_id,
            progress=progress,
            batch_size=batch_size,
        )
    else:
        out = autoregressive_generate(
            model,
            ids,
            mask,
            num_beams=num_beams or DEFAULT_BEAMS,
            max_new_tokens=model.max_target_length,
            progress=progress,
            batch_size=batch_size,
        )
    texts = [tok.decode(s, skip_special_tokens=True).strip() for s in out.sequences]
    return texts, out


def decode_rows(
    model: NARSeq2Seq,
    tok: Any,
    sources: list[str],
    sampling: SamplingConfig,
    *,
    method: str = "auto",
    num_beams: int | None = None,
    progress: bool = False,
    batch_size: int | None = 16,
) -> list[dict[str, Any]]:
    """:func:`decode` on this process's share of ``sources`` (whole batches of ``batch_size``;
    :func:`gencraft.distributed.map_sharded`), gathered in input order on every process: one
    row per source (``text``, ``sequence``, ``score``, ``calls``, ``steps``, ``seconds``).
    One process decodes the same batches, so the outputs do not depend on the process count."""
    from gencraft.distributed import map_sharded
    from gencraft.progress import tqdm

    if not sources:
        raise GencraftError("no inputs to decode")

    def run(indices: list[int]) -> list[dict[str, Any]]:
        texts, out = decode(
            model,
            tok,
            [sources[i] for i in indices],
            sampling,
            method=method,
            num_beams=num_beams,
            batch_size=None,
        )
        return [
            {"text": t, "sequence": q, "score": sc, "calls": c, "steps": st, "seconds": sec}
            for t, q, sc, c, st, sec in zip(
                texts,
                out.sequences,
                out.scores,
                out.model_calls,
                out.steps,
                out.seconds,
                strict=True,
            )
        ]

    bar = tqdm(total=len(sources), desc=method, disable=not progress)
    rows = map_sharded(run, len(sources), batch_size or len(sources), on_batch=bar.update)
    bar.close()
    return rows


def decode_sharded(
    model: NARSeq2Seq,
    tok: Any,
    sources: list[str],
    sampling: SamplingConfig,
    *,
    method: str = "auto",
    num_beams: int | None = None,
    progress: bool = False,
    batch_size: int | None = 16,
) -> tuple[list[str], NAROutput]:
    """:func:`decode_rows` as the outputs' texts and one :class:`NAROutput`."""
    rows = decode_rows(
        model,
        tok,
        sources,
        sampling,
        method=method,
        num_beams=num_beams,
        progress=progress,
        batch_size=batch_size,
    )
    out = NAROutput()
    for r in rows:
        out.add(r["sequence"], r["score"], r["calls"], r["steps"], r["seconds"])
    return [r["text"] for r in rows], out


def task_inputs(
    task: str,
    split: str = "test",
    limit: int | None = None,
    data_dir: str | None = None,
    source_field: str = "source",
    target_field: str = "target",
) -> tuple[list[str], list[list[str]]]:
    """The sources and their references :func:`evaluate` scores (``limit``: evenly spaced)."""
    fields = {"source_field": source_field, "target_field": target_field}  # own data's
    examples = pick_examples(task_examples(task, split, data_dir, **fields), limit, spread=True)
    return [source_of(e) for e in examples], [references_of(e) for e in examples]


def summarize(
    task: str,
    rows: list[dict[str, Any]],
    refs: list[list[str]],
    *,
    lowercase: bool = False,
    batch_size: int | None = 16,
) -> dict[str, Any]:
    """:func:`evaluate`'s record from :func:`decode_rows`'s rows and their references: BLEU
    and ROUGE-L by the task's one convention, time, calls, steps and tokens per call."""
    n, texts = len(rows), [r["text"] for r in rows]
    scores = score_task(task, texts, refs, lowercase=lowercase, metrics=("BLEU", "ROUGE-L"))
    calls = sum(r["calls"] for r in rows)
    return {
        "outputs": n,
        **scores,
        "seconds/output": sum(r["seconds"] for r in rows) / n,
        "calls/output": calls / n,
        "steps/output": sum(r["steps"] for r in rows) / n,
        "tokens/call": sum(len(r["sequence"]) for r in rows) / max(calls, 1),
        "batch_size": batch_size or n,
        "predictions": texts,
    }


def evaluate(
    model: NARSeq2Seq,
    tok: Any,
    *,
    task: str,
    split: str = "test",
    limit: int | None = None,
    sampling: SamplingConfig | None = None,
    method: str = "auto",
    num_beams: int | None = None,
    data_dir: str | None = None,
    lowercase: bool = False,
    progress: bool = False,
    batch_size: int | None = 16,
    source_field: str = "source",
    target_field: str = "target",
) -> dict[str, Any]:
    """BLEU and ROUGE-L of decoded outputs by the task's one convention
    (:func:`gencraft.metrics.score_task`; ``lowercase``: references lower-cased like the
    outputs of an uncased tokenizer), with decoding time and model calls per output."""
    sources, refs = task_inputs(task, split, limit, data_dir, source_field, target_field)
    rows = decode_rows(
        model,
        tok,
        sources,
        sampling or SamplingConfig(),
        method=method,
        num_beams=num_beams,
        progress=progress,
        batch_size=batch_size,
    )
    return summarize(task, rows, refs, lowercase=lowercase, batch_size=batch_size)
