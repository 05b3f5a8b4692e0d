"""The HSO experiments of docs/results/hso.md, runnable with ``gencraft reproduce``:

* ``hso-lm``: Tables 3.2, 3.3 and 3.5 analogues. A pretrained causal LM (SmolLM2-135M) on
  WikiText-2 valid/test as one subword stream cut into non-overlapping contexts (the thesis's
  GPT-2 runs reset the state every 1024 tokens); per-token and per-word perplexity of the plain
  model, HSO at the thesis's LM setting, the Table 3.3 ablations (validation only, as there),
  and dynamic evaluation; seconds per token against the plain model's in the same run. One
  unit per (split, variant): a stopped run goes on where it stopped.
* ``hso-ppl``: the confirmatory perplexity run: a whole split in contexts with the state
  reset between them, plain vs HSO at the thesis's LM setting, each context's summed NLL and
  token count and the article it lies in saved, so that the paired comparison is clustered by
  article (``compare_paired(clusters=...)``). The contexts are computed and saved a batch at a
  time: a stopped run loses one batch.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from gencraft.data import stream_articles, subword_stream
from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig, HSOConfig
from gencraft.hso.dynamic import dynamic_eval_nll
from gencraft.hso.fewshot import (
    METHODS,
    build_task,
    classify_batch,
    draw_prompt,
    label_token_ids,
    task_rows,
)
from gencraft.hso.functional import contexts, hso_nll
from gencraft.metrics import windowed_nll
from gencraft.metrics.lm import stream_perplexities
from gencraft.metrics.stats import compare_paired, decide, holm, p_text, sign_test
from gencraft.metrics.text import bootstrap_mean
from gencraft.models import load_model
from gencraft.studies.runner import ExperimentRun, register, settings_field
from gencraft.studies.timing import running_clock
from gencraft.utils import default_device

#: Table 3.3's rows (thesis values: GPT-2 345M, PG-19 validation), as HSOConfig overrides
VARIANTS: dict[str, dict] = {
    "hso": {},
    "lr3e-4-b0.8": {"lr": 3e-4, "betas": (0.8, 0.9)},
    "present-only": {"present_only": True},
    "k10": {"window": 10},
    "k10-present-only": {"window": 10, "present_only": True},
    "sgd": {"optimizer": "sgd", "lr": 0.01},
    "sgd-present-only": {"optimizer": "sgd", "lr": 0.01, "present_only": True},
    "hso2": {"steps": 2},
}
PAPER_33 = {
    "hso": 25.1,
    "lr3e-4-b0.8": 23.8,
    "present-only": 23.6,
    "k10": 24.4,
    "k10-present-only": 22.1,
    "sgd": 24.7,
    "sgd-present-only": 25.1,
}


@dataclass
class HSOLMSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    corpus: str = settings_field("wikitext-2", "word-level corpus (wikitext-2, ptb)")
    max_words: int | None = settings_field(20000, "words of each split scored (None: all)")
    context: int = settings_field(512, "inputs per context; the state resets between contexts")
    splits: tuple[str, ...] = settings_field(("valid", "test"), "splits for baseline vs HSO")
    ablations: tuple[str, ...] = settings_field(
        tuple(v for v in VARIANTS if v != "hso"), "Table 3.3 rows, on the first split"
    )
    de_words: int = settings_field(5000, "words of the first split for dynamic evaluation")
    de_lr: float = settings_field(1e-4, "dynamic evaluation's SGD learning rate")
    batch_size: int = settings_field(8, "HSO contexts optimised together")
    data_dir: str | None = settings_field(None, "datasets directory")


def _score(name: str, fn, ids: torch.Tensor, words: int) -> dict:
    t0 = running_clock()
    nll = fn(ids)
    return {"variant": name, **stream_perplexities(nll, words, running_clock() - t0)}


@register(
    "hso-lm",
    title="HSO on a pretrained LM: baseline vs HSO, Table 3.3 ablations, dynamic evaluation",
    settings=HSOLMSettings,
    scales={
        "tiny": {"model": "tiny-llama", "max_words": 300, "context": 64, "de_words": 100},
        "cpu": {},
        "gpu": {"max_words": None, "context": 1024, "de_words": 50000},
    },
    cpu_minutes=75,
)
def hso_lm(s: HSOLMSettings, run: ExperimentRun) -> None:
    """Baseline vs HSO per split; the ablations and dynamic evaluation on the first split."""
    bad = [a for a in s.ablations if a not in VARIANTS]
    if bad:
        raise GencraftError(f"unknown HSO variants {bad}; choose from {', '.join(VARIANTS)}")
    model, tok = load_model(s.model, device=default_device())
    model.eval()
    rows = []
    for i, split in enumerate(s.splits):
        ids, words = subword_stream(
            s.corpus, split, tok, data_dir=s.data_dir, max_words=s.max_words
        )
        todo = [("baseline", _plain_nll(model, s)), ("hso", _hso_nll(model, s, {}))]
        if i == 0:
            todo += [(a, _hso_nll(model, s, VARIANTS[a])) for a in s.ablations]
        rows += _scored_units(run, todo, (ids, words), split, split)
        if i == 0 and s.de_words:
            de_stream = subword_stream(
                s.corpus, split, tok, data_dir=s.data_dir, max_words=s.de_words
            )
            todo = [
                ("baseline", _plain_nll(model, s)),
                ("hso", _hso_nll(model, s, {})),
                ("dynamic eval", _dynamic_nll(model, s)),
            ]
            label = f"{split} (first {s.de_words} words)"
            rows += _scored_units(run, todo, de_stream, f"{split} de-subset", label)
    _report_lm(s, run, rows)


def _plain_nll(model, s: HSOLMSettings):
    """Token NLL ``[N]`` of a stream ``[N]``: the model alone, windows of ``s.context``."""
    return lambda x: windowed_nll(model, x, window=s.context, overlap=0)


def _hso_nll(model, s: HSOLMSettings, over: dict):
    """Token NLL ``[N]`` under HSO with ``over`` replacing HSOConfig's defaults."""
    cfg = HSOConfig(reset_every=s.context, **over)
    return lambda x: hso_nll(model, x, cfg, batch_size=s.batch_size).token_nll


