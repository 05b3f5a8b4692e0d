"""The RUM-SUNDAE experiment of docs/results/nar.md, runnable with ``gencraft reproduce``:

``nar-tasks``: on one local seq2seq task (E2E by default; WebNLG or DART), train

* RUM-SUNDAE: the MLM in both stacks, random cross-attention;
* RUM-SUNDAE with cross-attention copied from self-attention;
* SUNDAE from scratch, with more steps than the pretrained models (the thesis's
  "a fraction of the training steps" turned around);
* Mask-Predict on the same converted model;
* the autoregressive BERT2BERT from the same MLM (beam 4).

Each SUNDAE model's temperature is tuned on its own validation outputs (Appendix A: within
[0.1, 1.1]). Each model is scored on test (BLEU, ROUGE-L, decoding seconds and model calls
per output). Quality against decoding steps is plotted for the first SUNDAE variant and
Mask-Predict. Each training and each evaluation is a unit that resumes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from gencraft.nar.config import ConvertConfig, NARTrainConfig, ObjectiveConfig, SamplingConfig
from gencraft.nar.evaluate import (
    decode_rows,
    evaluate,
    sampling_for,
    summarize,
    task_inputs,
)
from gencraft.nar.train import train
from gencraft.studies.runner import (
    ExperimentRun,
    kept_models,
    register,
    runs_by_settings,
    settings_field,
)
from gencraft.training import FitConfig, load_run

#: name -> (objective, convert settings, decoding method)
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "rum-sundae": ("sundae", {}, "sundae"),
    "rum-sundae-copy": ("sundae", {"cross_attention": "copy"}, "sundae"),
    "sundae-scratch": ("sundae", {"pretrained": False}, "sundae"),
    "mask-predict": ("mask-predict", {}, "mask-predict"),
    "autoregressive": ("autoregressive", {"bidirectional": False}, "beam"),
}


@dataclass
class NARTasksSettings:
    model: str = settings_field("minilm-l6", "the masked LM")
    task: str = settings_field("e2e", "e2e, webnlg or dart")
    variants: tuple[str, ...] = settings_field(tuple(VARIANTS), "models trained and scored")
    steps: int = settings_field(300, "optimizer steps of a pretrained start")
    scratch_steps: int = settings_field(600, "optimizer steps of SUNDAE from scratch")
    batch_size: int = settings_field(16, "pairs per batch")
    train_examples: int | None = settings_field(None, "the first N training pairs (None: all)")
    valid_examples: int = settings_field(256, "validation pairs for the loss")
    lr: float = settings_field(2e-4, "learning rate of a pretrained start")
    scratch_lr: float = settings_field(5e-4, "learning rate from scratch")
    seed: int | None = settings_field(
        None, "training seed of every model (None: 0; runs saved before it had none)"
    )
    max_target_length: int = settings_field(96, "the length predictor's range")
    samples: int = settings_field(16, "SUNDAE samples per input (Appendix A: 16)")
    decode_steps: int = settings_field(15, "SUNDAE / Mask-Predict steps (Appendix A: 15)")
    length_candidates: int = settings_field(3, "top-ℓ lengths decoded")
    decode_batch: int = settings_field(16, "test sources decoded together")
    temperatures: tuple[float, ...] = settings_field(
        (0.1, 0.4, 0.7, 1.0), "SUNDAE temperatures tried on validation"
    )
    tune_inputs: int = settings_field(24, "validation inputs for the temperature")
    test_limit: int | None = settings_field(80, "test inputs scored (evenly spaced; None: all)")
    curve_steps: tuple[int, ...] = settings_field((1, 2, 4, 8, 15), "decoding steps plotted")
    curve_inputs: int = settings_field(40, "test inputs of the quality-vs-steps curve")
    curve_thresholds: tuple[float, ...] = settings_field(
        (0.5, 0.7, 0.9, 0.95), "confidence thresholds plotted (Fast-dLLM decoding)"
    )
    threshold_steps: int = settings_field(64, "the most calls a threshold decode may take")
    data_dir: str | None = settings_field(None, "datasets directory")


def _curve_models(s: NARTasksSettings) -> list[str]:
    """The models of the quality-vs-steps curve: the first SUNDAE and the first Mask-Predict."""
    firsts = {}
    for v in s.variants:
        firsts.setdefault(VARIANTS[v][2], v)
    return [firsts[m] for m in ("sundae", "mask-predict") if m in firsts]


def _tasks_units(s: NARTasksSettings) -> list[str]:
    """The unit keys of a run in the order a new run computes them: each model's training,
    temperature (SUNDAE) and test, then for a curve model its curve's points."""
    keys = []
    for v in s.variants:
        keys.append(f"train {v}")
        keys += [f"tune {v}"] if VARIANTS[v][2] == "sundae" else []
        keys.append(f"test {v}")
        if v in _curve_models(s):
            keys += [f"curve {v} {n}" for n in s.curve_steps]
            keys += [f"curve {v} tau={t}" for t in s.curve_thresholds]
    return keys


