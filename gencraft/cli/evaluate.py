"""``gencraft eval``: read predictions/references/sources (txt or jsonl) and compute metrics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gencraft import metrics as M
from gencraft.data.io import read_jsonl, read_lines
from gencraft.errors import DataError, GencraftError

# jsonl keys tried in order when --field is not given
FIELDS = {
    "predictions": ("prediction", "output", "text", "summary"),
    "references": ("references", "reference", "ref", "summary", "target", "text"),
    "sources": ("document", "source", "input", "text"),
}


def read_texts(path: str | Path, role: str, field: str | None = None) -> list:
    """One item per line of a ``.txt`` file, or per record of a ``.jsonl`` file (the value of
    ``field``, else the first of :data:`FIELDS` [role] present). A references record may hold
    a list of strings (multi-reference)."""
    path = Path(path)
    if path.suffix != ".jsonl":
        return read_lines(path)
    rows = read_jsonl(path)
    keys = (field,) if field else FIELDS[role]  # --field: the predictions' only
    out = []
    for i, row in enumerate(rows, 1):
        key = next((k for k in keys if k in row), None)
        if key is None:
            how = "choose it with --field" if role == "predictions" else "rename it to one of them"
            raise DataError(
                f"{path}: record {i} has none of the {role} fields {', '.join(keys)} ({how})"
            )
        value = row[key]
        ok = isinstance(value, str) or (
            role == "references"
            and isinstance(value, list)
            and all(isinstance(v, str) for v in value)
        )
        if not ok:
            raise DataError(
                f"{path}: record {i} field {key!r} must be a string"
                + (" or a list of strings" if role == "references" else "")
            )
        out.append(value)
    return out


def _first_refs(refs: Sequence) -> list[str]:
    return [r if isinstance(r, str) else r[0] for r in refs]


MetricFn = Callable[[list[str], list, list[str] | None], dict[str, float]]


def _needs_sources(name: str, sources: list[str] | None) -> list[str]:
    if sources is None:
        raise GencraftError(f"metric {name!r} needs --sources")
    return sources


METRICS: dict[str, MetricFn] = {
    "rouge": lambda p, r, s: M.rouge(p, r),
    "bleu": lambda p, r, s: {"bleu": M.bleu(p, r)},
    "bertscore": lambda p, r, s: M.bertscore(p, _first_refs(r)),
    "distinct": lambda p, r, s: {f"distinct{n}": M.distinct_n(p, n) for n in (1, 2, 3)},
    "repetition": lambda p, r, s: {"repetition": M.repetition_rate(p)},
    "length": lambda p, r, s: {"length": M.mean_length(p)},
    "novel": lambda p, r, s: {
        f"novel{n}": M.novel_ngram_rate(p, _needs_sources("novel", s), n) for n in (1, 2, 3, 4)
    },
    "r1p_source": lambda p, r, s: {
        "r1p_source": M.rouge1_precision_vs_source(p, _needs_sources("r1p_source", s))
    },
}


def evaluate_files(
    predictions: str,
    references: str,
    sources: str | None,
    metric_names: Sequence[str],
    field: str | None = None,
) -> dict[str, float]:
    """Compute ``metric_names`` (keys of :data:`METRICS`) for the given files."""
    unknown = [m for m in metric_names if m not in METRICS]
    if unknown:
        raise GencraftError(
            f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}"
        )
    preds = read_texts(predictions, "predictions", field)
    refs = read_texts(references, "references")
    srcs = read_texts(sources, "sources") if sources else None
    for other, name in ((refs, "references"), (srcs, "sources")):
        if other is not None and len(other) != len(preds):
            raise DataError(f"{len(preds)} predictions but {len(other)} {name}")
    if not preds:
        raise DataError(f"{predictions}: no predictions")
    results: dict[str, float] = {"n": float(len(preds))}
    for name in metric_names:
        results.update(METRICS[name](preds, refs, srcs))
    return results


def format_table(
    rows: Sequence[dict], columns: Sequence[str] | None = None, floatfmt: str = ".2f"
) -> str:
    """A plain aligned text table of ``rows`` (dicts), for terminals and docs."""
    columns = list(columns or dict.fromkeys(k for r in rows for k in r))

    def cell(v: object) -> str:
        if isinstance(v, float):
            return format(v, floatfmt)
        return "" if v is None else str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths, strict=True))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, body)])