def _dynamic_nll(model, s: HSOLMSettings):
    """Token NLL ``[N]`` under dynamic evaluation (it updates the model's weights)."""
    cfg = DynamicEvalConfig(window=25, lr=s.de_lr, reset_every=s.context)
    return lambda x: dynamic_eval_nll(model, x, cfg).token_nll


def _scored_units(
    run: ExperimentRun, todo: list, stream: tuple, key: str, label: str
) -> list[dict[str, Any]]:
    """One unit ``KEY NAME`` per (name, NLL function) of ``todo`` on ``stream`` (token ids
    ``[N]``, word count); each row's split column says ``label``."""
    ids, words = stream
    return [
        {"split": label, **run.unit(f"{key} {n}", lambda n=n, f=f: _score(n, f, ids, words))}
        for n, f in todo
    ]


def _report_lm(s: HSOLMSettings, run: ExperimentRun, rows: list[dict[str, Any]]) -> None:
    """The table of every split's rows, with times against the baseline of the same rows."""
    base = {r["split"]: r["ms/token"] for r in rows if r["variant"] == "baseline"}
    for r in rows:
        r["time vs baseline"] = r["ms/token"] / base[r["split"]]
        r["thesis (Table 3.3)"] = (
            PAPER_33.get(r["variant"], "") if r["split"] == s.splits[0] else ""
        )
    run.text(
        f"{s.model} on {s.corpus}, contexts of {s.context} tokens (state reset between them), "
        f"{s.max_words or 'all'} words per split. Per-word perplexity divides the summed NLL "
        "by the corpus's word count (``<eos>`` included). HSO: k = 25, η = 0.003, "
        "β = (0.65, 0.9) unless the row says otherwise; the thesis's Table 3.3 column is "
        f"GPT-2 345M on PG-19 validation, for direction only. HSO runs {s.batch_size} "
        "contexts together; dynamic evaluation one at a time (it updates the shared weights)."
    )
    run.table(
        rows,
        [
            "split",
            "variant",
            "tokens",
            "token ppl",
            "word ppl",
            "ms/token",
            "time vs baseline",
            "thesis (Table 3.3)",
        ],
    )


@dataclass
class HSOPplSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    corpus: str = settings_field("wikitext-2", "word-level corpus with articles (wikitext-2)")
    split: str = settings_field("test", "split scored whole")
    max_words: int | None = settings_field(None, "words of the split scored (None: all)")
    context: int = settings_field(512, "inputs per context; the state resets between contexts")
    batch_size: int = settings_field(8, "contexts run together (a saved part)")
    resamples: int = settings_field(10_000, "bootstrap and randomisation resamples")
    data_dir: str | None = settings_field(None, "datasets directory")


