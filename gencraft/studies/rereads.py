"""Readers of committed run files: each turns one run's saved per-unit values into paired
comparisons on the claim's independent unit (:func:`gencraft.metrics.stats.compare_paired`),
without running a model. A reader returns None when the run is not in the folder given.

Every reader takes the runs folder (``docs/results/runs`` in the repository) and the data
directory (for labels and references the runs did not save)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gencraft.metrics.stats import compare_paired, paired_t, wilson_interval
from gencraft.studies.search_conditional import prompt_texts, study_items


@dataclass(frozen=True)
class Comparison:
    """One comparison of a claim: its name, its result (a mapping with ``mean``, ``low``,
    ``high``, ``p``, ``units``; ``resamples`` where p was resampled) and the unit's name."""

    name: str
    result: Mapping[str, Any]
    unit: str


@dataclass(frozen=True)
class Measured:
    """What a committed run says about one claim: the primary comparison, the secondary ones
    (Holm over all of them), notes, descriptive details (label, text), the paper's effect in
    this endpoint's units where it must be converted, and the files read."""

    primary: Comparison
    secondary: tuple[Comparison, ...] = ()
    notes: tuple[str, ...] = ()
    details: tuple[tuple[str, str], ...] = ()
    paper_effect: float | None = None
    equivalence_p: float | None = None
    files: tuple[str, ...] = field(default=())


@cache
def _json(path: Path) -> Any:
    return json.loads(path.read_text())


# --- HSO few-shot (campaign-cpu/hso-fewshot/run) ------------------------------------------

HSO_FEWSHOT = "campaign-cpu/hso-fewshot/run/results.json"


def _fewshot_cells(units: dict) -> dict[str, dict[tuple[int, int], list[int]]]:
    """method -> (n, seed) -> per-example correctness, from units ``n=N seed=S METHOD``."""
    out: dict[str, dict[tuple[int, int], list[int]]] = {}
    for key, unit in units.items():
        n, seed, method = key.split(" ", 2)
        out.setdefault(method, {})[int(n[2:]), int(seed[5:])] = unit["correct"]
    return out


def _fewshot_pairs(cells: dict, a: str, b: str) -> tuple[list[float], list[float], list[int]]:
    """Rows (a's correctness, b's, example index) over every cell both methods finished."""
    xa, xb, ids = [], [], []
    for cell, got in sorted(cells[a].items()):
        other = cells[b].get(cell)
        if other is None:
            continue
        for i, (u, v) in enumerate(zip(got, other, strict=False)):
            xa.append(100.0 * u)
            xb.append(100.0 * v)
            ids.append(i)
    return xa, xb, ids


def _fewshot_labels(settings: dict, data_dir: str | None) -> tuple[list[int], list[str]]:
    """The test examples' labels in the run's order, and the label names (the run's
    class-balanced draw, which reads no tokenizer when the test length is not capped)."""
    from gencraft.hso.fewshot import build_task
    from gencraft.studies.hso import _test_examples

    task = build_task(settings["task"], data_dir)
    tests = _test_examples(task, settings["examples"], None, settings.get("max_test_tokens"))
    return [y for _, y in tests], list(task.labels)


def _answers_table(cells: dict, labels: list[int], names: list[str]) -> list[tuple[str, str]]:
    """Per method: accuracy on each class and the share of each answer (two classes: a wrong
    answer is the other label), pooled over the cells."""
    rows = []
    for method in ("baseline", "hso", "hso2"):
        right = {y: [0, 0] for y in range(len(names))}
        said = [0] * len(names)
        for got in cells[method].values():
            for c, y in zip(got, labels, strict=False):
                right[y][0] += c
                right[y][1] += 1
                said[y if c else 1 - y] += 1
        total = sum(said)
        acc = ", ".join(f"{names[y]} {100 * r / max(n, 1):.1f}%" for y, (r, n) in right.items())
        rate = ", ".join(f"{names[y]} {100 * k / total:.1f}%" for y, k in enumerate(said))
        rows.append((f"{method}: accuracy per class", f"{acc}; answers: {rate}"))
    return rows


