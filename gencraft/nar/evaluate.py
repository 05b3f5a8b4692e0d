"""Decoding and scoring a trained NAR model: SUNDAE, Mask-Predict or beam search (a causal
decoder) over a task's split, scored by :func:`gencraft.metrics.score_task`."""

from __future__ import annotations

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