#: (claimed better, other) pairs the verdict compares, when both ran
COMPARED = (("rum-sundae", "sundae-scratch"), ("rum-sundae-copy", "rum-sundae"))
#: peers the thesis claims nothing against, compared at equal training steps for the record
PEERS = (("rum-sundae", "mask-predict"), ("rum-sundae", "autoregressive"))


def peer_verdict(a: str, b: str, mean: float, p: float, alpha: float = 0.05) -> str:
    """A peer comparison's verdict: which of ``a`` and ``b`` scores higher (p < ``alpha``),
    or neither; never "reproduced" or "contradicted", since no claim is tested."""
    if p < alpha and mean != 0:
        return f"{a if mean > 0 else b} higher (peer, no claim)"
    return "not distinguishable at this size (peer, no claim)"


def tasks_verdict(runs: list[tuple[NARTasksSettings, dict]]) -> list[dict]:
    """Paired bootstrap of test BLEU (lower-cased convention) over the test inputs, for each
    pair of :data:`COMPARED`, then of :data:`PEERS`, that a run finished. Runs whose settings
    differ only in ``seed`` (the training seed) are pooled: one row over their inputs and seeds
    (:func:`~gencraft.metrics.tasks.bleu_paired_runs`); runs set otherwise get rows apart."""
    from gencraft.data.tasks import pick_examples, references_of, task_examples
    from gencraft.metrics.stats import verdict as claim_verdict
    from gencraft.metrics.tasks import bleu_paired_runs

    rows = []
    for group in runs_by_settings(runs, but=("seed",)):
        s = group[0][0]
        examples = pick_examples(
            task_examples(s.task, "test", s.data_dir), s.test_limit, spread=True
        )
        refs = [references_of(e) for e in examples]
        for a, b in [*COMPARED, *PEERS]:
            done = [u for _, u in group if f"test {a}" in u and f"test {b}" in u]
            if not done:
                continue
            outs = [[u[f"test {m}"]["predictions"] for u in done] for m in (a, b)]
            r = bleu_paired_runs(s.task, *outs, refs, lowercase=True)
            seeds = f" × {r['runs']} training seeds" if r["runs"] > 1 else ""
            if (a, b) in COMPARED:
                verdict = claim_verdict(r)
            else:
                verdict = peer_verdict(a, b, r["mean"], r["p"])
            rows.append(
                {
                    "comparison": f"{a} − {b}, BLEU",
                    "pairs": f"test inputs{seeds} (paired bootstrap)",
                    "unit": "BLEU",
                    **r,
                    "verdict": verdict,
                    "needed": None,
                }
            )
    return rows