HSO_FEWSHOT_CONFIRM = "hso-fewshot-confirm-cpu/results.json"


def hso_fewshot_confirm(runs: Path, data_dir: str | None):
    """The pre-registered analysis of ``hso-fewshot-confirm`` (:func:`gencraft.hso.
    experiments.confirm_analysis`): HSO-2 − plain at n = 2 by example, then the other three
    comparisons; None until every comparison's cells are finished."""
    from gencraft.studies.hso import CONFIRM_COMPARISONS, confirm_analysis

    path = runs / HSO_FEWSHOT_CONFIRM
    if not path.is_file():
        return None
    run = _json(path)
    units, s = run["units"], run["settings"]
    if "examples" not in units:
        return None
    labels = units["examples"]["label"]
    a = confirm_analysis(units, labels, s["seeds"], s["resamples"])
    if any(c is None for c in a["comparisons"]):
        return None
    comps = [
        Comparison(f"{m} − plain, n = {n}", c["result"], "example")
        for (m, n), c in zip(CONFIRM_COMPARISONS, a["comparisons"], strict=True)
    ]
    details = [
        (
            f"{x['unit']}: accuracy per class",
            f"yes {x['class accuracy'][0]:.1f}%, no {x['class accuracy'][1]:.1f}%; answers: "
            f"yes {x['answer share'][0]:.1f}%, no {x['answer share'][1]:.1f}%",
        )
        for x in a["answers"]
    ]
    notes = (
        f"Pre-registered; {len(labels)} fresh examples ({labels.count(0)} yes, "
        f"{labels.count(1)} no), prompt seeds {s['seeds']}; each example one unit.",
    )
    return Measured(comps[0], tuple(comps[1:]), notes, tuple(details), files=(HSO_FEWSHOT_CONFIRM,))


def hso_fewshot(runs: Path, data_dir: str | None, *, a: str = "hso", b: str = "baseline"):
    """HSO (or ``a``) minus ``b`` in accuracy points, clustered by test example over the
    (n, seed) cells; secondary: the other HSO variant. Once the pre-registered run has
    finished, HSO and the claim are read from it (:func:`hso_fewshot_confirm`)."""
    if a == "hso" and (confirmed := hso_fewshot_confirm(runs, data_dir)) is not None:
        return confirmed
    path = runs / HSO_FEWSHOT
    if not path.is_file():
        return None
    run = _json(path)
    cells = _fewshot_cells(run["units"])
    comps = []
    for x, y in ((a, b), *((("hso2", b),) if a == "hso" else ())):
        xa, xb, ids = _fewshot_pairs(cells, x, y)
        comps.append(Comparison(f"{x} − {y}", compare_paired(xa, xb, clusters=ids), "example"))
    n_cells = len(cells[a])
    labels, names = _fewshot_labels(run["settings"], data_dir)
    notes = (
        f"{n_cells} (n, seed) cells of {len(labels)} test examples: each example is one unit "
        "(its mean over the cells), not one pair per cell.",
        "Exploratory: this run was not pre-registered; the confirmatory run is planned.",
    )
    return Measured(
        comps[0],
        tuple(comps[1:]),
        notes,
        tuple(_answers_table(cells, labels, names)),
        files=(HSO_FEWSHOT,),
    )


def hso_cost(runs: Path, data_dir: str | None):
    """log(seconds per example) of HSO minus dynamic evaluation's, one unit per (n, seed)
    cell (the run saved each unit's time, not each example's)."""
    path = runs / HSO_FEWSHOT
    if not path.is_file():
        return None
    units = _json(path)["units"]
    cells = _fewshot_cells(units)

    def per_example(method: str, cell: tuple[int, int]) -> float:
        key = f"n={cell[0]} seed={cell[1]} {method}"
        return units[key]["seconds"] / len(units[key]["correct"])

    both = sorted(set(cells["hso"]) & set(cells["dynamic eval"]))
    hso = [math.log(per_example("hso", c)) for c in both]
    de = [math.log(per_example("dynamic eval", c)) for c in both]
    ratio = statistics.fmean(math.exp(x - y) for x, y in zip(hso, de, strict=True))
    return Measured(
        Comparison("log s/example, HSO − dynamic evaluation", compare_paired(hso, de), "cell"),
        notes=(
            f"HSO takes {ratio:.2f}× dynamic evaluation's time per example (mean over "
            f"{len(both)} cells); dynamic evaluation ran on the first 20 examples of each cell.",
        ),
        files=(HSO_FEWSHOT,),
    )