class _Contexts(NamedTuple):
    """A stream ``ids`` [N], its contexts' input ranges [(c0, c1)] and each context's article."""

    ids: torch.Tensor
    ranges: list[tuple[int, int]]
    articles: list[int]


def _stream_contexts(s: HSOPplSettings, model, tok) -> _Contexts:
    """The split as one stream cut into contexts of ``s.context`` inputs; a context's article
    is the one most of its targets lie in (the earlier on a tie)."""
    kw = {"data_dir": s.data_dir, "max_words": s.max_words}
    ids, _ = subword_stream(s.corpus, s.split, tok, **kw)
    of_token = stream_articles(s.corpus, s.split, tok, **kw)
    ranges = contexts(ids.numel() - 1, s.context, model)
    arts = [int(torch.bincount(of_token[c0 + 1 : c1 + 1]).argmax()) for c0, c1 in ranges]
    return _Contexts(ids, ranges, arts)


def context_sums(fn, stream: _Contexts, a: int, b: int) -> list[list[float]]:
    """``[summed NLL, targets]`` of contexts ``a..b-1``, scoring their stretch of the stream
    with ``fn`` (token ids ``[M]`` -> NLL ``[M - 1]``, the state reset every context)."""
    part = stream.ranges[a:b]
    nll = fn(stream.ids[part[0][0] : part[-1][1] + 1])
    sizes = [c1 - c0 for c0, c1 in part]
    return [[math.fsum(x.tolist()), len(x)] for x in torch.split(nll.double(), sizes)]


def ppl_analysis(units: dict, resamples: int = 10_000) -> dict[str, Any]:
    """The planned analysis of an ``hso-ppl`` run's units: HSO − plain NLL per token, one row
    per context, clustered by article (primary), and the sign test over articles (secondary;
    Holm over both)."""
    arts = units["articles"]["article"]
    per_token = {m: [x / n for x, n in units[m]["contexts"]] for m in ("hso", "plain")}
    primary = compare_paired(
        per_token["hso"], per_token["plain"], clusters=arts, resamples=resamples
    )
    by_article: dict[int, list[float]] = {}
    for a, h, p in zip(arts, per_token["hso"], per_token["plain"], strict=True):
        by_article.setdefault(a, []).append(h - p)
    means = [math.fsum(d) / len(d) for d in by_article.values()]
    wins, losses = sum(d < 0 for d in means), sum(d > 0 for d in means)
    p_sign = sign_test(wins, losses)
    adjusted = holm([primary.p, p_sign])
    return {
        "primary": primary,
        "p_holm": adjusted[0],
        "sign": {"lower": wins, "higher": losses, "p": p_sign, "p_holm": adjusted[1]},
    }


def _ppl_unit(run: ExperimentRun, s: HSOPplSettings, stream: _Contexts, name: str, fn) -> dict:
    """Unit ``name``: every context's ``[summed NLL, targets]``, saved a batch at a time."""

    def combine(items: list, seconds: float) -> dict:
        return {"contexts": items, "seconds": seconds}

    total = len(stream.ranges)
    return run.unit_over(
        name,
        total,
        s.batch_size,
        lambda a, b: context_sums(fn, stream, a, b),
        combine,
        progress=f"{name} contexts",
    )


@register(
    "hso-ppl",
    title="HSO perplexity, confirmatory: a whole split, paired over contexts by article",
    settings=HSOPplSettings,
    scales={
        "tiny": {"model": "tiny-llama", "max_words": 400, "context": 32, "resamples": 200},
        "cpu": {},
        "gpu": {},
    },
    cpu_minutes=110,
    units=lambda s: ["articles", "plain", "hso"],
    volatile=("batch_size",),
)
def hso_ppl(s: HSOPplSettings, run: ExperimentRun) -> None:
    """Plain vs HSO on every context of the split; the pre-registered analysis first."""
    model, tok = load_model(s.model, device=default_device())
    model.eval()
    stream = _stream_contexts(s, model, tok)
    units = {
        "articles": run.unit(
            "articles", lambda: {"article": stream.articles, "tokens": int(stream.ids.numel())}
        )
    }
    hso = HSOConfig(reset_every=s.context)
    units["plain"] = _ppl_unit(
        run,
        s,
        stream,
        "plain",
        lambda x: windowed_nll(model, x, window=s.context, overlap=0, batch_size=s.batch_size),
    )
    units["hso"] = _ppl_unit(
        run, s, stream, "hso", lambda x: hso_nll(model, x, hso, batch_size=s.batch_size).token_nll
    )
    _report_ppl(s, run, units, hso)


