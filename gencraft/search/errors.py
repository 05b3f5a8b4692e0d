"""Search errors against model errors (Stahlberg & Byrne 2019; Yoshida 2023, ch. 6).

For each prompt, :func:`search_errors` runs beam search at several widths (width 1 is greedy)
and exact search with a node budget, and says of each search's output whether it scores below
the proven mode (a *search error*), equals it, or cannot be judged (the mode is not proven, or
the output was cut before EOS). :func:`error_table` and :func:`length_table` summarise rows in
Stahlberg & Byrne's shape, with 95% Wilson intervals over the proven prompts and bounds over all.

Both searches range over the same outputs: ``max_new_tokens`` counts tokens before EOS, as
:func:`~gencraft.search.exact.exact_mode` counts them, so each beam search runs one step more
(its limit counts the EOS).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.metrics.stats import wilson_interval
from gencraft.search.beam import beam_search_batch
from gencraft.search.exact import exact_mode_batch

#: what ``SearchOutcome.error`` may be
ERROR_KINDS = ("cut", "unknown", "equal", "below")


class _Fields:
    """Row fields as attributes or keys (``row.proven`` or ``row["proven"]``)."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> list[str]:
        return list(self.__dataclass_fields__)  # type: ignore[attr-defined]


@dataclass
class SearchOutcome(_Fields):
    """One search's output for one prompt. ``tokens``: ids before EOS; ``logprob``: summed
    log-probability, the EOS step included when ``finished``; ``error``: one of
    :data:`ERROR_KINDS`, against the row's mode."""

    tokens: list[int]
    logprob: float
    finished: bool
    error: str