# --- HSO perplexity, confirmatory (hso-ppl-cpu) ---------------------------------------------

HSO_PPL = "hso-ppl-cpu/results.json"


def hso_ppl(runs: Path, data_dir: str | None):
    """The pre-registered analysis of the ``hso-ppl`` run (:func:`gencraft.studies.hso.
    ppl_analysis`): HSO − plain NLL per token by article; secondary: the sign test over
    articles. None until both methods have scored every context (an interim look decides
    nothing)."""
    from gencraft.studies.hso import ppl_analysis

    path = runs / HSO_PPL
    if not path.is_file():
        return None
    run = _json(path)
    units = run["units"]
    if not {"articles", "plain", "hso"} <= set(units):
        return None
    a = ppl_analysis(units, run["settings"]["resamples"])
    lower, higher = a["sign"]["lower"], a["sign"]["higher"]
    sign = {
        "mean": (lower - higher) / max(1, lower + higher),
        "low": math.nan,
        "high": math.nan,
        "p": a["sign"]["p"],
        "units": lower + higher,
    }
    totals = []
    for m in ("plain", "hso"):
        ctx = units[m]["contexts"]
        n = sum(k for _, k in ctx)
        ppl = math.exp(math.fsum(x for x, _ in ctx) / n)
        totals.append((f"{m}: token perplexity (exploratory)", f"{ppl:.3f} over {n:,} tokens"))
    return Measured(
        Comparison("HSO − plain, NLL nats/token", a["primary"], "article"),
        (
            Comparison(
                f"sign test: HSO lower in {lower}, higher in {higher} articles", sign, "article"
            ),
        ),
        notes=(
            f"Pre-registered; {a['primary'].rows} contexts of {run['settings']['context']} "
            f"tokens in {a['primary'].units} articles, each article one unit.",
        ),
        details=tuple(totals),
        files=(HSO_PPL,),
    )


# --- pointer sentinel vs LSTM, confirmatory (pointer-confirm-cpu) ----------------------------

POINTER_CONFIRM = "pointer-confirm-cpu/results.json"


def _pointer_run(runs: Path, data_dir: str | None):
    """(results, corpus) of the pre-registered pointer run, or None until its every seed has
    both test units."""
    path = runs / POINTER_CONFIRM
    if not path.is_file():
        return None
    run = _json(path)
    s = run["settings"]
    keys = [f"test {m}-s{sd}" for sd in s["seeds"] for m in ("lstm", "pointer")]
    if not all(k in run["units"] for k in keys):
        return None
    from gencraft.data import load_lm_corpus

    return run, load_lm_corpus(s["corpus"], data_dir, splits=("test",))


def pointer_ptb(runs: Path, data_dir: str | None):
    """Pointer − LSTM NLL per word over seeds × test sentences (the registered primary), and
    the gain in each frequency bucket (secondary) (:func:`gencraft.studies.pointer.
    pointer_confirm_analysis`)."""
    from gencraft.studies.pointer import pointer_confirm_analysis

    got = _pointer_run(runs, data_dir)
    if got is None:
        return None
    run, corpus = got
    s = run["settings"]
    a = pointer_confirm_analysis(run["units"], corpus, s["seeds"], s["resamples"])
    buckets = tuple(
        Comparison(
            f"gain LSTM − pointer, bucket {b['bucket']} ({b['words']:,} words)",
            b["result"],
            "training seed",
        )
        for b in a["buckets"]
    )
    ppl = [
        (
            f"{m}: test perplexity per seed (batch 1)",
            ", ".join(
                f"{math.exp(statistics.fmean(run['units'][f'test {m}-s{sd}']['token_nll'])):.1f}"
                for sd in s["seeds"]
            ),
        )
        for m in ("lstm", "pointer")
    ]
    return Measured(
        Comparison("pointer − LSTM, NLL nats/word", a["primary"], "training seed"),
        buckets,
        notes=(
            f"Pre-registered; {len(s['seeds'])} seeds, {a['primary'].units:,} test sentences "
            "as the second level.",
        ),
        details=(*ppl, _over_seeds(a["primary"])),
        files=(POINTER_CONFIRM,),
    )