def _report_ppl(s: HSOPplSettings, run: ExperimentRun, units: dict, hso: HSOConfig) -> None:
    """The planned analysis, then the exploratory totals."""
    a = ppl_analysis(units, s.resamples)
    r, sign = a["primary"], a["sign"]
    run.text(
        f"{s.model} on {s.corpus} {s.split} ({'all' if s.max_words is None else s.max_words} "
        f"words), contexts of {s.context} tokens with the state reset between them; HSO "
        f"k = {hso.window}, η = {hso.lr}, β = {tuple(hso.betas)}. Each context's article is "
        "the one most of its targets lie in.\n\n**Planned analysis** (registered before the "
        "run): HSO − plain NLL per token (nats), one row per context, clustered by article "
        "(each article one unit: the mean of its contexts); sign-flip randomisation p and "
        f"BCa 95 % interval, {s.resamples:,} resamples; secondary: the sign test over "
        "articles; Holm over both."
    )
    run.table(
        [
            {
                "comparison": "HSO − plain, nats/token (primary)",
                "mean": r.mean,
                "95% interval": f"[{r.low:+.5f}, {r.high:+.5f}]",
                "p (Holm)": p_text(a["p_holm"], s.resamples),
                "articles": r.units,
                "contexts": r.rows,
            },
            {
                "comparison": f"sign test: HSO lower in {sign['lower']}, higher in "
                f"{sign['higher']} articles",
                "mean": "",
                "95% interval": "",
                "p (Holm)": p_text(sign["p_holm"]),
                "articles": sign["lower"] + sign["higher"],
                "contexts": "",
            },
        ]
    )
    run.text("**Exploratory** (not part of the plan): totals over every target token.")
    rows = []
    for m in ("plain", "hso"):
        ctx = units[m]["contexts"]
        nll, n = math.fsum(x for x, _ in ctx), sum(k for _, k in ctx)
        rows.append(
            {
                "method": m,
                "tokens": n,
                "token ppl": math.exp(nll / n),
                "ms/token": 1000 * units[m]["seconds"] / n,
            }
        )
    run.table(rows)


@dataclass
class FewShotSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    task: str = settings_field("e2e-family", "e2e-family (binary) or webnlg-topic (4-way)")
    shots: tuple[int, ...] = settings_field((2, 4, 6, 8), "examples per prompt (n)")
    seeds: tuple[int, ...] = settings_field((0, 1), "seeds of the prompt draws")
    examples: int = settings_field(16, "test examples (class-balanced, the same for every n)")
    de_examples: int = settings_field(4, "of which dynamic evaluation runs on the first")
    hso_lr: float = settings_field(0.01, "HSO learning rate (the thesis's few-shot: 0.01)")
    hso_window: int = settings_field(10, "HSO window k (the thesis's few-shot: 10)")
    hso_betas: tuple[float, ...] = settings_field((0.65, 0.9), "Adam betas (not stated there)")
    de_lr: float = settings_field(1e-4, "dynamic evaluation's SGD rate (the thesis: 1e-4)")
    max_example_tokens: int = settings_field(35, "longest text put in a prompt (the thesis: 35)")
    max_test_tokens: int | None = settings_field(None, "longest test text (None: any)")
    batch_size: int = settings_field(8, "prompts per batch (dynamic evaluation: de_batch_size)")
    de_batch_size: int = settings_field(
        1, "prompts adapted together by dynamic evaluation, each with its own copy of the weights"
    )
    data_dir: str | None = settings_field(None, "datasets directory")


def _test_examples(task, n: int, tok, max_tokens: int | None) -> list[tuple[str, int]]:
    rng = random.Random(1234)
    k = len(task.labels)
    out = []
    for y in range(k):
        cands = [
            t
            for t in task.test
            if t[1] == y
            and (
                max_tokens is None
                or len(tok(t[0], add_special_tokens=False).input_ids) <= max_tokens
            )
        ]
        out += rng.sample(cands, min(len(cands), math.ceil(n / k)))
    rng.shuffle(out)
    return out[:n]


