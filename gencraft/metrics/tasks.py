"""One scorer per task: :func:`score_task` fixes case, tokenisation and stemming for each task,
so every method's numbers on a task are comparable (with each other and with the papers).

=========================  =============================================================
task                       convention (:data:`CONVENTIONS`)
=========================  =============================================================
``e2e``, ``webnlg``,       the E2E challenge's: outputs and references as written (cased,
``dart``                   detokenised). BLEU and TER: ``sacrebleu`` (mteval-13a
                           tokenisation, case-sensitive); NIST: ``nltk`` (n = 5); METEOR
                           1.5 and CIDEr: ``pycocoevalcap``; ROUGE-L: ``pycocoevalcap``'s
                           (LCS, β = 1.2, best precision and recall over the references) on
                           word/punctuation tokens. All references of an input are used.
``xsum``, ``cnndm``        FAME's: ROUGE-1/2/L F1 of ``rouge-score`` with Porter stemming
                           (pyrouge ``-m``); its tokenizer lower-cases.
=========================  =============================================================

``lowercase=True`` lower-cases outputs and references before every metric, for a model
whose tokenizer lower-cases (MiniLM's): asked for by the caller only, and the returned
``convention`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from gencraft.errors import ConfigError
from gencraft.extras import require

DATA_TO_TEXT_METRICS = ("BLEU", "NIST", "METEOR", "ROUGE-L", "CIDEr", "TER")
SUMMARY_METRICS = ("rouge1", "rouge2", "rougeL")


@dataclass(frozen=True)
class TaskConvention:
    """How a task is scored: its metrics, which ROUGE, whether ROUGE stems."""

    family: Literal["data-to-text", "summarization", "own"]
    metrics: tuple[str, ...]
    rouge: Literal["coco", "rouge-score"]
    stem: bool

    def describe(self, lowercase: bool) -> str:
        if self.family == "own":
            case = " lower-cased (asked for by the caller)" if lowercase else ""
            return (
                f"own data{case}: BLEU (sacrebleu, 13a) as for E2E; two ROUGE-Ls side by side: "
                "ROUGE-L = pycocoevalcap's (E2E's scripts: LCS, beta 1.2, every character), "
                "rougeL = rouge-score's F1 (Porter stemming; it reads only a-z and 0-9), with "
                "rouge1/2 from rouge-score"
            )
        if self.family == "summarization":
            return "ROUGE F1 (rouge-score, Porter stemming, lower-cased by its tokenizer)"
        case = (
            "outputs and references lower-cased (asked for by the caller)"
            if lowercase
            else "cased, detokenised references"
        )
        return f"E2E challenge convention: {case}; ROUGE-L pycocoevalcap (beta=1.2)"


_D2T = TaskConvention("data-to-text", DATA_TO_TEXT_METRICS, "coco", False)
_SUMM = TaskConvention("summarization", SUMMARY_METRICS, "rouge-score", True)
CONVENTIONS: dict[str, TaskConvention] = {
    "e2e": _D2T,
    "webnlg": _D2T,
    "dart": _D2T,
    "xsum": _SUMM,
    "cnndm": _SUMM,
}
#: a task given as a path (a researcher's own data): both families' main metrics
#: (the two ROUGE-Ls next to each other: pycocoevalcap's, then rouge-score's)
OWN_CONVENTION = TaskConvention(
    "own", ("BLEU", "ROUGE-L", "rougeL", "rouge1", "rouge2"), "coco", True
)


def convention_of(task: str) -> TaskConvention:
    """The scoring convention of a named task, or :data:`OWN_CONVENTION` for a path."""
    if task in CONVENTIONS:
        return CONVENTIONS[task]
    from gencraft.data.tasks import is_task_path

    if is_task_path(task):
        return OWN_CONVENTION
    raise ConfigError(
        f"no scoring convention for task {task!r}; known: {sorted(CONVENTIONS)} or a path"
    )


def _references(task: str, references: Sequence[Any], n: int) -> list[list[str]]:
    if len(references) != n:
        raise ConfigError(f"{n} outputs but {len(references)} references for task {task!r}")
    out = [[r] if isinstance(r, str) else list(r) for r in references]
    if any(not refs for refs in out):
        raise ConfigError(f"every output needs at least one reference (task {task!r})")
    return out


def _cased(
    outputs: Sequence[str], refs: list[list[str]], lowercase: bool
) -> tuple[list[str], list[list[str]]]:
    """The outputs and references as scored: lower-cased both when ``lowercase``."""
    if lowercase:
        return [p.lower() for p in outputs], [[r.lower() for r in rs] for rs in refs]
    return list(outputs), refs


def score_task(
    task: str,
    outputs: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    lowercase: bool = False,
    metrics: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Score ``outputs`` against ``references`` (per output a string or a list of strings) by
    the convention of ``task`` (:data:`CONVENTIONS`).

    Args:
        lowercase: lower-case outputs and references first (data-to-text tasks; the
            summarization convention is case-insensitive already).
        metrics: a subset of the task's metrics (default: all of them).
    Returns ``{metric: value, ..., "convention": text}``; percentages except NIST, CIDEr
    (x1) and TER (a fraction), as the papers print them.
    """
    conv = convention_of(task)
    if not outputs:
        raise ConfigError(f"no outputs to score for task {task!r}")
    refs = _references(task, references, len(outputs))
    wanted = tuple(metrics) if metrics is not None else conv.metrics
    unknown = [m for m in wanted if m not in conv.metrics]
    if unknown:
        raise ConfigError(f"task {task!r} has no metric {unknown}; its metrics: {conv.metrics}")
    preds, refs = _cased(outputs, refs, lowercase)
    if conv.family == "summarization":
        from gencraft.metrics.text import rouge

        scores: dict[str, Any] = rouge(preds, refs, wanted, use_stemmer=conv.stem)
    elif conv.family == "own":
        from gencraft.metrics.text import rouge

        summ = tuple(m for m in wanted if m in SUMMARY_METRICS)
        scores = _data_to_text(preds, refs, tuple(m for m in wanted if m not in summ))
        scores |= rouge(preds, refs, summ, use_stemmer=True) if summ else {}
        scores = {m: scores[m] for m in wanted}
    else:
        scores = _data_to_text(preds, refs, wanted)
    scores["convention"] = conv.describe(lowercase)
    if any(m in SUMMARY_METRICS for m in wanted):
        scores["convention"] += _unread_by_rouge_score(preds, refs, conv.family == "own")
    return scores