def pointer_rare(runs: Path, data_dir: str | None):
    """Within each test sentence holding words of both, the gain (LSTM − pointer NLL) on the
    rarest decile's words minus that on the most frequent decile's, over seeds × sentences."""
    from gencraft.data import EOS
    from gencraft.pointer.analysis import frequency_buckets
    from gencraft.studies.pointer import sentence_of_words

    got = _pointer_run(runs, data_dir)
    if got is None:
        return None
    run, corpus = got
    test = corpus["test"]
    sent = sentence_of_words(test, corpus.vocab.stoi[EOS])
    bucket = frequency_buckets(corpus.vocab.counts, 10)[test[1:]].tolist()
    rare, frequent, ids, seeds = [], [], [], []
    for sd in run["settings"]["seeds"]:
        lstm = run["units"][f"test lstm-s{sd}"]["token_nll"]
        ptr = run["units"][f"test pointer-s{sd}"]["token_nll"]
        gains: dict[tuple[int, int], list[float]] = {}
        for i, (x, y) in enumerate(zip(lstm, ptr, strict=True)):
            if bucket[i] in (0, 9):
                gains.setdefault((sent[i], bucket[i]), []).append(x - y)
        for (k, b), g in sorted(gains.items()):
            if b == 9 and (k, 0) in gains:
                rare.append(statistics.fmean(g))
                frequent.append(statistics.fmean(gains[k, 0]))
                ids.append(k)
                seeds.append(sd)
    r = compare_paired(rare, frequent, clusters=ids, seeds=seeds)
    return Measured(
        Comparison("gain on the rarest decile − on the most frequent", r, "training seed"),
        notes=(f"{r.units:,} test sentences hold words of both deciles.",),
        details=(_over_seeds(r),),
        files=(POINTER_CONFIRM,),
    )


def _over_seeds(r: Any) -> tuple[str, str]:
    """A detail line: each seed's difference and the t test over those seed means alone
    (exploratory; it does not rest on the bootstrap's few distinct seed draws)."""
    t = paired_t(r.run_means)
    each = ", ".join(f"{x:+.3f}" for x in r.run_means)
    return (
        "each seed's difference, and a t test over the seeds alone (exploratory)",
        f"{each}; p = {t['p']:.2g} ({t['n'] - 1} degrees of freedom)",
    )


# --- recurrence (campaign-cpu/recurrence/seed0) -------------------------------------------

RECURRENCE = "campaign-cpu/recurrence/seed0/results.json"
#: consecutive 1,024-token blocks per resampled block: about one WikiText-2 test article
RECURRENCE_BLOCK = 5
#: the thesis's Table 2.1 (WikiText-103 test, overlap 0): baseline and recurrent word ppl
THESIS_RECURRENCE_PPL = (30.47, 29.01)