@dataclass
class SearchErrorRow(_Fields):
    """One prompt. ``proven``: exact search finished within ``max_nodes``; ``mode_logprob``:
    the best complete output's log-probability, EOS included (-inf if none was found), a lower
    bound on the mode's unless proven; ``mode_empty``: proven, and the mode is the empty
    output; ``best_empty``: the best output found is empty (proven or not); ``searches``: beam
    width (1: greedy) -> :class:`SearchOutcome`."""

    proven: bool
    mode_empty: bool
    mode_logprob: float
    mode_tokens: list[int]
    best_empty: bool
    nodes: int
    seconds: float
    searches: dict[int, SearchOutcome] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (widths as string keys); :meth:`from_json` reads it back."""
        out = asdict(self)
        out["searches"] = {str(k): asdict(v) for k, v in self.searches.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchErrorRow:
        searches = {int(k): SearchOutcome(**v) for k, v in data["searches"].items()}
        return cls(**{**data, "searches": searches})


def classify(
    logprob: float, finished: bool, proven: bool, mode_logprob: float, tol: float = 1e-4
) -> str:
    """A search output's verdict: ``"cut"`` (no EOS within the limit), ``"unknown"`` (the
    mode is not proven), ``"equal"`` (within ``tol`` of the mode's log-probability) or
    ``"below"`` (a search error)."""
    if not finished:
        return "cut"
    if not proven:
        return "unknown"
    if logprob > mode_logprob + tol:
        raise GencraftError(
            f"a beam output scores {logprob:.6f}, above the proven mode's {mode_logprob:.6f} "
            f"by more than tol={tol:g}: the searches' numerics disagree; raise tol"
        )
    return "equal" if abs(logprob - mode_logprob) <= tol else "below"


def check_beams(beams: Sequence[int]) -> list[int]:
    widths = [int(k) for k in beams]
    if not widths or any(k < 1 for k in widths) or len(set(widths)) != len(widths):
        raise GencraftError(f"beams must be distinct widths >= 1 (1: greedy), got {list(beams)}")
    return widths


def search_errors(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    beams: Sequence[int] = (1, 4),
    max_nodes: int | None,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None = None,
    tol: float = 1e-4,
    max_seconds: float | None = None,
    seed: bool = True,
) -> list[SearchErrorRow]:
    """Greedy, beam and exact search on each prompt of a batch, and each output's verdict.

    Args:
        model: a Hugging Face causal LM or encoder-decoder.
        input_ids: [B, P] prompts (causal LM: left-padded) or encoder inputs.
        attention_mask: [B, P] 1 for tokens, 0 for padding (default: none padded).
        beams: beam widths; 1 is greedy. Width k's output is the first hypothesis
            ``beam_search(..., num_beams=k)`` returns (length penalty 0, early stopping).
        max_nodes: exact search's node budget per prompt (None: none; the search is then
            always proven, at a cost exponential in ``max_new_tokens``).
        max_new_tokens: the longest output, in tokens before EOS. Beam search runs
            ``max_new_tokens + 1`` steps, so both range over the same outputs.
        eos_token_id: id or ids ending an output (default: the model's).
        tol: log-probabilities within ``tol`` of the mode's count as equal.
        max_seconds: exact search's wall-time budget (the batch's, as its rows advance
            together); a row it stops is unproven, as one ``max_nodes`` stops.
        seed: start each exact search's bound at the best finished beam output of the row
            (its scoring steps count as nodes), so the DFS prunes from its first node; the
            mode it proves is the same, in fewer nodes.
    Returns one :class:`SearchErrorRow` per prompt.
    """
    widths = check_beams(beams)
    if max_new_tokens < 0:
        raise GencraftError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    kw = dict(eos_token_id=eos_token_id)
    found = {
        k: beam_search_batch(
            model, input_ids, attention_mask, num_beams=k, max_new_tokens=max_new_tokens + 1, **kw
        )
        for k in widths
    }
    tops = [[found[k][r][0] for k in widths] for r in range(len(found[widths[0]]))]
    modes = exact_mode_batch(
        model,
        input_ids,
        attention_mask,
        max_new_tokens=max_new_tokens,
        max_nodes=max_nodes,
        max_seconds=max_seconds,
        initial=[_best_finished(t) for t in tops] if seed else None,
        **kw,
    )
    return [_row(mode, tops[r], widths, tol) for r, mode in enumerate(modes)]


def _best_finished(tops: list[Any]) -> list[int] | None:
    """The highest-scoring finished hypothesis's tokens among ``tops`` (None: none finished)."""
    done = [t for t in tops if t.finished]
    return list(max(done, key=lambda t: t.score).tokens) if done else None


def _row(mode: Any, tops: list[Any], widths: list[int], tol: float) -> SearchErrorRow:
    """One prompt's row from its exact search (a ``ModeResult``) and each width's first
    hypothesis (``tops``, in the order of ``widths``)."""
    searches = {
        k: SearchOutcome(
            list(top.tokens),
            float(top.score),
            top.finished,
            classify(top.score, top.finished, mode.exact, mode.log_prob, tol),
        )
        for k, top in zip(widths, tops, strict=True)
    }
    return SearchErrorRow(
        proven=mode.exact,
        mode_empty=mode.exact and not mode.tokens,
        mode_logprob=float(mode.log_prob),
        mode_tokens=list(mode.tokens),
        best_empty=not mode.tokens and math.isfinite(mode.log_prob),
        nodes=mode.nodes,
        seconds=mode.seconds,
        searches=searches,
    )


def _pct(k: int, n: int) -> str:
    """``k / n`` as a percentage with its 95% Wilson interval; "-" for n = 0."""
    if n == 0:
        return "-"
    low, high = wilson_interval(k, n)
    return f"{100 * k / n:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def _bound(low: int, high: int, n: int) -> str:
    """A share known only between ``low / n`` and ``high / n``, as percentages."""
    if n == 0:
        return "-"
    if low == high:
        return f"{100 * low / n:.1f}"
    return f"{100 * low / n:.1f} to {100 * high / n:.1f}"


def _share(k: int, n: int) -> str:
    return f"{100 * k / max(1, n):.1f}"