def _unread_by_rouge_score(preds: list[str], refs: list[list[str]], own: bool) -> str:
    """A note when rouge-score's tokenizer (a-z and 0-9 only) finds no word in outputs or
    references that have text (a non-Latin script): its scores count those as 0."""
    from rouge_score import tokenize

    def unread(text: str) -> bool:
        return bool(text.strip()) and not tokenize.tokenize(text, None)

    outs = sum(unread(p) for p in preds)
    ref_rows = sum(any(unread(r) for r in rs) for rs in refs)
    if not outs and not ref_rows:
        return ""
    return (
        f"; WARNING: rouge-score read no word in {outs} of {len(preds)} outputs and in the "
        f"references of {ref_rows} (text outside a-z and 0-9, e.g. a non-Latin script): its "
        "rouge1/2/L score those as 0"
        + ("; ROUGE-L (pycocoevalcap) reads every character" if own else "")
    )


def _data_to_text(
    preds: list[str], refs: list[list[str]], wanted: tuple[str, ...]
) -> dict[str, Any]:
    sacrebleu = require("sacrebleu", "metrics", "BLEU and TER")

    from gencraft.metrics.data2text import cider, coco_rouge_l, meteor, nist

    # sacrebleu takes one stream per reference position; None marks a missing reference
    width = max(len(r) for r in refs)
    streams = [[r[j] if j < len(r) else None for r in refs] for j in range(width)]
    compute = {
        "BLEU": lambda: sacrebleu.corpus_bleu(preds, streams).score,
        "NIST": lambda: nist(preds, refs),
        "METEOR": lambda: meteor(preds, refs),
        "ROUGE-L": lambda: coco_rouge_l(preds, refs),
        "CIDEr": lambda: cider(preds, refs),
        "TER": lambda: sacrebleu.corpus_ter(preds, streams).score / 100.0,
    }
    out: dict[str, Any] = {}
    for name in wanted:
        value = compute[name]()
        out[name] = float(value) if value is not None else math.nan
    return out