def recurrence(runs: Path, data_dir: str | None):
    """Recurrent minus baseline mean NLL per token (nats) over the WikiText-2 test blocks,
    block-bootstrapped in runs of consecutive blocks; secondary: the sign test over blocks."""
    from gencraft.metrics.stats import sign_test

    path = runs / RECURRENCE
    if not path.is_file():
        return None
    units = _json(path)["units"]
    base, rec = (units[f"eval {m} verdict"][0] for m in ("baseline", "recurrent"))
    a, b = rec["block_nll"], base["block_nll"]
    by_article = "block_article" in base  # runs since articles are saved: the true unit
    primary = (
        compare_paired(a, b, clusters=base["block_article"])
        if by_article
        else compare_paired(a, b, block=RECURRENCE_BLOCK)
    )
    wins = sum(x < y for x, y in zip(a, b, strict=True))
    losses = sum(x > y for x, y in zip(a, b, strict=True))
    sign = {
        "mean": (wins - losses) / len(a),
        "low": math.nan,
        "high": math.nan,
        "p": sign_test(wins, losses),
        "units": len(a),
    }
    words_per_token = base["words"] / base["tokens"]
    paper = math.log(THESIS_RECURRENCE_PPL[1] / THESIS_RECURRENCE_PPL[0]) * words_per_token
    return Measured(
        Comparison(
            "recurrent − baseline, NLL nats/token",
            primary,
            "article" if by_article else f"run of {RECURRENCE_BLOCK} consecutive blocks",
        ),
        (
            Comparison(
                f"sign test: recurrent lower on {wins}, higher on {losses} blocks",
                sign,
                "block (not independent)",
            ),
        ),
        notes=(
            "Blocks clustered by the article they lie in."
            if by_article
            else "The run saved each block's NLL but not its article: the blocks are "
            f"resampled in runs of {RECURRENCE_BLOCK} consecutive blocks (about an article) "
            "instead; runs made since save each block's article.",
            "One training seed; the analysis was widened from 10 blocks to the whole split "
            "after an interim look (exploratory).",
        ),
        paper_effect=paper,
        files=(RECURRENCE,),
    )


# --- search errors and empty modes (search-errors-cpu) ------------------------------------

SEARCH_ERRORS = "search-errors-cpu/results.json"
#: the thesis's Table 6.x empty-mode rates: the instruction-tuned models nearest SmolLM2
THESIS_EMPTY = {
    "MarianMT": (57.7, 70.7),
    "GPT-2": 28.7,
    "LLaMA-7B": 30.5,
    "Alpaca-7B": 16.0,
    "Guanaco-7B": 7.7,
}


def _error_entries(runs: Path) -> list[tuple[str, int, dict]]:
    """(prompt set, index in the set, entry) of every saved prompt."""
    units = _json(runs / SEARCH_ERRORS)["units"]
    out = []
    for key, entries in units.items():
        name, span = key.rsplit(" #", 1)
        first = int(span.split("-")[0])
        out += [(name, first + j, e) for j, e in enumerate(entries)]
    return out


def empty_modes(runs: Path, data_dir: str | None):
    """The share of proven modes that are empty minus Guanaco-7B's 7.7% (the lowest
    instruction-tuned rate of the thesis's table), Wilson interval, exact binomial test."""
    from scipy.stats import binomtest

    if not (runs / SEARCH_ERRORS).is_file():
        return None
    from gencraft.search.errors import SearchErrorRow, empty_bounds

    rows = [SearchErrorRow.from_json(e["row"]) for _, _, e in _error_entries(runs)]
    proven = [r for r in rows if r.proven]
    k, n, p0 = sum(r.mode_empty for r in proven), len(proven), THESIS_EMPTY["Guanaco-7B"] / 100
    low, high = wilson_interval(k, n)
    res = {
        "mean": k / n - p0,
        "low": low - p0,
        "high": high - p0,
        "units": n,
        "p": float(binomtest(k, n, p0).pvalue),
    }
    lp = statistics.median(r.mode_logprob for r in proven)
    least, most = empty_bounds(rows)
    rates = ", ".join(
        f"{m} {v}%" if not isinstance(v, tuple) else f"{m} {v[0]}–{v[1]}%"
        for m, v in THESIS_EMPTY.items()
    )
    return Measured(
        Comparison("empty share of proven modes − Guanaco's 7.7%", res, "proven prompt"),
        notes=(
            f"{k} of {n} proven modes empty, {100 * low:.1f}–{100 * high:.1f}% (Wilson); "
            f"over all {len(rows)} prompts between {least} and {most} modes are empty (the "
            "unproven ones count when their best output found is empty).",
            "Selection: a mode is proven within the node budget only when a confident "
            f"non-empty output bounds the search; proven modes have a median log-prob of "
            f"{lp:.1f}, far above what the empty output costs, so proven modes are rarely "
            "empty by construction.",
            f"The thesis's rates: {rates}.",
        ),
        files=(SEARCH_ERRORS,),
    )


