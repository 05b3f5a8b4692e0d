"""Summaries for a list of documents under FAME's decoding settings, and the paper's metrics.

Decodings (Table 1 / Table 2 / Fig. 4 of Aralikatte et al.):

* ``beam``: beam search, 4 beams;
* ``top_k``: Div_top,k, sampling from the 640 most likely tokens;
* ``nucleus``: Div_nucleus, p = 0.95;
* ``focus_sample``: V_k drawn from T_X once per sample (k = 10,000 by default), beam 4;
* ``focus_sample+top_k`` / ``focus_sample+nucleus``: V_k restriction, then top-k / nucleus
  sampling inside it (our reading of the paper's unspecified composition: the V_k mask is
  applied first, the sampler's truncation second);
* ``focus_top``: V_k = top-k of T_X, beam 4 (the trade-off curve).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.focus.config import DECODINGS
from gencraft.focus.data import SummaryEncoder, collate
from gencraft.focus.model import FocusForConditionalGeneration
from gencraft.metrics import (
    distinct_n,
    mean_length,
    mean_unique,
    repetition_rate,
    rouge1_precision_vs_source,
    score_task,
)
from gencraft.models.introspect import check_token_budget
from gencraft.progress import tqdm


def _generate_kwargs(decoding: str, num_beams: int, top_k: int, top_p: float) -> dict:
    sampler = decoding.split("+")[-1] if "+" in decoding or decoding in ("top_k", "nucleus") else ""
    if sampler == "top_k":
        return {"do_sample": True, "top_k": top_k, "num_beams": 1}
    if sampler == "nucleus":
        return {"do_sample": True, "top_p": top_p, "top_k": 0, "num_beams": 1}
    return {"do_sample": False, "num_beams": num_beams}


def _check_decoding(model: Any, decoding: str, samples: int) -> bool:
    """Refuse an unknown decoding, a focus decoding without a FAME model, or no samples; True
    for a focus decoding."""
    if decoding not in DECODINGS:
        raise GencraftError(f"unknown decoding {decoding!r}; choose one of {', '.join(DECODINGS)}")
    focus = decoding.startswith("focus")
    if focus and not isinstance(model, FocusForConditionalGeneration):
        raise GencraftError(f"{decoding} needs a FAME model (T_X); this is a plain model")
    if samples < 1:
        raise GencraftError(f"samples must be >= 1, got {samples}")
    return focus


def _focus_kwargs(
    model: Any, decoding: str, focus_k: int | None, renormalize: bool
) -> dict[str, Any]:
    """The focus decodings' arguments: |V_k| (the paper's 10,000 of a 30k vocabulary, or all
    of a smaller one; a value outside [1, |V|] is refused), the mode and the renormalisation."""
    v = model.embedding_weight.shape[0]
    if focus_k is None:
        focus_k = min(10_000, v)
    elif not 1 <= focus_k <= v:
        raise GencraftError(f"focus_k must lie in [1, |V| = {v}], got {focus_k}")
    mode = "top" if decoding == "focus_top" else "sample"
    return {"focus_k": focus_k, "focus_mode": mode, "focus_renormalize": renormalize}


def summarize(
    model: Any,
    tokenizer: Any,
    documents: Sequence[str],
    *,
    decoding: str = "beam",
    samples: int = 1,
    focus_k: int | None = None,
    num_beams: int = 4,
    top_k: int = 640,
    top_p: float = 0.95,
    max_source: int = 512,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
    focus_renormalize: bool = True,
    on_batch: Callable[[int, list[list[str]]], None] | None = None,
) -> list[list[str]]:
    """``samples`` summaries per document (list per document), decoded with ``decoding``.
    ``focus_k``: |V_k| of the focus decodings (default 10,000, or the whole vocabulary when
    it is smaller; a larger value is refused); ``focus_renormalize``: scores re-normalised over
    V_k ∪ F (eq. 5, default) or only masked. ``on_batch(first index, summaries)`` runs as
    each batch of documents finishes (a file written as it goes survives an interruption).

    ``model`` is a :class:`FocusForConditionalGeneration` or a plain HF model (then only the
    non-focus decodings are available)."""
    focus = _check_decoding(model, decoding, samples)
    base = model.base if isinstance(model, FocusForConditionalGeneration) else model
    is_ed = bool(base.config.is_encoder_decoder)
    enc = SummaryEncoder(tokenizer, is_ed, max_source=max_source)
    budget = ("--max-source", "--max-new-tokens")  # refused, or cut to fit with a note
    enc.max_source = check_token_budget(base, max_source, max_new_tokens, budget, enc.prompt_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else enc.eos_id
    kw = _generate_kwargs(decoding, num_beams, top_k, top_p)
    kw.update(max_new_tokens=max_new_tokens, pad_token_id=pad)
    if focus:
        kw.update(_focus_kwargs(model, decoding, focus_k, focus_renormalize))
    dev = next(base.parameters()).device
    out: list[list[str]] = [[] for _ in documents]
    bar = tqdm(total=len(documents) * samples, desc=f"summarize ({decoding})", disable=not progress)
    for j in range(0, len(documents), batch_size):
        docs = documents[j : j + batch_size]
        batch = collate([enc.encode(d) for d in docs], pad, left=not is_ed)
        batch = {k: v.to(dev) for k, v in batch.items()}
        for s in range(samples):
            seed_s = seed + 1000 * s + j  # one seed per (sample, batch)
            torch.manual_seed(seed_s)
            extra = {"focus_seed": seed_s} if focus else {}
            with torch.no_grad():
                ids = model.generate(**batch, **kw, **extra)
            new = ids if is_ed else ids[:, batch["input_ids"].shape[1] :]
            for i, t in enumerate(tokenizer.batch_decode(new, skip_special_tokens=True)):
                out[j + i].append(t.strip())
            bar.update(len(docs))
        if on_batch is not None:
            on_batch(j, out[j : j + len(docs)])
    bar.close()
    return out


def summary_metrics(
    predictions: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    documents: Sequence[str],
    *,
    with_bertscore: bool = True,
    task: str = "xsum",
) -> dict[str, float]:
    """Table 1 columns: R1/R2/RL (``task``'s convention, :func:`~gencraft.metrics.score_task`),
    BERTScore F1 (local MiniLM), length (words), repetition (%), ROUGE-1 precision against
    the document (%). A document with several references (own data) is scored against all
    of them for ROUGE, against its first for BERTScore."""
    r = score_task(task, predictions, references, metrics=("rouge1", "rouge2", "rougeL"))
    row = {"R1": r["rouge1"], "R2": r["rouge2"], "RL": r["rougeL"]}
    if with_bertscore:
        from gencraft.metrics import bertscore

        firsts = [x if isinstance(x, str) else x[0] for x in references]
        row["BERTScore"] = bertscore(predictions, firsts)["bertscore_f"]
    row.update(
        length=mean_length(predictions),
        repetition=repetition_rate(predictions),
        R1_precision_doc=rouge1_precision_vs_source(predictions, documents),
    )
    return row


def diversity_metrics(
    groups: Sequence[Sequence[str]],
    references: Sequence[str] | Sequence[Sequence[str]],
    documents: Sequence[str],
    *,
    with_bertscore: bool = True,
    task: str = "xsum",
) -> dict[str, float]:
    """Table 2 columns over ``groups`` (the samples of each document): unique outputs per
    document, distinct-1/2/3 (%, over each document's samples, averaged), and the Table 1
    metrics averaged over samples."""
    n = len(groups[0])
    row: dict[str, float] = {"unique": mean_unique(groups)}
    for k in (1, 2, 3):
        row[f"distinct_{k}"] = sum(distinct_n(g, k) for g in groups) / len(groups)
    flat = [s for g in groups for s in g]
    refs = [r for r in references for _ in range(n)]
    docs = [d for d in documents for _ in range(n)]
    row.update(summary_metrics(flat, refs, docs, with_bertscore=with_bertscore, task=task))
    return row