def bleu_interval(
    task: str,
    outputs: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    lowercase: bool = False,
    resamples: int = 1000,
) -> tuple[float, float]:
    """(bootstrap mean, 95% half-width) of a data-to-text task's corpus BLEU, by its
    convention, over test inputs resampled with replacement (sacrebleu's own bootstrap,
    seeded by ``SACREBLEU_SEED``)."""
    sacrebleu = require("sacrebleu", "metrics", "BLEU and TER")

    if CONVENTIONS.get(task, _SUMM).family != "data-to-text":
        raise ConfigError(f"BLEU intervals are for data-to-text tasks, not {task!r}")
    refs = _references(task, references, len(outputs))
    preds, refs = _cased(outputs, refs, lowercase)
    width = max(len(r) for r in refs)
    streams = [[r[j] if j < len(r) else None for r in refs] for j in range(width)]
    score = sacrebleu.BLEU().corpus_score(preds, streams, n_bootstrap=resamples)
    return float(score._mean), float(score._ci)


def bleu_paired(
    task: str,
    outputs_a: Sequence[str],
    outputs_b: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    lowercase: bool = False,
    resamples: int = 1000,
    seed: int = 12345,
    test: str = "bootstrap",
) -> dict[str, float | int]:
    """Corpus BLEU of A minus B by a data-to-text task's convention, with the paired bootstrap
    over test inputs (Koehn 2004; sacrebleu's sufficient statistics, so each resample costs a
    sum): ``n`` inputs, ``mean`` the observed difference, ``low``/``high`` the 95% percentile
    interval of the resampled differences, ``p`` two-sided (twice the share of resamples on
    the far side of 0, at least 1 / resamples; ``test="randomisation"``: approximate
    randomisation's instead). :func:`bleu_paired_runs` of one run."""
    r = bleu_paired_runs(
        task,
        [outputs_a],
        [outputs_b],
        references,
        lowercase=lowercase,
        resamples=resamples,
        seed=seed,
        test=test,
    )
    return {k: r[k] for k in ("n", "mean", "low", "high", "p", "test")}


def bleu_paired_runs(
    task: str,
    runs_a: Sequence[Sequence[str]],
    runs_b: Sequence[Sequence[str]],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    lowercase: bool = False,
    resamples: int = 1000,
    seed: int = 12345,
    test: str = "bootstrap",
) -> dict[str, Any]:
    """:func:`bleu_paired` pooled over K paired runs (``runs_a[k]`` and ``runs_b[k]``: system
    A's and B's outputs on the same inputs under training seed k). ``mean`` is the mean over
    runs of the corpus BLEU differences; the interval and ``p`` come from a two-level
    bootstrap: each resample draws K runs with replacement and the inputs with replacement
    (the same inputs for every drawn run), and averages the drawn runs' differences. The
    interval so widens with the spread between seeds as well as between inputs (with K = 2
    it still understates the seeds' share: a bootstrap over K values has variance (K-1)/K
    of theirs). One run gives :func:`bleu_paired`'s numbers; ``run_means`` holds each run's
    difference.

    ``test="randomisation"`` takes ``p`` from approximate randomisation instead (Riezler &
    Maxwell 2005; sacrebleu's ``--paired-ar``): each resample swaps A's and B's outputs on a
    random half of the inputs (the same inputs in every run), and p = (c + 1) / (R + 1) with
    c the resamples whose mean difference is at least as far from 0 as the observed one; the
    interval stays the bootstrap's."""
    import numpy as np

    n = _check_runs(task, runs_a, runs_b, test)
    refs = _references(task, references, n)
    idx = np.random.default_rng(seed).choice(n, size=(resamples, n), replace=True)
    observed, resampled, stats = [], [], []
    for outs_a, outs_b in zip(runs_a, runs_b, strict=True):
        a, b = (_bleu_resampled(o, refs, lowercase, idx) for o in (outs_a, outs_b))
        observed.append(a.score - b.score)
        resampled.append(a.resampled - b.resampled)
        stats.append((a.stats, b.stats))
    low, high, p = _two_level_bootstrap(resampled, resamples, seed + 1)
    if test == "randomisation":
        p = _randomisation_p(stats, float(np.mean(observed)), resamples, seed + 2)
    return {
        "n": n,
        "runs": len(observed),
        "mean": float(np.mean(observed)),
        "run_means": observed,
        "low": low,
        "high": high,
        "p": float(p),
        "test": test,
    }