def search_errors(runs: Path, data_dir: str | None):
    """Greedy's ROUGE-L minus the mode's, by XSum prompt with a proven mode; secondary:
    beam 4 and beam 10."""
    from gencraft.metrics.text import rouge_per_example
    from gencraft.search.prompts import instruction_references

    if not (runs / SEARCH_ERRORS).is_file():
        return None
    settings = _json(runs / SEARCH_ERRORS)["settings"]
    refs_of: dict[str, list] = {}
    chosen = []
    for name, i, e in _error_entries(runs):
        if not name.startswith("xsum") or not e["row"]["proven"]:
            continue
        if name not in refs_of:
            refs_of[name] = instruction_references(
                "xsum", settings["prompts"], data_dir, every=True
            )
        chosen.append((e["outputs"], refs_of[name][i]))
    refs = [r for _, r in chosen]
    score = {
        s: rouge_per_example([o[s] for o, _ in chosen], refs, "rougeL")
        for s in ("greedy", "beam 4", "beam 10", "exact")
    }
    comps = [
        Comparison(
            f"{s} − exact (the mode), ROUGE-L", compare_paired(score[s], score["exact"]), "prompt"
        )
        for s in ("greedy", "beam 4", "beam 10")
    ]
    return Measured(
        comps[0],
        tuple(comps[1:]),
        files=(SEARCH_ERRORS,),
        notes=(f"{len(chosen)} XSum prompts with a proven mode.",),
    )


# --- conditional beam search (search-conditional-cpu) -------------------------------------

CONDITIONAL = "search-conditional-cpu"
BEAM, COND = "beam (on_beam)", "conditional (on_beam)"


def degenerate_kinds(text: str, prompt: str, finished: bool) -> dict[str, bool]:
    """Each kind of degenerate output apart: ``empty``, ``copy`` (a 12-word span of the
    prompt, or the whole short output inside it), ``loop`` (a 4-gram three times) and
    ``truncated`` (cut at the length limit, not a kind the thesis counts)."""
    from gencraft.search.classifier import _repeats_ngram, degenerate

    words = [w.lower() for w in text.split()]
    kinds = {"empty": not words, "loop": bool(words) and _repeats_ngram(words)}
    kinds["copy"] = bool(words) and degenerate(text, prompt, True) and not kinds["loop"]
    kinds["truncated"] = not finished
    return kinds


def conditional_degenerate(runs: Path, data_dir: str | None):
    """Conditional minus plain beam search in the share of outputs of the thesis's kinds
    (empty, prompt copy, loop), by prompt; secondary: truncation, and any kind (the earlier
    definition, truncation included)."""
    read = study_items(runs / CONDITIONAL, "degenerate")
    if read is None:
        return None
    examples, path = read
    prompts = prompt_texts(data_dir, 200, 100)  # the committed run's test prompts
    kinds: dict[str, list[dict[str, bool]]] = {BEAM: [], COND: []}
    for j, row in enumerate(examples):
        for system in kinds:
            out = row[system]
            kinds[system].append(degenerate_kinds(out["text"], prompts[j], out["finished"]))

    def share(test: Callable[[dict], bool]) -> tuple[list[float], list[float]]:
        return ([100.0 * test(k) for k in kinds[COND]], [100.0 * test(k) for k in kinds[BEAM]])

    thesis = share(lambda k: k["empty"] or k["copy"] or k["loop"])
    comps = [
        Comparison(f"conditional − beam, % {name}", compare_paired(*share(t)), "prompt")
        for name, t in (
            ("truncated", lambda k: k["truncated"]),
            ("any kind", lambda k: any(k.values())),
        )
    ]
    counts = {s: {kind: sum(k[kind] for k in ks) for kind in ks[0]} for s, ks in kinds.items()}
    return Measured(
        Comparison("conditional − beam, % empty/copy/loop", compare_paired(*thesis), "prompt"),
        tuple(comps),
        notes=tuple(
            f"{s}: " + ", ".join(f"{k} {v}" for k, v in c.items()) + f" of {len(kinds[s])}"
            for s, c in counts.items()
        ),
        files=(str(path.relative_to(runs)),),
    )