def _width_row(name: str, outs: list[tuple[SearchErrorRow, SearchOutcome]]) -> dict[str, Any]:
    """One search's line of :func:`error_table`; ``outs``: (row, its output) pairs."""
    below = sum(o.error == "below" for _, o in outs)
    # unproven: the output is certainly an error if the best output found beats it
    beaten = [o.error == "unknown" and r.mode_logprob > o.logprob + 1e-4 for r, o in outs]
    known = below + sum(beaten)
    unjudged = sum(o.error in ("cut", "unknown") for _, o in outs) - sum(beaten)
    return {
        "search": name,
        "search errors %": _pct(below, sum(r.proven for r, _ in outs)),
        "search errors % (bounds, all)": _bound(known, known + unjudged, len(outs)),
        "empty %": _share(sum(o.finished and not o.tokens for _, o in outs), len(outs)),
        "cut %": _share(sum(not o.finished for _, o in outs), len(outs)),
        "n": len(outs),
    }


def error_table(
    rows: Sequence[SearchErrorRow], scores: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Stahlberg & Byrne's table: one line per search (greedy, beam k, exact).

    Columns: ``search``; ``task score`` (from ``scores``, keyed by the line names, if given);
    ``search errors %`` over the proven prompts with its 95% Wilson interval; ``search errors
    % (bounds, all)`` over all prompts, from the known errors (below a proven mode, or below
    the best output found) to those plus the unjudged (cut, or not beaten by the best found);
    ``empty %`` of outputs (exact: of the proven modes, with interval; ``empty % (bounds,
    all)``: see :func:`empty_bounds`); ``cut %``; ``proven %``; ``n``."""
    n, proven = len(rows), [r for r in rows if r.proven]
    widths = sorted({k for r in rows for k in r.searches})
    table = [
        _width_row("greedy" if k == 1 else f"beam {k}", [(r, r.searches[k]) for r in rows])
        for k in widths
    ]
    empty = sum(r.mode_empty for r in proven)
    table.append(
        {
            "search": "exact",
            "search errors %": "0 (by definition)" if proven else "-",
            "empty %": _pct(empty, len(proven)),
            "empty % (bounds, all)": _bound(*empty_bounds(rows), n),
            "cut %": "0.0",
            "n": n,
        }
    )
    for line in table:
        line["proven %"] = _share(len(proven), n)
        if scores:
            line["task score"] = scores.get(line["search"])
    return table


def empty_bounds(rows: Sequence[SearchErrorRow]) -> tuple[int, int]:
    """How many of ``rows`` have an empty mode, at least and at most: the proven empty modes,
    plus the unproven rows whose best output found is empty. An unproven row whose best found
    is not empty has a non-empty mode: the search scores the empty output first (at its root)
    and found a complete output above it."""
    known = sum(r.mode_empty for r in rows if r.proven)
    return known, known + sum(1 for r in rows if not r.proven and r.best_empty)


def length_table(
    rows: Sequence[SearchErrorRow], prompt_tokens: Sequence[int], edges: Sequence[int]
) -> list[dict[str, Any]]:
    """The rows binned by prompt length (the thesis's Fig. 6.x): bins ``[edges[i],
    edges[i+1])`` of ``prompt_tokens`` (one per row), each with ``proven %``, ``empty mode %``
    over the proven prompts (95% interval), its bounds over all, and each width's search
    errors % over the proven prompts."""
    if len(prompt_tokens) != len(rows):
        raise GencraftError(f"{len(rows)} rows but {len(prompt_tokens)} prompt lengths")
    table = []
    widths = sorted({k for r in rows for k in r.searches})
    for lo, hi in itertools.pairwise(edges):
        group = [r for r, p in zip(rows, prompt_tokens, strict=True) if lo <= p < hi]
        if not group:
            continue
        proven = [r for r in group if r.proven]
        empty = sum(r.mode_empty for r in proven)
        entry = {
            "prompt tokens": f"{lo}-{hi - 1}",
            "n": len(group),
            "proven %": f"{100 * len(proven) / len(group):.1f}",
            "empty mode %": _pct(empty, len(proven)),
            "empty mode % (bounds, all)": _bound(*empty_bounds(group), len(group)),
        }
        for k in widths:
            below = sum(r.searches[k].error == "below" for r in proven if k in r.searches)
            entry["greedy errors %" if k == 1 else f"beam {k} errors %"] = _pct(below, len(proven))
        table.append(entry)
    return table


def budget_table(
    rows: Sequence[SearchErrorRow], budgets: Sequence[int], max_nodes: int | None = None
) -> list[dict[str, Any]]:
    """The proven share and the empty-mode rate at smaller node budgets, read off one run.

    The DFS is deterministic and checks its budget before each expansion, so a prompt proven
    with ``nodes`` expansions is proven under any budget >= ``nodes`` and under none below it:
    one run at the largest budget gives every smaller budget's line. A budget above that
    run's ``max_nodes`` would need a new run (its line shows the run's share).

    The upper bound on empty modes counts every prompt unproven at a smaller budget (what
    that search would have found is not recorded); at the run's own budget (``max_nodes``,
    when given) it is :func:`empty_bounds`'s, from the best outputs the run found."""
    table = []
    for budget in budgets:
        proven = [r for r in rows if r.proven and r.nodes <= budget]
        empty = sum(r.mode_empty for r in proven)
        own = max_nodes is not None and budget >= max_nodes
        bounds = empty_bounds(rows) if own else (empty, empty + len(rows) - len(proven))
        table.append(
            {
                "node budget": budget,
                "proven %": _pct(len(proven), len(rows)),
                "empty mode % (of proven)": _pct(empty, len(proven)),
                "empty mode % (bounds, all)": _bound(*bounds, len(rows)),
                "n": len(rows),
            }
        )
    return table