def _fewshot_rows(s: FewShotSettings, units: dict[tuple[int, int], dict]) -> list[dict]:
    """One row per n: mean prompt tokens, each method's accuracy (mean ± s.d. over seeds) and
    seconds per example."""
    rows = []
    for n in s.shots:
        per_seed = [units[n, seed] for seed in s.seeds]
        row = {"n": n, "prompt tokens": statistics.mean(u["mean prompt tokens"] for u in per_seed)}
        for m in per_seed[0]["accuracy"]:  # the methods the run ran, in METHODS' order
            accs = [u["accuracy"][m] for u in per_seed]
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            row[m] = f"{statistics.mean(accs):.1f} ± {sd:.1f}"
            row[f"s/ex {m}"] = statistics.mean(u["seconds per example"][m] for u in per_seed)
        rows.append(row)
    return rows


def _paired_rows(units: dict[tuple[int, int], dict]) -> list[dict]:
    """One row per (n, seed): HSO and HSO-2 minus the plain model, in points, with the 95 %
    paired bootstrap interval over the test examples (units saved before per-example results
    were kept give the difference alone)."""
    rows = []
    for (n, seed), u in units.items():
        row = {"n": n, "seed": seed, "examples": u["examples"]["baseline"]}
        for m in ("hso", "hso2"):
            diff = u["accuracy"][m] - u["accuracy"]["baseline"]
            row[f"{m} - baseline"] = f"{diff:+.2f} (unpaired)"
            if "correct" in u:
                pairs = zip(u["correct"][m], u["correct"]["baseline"], strict=True)
                d = [100.0 * (a - b) for a, b in pairs]
                mean, half = bootstrap_mean(d)
                row[f"{m} - baseline"] = f"{mean:+.2f} ± {half:.2f}"
        rows.append(row)
    return rows


def _combine(parts: dict[str, dict]) -> dict:
    """The (n, seed) unit from its per-method units."""
    return {
        "accuracy": {m: 100 * sum(p["correct"]) / len(p["correct"]) for m, p in parts.items()},
        "examples": {m: len(p["correct"]) for m, p in parts.items()},
        "seconds per example": {
            m: p["seconds"] / max(1, len(p["correct"])) for m, p in parts.items()
        },
        "mean prompt tokens": parts["baseline"]["mean prompt tokens"],
        "correct": {m: p["correct"] for m, p in parts.items()},
    }


def _fewshot_units(s: FewShotSettings) -> list[str]:
    """The unit keys of a run: one per (n, seed, method)."""
    return [f"n={n} seed={seed} {m}" for n in s.shots for seed in s.seeds for m in METHODS]


def _fewshot_correct(units: dict, n: int, seed: int, m: str) -> list[int] | None:
    """Per-example correctness of method ``m`` at (n, seed), from its own unit or a whole
    (n, seed) unit saved before units were kept per method (None: not finished)."""
    part = units.get(f"n={n} seed={seed} {m}")
    if part is not None:
        return part["correct"]
    whole = units.get(f"n={n} seed={seed}")
    return whole["correct"][m] if whole and "correct" in whole else None


def fewshot_verdict(runs: list[tuple[FewShotSettings, dict]]) -> list[dict]:
    """HSO and HSO-2 against the plain model: accuracy differences paired by test example,
    pooled over every finished (n, seed) of the runs."""
    rows = []
    for m, label in (("hso", "HSO"), ("hso2", "HSO-2")):
        diffs: list[float] = []
        for s, units in runs:
            for n in s.shots:
                for seed in s.seeds:
                    a = _fewshot_correct(units, n, seed, m)
                    b = _fewshot_correct(units, n, seed, "baseline")
                    if a is not None and b is not None:
                        diffs += [100.0 * (x - y) for x, y in zip(a, b, strict=True)]
        if diffs:
            rows.append(
                {
                    "comparison": f"{label} − plain model, accuracy",
                    "pairs": "(example, n, seed) pairs",
                    "unit": "points",
                    **decide(diffs),
                }
            )
    return rows


@dataclass
class _FewShot:
    """What every few-shot unit of a run reads: the model, the task and its test examples
    ([(text, label index)]), and the methods' configurations."""

    model: torch.nn.Module
    tok: Any
    task: Any
    shared: list[int]
    label_ids: list[int]
    tests: list[tuple[str, int]]
    hso: HSOConfig
    de: DynamicEvalConfig


@dataclass
class _Cell:
    """One (n, seed): its prompts ([1, P] each, one per test example), drawn once when a unit
    first needs them (a resumed run whose units are finished draws none)."""

    n: int
    seed: int
    drawn: list[torch.Tensor] = field(default_factory=list)

    def prompts(self, s: FewShotSettings, setup: _FewShot) -> list[torch.Tensor]:
        if not self.drawn:
            rng = random.Random(self.seed * 7919 + self.n)
            self.drawn += [
                draw_prompt(
                    setup.task, setup.tok, self.n, text, rng, s.max_example_tokens, setup.shared
                )
                for text, _ in setup.tests
            ]
        return self.drawn