def conditional_length(runs: Path, data_dir: str | None):
    """Conditional minus plain beam search in log P(output | prompt) at a forced length,
    clustered by prompt over the ratios and beam sizes."""
    read = study_items(runs / CONDITIONAL, "length")
    if read is None:
        return None
    items, path = read
    pairs = [(row, j) for j, rows in enumerate(items) for row in rows]
    a = [row["cond_log_prob"] for row, _ in pairs]
    b = [row["beam_log_prob"] for row, _ in pairs]
    ids = [j for _, j in pairs]
    res = compare_paired(a, b, clusters=ids)
    return Measured(
        Comparison("conditional − beam, log P at the forced length", res, "prompt"),
        notes=(f"{len(a)} (prompt, ratio, beam) pairs from {res.units} prompts.",),
        files=(str(path.relative_to(runs)),),
    )


# --- RUM-SUNDAE (campaign-cpu/rum-sundae, nar-verdict-cpu*) -------------------------------

RUM_EPOCH = "campaign-cpu/rum-sundae/run/results.json"
RUM_300 = ("nar-verdict-cpu/results.json", "nar-verdict-cpu-seed1/results.json")


def _bleu(settings: dict, runs_a: list, runs_b: list, data_dir: str | None, lowercase: bool):
    from gencraft.data.tasks import pick_examples, references_of, task_examples
    from gencraft.metrics.tasks import bleu_paired_runs

    examples = pick_examples(
        task_examples(settings["task"], "test", data_dir), settings["test_limit"], spread=True
    )
    refs = [references_of(e) for e in examples]
    r = bleu_paired_runs(settings["task"], runs_a, runs_b, refs, lowercase=lowercase)
    return {**r, "units": r["n"], "resamples": 1000}


def rum_sundae(runs: Path, data_dir: str | None):
    """RUM-SUNDAE minus SUNDAE from scratch in cased corpus BLEU at one epoch (sacreBLEU's
    default, the thesis's), paired bootstrap over test MRs; secondary: lower-cased, the
    300-step two-seed runs, and the copied cross-attention against random."""
    if not (runs / RUM_EPOCH).is_file():
        return None
    run = _json(runs / RUM_EPOCH)
    s, u = run["settings"], run["units"]

    def outs(m: str) -> list:
        return [u[f"test {m}"]["predictions"]]

    primary = _bleu(s, outs("rum-sundae"), outs("sundae-scratch"), data_dir, False)
    second = [
        Comparison(
            "one epoch, lower-cased BLEU",
            _bleu(s, outs("rum-sundae"), outs("sundae-scratch"), data_dir, True),
            "test MR",
        )
    ]
    short = [_json(runs / p) for p in RUM_300 if (runs / p).is_file()]
    if short:
        s3 = short[0]["settings"]
        a = [r["units"]["test rum-sundae"]["predictions"] for r in short]
        b = [r["units"]["test sundae-scratch"]["predictions"] for r in short]
        for low in (False, True):
            second.append(
                Comparison(
                    f"300 steps × {len(short)} seeds, {'lower-cased' if low else 'cased'} BLEU",
                    _bleu(s3, a, b, data_dir, low),
                    "test MR × seed",
                )
            )
    for low in (False, True):
        second.append(
            Comparison(
                f"copied − random cross-attention (no paper claim), {'lower' if low else ''}cased",
                _bleu(s, outs("rum-sundae-copy"), outs("rum-sundae"), data_dir, low),
                "test MR",
            )
        )
    return Measured(
        Comparison("RUM-SUNDAE − SUNDAE from scratch, cased BLEU, one epoch", primary, "test MR"),
        tuple(second),
        notes=(
            "Equal training for both (one epoch of E2E); the thesis trained its scratch "
            "baseline on its whole MT corpora, about 40× these examples.",
        ),
        files=(RUM_EPOCH, *RUM_300),
    )