@register(
    "nar-tasks",
    title="RUM-SUNDAE vs SUNDAE from scratch, Mask-Predict and autoregressive BERT2BERT (ch. 4)",
    settings=NARTasksSettings,
    scales={
        "tiny": {
            "model": "tiny-bert",
            "steps": 3,
            "scratch_steps": 4,
            "batch_size": 4,
            "lr": 1e-3,
            "max_target_length": 128,
            "samples": 2,
            "decode_steps": 2,
            "length_candidates": 2,
            "temperatures": (0.5, 1.0),
            "tune_inputs": 2,
            "test_limit": 3,
            "curve_steps": (1, 2),
            "curve_inputs": 2,
            "curve_thresholds": (0.5,),
            "threshold_steps": 8,
            "train_examples": 64,
            "valid_examples": 16,
        },
        "cpu": {},
        "gpu": {
            "steps": 20000,
            "scratch_steps": 60000,
            "batch_size": 64,
            "lr": 1e-4,
            "test_limit": None,
            "tune_inputs": 200,
            "curve_inputs": 300,
        },
    },
    cpu_minutes=120,
    units=_tasks_units,
    kept=lambda s: kept_models(_tasks_units(s)),
    verdict=tasks_verdict,
)
def nar_tasks(s: NARTasksSettings, run: ExperimentRun) -> None:
    done: dict[str, VariantRows] = {}
    curves: dict[str, list[dict]] = {}
    temperatures: dict[str, float] = {}  # each SUNDAE model decodes at its own tuned temperature
    for name in run_order(s.variants, run.earlier):
        done[name] = _variant(s, run, name, temperatures)
        if name in _curve_models(s):  # while its model is on disk (a new checkout loses it)
            curves[name] = _curve(s, run, name, temperatures.get(name, 1.0))
    rows = [done[n].test for n in s.variants]
    conventions = [done[n].lower for n in s.variants]
    _relative_cost(rows)
    _report_tasks(s, run, rows, conventions)
    curve = [r for n in _curve_models(s) for r in curves[n]]
    if curve:
        _report_curve(s, run, curve)


def run_order(variants: tuple[str, ...], earlier: dict[str, Any]) -> list[str]:
    """The order the variants run in: as given, except that one whose finished training runs
    again (its model gone, ``ExperimentRun.earlier``) comes after those that are new, so that
    a resumed run spends its time on new models first."""
    return sorted(variants, key=lambda v: f"train {v}" in earlier)