def _method_unit(
    run: ExperimentRun, s: FewShotSettings, setup: _FewShot, cell: _Cell, m: str
) -> dict:
    """Unit ``n=N seed=S METHOD``: each test example's correctness under method ``m`` (dynamic
    evaluation on the first ``de_examples``), computed and saved one batch at a time."""

    def labels(a: int, b: int) -> list[int]:
        return classify_batch(
            setup.model,
            cell.prompts(s, setup)[a:b],
            setup.label_ids,
            m,
            setup.hso,
            setup.de,
            batch_size=s.batch_size,
            de_batch_size=s.de_batch_size,
        )

    def combine(found: list[int], seconds: float) -> dict:
        prompts = cell.prompts(s, setup)
        return {
            "correct": [int(p == y) for p, (_, y) in zip(found, setup.tests, strict=False)],
            "seconds": seconds,
            "mean prompt tokens": statistics.mean(p.shape[1] for p in prompts),
        }

    de_unit = m == "dynamic eval"
    total = s.de_examples if de_unit else len(setup.tests)
    step = s.de_batch_size if de_unit else s.batch_size  # a part is one batch
    key = f"n={cell.n} seed={cell.seed} {m}"
    total = min(total, len(setup.tests))
    return run.unit_over(key, total, step, labels, combine, progress=key)


@register(
    "hso-fewshot",
    title="few-shot classification: baseline, dynamic evaluation, HSO, HSO-2 (Table 3.4)",
    settings=FewShotSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "shots": (2,),
            "seeds": (0, 1),
            "examples": 4,
            "de_examples": 2,
            "max_example_tokens": 80,
            "max_test_tokens": 120,
            "de_batch_size": 2,
        },
        "cpu": {},
        "gpu": {"examples": 400, "de_examples": 100, "seeds": (0, 1, 2)},
    },
    cpu_minutes=35,
    units=_fewshot_units,
    verdict=fewshot_verdict,
    volatile=("de_batch_size",),  # the same predictions (tested), another memory and speed
)
def hso_fewshot(s: FewShotSettings, run: ExperimentRun) -> None:
    """Accuracy and seconds per example of each method, per n, mean over seeds."""
    model, tok = load_model(s.model, device=default_device())
    model.eval()
    task = build_task(s.task, s.data_dir)
    tests = _test_examples(task, s.examples, tok, s.max_test_tokens)
    units = _fewshot_cells_run(s, run, (model, tok), task, tests, METHODS)
    _report_fewshot(s, run, task, tests, units)


def _fewshot_cells_run(
    s: FewShotSettings, run: ExperimentRun, loaded: tuple, task, tests: list, methods
) -> dict[tuple[int, int], dict]:
    """Every (n, seed) cell's unit: one unit per method, each saved batch by batch."""
    model, tok = loaded
    shared, label_ids = label_token_ids(tok, task.labels)
    hso = HSOConfig(window=s.hso_window, lr=s.hso_lr, betas=tuple(s.hso_betas))
    de = DynamicEvalConfig(window=s.hso_window, lr=s.de_lr)
    setup = _FewShot(model, tok, task, shared, label_ids, tests, hso, de)
    units = {}
    for n in s.shots:
        for seed in s.seeds:
            key = f"n={n} seed={seed}"
            if key in run.units:  # a whole unit saved before units were kept per method
                units[n, seed] = run.units[key]
                continue
            # a unit per method, each saved batch by batch: a stopped run loses one batch
            cell = _Cell(n, seed)
            parts = {m: _method_unit(run, s, setup, cell, m) for m in methods}
            units[n, seed] = _combine(parts)
    return units