# --- FAME (focus-vs-cad-cpu) --------------------------------------------------------------

FAME_CPU = "focus-vs-cad-cpu/results.json"


def _fame_docs(runs: Path, data_dir: str | None) -> tuple[dict, list]:
    from gencraft.data import load_summarization

    run = _json(runs / FAME_CPU)
    n = len(run["units"]["decode base"])
    return run, load_summarization("xsum", "test", data_dir)[:n]


def fame_rouge(runs: Path, data_dir: str | None):
    """FAME minus the plain model's ROUGE-L (F1 x100) by XSum test document (the CPU run)."""
    from gencraft.metrics.text import rouge_per_example

    if not (runs / FAME_CPU).is_file():
        return None
    run, docs = _fame_docs(runs, data_dir)
    refs = [[d.summary] for d in docs]
    fame, base = (
        rouge_per_example(run["units"][f"decode {m}"], refs, "rougeL") for m in ("FAME", "base")
    )
    s = run["settings"]
    return Measured(
        Comparison("FAME − plain, ROUGE-L", compare_paired(fame, base), "document"),
        notes=(
            f"{s['model']}, {s['minutes']:g} training minutes each, {len(docs)} XSum test "
            "documents, beam 4 (the CPU run).",
        ),
        files=(FAME_CPU,),
    )


def fame_faithfulness(runs: Path, data_dir: str | None):
    """FAME minus the plain model's ROUGE-1 precision against the document (the share of a
    summary's words found in its source; the paper's "R1 (P%) with doc"), by document."""
    from gencraft.metrics.text import rouge_per_example

    if not (runs / FAME_CPU).is_file():
        return None
    run, docs = _fame_docs(runs, data_dir)
    srcs = [[d.document] for d in docs]
    fame, base = (
        rouge_per_example(run["units"][f"decode {m}"], srcs, "rouge1", "precision")
        for m in ("FAME", "base")
    )
    return Measured(
        Comparison(
            "FAME − plain, ROUGE-1 precision vs document", compare_paired(fame, base), "document"
        ),
        files=(FAME_CPU,),
    )


# --- chapter 5's toys (exact) ----------------------------------------------------------------


def bad_mode_toys(runs: Path, data_dir: str | None):
    """Each toy's log10 P(modal attribute) − log10 P(the mode's attribute), computed exactly
    (no sampling: p = 0, one unit); primary: the strings whose mode is the empty string."""
    from gencraft.search.toy import report

    comps = []
    for row in report():
        gap = math.log10(row["P(modal A)"]) - math.log10(row["P(A of the mode)"])
        res = {"mean": gap, "low": gap, "high": gap, "p": 0.0, "units": 1}
        comps.append(Comparison(f"{row['toy']}: mode {row['mode']}", res, "toy"))
    comps.insert(0, comps.pop(1))  # the empty-string toy first
    return Measured(
        comps[0],
        tuple(comps[1:]),
        notes=(
            "Exact enumeration (gencraft.search.toy, checked by brute force in the tests): "
            "p = 0 means no sampling error, not a test.",
        ),
    )


#: claim id -> reader
READERS: dict[str, Callable[[Path, str | None], Measured | None]] = {
    "hso-ppl": hso_ppl,
    "hso-fewshot": hso_fewshot,
    "hso2-vs-hso": lambda r, d: hso_fewshot(r, d, a="hso2", b="hso"),
    "hso-cost": hso_cost,
    "recurrence-ppl": recurrence,
    "empty-mode": empty_modes,
    "search-errors": search_errors,
    "conditional-degenerate": conditional_degenerate,
    "conditional-length": conditional_length,
    "rum-sundae": rum_sundae,
    "fame-rouge": fame_rouge,
    "fame-faithfulness": fame_faithfulness,
    "bad-mode-toys": bad_mode_toys,
    "pointer-ptb": pointer_ptb,
    "pointer-rare": pointer_rare,
}