def _check_runs(task: str, runs_a: Sequence, runs_b: Sequence, test: str) -> int:
    """The inputs per run of :func:`bleu_paired_runs`, after its checks of the arguments."""
    if test not in ("bootstrap", "randomisation"):
        raise ConfigError(f"paired BLEU's test is bootstrap or randomisation, not {test!r}")
    if CONVENTIONS.get(task, _SUMM).family != "data-to-text":
        raise ConfigError(f"paired BLEU is for data-to-text tasks, not {task!r}")
    if not runs_a or len(runs_a) != len(runs_b):
        raise ConfigError(
            f"paired BLEU needs as many runs, at least one: {len(runs_a)} and {len(runs_b)}"
        )
    n = len(runs_a[0])
    if any(len(o) != n for o in (*runs_a, *runs_b)):
        sizes = sorted({len(o) for o in (*runs_a, *runs_b)})
        raise ConfigError(f"paired BLEU needs as many outputs in every run, got {sizes}")
    return n


def _two_level_bootstrap(resampled: list, resamples: int, seed: int) -> tuple[float, ...]:
    """(low, high, p) of the mean over runs from each run's resampled differences ``[R]``:
    each resample draws the runs with replacement; the 95% percentile interval, and p two-sided
    (twice the share on the far side of 0, at least 1 / resamples)."""
    import numpy as np

    k = len(resampled)
    drawn = np.random.default_rng(seed).integers(k, size=(resamples, k))
    diffs = np.stack(resampled)[drawn, np.arange(resamples)[:, None]].mean(1)
    far = min((diffs <= 0).mean(), (diffs >= 0).mean())
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high), float(min(1.0, max(2 * far, 1 / resamples)))


def _randomisation_p(stats: list, observed: float, resamples: int, seed: int) -> float:
    """Approximate randomisation's two-sided p of the mean corpus-BLEU difference over runs:
    ``stats`` holds each run's (A, B) per-input sufficient statistics ``[n, S]``."""
    import numpy as np

    sacrebleu = require("sacrebleu", "metrics", "BLEU and TER")
    metric = sacrebleu.BLEU()
    swap = np.random.default_rng(seed).random((resamples, stats[0][0].shape[0])) < 0.5
    keep = (~swap).astype("float64")
    swap = swap.astype("float64")
    diffs = np.zeros(resamples)
    for a, b in stats:
        for which, (x, y) in enumerate(zip(keep @ a + swap @ b, swap @ a + keep @ b, strict=True)):
            diffs[which] += (
                metric._compute_score_from_stats(x.tolist()).score
                - metric._compute_score_from_stats(y.tolist()).score
            )
    diffs /= len(stats)
    beyond = int((np.abs(diffs) >= abs(observed) * (1 - 1e-12)).sum())
    return (beyond + 1) / (resamples + 1)


class _Resampled(NamedTuple):
    """Corpus BLEU of some outputs, its value on each bootstrap resample (array ``[R]``), and
    the per-input sufficient statistics it comes from (``[n, S]``)."""

    score: float
    resampled: Any
    stats: Any


def _bleu_resampled(
    outputs: Sequence[str], refs: list[list[str]], lowercase: bool, idx: Any
) -> _Resampled:
    """Corpus BLEU of ``outputs`` and its value on each row of input indices ``idx``
    ``[R, n]``, from sacrebleu's per-input sufficient statistics."""
    import numpy as np

    sacrebleu = require("sacrebleu", "metrics", "BLEU and TER")
    outs, refs_c = _cased(outputs, refs, lowercase)
    width = max(len(r) for r in refs_c)
    streams = [[r[j] if j < len(r) else None for r in refs_c] for j in range(width)]
    metric = sacrebleu.BLEU()
    stats = np.array(metric._extract_corpus_statistics(outs, streams), dtype="float64")
    score = metric._compute_score_from_stats(stats.sum(0)).score
    again = [metric._compute_score_from_stats(stats[i].sum(0)).score for i in idx]
    return _Resampled(score, np.array(again), stats)