def _train_config(s: NARTasksSettings, scratch: bool) -> NARTrainConfig:
    """The training settings of one variant (from scratch: its own steps and learning rate)."""
    steps = s.scratch_steps if scratch else s.steps
    return NARTrainConfig(
        model=s.model,
        task=s.task,
        train_examples=s.train_examples,
        valid_examples=s.valid_examples,
        lr=s.scratch_lr if scratch else s.lr,
        fit=FitConfig(
            batch_size=s.batch_size,
            max_steps=steps,
            eval_every=max(1, steps // 4),
            warmup=0.05,
            seed=s.seed or 0,
        ),
    )


class VariantRows(NamedTuple):
    """A variant's row of the test table and its row under the lower-cased convention."""

    test: dict[str, Any]
    lower: dict[str, Any]


def _variant(
    s: NARTasksSettings, run: ExperimentRun, name: str, temperatures: dict[str, float]
) -> VariantRows:
    """Units ``train NAME``, ``tune NAME`` (SUNDAE) and ``test NAME``: the variant's row of the
    test table and its row under the lower-cased convention. Records a SUNDAE model's tuned
    temperature in ``temperatures``."""
    objective, convert_kw, method = VARIANTS[name]
    scratch = convert_kw.get("pretrained") is False
    cfg = _train_config(s, scratch)
    convert = ConvertConfig(max_target_length=s.max_target_length, **convert_kw)
    obj = ObjectiveConfig(objective=objective)
    out = Path(run.directory) / name

    def fit_one(callbacks):
        summary = train(
            cfg, convert, obj, out, data_dir=s.data_dir, progress=True, callbacks=callbacks
        )
        return {k: v for k, v in summary.items() if k != "history"}

    summary = run.unit(f"train {name}", fit_one, resumes=True)
    sampling = sampling_for(
        method, steps=s.decode_steps, samples=s.samples, length_candidates=s.length_candidates
    )
    if method == "sundae":
        tuned = run.unit(f"tune {name}", lambda sp=sampling: _tune(s, out, sp))
        temperatures[name] = tuned["temperature"]
        sampling = SamplingConfig(**{**asdict(sampling), "temperature": tuned["temperature"]})

    r = _test_unit(s, run, name, sampling, method)
    row = {
        "model": name,
        "init": "random" if scratch else "MLM",
        "steps": summary["steps"],
        "decoding": method + (f" (T={temperatures[name]})" if method == "sundae" else ""),
        **{k: v for k, v in r.items() if k not in ("predictions", "lower-cased")},
    }
    return VariantRows(row, {"model": name, **_rescored(r["lower-cased"])})


def _report_tasks(
    s: NARTasksSettings, run: ExperimentRun, rows: list[dict], conventions: list[dict]
) -> None:
    """The test table and the same outputs under the other scoring conventions."""
    run.text(
        f"{s.model} converted to an encoder-decoder, trained on {s.task} train "
        f"(batch {s.batch_size}; pretrained starts {s.steps} steps, from scratch "
        f"{s.scratch_steps}), scored on {s.test_limit or 'all'} test inputs (evenly spaced, all "
        "references). SUNDAE: best of "
        f"{s.samples} samples, {s.decode_steps} steps at most, top-{s.length_candidates} "
        "lengths, temperature tuned on validation BLEU. Decoding runs batches of "
        f"{s.decode_batch} sources (a source's output does not depend on its batch: SUNDAE "
        "seeds each source's generator from its tokens); seconds are a batch's wall time per "
        "output; calls are the decoder forward passes each output took part in."
    )
    cols = ["model", "init", "steps", "decoding", "outputs", "BLEU", "ROUGE-L"]
    run.table(rows, [*cols, "seconds/output", "calls/output", "steps/output", "time vs AR"])
    run.text(
        f"Scored by score_task ({rows[0]['convention']}). The same outputs under the "
        "lower-cased convention (MiniLM's tokenizer lower-cases, so its outputs cannot match "
        "cased references) and under the earlier scoring (case-sensitive BLEU, "
        "rouge-score ROUGE-L with stemming):"
    )
    run.table(conventions, ["model", *_RESCORED])


def _report_curve(s: NARTasksSettings, run: ExperimentRun, curve: list[dict]) -> None:
    """Quality against decoder calls, threshold decoding's targets, and the plot."""
    run.text(
        f"Quality against decoder calls ({s.curve_inputs} test inputs): fixed steps, and "
        f"confidence-threshold decoding (at most {s.threshold_steps} calls):"
    )
    cols = ["model", "max steps", "threshold", "BLEU", "ROUGE-L", "calls/output"]
    run.table(curve, [*cols, "seconds/output"])
    run.text(
        "Threshold decoding against each model's fixed schedule at its most steps: the "
        "fewest calls per output of a threshold that reaches that BLEU (none: no threshold "
        "reaches it):"
    )
    run.table(threshold_target(curve))
    _plot(run, curve, s)


def _test_unit(
    s: NARTasksSettings, run: ExperimentRun, name: str, sampling: SamplingConfig, method: str
) -> dict[str, Any]:
    """Unit ``test NAME``: the model's test outputs, scored (:func:`summarize`), with the
    lower-cased convention beside them; decoded and saved one batch at a time, so a stopped
    run resumes at its batch (``ExperimentRun.unit_over``)."""
    sources, refs = task_inputs(s.task, "test", s.test_limit, s.data_dir)
    loaded: list[Any] = []

    def rows(a: int, b: int) -> list[dict[str, Any]]:
        if not loaded:  # once, and only if a batch is left to decode
            loaded.extend(load_run(Path(run.directory) / name / "best")[:2])
        return decode_rows(*loaded, sources[a:b], sampling, method=method, batch_size=None)

    def combine(done: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        r = summarize(s.task, done, refs, batch_size=s.decode_batch)
        r["lower-cased"] = _rescore(s, r["predictions"])
        return r

    key = f"test {name}"
    return run.unit_over(key, len(sources), s.decode_batch, rows, combine, progress=key)


def threshold_target(curve: list[dict]) -> list[dict]:
    """Per model: its fixed-step point with the most steps, and the threshold point with the
    fewest calls per output among those whose BLEU reaches it (``curve``: ``_curve``'s rows)."""
    rows = []
    for name in dict.fromkeys(r["model"] for r in curve):
        fixed = [r for r in curve if r["model"] == name and r["threshold"] == "-"]
        taus = [r for r in curve if r["model"] == name and r["threshold"] != "-"]
        if not fixed or not taus:
            continue
        ref = max(fixed, key=lambda r: r["max steps"])
        reach = [r for r in taus if r["BLEU"] >= ref["BLEU"]]
        best = min(reach, key=lambda r: r["calls/output"]) if reach else None
        rows.append(
            {
                "model": name,
                "fixed steps": ref["max steps"],
                "BLEU": ref["BLEU"],
                "calls/output": ref["calls/output"],
                "threshold reaching it": best["threshold"] if best else "none",
                "its BLEU": best["BLEU"] if best else max(r["BLEU"] for r in taus),
                "its calls/output": best["calls/output"] if best else "-",
            }
        )
    return rows


def _curve(s: NARTasksSettings, run: ExperimentRun, name: str, temperature: float) -> list[dict]:
    """The quality-vs-calls points of curve model ``name`` (decoding at ``temperature``): each
    of ``curve_steps`` fixed steps, and each of ``curve_thresholds`` (one unit each)."""
    method = VARIANTS[name][2]
    settings = [(n, None) for n in s.curve_steps]
    settings += [(s.threshold_steps, t) for t in s.curve_thresholds]
    curve = []
    for steps, tau in settings:

        def point(steps=steps, tau=tau):
            model, tok, _ = load_run(Path(run.directory) / name / "best")
            sp = sampling_for(
                method,
                steps=steps,
                samples=s.samples,
                temperature=temperature,
                length_candidates=s.length_candidates,
                threshold=tau,
            )
            r = evaluate(
                model,
                tok,
                task=s.task,
                split="test",
                limit=s.curve_inputs,
                sampling=sp,
                method=method,
                data_dir=s.data_dir,
                batch_size=s.decode_batch,
            )
            return {k: r[k] for k in ("BLEU", "ROUGE-L", "calls/output", "seconds/output")}

        key = f"curve {name} {steps}" if tau is None else f"curve {name} tau={tau}"
        row = {"model": name, "max steps": steps, "threshold": "-" if tau is None else tau}
        curve.append({**row, **run.unit(key, point)})
    return curve


def _tune(s: NARTasksSettings, out: Path, sampling: SamplingConfig) -> dict[str, Any]:
    model, tok, _ = load_run(out / "best")
    scores = {}
    for t in s.temperatures:
        sp = SamplingConfig(**{**asdict(sampling), "temperature": t})
        r = evaluate(
            model,
            tok,
            task=s.task,
            split="validation",
            limit=s.tune_inputs,
            sampling=sp,
            method="sundae",
            data_dir=s.data_dir,
            batch_size=s.decode_batch,
        )
        scores[str(t)] = r["BLEU"]
    best = max(s.temperatures, key=lambda t: scores[str(t)])
    return {"temperature": best, "validation bleu": scores}


_RESCORED = (
    "BLEU (lower-cased)",
    "ROUGE-L (lower-cased)",
    "BLEU (earlier scoring)",
    "ROUGE-L (earlier scoring)",
)


def _rescored(saved: dict[str, Any]) -> dict[str, Any]:
    """A test unit's other conventions under today's column names (a unit saved by an
    older version names the earlier scoring by when it was used)."""
    return {
        (k if k in _RESCORED else f"{k.split(' (')[0]} (earlier scoring)"): v
        for k, v in saved.items()
    }


def _rescore(s: NARTasksSettings, predictions: list[str]) -> dict[str, float]:
    """The test outputs under the lower-cased convention of score_task, and under the scoring
    this experiment used before it went through score_task (kept only for that comparison)."""
    from gencraft.data.tasks import pick_examples, references_of, task_examples
    from gencraft.metrics import bleu, rouge, score_task

    examples = pick_examples(task_examples(s.task, "test", s.data_dir), s.test_limit, spread=True)
    refs = [references_of(e) for e in examples]
    low = score_task(s.task, predictions, refs, lowercase=True, metrics=("BLEU", "ROUGE-L"))
    return dict(
        zip(
            _RESCORED,
            (
                low["BLEU"],
                low["ROUGE-L"],
                bleu(predictions, refs),
                rouge(predictions, refs, ("rougeL",))["rougeL"],
            ),
            strict=True,
        )
    )


def _relative_cost(rows: list[dict[str, Any]]) -> None:
    ar = next((r for r in rows if r["model"] == "autoregressive"), None)
    for r in rows:
        if ar is not None and ar["seconds/output"] > 0:
            r["time vs AR"] = r["seconds/output"] / ar["seconds/output"]


def _plot(run: ExperimentRun, curve: list[dict], s: NARTasksSettings) -> None:
    from gencraft.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name in dict.fromkeys(r["model"] for r in curve):
        for kind, style in (("fixed", "o-"), ("threshold", "s--")):
            pts = [
                r
                for r in curve
                if r["model"] == name and (r["threshold"] == "-") == (kind == "fixed")
            ]
            if pts:
                x, y = [r["calls/output"] for r in pts], [r["BLEU"] for r in pts]
                ax.plot(x, y, style, label=f"{name}, {kind}")
            for r in pts if kind == "threshold" else []:
                ax.annotate(f"τ={r['threshold']}", (r["calls/output"], r["BLEU"]), fontsize=7)
    ax.set_xlabel("decoder calls per output")
    ax.set_ylabel(f"BLEU ({s.task} test, {s.curve_inputs} inputs)")
    ax.set_title(f"{s.model}: quality vs decoder calls")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run.plot_path("quality_vs_steps.png", "quality vs decoding steps"), dpi=120)
    plt.close(fig)


@dataclass
class NARSpeedSettings:
    model: str = settings_field("minilm-l6", "the masked LM converted (registered name or path)")
    task: str = settings_field("e2e", "whose test sources are decoded")
    inputs: int = settings_field(8, "test inputs decoded per case and round")
    length: int = settings_field(32, "target tokens of every output (all methods alike)")
    steps: int = settings_field(15, "SUNDAE steps and Mask-Predict iterations (thesis: 15)")
    samples: int = settings_field(16, "SUNDAE samples per input (thesis: best of 16)")
    num_beams: int = settings_field(4, "the autoregressive baseline's beam")
    rounds: int = settings_field(5, "interleaved rounds (each case once per round)")
    threads: int | None = settings_field(None, "torch CPU threads (default: torch's)")
    data_dir: str | None = settings_field(None, "datasets directory")


def nar_speed_unit(s: NARSpeedSettings) -> dict[str, Any]:
    """Decoding time per output of SUNDAE, Mask-Predict and autoregressive beam search, every
    output ``s.length`` tokens long, interleaved in one process."""
    import torch

    from gencraft.studies.runner import machine
    from gencraft.studies.timing import interleaved

    if s.threads:
        torch.set_num_threads(s.threads)
    cases, per = _speed_cases(s)
    beam = f"autoregressive, beam {s.num_beams}"
    with torch.no_grad():
        calls = {k: fn() for k, fn in cases.items()}  # also the warm-up
        timings = interleaved(cases, beam, rounds=s.rounds, warmup=0)
    rows = {}
    for k, t in timings.items():
        rows[k] = {
            "s/output": t.seconds / per,
            **{c: v for c, v in t.row().items() if c != "median s"},
            "calls/output": sum(calls[k].model_calls) / per,
        }
    return {"cases": rows, "inputs": per, **machine()}


def _speed_cases(s: NARSpeedSettings) -> tuple[dict[str, Any], int]:
    """(name -> a call decoding ``s.inputs`` test sources to ``s.length`` tokens, the number
    of sources); the autoregressive beam case is named ``autoregressive, beam N``."""
    import torch

    from gencraft.data.tasks import pick_examples, source_of, task_examples
    from gencraft.nar.decoding import (
        autoregressive_generate,
        mask_predict_generate,
        sundae_generate,
    )
    from gencraft.nar.functional import noise_ids
    from gencraft.nar.model import load_mlm_seq2seq, target_token_ids
    from gencraft.utils import default_device

    top = max(s.length + 2, 64)
    nar, tok = load_mlm_seq2seq(s.model, max_target_length=top)
    ar, _ = load_mlm_seq2seq(s.model, max_target_length=top, bidirectional=False)
    nar, ar = nar.to(default_device()).eval(), ar.to(default_device()).eval()
    examples = pick_examples(task_examples(s.task, "test", s.data_dir), s.inputs, spread=True)
    enc = tok([source_of(e) for e in examples], truncation=True, max_length=128, padding=True)
    ids = torch.tensor(enc["input_ids"])
    mask = torch.tensor(enc["attention_mask"])
    lengths = torch.full((ids.shape[0],), s.length)
    sundae = SamplingConfig(steps=s.steps, samples=s.samples, length_candidates=1)
    mp = SamplingConfig(steps=s.steps, length_candidates=1)
    noise, mask_id = noise_ids(tok), target_token_ids(tok)["mask"]
    n = s.length
    cases = {
        f"autoregressive, beam {s.num_beams}": lambda: autoregressive_generate(
            ar, ids, mask, num_beams=s.num_beams, max_new_tokens=n + 1, min_new_tokens=n + 1
        ),
        "autoregressive, greedy": lambda: autoregressive_generate(
            ar, ids, mask, num_beams=1, max_new_tokens=n + 1, min_new_tokens=n + 1
        ),
        f"SUNDAE, {s.steps} steps × {s.samples} samples": lambda: sundae_generate(
            nar, ids, mask, sundae, noise=noise, lengths=lengths
        ),
        f"SUNDAE, {s.steps} steps × 1 sample": lambda: sundae_generate(
            nar, ids, mask, replace(sundae, samples=1), noise=noise, lengths=lengths
        ),
        f"Mask-Predict, {s.steps} iterations": lambda: mask_predict_generate(
            nar, ids, mask, mp, mask_id=mask_id, lengths=lengths
        ),
    }
    return cases, ids.shape[0]


@register(
    "nar-speed",
    title="decoding time per output: SUNDAE and Mask-Predict against autoregressive beam search",
    settings=NARSpeedSettings,
    scales={
        "tiny": {
            "model": "tiny-bert",
            "inputs": 2,
            "length": 6,
            "steps": 3,
            "samples": 2,
            "rounds": 2,
        },
        "cpu": {},
        "gpu": {"inputs": 64, "rounds": 9},
    },
    cpu_minutes=10,
)
def nar_speed(s: NARSpeedSettings, run: ExperimentRun) -> None:
    """Decode the same test sources at one fixed output length with every method, interleaved
    in one process; time per output as a ratio to autoregressive beam search."""
    r = run.unit("speed", lambda: nar_speed_unit(s))
    run.text(
        f"{s.model} converted (untrained: the cost of decoding does not depend on the weights "
        f"once every output has the same length), {r['inputs']} {s.task} test sources, every "
        f"output {s.length} tokens (oracle lengths for SUNDAE and Mask-Predict, EOS held off "
        f"for the autoregressive decoder), every method decoding all {r['inputs']} sources as "
        f"one batch, {s.rounds} interleaved rounds on {r['device']} "
        f"({r['threads']} threads). Ratio: median over rounds of the time ratio to an "
        "adjacent run of beam search, q25–q75 beside it. SUNDAE runs every step (an "
        "untrained model's samples keep changing; a trained one may stop earlier)."
    )
    run.table([{"case": k, **v} for k, v in r["cases"].items()])