def _report_fewshot(s: FewShotSettings, run: ExperimentRun, task, tests, units) -> None:
    """The accuracy table per n and the paired differences per (n, seed)."""
    rows = _fewshot_rows(s, units)
    run.text(
        f"{s.model}, task {s.task} ({len(task.labels)} classes: {', '.join(task.labels)}); "
        f"{len(tests)} class-balanced test examples (dynamic evaluation on the first "
        f"{s.de_examples}); a class-balanced prompt of n examples drawn afresh per test "
        f"example, the same for every method; accuracy (%) mean ± s.d. over seeds "
        f"{list(s.seeds)}. HSO: k = {s.hso_window}, η = {s.hso_lr}, β = {tuple(s.hso_betas)}; "
        f"HSO-2 two steps per window; dynamic evaluation: SGD η = {s.de_lr}, a step per "
        f"{s.hso_window} tokens, hidden states recomputed. Chance: {100 / len(task.labels):.0f} %. "
        f"Batches of {s.batch_size} prompts (left-padded); dynamic evaluation "
        + (
            "one prompt at a time."
            if s.de_batch_size == 1
            else f"{s.de_batch_size} prompts together, each with its own copy of the weights."
        )
    )
    run.table(rows)
    run.text(
        "Per prompt seed, each HSO variant minus the plain model over the same test examples "
        "(points; ± the 95 % paired bootstrap interval, 1,000 resamples):"
    )
    run.table(_paired_rows(units))


#: the sizes of the test draws of every committed or documented ``hso-fewshot`` run (the CPU
#: default, the CPU campaign, the GPU slot): their examples are not fresh
USED_DRAWS = (16, 200, 400)
#: the confirmatory comparisons in the registered order: (method, n); the first is primary
CONFIRM_COMPARISONS = (("hso2", 2), ("hso", 2), ("hso2", 4), ("hso", 4))


@dataclass
class FewShotConfirmSettings(FewShotSettings):
    shots: tuple[int, ...] = settings_field((2, 4), "examples per prompt (n)")
    seeds: tuple[int, ...] = settings_field((0, 1, 2), "seeds of the prompt draws")
    examples: int = settings_field(450, "fresh test examples (class-balanced as the pool allows)")
    methods: tuple[str, ...] = settings_field(("baseline", "hso", "hso2"), "methods run")
    used_draws: tuple[int, ...] = settings_field(
        USED_DRAWS, "sizes of earlier runs' test draws, whose examples are left out"
    )
    resamples: int = settings_field(10_000, "bootstrap and randomisation resamples")


def balanced_counts(sizes: list[int], n: int) -> list[int]:
    """How many of each class to take for ``n`` examples from classes of ``sizes``: as equal
    as the sizes allow (one more each, in turn, to every class with some left)."""
    take = [0] * len(sizes)
    while sum(take) < n and any(t < z for t, z in zip(take, sizes, strict=True)):
        for i, z in enumerate(sizes):
            if take[i] < z and sum(take) < n:
                take[i] += 1
    return take


def fresh_examples(
    task, held_out: list[tuple[str, int]], n: int, used_draws: tuple[int, ...]
) -> list[tuple[str, int]]:
    """``n`` (text, label) examples no earlier run scored: the ``held_out`` rows (the
    validation split) and the test rows none of the ``used_draws`` draws picked, class-balanced
    as far as the pool allows (:func:`balanced_counts`), in a seeded order."""
    used = set().union(*(_test_examples(task, k, None, None) for k in used_draws))
    pool = list(dict.fromkeys([*held_out, *(t for t in task.test if t not in used)]))
    rng = random.Random(4321)
    by_class = [[t for t in pool if t[1] == y] for y in range(len(task.labels))]
    for rows in by_class:
        rng.shuffle(rows)
    take = balanced_counts([len(r) for r in by_class], n)
    out = [t for rows, k in zip(by_class, take, strict=True) for t in rows[:k]]
    if len(out) < n:
        raise GencraftError(f"{task.name} has {len(out)} fresh examples; {n} were asked for")
    rng.shuffle(out)
    return out


def confirm_analysis(units: dict, labels: list[int], seeds, resamples: int = 10_000) -> dict:
    """The registered analysis of an ``hso-fewshot-confirm`` run's units: each comparison of
    :data:`CONFIRM_COMPARISONS` (method − plain accuracy in points at n) clustered by test
    example over the seeds, Holm over all of them (None where a cell is unfinished), and per
    method and n the accuracy on each class and the share of each answer."""
    out: dict[str, Any] = {"comparisons": [], "answers": []}
    for m, n in CONFIRM_COMPARISONS:
        keys = [(f"n={n} seed={sd} {m}", f"n={n} seed={sd} baseline") for sd in seeds]
        if not all(a in units and b in units for a, b in keys):
            out["comparisons"].append(None)
            continue
        a = [100.0 * c for k, _ in keys for c in units[k]["correct"]]
        b = [100.0 * c for _, k in keys for c in units[k]["correct"]]
        ids = [i for _ in seeds for i in range(len(labels))]
        r = compare_paired(a, b, clusters=ids, resamples=resamples)
        out["comparisons"].append({"method": m, "n": n, "result": r})
    done = [c for c in out["comparisons"] if c]
    for c, q in zip(done, holm([c["result"].p for c in done]), strict=True):
        c["p_holm"] = q
    for key in sorted(units):
        if key.startswith("n="):
            out["answers"].append({"unit": key, **answer_rates(units[key]["correct"], labels)})
    return out


