"""The DASP experiment of docs/results/prefix.md, runnable with ``gencraft reproduce``:

``prefix-tasks``: full fine-tuning, dense prefix-tuning, peft's PrefixTuning and the DASP
variants (UniBlock, HierBlock, HTruncSA, HSoftSA, HierBlock+SoftSA) trained with the same
budget on E2E, DART or XSum, scored on the test split (data-to-text: BLEU, NIST, METEOR,
ROUGE-L, CIDEr, TER against every reference; XSum: ROUGE-1/2/L), over one or more seeds.

Each (variant, seed) is one unit. Its run lives in ``runs_dir/VARIANT`` (``VARIANT-seedN`` for
seeds other than 0), so separate invocations (one variant each, on separate cores) share
trained runs: training resumes from the run's checkpoint, and the test scores are kept in
``test-N.json`` beside it and reused when the decoding settings match.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencraft.errors import ConfigError
from gencraft.extras import require
from gencraft.studies.runner import ExperimentRun, register, settings_field
from gencraft.utils import default_device

#: variant -> (training method, PrefixConfig fields); "lower" = the paper's 7-of-12 split
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "finetune": ("finetune", {}),
    "dense": ("prefix", {}),
    "peft": ("peft", {}),
    "uniblock": ("prefix", {"encoder_segments": 2, "blocked_layers": "all"}),
    "hierblock": ("prefix", {"encoder_segments": 2, "blocked_layers": "lower"}),
    "htruncsa": ("prefix", {"normalizer": "truncsa", "sparse_layers": "lower"}),
    "hsoftsa": ("prefix", {"normalizer": "softsa", "sparse_layers": "lower"}),
    "hierblock-softsa": (
        "prefix",
        {
            "encoder_segments": 2,
            "blocked_layers": "lower",
            "normalizer": "softsa",
            "sparse_layers": "lower",
        },
    ),
}
#: the variants each task's table has (XSum: the issue's three)
TASK_VARIANTS = {
    "e2e": tuple(VARIANTS),
    "dart": tuple(VARIANTS),
    "xsum": ("dense", "hierblock", "hierblock-softsa"),
}
#: prefix length per task (DASP Tables 9/12: 5 for E2E, 10 for DART; hyperparameters: 100 for XSum)
TASK_PREFIX = {"e2e": 5, "dart": 10, "xsum": 100}
DATA2TEXT_METRICS = ("BLEU", "NIST", "METEOR", "ROUGE-L", "CIDEr", "TER")
SUMMARY_METRICS = ("rouge1", "rouge2", "rougeL")

#: DASP's own numbers (BART-large; Tables 2, 5, 9, 12, digest §3.8) for the report
PAPER = {
    "e2e": {
        "finetune": {"BLEU": 67.8, "NIST": 8.76, "METEOR": 0.451, "ROUGE-L": 69.5, "CIDEr": 2.38},
        "dense": {"BLEU": 67.3, "NIST": 8.66, "METEOR": 0.448, "ROUGE-L": 68.6, "CIDEr": 2.34},
        "uniblock": {"BLEU": 66.1, "NIST": 8.60, "METEOR": 0.450, "ROUGE-L": 68.3, "CIDEr": 2.36},
        "hierblock": {"BLEU": 67.2, "NIST": 8.70, "METEOR": 0.451, "ROUGE-L": 69.1, "CIDEr": 2.35},
        "hsoftsa": {"BLEU": 66.2, "NIST": 8.57, "METEOR": 0.450, "ROUGE-L": 68.7, "CIDEr": 2.33},
        "hierblock-softsa": {
            "BLEU": 68.0,
            "NIST": 8.76,
            "METEOR": 0.453,
            "ROUGE-L": 69.6,
            "CIDEr": 2.38,
        },
    },
    "dart": {
        "finetune": {"BLEU": 46.1, "METEOR": 0.38, "TER": 0.46},
        "dense": {"BLEU": 45.9, "METEOR": 0.39, "TER": 0.45},
        "uniblock": {"BLEU": 46.5, "METEOR": 0.39, "TER": 0.46},
        "hierblock": {"BLEU": 46.6, "METEOR": 0.39, "TER": 0.45},
        "hsoftsa": {"BLEU": 46.2, "METEOR": 0.39, "TER": 0.45},
        "hierblock-softsa": {"BLEU": 46.0, "METEOR": 0.39, "TER": 0.46},
    },
    "xsum": {
        "finetune": {"rouge1": 45.47, "rouge2": 22.40, "rougeL": 37.42},
        "dense": {"rouge1": 43.43, "rouge2": 20.37, "rougeL": 35.47},
        "uniblock": {"rouge1": 43.49, "rouge2": 20.58, "rougeL": 35.80},
        "hierblock": {"rouge1": 43.91, "rouge2": 20.83, "rougeL": 36.38},
        "htruncsa": {"rouge1": 44.17, "rouge2": 21.11, "rougeL": 36.42},
        "hsoftsa": {"rouge1": 44.05, "rouge2": 20.84, "rougeL": 36.13},
        "hierblock-softsa": {"rouge1": 44.00, "rouge2": 20.93, "rougeL": 36.59},
    },
}
#: two-sided 95% Student-t quantiles by degrees of freedom (no scipy dependency)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass
class PrefixTaskSettings:
    task: str = settings_field("e2e", "e2e, dart (trained on dev minus 300) or xsum")
    variants: str = settings_field(
        "", f"comma-separated, from {', '.join(VARIANTS)} (empty: the task's table)"
    )
    seeds: str = settings_field("0", "comma-separated training seeds")
    model: str = settings_field("smollm2-135m", "base model (registered name or local path)")
    num_virtual_tokens: int | None = settings_field(None, "P (None: 5 E2E, 10 DART, 100 XSum)")
    steps: int = settings_field(120, "optimizer steps per run")
    batch_size: int = settings_field(8, "pairs per step")
    lr: float = settings_field(5e-3, "AdamW learning rate of the prefixes")
    finetune_lr: float = settings_field(5e-5, "AdamW learning rate of full fine-tuning")
    valid_examples: int = settings_field(64, "validation pairs (best checkpoint by their loss)")
    train_examples: int | None = settings_field(
        None, "the first N training pairs after the shuffle (default: all)"
    )
    max_source_tokens: int = settings_field(256, "source tokens kept")
    test_limit: int | None = settings_field(80, "N test inputs (None: the whole split)")
    test_spread: bool = settings_field(
        False, "the N test inputs evenly spaced over the split, not its first N"
    )
    num_beams: int = settings_field(5, "beam size (paper: 5)")
    max_new_tokens: int = settings_field(64, "output tokens at most")
    bootstrap: int = settings_field(1000, "test-set bootstrap resamples for BLEU's interval")
    metrics: tuple[str, ...] = settings_field((), "metrics scored (empty: every one of the task's)")
    runs_dir: str | None = settings_field(None, "where runs live (None: outputs/prefix-TASK)")
    data_dir: str | None = settings_field(None, "datasets directory")


def _variants(s: PrefixTaskSettings) -> list[str]:
    names = [v.strip() for v in s.variants.split(",") if v.strip()] or list(TASK_VARIANTS[s.task])
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    return names


def _seeds(s: PrefixTaskSettings) -> list[int]:
    try:
        return [int(x) for x in s.seeds.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"seeds: comma-separated integers, got {s.seeds!r}") from None


def run_dir(s: PrefixTaskSettings, variant: str, seed: int) -> Path:
    root = Path(s.runs_dir or f"outputs/prefix-{s.task}")
    return root / (variant if seed == 0 else f"{variant}-seed{seed}")


def train_and_score(s: PrefixTaskSettings, variant: str, seed: int, progress: bool) -> dict:
    """Train one (variant, seed) run (resuming) and score its best checkpoint on the test
    split (reusing ``test-N.json`` written with the same decoding settings)."""
    from gencraft.data.tasks import pick_examples, task_examples
    from gencraft.prefix.train import train

    method = VARIANTS[variant][0]
    out = run_dir(s, variant, seed)
    cfg, prefix = _train_configs(s, variant, seed)
    summary = train(cfg, prefix, out, data_dir=s.data_dir, progress=progress)
    examples = pick_examples(task_examples(s.task, "test", s.data_dir), s.test_limit, s.test_spread)
    result = _test_result(s, out, len(examples), progress)
    unit = {
        "method": method,
        "run": str(out),
        "steps": summary["steps"],
        "best_valid_loss": summary["best_valid_loss"],
        "train_seconds": summary["train_seconds"],
        "trainable_parameters": summary["trainable_parameters"],
        "examples": result["examples"],
        "generate_seconds": result["generate_seconds"],
        "scores": {k: v for k, v in result["scores"].items() if isinstance(v, float)},
        "outputs": list(result["outputs"]),  # per input: what paired tests between rows read
    }
    unit.update(_intervals(s, result["outputs"], examples))
    return unit


def _train_configs(s: PrefixTaskSettings, variant: str, seed: int) -> tuple:
    """The (PrefixTrainConfig, PrefixConfig) of one (variant, seed) run."""
    from gencraft.prefix import PrefixConfig
    from gencraft.prefix.config import PrefixTrainConfig
    from gencraft.training import FitConfig

    method, fields = VARIANTS[variant]
    cfg = PrefixTrainConfig(
        model=s.model,
        task=s.task,
        method=method,
        lr=s.finetune_lr if method == "finetune" else s.lr,
        valid_examples=s.valid_examples,
        train_examples=s.train_examples,
        max_source_tokens=s.max_source_tokens,
        fit=FitConfig(epochs=10, batch_size=s.batch_size, max_steps=s.steps, seed=seed),
    )
    prefix = PrefixConfig(
        num_virtual_tokens=s.num_virtual_tokens or TASK_PREFIX[s.task],
        init="tokens",
        init_seed=seed,
        **fields,
    )
    return cfg, prefix


def _test_result(s: PrefixTaskSettings, out: Path, n: int, progress: bool) -> dict:
    """The best checkpoint's test outputs and scores on ``n`` examples, from
    ``test-N.json`` when it was written with the same decoding and every metric asked for."""
    from gencraft.prefix.evaluate import evaluate
    from gencraft.prefix.variants import rebuild_finetuned
    from gencraft.training import load_run

    path = out / f"test-{'spread' if s.test_spread else ''}{n}.json"
    decoding = {"num_beams": s.num_beams, "max_new_tokens": s.max_new_tokens}
    result = json.loads(path.read_text()) if path.is_file() else {}
    # a cached result scored with fewer metrics than wanted is scored again
    wanted = set(s.metrics) if s.metrics else None
    lacking = (wanted - set(result.get("scores", {}))) if wanted else bool(result.get("metrics"))
    if {k: result.get(k) for k in decoding} == decoding and not lacking:
        return result
    model, tok, _ = load_run(out / "best", build=rebuild_finetuned)
    result = evaluate(
        model,
        tok,
        s.task,
        "test",
        data_dir=s.data_dir,
        limit=s.test_limit,
        spread=s.test_spread,
        num_beams=s.num_beams,
        max_source_tokens=s.max_source_tokens,
        max_new_tokens=s.max_new_tokens,
        progress=progress,
        metrics=s.metrics or None,
    )
    result["metrics"] = list(s.metrics)
    path.write_text(json.dumps(result, indent=2))
    return result


def _intervals(s: PrefixTaskSettings, outputs: list[str], examples: list) -> dict:
    """XSum: ROUGE-L per document (and its bootstrap); other tasks: BLEU's bootstrap
    interval when ``s.bootstrap`` resamples are asked for."""
    from gencraft.data.tasks import references_of

    refs = [references_of(e) for e in examples]
    if s.task == "xsum":
        from gencraft.metrics.text import bootstrap_mean, rouge_per_example

        per_doc = rouge_per_example(outputs, refs)
        extra: dict = {"rougeL_per_doc": per_doc}
        if s.bootstrap:
            extra["rougeL_bootstrap"] = bootstrap_mean(per_doc, s.bootstrap)
        return extra
    if s.bootstrap:
        from gencraft.metrics import bleu_interval

        return {"BLEU_bootstrap": bleu_interval(s.task, outputs, refs, resamples=s.bootstrap)}
    return {}


def _bootstrap_key(unit: dict) -> str | None:
    return next((k for k in ("BLEU_bootstrap", "rougeL_bootstrap") if k in unit), None)


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, 95% Student-t half-width over seeds; None for one seed)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, None
    t = T95.get(len(values) - 1, T95[9])  # beyond 9 dof: the 9-dof quantile (conservative)
    return m, t * statistics.stdev(values) / math.sqrt(len(values))


def _cell(values: list[float]) -> str:
    m, h = mean_interval(values)
    digits = 3 if abs(m) < 10 else 2
    return f"{m:.{digits}f}" + ("" if h is None else f" ± {h:.{digits}f}")


def _tasks_units(s: PrefixTaskSettings) -> list[str]:
    """The unit keys of a run: one per (variant, seed)."""
    return [f"{v}/seed{seed}" for v in _variants(s) for seed in _seeds(s)]


def tasks_verdict(runs: list[tuple[PrefixTaskSettings, dict]]) -> list[dict]:
    """Each variant minus dense prefixes on the task's main metric (BLEU; ROUGE-L for XSum),
    paired by seed, pooled over runs."""
    from gencraft.metrics.stats import decide

    diffs: dict[str, list[float]] = {}
    for s, units in runs:
        metric = "rougeL" if s.task == "xsum" else "BLEU"
        for v in _variants(s):
            for seed in _seeds(s):
                got = units.get(f"{v}/seed{seed}"), units.get(f"dense/seed{seed}")
                if v != "dense" and None not in got:
                    diffs.setdefault(f"{v} − dense, {metric}", []).append(
                        got[0]["scores"][metric] - got[1]["scores"][metric]
                    )
    return [
        {"comparison": name, "pairs": "seeds", "unit": "points", **decide(d)}
        for name, d in diffs.items()
    ]


@register(
    "prefix-tasks",
    title="DASP prefix-tuning variants against dense prefixes and fine-tuning",
    settings=PrefixTaskSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "variants": "dense,hierblock,htruncsa",
            "seeds": "0,1",
            "steps": 2,
            "batch_size": 4,
            "lr": 1e-2,
            "valid_examples": 4,
            "train_examples": 64,
            "test_limit": 3,
            "num_beams": 2,
            "max_new_tokens": 8,
            "bootstrap": 50,
        },
        "cpu": {},
        "gpu": {"test_limit": None, "steps": 5000, "batch_size": 16, "seeds": "0,1,2"},
    },
    cpu_minutes=150,
    units=_tasks_units,
    verdict=tasks_verdict,
)
def prefix_tasks(s: PrefixTaskSettings, run: ExperimentRun) -> None:
    """DASP variants vs dense prefix-tuning and full fine-tuning on one task, over seeds."""
    if s.task not in TASK_VARIANTS:
        raise ConfigError(f"task must be one of {', '.join(TASK_VARIANTS)}, got {s.task!r}")
    variants, seeds = _variants(s), _seeds(s)
    units = {
        (v, seed): run.unit(
            f"{v}/seed{seed}", lambda v=v, seed=seed: train_and_score(s, v, seed, True)
        )
        for v in variants
        for seed in seeds
    }
    metrics = SUMMARY_METRICS if s.task == "xsum" else DATA2TEXT_METRICS
    rows = []
    for v in variants:
        got = [units[v, seed] for seed in seeds]
        row: dict[str, Any] = {"variant": v, "seeds": len(seeds)}
        for m in metrics:
            if all(m in u["scores"] for u in got):  # the metrics scored (``s.metrics``)
                row[m] = _cell([u["scores"][m] for u in got])
        key = _bootstrap_key(got[0])
        if key:
            mean, half = got[0][key]
            row[f"{key.split('_')[0]}, seed 0 (test bootstrap)"] = f"{mean:.2f} ± {half:.2f}"
        if "rougeL_per_doc" in got[0] and "dense" in variants:  # every row has the column
            from gencraft.metrics.text import bootstrap_mean

            base = units["dense", seeds[0]]["rougeL_per_doc"]
            diff = [a - b for a, b in zip(got[0]["rougeL_per_doc"], base, strict=True)]
            mean, half = bootstrap_mean(diff, s.bootstrap or 1000)
            paired = "–" if v == "dense" else f"{mean:+.2f} ± {half:.2f}"
            row["rougeL − dense, seed 0 (paired)"] = paired
        row["valid loss"] = _cell([u["best_valid_loss"] for u in got])
        row["trained params"] = got[0]["trainable_parameters"]
        paper = PAPER.get(s.task, {}).get(v)
        row["paper (BART-L)"] = " / ".join(f"{k} {x:g}" for k, x in paper.items()) if paper else "–"
        rows.append(row)
    n = units[variants[0], seeds[0]]["examples"]
    which = "evenly spaced" if s.test_spread else "first"
    run.text(
        f"{s.task} test, {which} {n} inputs; {s.model}, {s.steps} steps of batch {s.batch_size}, "
        f"P = {s.num_virtual_tokens or TASK_PREFIX[s.task]}, beam {s.num_beams}. "
        "Cells: mean over seeds ± the 95% t-interval half-width (seeds > 1); test bootstrap: "
        "95% half-width over resampled test inputs (BLEU: sacrebleu's; ROUGE-L: per-document "
        "percentile, paired against dense where shown); ROUGE ×100, "
        "METEOR and TER as fractions. The paper column is DASP's BART-large result (Tables "
        "2, 5, 9, 12), for direction only."
    )
    run.table(rows)
    _plot(run, variants, seeds, units, "rougeL" if s.task == "xsum" else "BLEU")


def _plot(run: ExperimentRun, variants, seeds, units, metric: str) -> None:
    from gencraft.plotting import pyplot

    plt = pyplot()

    means, halves = [], []
    for v in variants:
        m, h = mean_interval([units[v, seed]["scores"][metric] for seed in seeds])
        key = _bootstrap_key(units[v, seeds[0]])
        if h is None and key:
            h = units[v, seeds[0]][key][1]
        means.append(m)
        halves.append(h or 0.0)
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(variants), 3.2))
    ax.bar(range(len(variants)), means, yerr=halves, capsize=4, color="tab:blue")
    ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by variant (95% interval)")
    fig.tight_layout()
    fig.savefig(run.plot_path(f"{metric.lower()}_by_variant.png", f"{metric} by variant"))
    plt.close(fig)


# ---- prefix-speed -------------------------------------------------------------------------
#: the variants timed by prefix-speed (peft: the baseline), as PrefixConfig fields
SPEED_VARIANTS: dict[str, dict[str, Any]] = {
    "peft": {},
    **{v: f for v, (method, f) in VARIANTS.items() if method == "prefix"},
}


@dataclass
class PrefixSpeedSettings:
    model: str = settings_field("smollm2-135m", "causal LM (registered name or local path)")
    variants: str = settings_field(",".join(SPEED_VARIANTS), "comma-separated; peft first")
    num_virtual_tokens: int = settings_field(10, "P")
    batch_size: int = settings_field(8, "sequences per training step")
    length: int = settings_field(64, "tokens per sequence (loss on the second half)")
    new_tokens: int = settings_field(32, "generated tokens (dense prefixes vs the base)")
    rounds: int = settings_field(9, "rounds (each variant once per round, beside a peft step)")
    threads: int | None = settings_field(None, "torch CPU threads (default: torch's)")


def _speed_models(s: PrefixSpeedSettings, names: list[str]) -> dict[str, Any]:
    """One fresh base per variant (a PrefixModel and peft each change their base), the
    prefixes on it; all in train mode."""
    import torch

    from gencraft.models import load_model
    from gencraft.prefix import PrefixConfig, PrefixModel

    models = {}
    for name in names:
        torch.manual_seed(0)
        base, _ = load_model(s.model)
        if name == "peft":
            peft = require("peft", "peft", "the peft baseline")
            PrefixTuningConfig, TaskType = peft.PrefixTuningConfig, peft.TaskType
            get_peft_model = peft.get_peft_model
            cfg = PrefixTuningConfig(
                task_type=TaskType.CAUSAL_LM, num_virtual_tokens=s.num_virtual_tokens
            )
            model = get_peft_model(base, cfg)
        else:
            fields = SPEED_VARIANTS[name]
            model = PrefixModel(
                base, PrefixConfig(num_virtual_tokens=s.num_virtual_tokens, **fields)
            )
        models[name] = model.to(default_device()).train()
    return models


def prefix_speed_unit(s: PrefixSpeedSettings) -> dict[str, Any]:
    """Training-step time and saved activations of every variant against peft's, interleaved
    in one process; dense prefixes' generate against the base model's."""
    import torch

    from gencraft.studies.runner import machine
    from gencraft.studies.timing import cuda_peak_bytes, interleaved, saved_tensor_bytes

    if s.threads:
        torch.set_num_threads(s.threads)
    names = [v.strip() for v in s.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(SPEED_VARIANTS))
    if unknown or not names or names[0] != "peft":
        raise ConfigError(
            f"variants: peft first, then any of {', '.join(SPEED_VARIANTS)}; got {s.variants!r}"
        )
    models = _speed_models(s, names)
    vocab = models["peft"].get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, min(1000, vocab), (s.batch_size, s.length), generator=g)
    ids = ids.to(default_device())
    mask, labels = torch.ones_like(ids), ids.clone()
    labels[:, : s.length // 2] = -100
    optimizers = {
        k: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
        for k, m in models.items()
    }

    def loss(name: str) -> torch.Tensor:
        return models[name](input_ids=ids, attention_mask=mask, labels=labels).loss

    def step(name: str) -> None:
        loss(name).backward()
        optimizers[name].step()
        optimizers[name].zero_grad()

    train = interleaved({k: (lambda k=k: step(k)) for k in names}, "peft", rounds=s.rounds)
    saved = {k: saved_tensor_bytes(lambda k=k: loss(k)) for k in names}
    peaks = {k: cuda_peak_bytes(lambda k=k: step(k)) for k in names}
    result: dict[str, Any] = {"train": {}, **machine()}
    for k in names:
        result["train"][k] = {
            **train[k].row(),
            "saved MiB": saved[k] / 2**20,
            "saved ratio": saved[k] / saved["peft"],
        }
        if peaks[k] is not None:  # CUDA only
            result["train"][k]["cuda peak MiB"] = peaks[k] / 2**20
    if "dense" in models:
        result["generate"] = _generate_rows(s, models["dense"], ids, mask)
    return result


def _generate_rows(s: PrefixSpeedSettings, dense: Any, ids, mask) -> dict[str, dict]:
    """The base model's ``generate`` against the dense-prefix model's, interleaved, on the
    first 16 tokens of the first row of ``ids``/``mask`` ``[B, T]``, ``s.new_tokens`` each."""
    import torch

    from gencraft.models import load_model
    from gencraft.studies.timing import interleaved

    dense = dense.eval()
    base, _ = load_model(s.model)
    base = base.to(default_device()).eval()
    prompt = dict(input_ids=ids[:1, :16], attention_mask=mask[:1, :16])
    kw = {"max_new_tokens": s.new_tokens, "min_new_tokens": s.new_tokens, "do_sample": False}
    with torch.no_grad():
        gen = interleaved(
            {
                "base": lambda: base.generate(**prompt, **kw),
                "dense prefixes": lambda: dense.generate(**prompt, **kw),
            },
            "base",
            rounds=s.rounds,
        )
    return {k: t.row() for k, t in gen.items()}


@register(
    "prefix-speed",
    title="DASP training-step cost against peft's prefix-tuning, and generation with prefixes",
    settings=PrefixSpeedSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "rounds": 3,
            "batch_size": 2,
            "length": 16,
            "new_tokens": 4,
        },
        "cpu": {},
        "gpu": {"rounds": 21, "batch_size": 16, "length": 256},
    },
    cpu_minutes=8,
)
def prefix_speed(s: PrefixSpeedSettings, run: ExperimentRun) -> None:
    """A training step of each DASP variant against peft's prefix-tuning on the same model and
    batch, interleaved in one process (ratio: median of per-round ratios, with quartiles);
    saved activations from autograd's hooks; dense prefixes' generate against the base."""
    r = run.unit("speed", lambda: prefix_speed_unit(s))
    run.text(
        f"{s.model}, P = {s.num_virtual_tokens}, batch {s.batch_size} × {s.length} tokens, "
        f"{s.rounds} interleaved rounds on {r['device']} ({r['threads']} threads). Ratios are "
        "to peft's PrefixTuning: the median over rounds of the time ratio to an adjacent peft "
        "step, q25–q75 beside it; ± spread = half the quartile range over the ratio. Saved "
        "MiB: what autograd keeps for backward in one step (exact on any device)."
    )
    run.table([{"variant": k, **v} for k, v in r["train"].items()])
    if "generate" in r:
        run.text(f"Generate {s.new_tokens} tokens greedily from a 16-token prompt:")
        run.table([{"case": k, **v} for k, v in r["generate"].items()])