def score_differences(
    outputs: Sequence[dict[str, str]],
    references: Sequence[Sequence[str]],
    proven: Sequence[bool],
    against: str = "exact",
) -> list[dict[str, Any]]:
    """Per-prompt ROUGE-L (F1 x100, against every reference) of each search's output minus
    that of ``against``'s, paired by prompt: does the approximate search's output score
    higher than the mode's? One line per search and prompt set (all prompts; the proven ones,
    where ``against``'s output is the mode), with the mean difference, its 95% paired t
    interval and p, and on how many prompts the search scored higher and lower.

    ``outputs``: per prompt, search name -> output text; ``proven``: per prompt."""
    from gencraft.metrics.stats import paired_t
    from gencraft.metrics.text import rouge_per_example

    if not (len(outputs) == len(references) == len(proven)):
        raise GencraftError(
            f"{len(outputs)} outputs, {len(references)} references and {len(proven)} proven "
            "flags: give one of each per prompt"
        )
    names = list(outputs[0]) if outputs else []
    per = {n: rouge_per_example([o[n] for o in outputs], references, "rougeL") for n in names}
    sets = {"all": list(range(len(outputs))), "proven": [i for i, p in enumerate(proven) if p]}
    table = []
    for name in (n for n in names if n != against):
        for which, idx in sets.items():
            diffs = [per[name][i] - per[against][i] for i in idx]
            t = paired_t(diffs) if diffs else None
            table.append(
                {
                    "search": name,
                    "minus": against,
                    "prompts": which,
                    "n": len(diffs),
                    "RL diff": "-" if t is None else round(t["mean"], 2),
                    "95% interval": "-"
                    if t is None or t["n"] < 2
                    else f"[{t['low']:.2f}, {t['high']:.2f}]",
                    "p": "-" if t is None else float(f"{t['p']:.3g}"),
                    "higher": sum(d > 0 for d in diffs),
                    "lower": sum(d < 0 for d in diffs),
                }
            )
    return table