def answer_rates(correct: list[int], labels: list[int], classes: int = 2) -> dict[str, Any]:
    """Accuracy on each class and the share of each answer (%), from correctness and labels
    (two classes: a wrong answer is the other label)."""
    right, seen, said = [0] * classes, [0] * classes, [0] * classes
    for c, y in zip(correct, labels, strict=True):
        right[y] += c
        seen[y] += 1
        said[y if c else 1 - y] += 1
    return {
        "class accuracy": [100.0 * r / max(1, k) for r, k in zip(right, seen, strict=True)],
        "answer share": [100.0 * k / max(1, len(correct)) for k in said],
    }


@register(
    "hso-fewshot-confirm",
    title="HSO few-shot, confirmatory: fresh examples, HSO-2 − plain at n = 2 by example",
    settings=FewShotConfirmSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "shots": (2,),
            "seeds": (0, 1),
            "examples": 6,
            "max_example_tokens": 80,
            "resamples": 200,
        },
        "cpu": {},
        "gpu": {},
    },
    cpu_minutes=300,
    units=lambda s: [
        "examples",
        *(f"n={n} seed={sd} {m}" for n in s.shots for sd in s.seeds for m in s.methods),
    ],
    volatile=("batch_size",),
)
def hso_fewshot_confirm(s: FewShotConfirmSettings, run: ExperimentRun) -> None:
    """The registered comparisons on fresh examples, then the exploratory tables."""
    if s.task != "e2e-family":
        raise GencraftError("hso-fewshot-confirm runs the binary task e2e-family only")
    model, tok = load_model(s.model, device=default_device())
    model.eval()
    task = build_task(s.task, s.data_dir)
    tests = fresh_examples(
        task, task_rows(s.task, "validation", s.data_dir), s.examples, tuple(s.used_draws)
    )
    labels = run.unit("examples", lambda: {"label": [y for _, y in tests]})["label"]
    units = _fewshot_cells_run(s, run, (model, tok), task, tests, tuple(s.methods))
    _report_confirm(s, run, labels, task.labels)
    run.text("**Exploratory** (not part of the plan): accuracy per n and per seed.")
    run.table(_fewshot_rows(s, units))
    run.table(_paired_rows(units))


def _report_confirm(s: FewShotConfirmSettings, run: ExperimentRun, labels, names) -> None:
    """The registered analysis: the comparisons under Holm, then answers per class."""
    a = confirm_analysis(run.units, labels, s.seeds, s.resamples)
    counts = [labels.count(y) for y in range(len(names))]
    run.text(
        f"{s.model}, {s.task}: {len(labels)} fresh examples ("
        + ", ".join(f"{k} {w!r}" for k, w in zip(counts, names, strict=True))
        + ") from the validation split and the test examples no earlier run drew; prompts of "
        f"n examples from the training split, drawn afresh per example with seeds "
        f"{list(s.seeds)}. HSO k = {s.hso_window}, η = {s.hso_lr}, β = {tuple(s.hso_betas)}; "
        "HSO-2 two steps per window.\n\n**Planned analysis** (registered before the run): "
        "each method − plain accuracy (points), clustered by example (its mean over the "
        f"seeds); sign-flip randomisation p and BCa 95 % interval, {s.resamples:,} resamples; "
        "Holm over the four comparisons; the first is primary."
    )
    rows = []
    for c in a["comparisons"]:
        if c is None:
            continue
        r = c["result"]
        rows.append(
            {
                "comparison": f"{c['method']} − plain, n = {c['n']}",
                "mean": r.mean,
                "95% interval": f"[{r.low:+.2f}, {r.high:+.2f}]",
                "p (Holm)": p_text(c["p_holm"], s.resamples),
                "examples": r.units,
            }
        )
    run.table(rows)
    run.text("Accuracy on each class and the share of each answer (%, descriptive):")
    run.table(
        [
            {
                "cell": x["unit"],
                **{f"acc {w}": v for w, v in zip(names, x["class accuracy"], strict=True)},
                **{f"says {w}": v for w, v in zip(names, x["answer share"], strict=True)},
            }
            for x in a["answers"]
        ]
    )
