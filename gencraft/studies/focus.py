"""The FAME experiments of docs/results/focus.md, runnable with ``gencraft reproduce``:

* ``focus-speed``: interleaved rounds (machine load hits both alike) of a forward pass with
  labels (base vs FAME, topic loss included) and of ``generate`` with beam search (the base vs
  FAME with focus_sample,k, k = 10,000, same beam size). Targets: forward <= 1.10x, generate
  <= 1.05x.
* ``focus-quality``: fine-tunes the baseline and FAME for ``minutes`` each on the train split
  (sha1-80/10/10 of the local 1,000 XSum documents), then on the test split: Table 1 (beam 4),
  Table 2 (``samples`` per document for top-k, nucleus, focus_sample and the combinations) and
  the focus_top,k curve (PNG). With ``freeze_base`` (causal LMs such as SmolLM2) the baseline
  is the base itself and FAME trains only the head. The trainers resume from their own
  checkpoints when the run is stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, NamedTuple

import torch

from gencraft.data import load_summarization
from gencraft.focus.data import SummaryEncoder, collate
from gencraft.focus.model import FocusForConditionalGeneration
from gencraft.metrics.stats import decide
from gencraft.models import load_model
from gencraft.studies.runner import ExperimentRun, machine, register, settings_field
from gencraft.studies.timing import running_clock
from gencraft.utils import default_device

_DEVICE = default_device()


@dataclass
class FocusSpeedSettings:
    model: str = settings_field("minilm-l6-bert2bert", "model name or path")
    docs: int = settings_field(8, "XSum test documents")
    beams: int = settings_field(4, "beam size")
    new_tokens: int = settings_field(32, "tokens generated (min = max)")
    rounds: int = settings_field(5, "interleaved timing rounds")
    max_source: int = settings_field(512, "source tokens")
    device: str = settings_field(_DEVICE, "cpu or cuda")
    data_dir: str | None = settings_field(None, "datasets directory")


@dataclass
class FocusQualitySettings:
    model: str = settings_field("minilm-l6-bert2bert", "model name or path")
    data: str = settings_field("xsum", "xsum or cnndm")
    seed: int = settings_field(0, "training and sampling seed")
    max_target: int | None = settings_field(None, "summary tokens (default 64 xsum, 128 cnndm)")
    frequent_size: int | None = settings_field(
        None, "|F| (default: the paper's 500 xsum, 1000 cnndm)"
    )
    select_by: str = settings_field("loss", "best checkpoint by validation 'loss' or 'rougeL'")
    select_docs: int = settings_field(50, "validation documents for select_by rougeL")
    minutes: float = settings_field(30.0, "training budget per system")
    epochs: int = settings_field(20, "epochs at most")
    lr: float = settings_field(1e-4, "learning rate")
    head_lr: float = settings_field(1e-3, "learning rate of the FAME head with a frozen base")
    batch_size: int = settings_field(8, "training batch size")
    freeze_base: bool = settings_field(False, "train only the FAME head")
    test_docs: int = settings_field(100, "test documents (Table 1)")
    bertscore: bool = settings_field(True, "Table 1's BERTScore (loads MiniLM)")
    sample_docs: int = settings_field(20, "test documents for the sampling table (Table 2)")
    samples: int = settings_field(10, "samples per document (Table 2)")
    eval_batch_size: int = settings_field(8, "generation batch size")
    focus_top: tuple[int, ...] = settings_field((50, 100, 200, 500, 1000, 10000), "k values")
    masked_rows: bool = settings_field(
        False, "also the beam focus decodings with the mask only (not re-normalised; before #13)"
    )
    max_source: int = settings_field(512, "source tokens")
    device: str = settings_field(_DEVICE, "cpu or cuda")
    data_dir: str | None = settings_field(None, "datasets directory")
    work_dir: str | None = settings_field(None, "where the trained systems go (default: the run)")

    def __post_init__(self) -> None:
        if self.max_target is None:
            self.max_target = 64 if self.data == "xsum" else 128
        if self.frequent_size is None:
            self.frequent_size = 500 if self.data == "xsum" else 1000


def _batch(model, tok, docs, max_source, with_labels):
    is_ed = bool(model.config.is_encoder_decoder)
    enc = SummaryEncoder(tok, is_ed, max_source=max_source)
    rows = [enc.encode(d.document, d.summary if with_labels else None) for d in docs]
    pad = tok.pad_token_id if tok.pad_token_id is not None else enc.eos_id
    batch = collate(rows, pad, left=not is_ed and not with_labels)
    return {k: v.to(model.device) for k, v in batch.items()}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def speed(args) -> dict:
    base, tok = load_model(args.model, device=args.device)
    ref, _ = load_model(args.model, device=args.device)  # untouched: the base as users run it
    v = base.get_output_embeddings().out_features
    fame = FocusForConditionalGeneration(base, frequent_ids=torch.arange(min(500, v))).to(
        args.device
    )
    docs = load_summarization("xsum", "test", args.data_dir)[: args.docs]
    train = _batch(ref, tok, docs, args.max_source, True)
    prompt = _batch(ref, tok, docs, args.max_source, False)
    gen = dict(
        num_beams=args.beams,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
    )
    cases = {
        "forward_base": lambda: ref(**{k: v for k, v in train.items() if k != "source_mask"}),
        "forward_fame": lambda: fame(**train),
        "generate_base": lambda: ref.generate(**prompt, **gen),
        "generate_fame_focus_sample": lambda: fame.generate(
            **prompt, focus_k=min(10_000, v), focus_seed=0, **gen
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    with torch.no_grad():
        for fn in cases.values():  # warm-up
            fn()
        for _ in range(args.rounds):
            for k, fn in cases.items():
                _sync(args.device)
                t0 = running_clock()
                fn()
                _sync(args.device)
                times[k].append(running_clock() - t0)
    med = {k: median(v) for k, v in times.items()}
    result = {
        "model": args.model,
        "documents": len(docs),
        "max_source": args.max_source,
        "beams": args.beams,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        **machine(),
        "device": _device_name(args.device),
        "median_seconds": med,
        "forward_ratio": med["forward_fame"] / med["forward_base"],
        "generate_ratio": med["generate_fame_focus_sample"] / med["generate_base"],
    }
    return result


def quality(args) -> dict:
    from gencraft.focus.evaluate import summarize, summary_metrics
    from gencraft.focus.train import load_summarizer

    out = Path(args.work_dir)
    train = load_summarization(args.data, "train", args.data_dir)
    valid = load_summarization(args.data, "validation", args.data_dir)
    test = load_summarization(args.data, "test", args.data_dir)[: args.test_docs]
    systems = _train_systems(args, train, valid, out)
    docs = [d.document for d in test]
    refs = [d.summary for d in test]
    gen = dict(
        max_source=args.max_source,
        batch_size=args.eval_batch_size,
        progress=True,
        max_new_tokens=args.max_target,
        seed=args.seed,
    )
    result: dict = {
        "model": args.model,
        "data": args.data,
        "train_docs": len(train),
        "test_docs": len(test),
        "minutes_per_system": args.minutes,
        "epochs": args.epochs,
        "seed": args.seed,
        "device": _device_name(args.device),
        "table1": {},
        "table2": {},
        "focus_top": {},
        "focus_top_masked": {},
    }
    # the beam focus decodings also with the mask only (the earlier scoring), if asked
    scorings = {"": True, ", masked only": False} if args.masked_rows else {"": True}
    for name, path in systems.items():
        model, tok = load_summarizer(path)
        model.to(args.device)
        preds = [g[0] for g in summarize(model, tok, docs, decoding="beam", **gen)]
        result["table1"][name] = summary_metrics(preds, refs, docs, with_bertscore=args.bertscore)
        run = _Scoring(args, model, tok, docs, refs, gen, scorings)
        result["table2"].update(_table2(run, name))
        if name == "fame":
            for key, k, metrics in _focus_top(run):
                result[key][k] = metrics
        (out / "quality.json").write_text(json.dumps(result, indent=2))
    if result["focus_top"]:
        _plot_focus_top(result["focus_top"], result["table1"], out / "focus_top.png")
    (out / "quality.md").write_text(_markdown(result))
    return result


def _train_systems(args, train: list, valid: list, out: Path) -> dict[str, str]:
    """Trains the baseline and FAME (the baseline is the untouched base with
    ``--freeze-base``); returns each system's name -> the model directory (or name) it loads."""
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.training import FitConfig

    common = dict(
        fit=FitConfig(
            max_time=args.minutes * 60,
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=args.seed,
            warmup=0.1,
        ),
        lr=args.lr,
        max_source=args.max_source,
        max_target=args.max_target,
        frequent_size=args.frequent_size,
        select_by=args.select_by,
        select_docs=args.select_docs,
    )
    systems = {}
    for name in ("baseline", "fame"):
        if name == "baseline" and args.freeze_base:
            systems[name] = args.model  # the untouched base
            continue
        base, tok = load_model(args.model, seed=args.seed)
        cfg = FocusTrainConfig(
            focus=name == "fame", freeze_base=args.freeze_base and name == "fame", **common
        )
        if args.freeze_base:
            cfg.lr = args.head_lr
        trainer = FocusTrainer(
            base, tok, train, valid, cfg, out / name, base_name_or_path=args.model
        )
        trainer.train()
        systems[name] = str(out / name / "best")
    return systems


class _Scoring(NamedTuple):
    """What every decoding of one trained system is scored with."""

    args: Any
    model: Any
    tok: Any
    docs: list[str]
    refs: list[str]
    gen: dict
    scorings: dict[str, bool]  # row label suffix -> focus_renormalize


def _table2(run: _Scoring, name: str) -> dict[str, dict]:
    """Table 2's rows of one system: ``--samples`` samples of each of the first
    ``--sample-docs`` documents per decoding (FAME adds the focus samplings)."""
    from gencraft.focus.evaluate import diversity_metrics, summarize

    args = run.args
    if not args.sample_docs:  # Table 2 not asked for
        return {}
    decodings = ["top_k", "nucleus"]
    if name == "fame":
        decodings += ["focus_sample", "focus_sample+top_k", "focus_sample+nucleus"]
    sub = slice(0, args.sample_docs)
    rows = {}
    for dec in decodings:
        variants = run.scorings if dec == "focus_sample" else {"": True}
        for label, renorm in variants.items():
            groups = summarize(
                run.model,
                run.tok,
                run.docs[sub],
                decoding=dec,
                samples=args.samples,
                focus_renormalize=renorm,
                **run.gen,
            )
            rows[f"{name} ({dec}{label})"] = diversity_metrics(
                groups, run.refs[sub], run.docs[sub], with_bertscore=args.bertscore
            )
    return rows


def _focus_top(run: _Scoring) -> list[tuple[str, int, dict]]:
    """FAME's ``focus_top,k`` beam rows: (result key, k, Table 1's metrics) per k and scoring."""
    from gencraft.focus.evaluate import summarize, summary_metrics

    rows = []
    for k in run.args.focus_top:
        for label, renorm in run.scorings.items():
            groups = summarize(
                run.model,
                run.tok,
                run.docs,
                decoding="focus_top",
                focus_k=k,
                focus_renormalize=renorm,
                **run.gen,
            )
            preds = [g[0] for g in groups]
            metrics = summary_metrics(preds, run.refs, run.docs, with_bertscore=False)
            rows.append(("focus_top_masked" if label else "focus_top", k, metrics))
    return rows


def _markdown(result: dict) -> str:
    lines = []
    for title, table in (
        ("Table 1 (beam 4)", result["table1"]),
        ("Table 2 (samples per document)", result["table2"]),
        ("focus_top,k (beam 4)", result["focus_top"]),
        ("focus_top,k (beam 4), mask only", result.get("focus_top_masked", {})),
    ):
        if not table:
            continue
        cols = list(next(iter(table.values())))
        lines += [
            f"**{title}**",
            "",
            "| system | " + " | ".join(cols) + " |",
            "|---|" + "---:|" * len(cols),
        ]
        lines += [
            f"| {k} | " + " | ".join(f"{v[c]:.2f}" for c in cols) + " |" for k, v in table.items()
        ]
        lines.append("")
    return "\n".join(lines)


def _plot_focus_top(curve: dict, table1: dict, path: Path) -> None:
    from gencraft.plotting import pyplot

    plt = pyplot()

    ks = sorted(curve)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for metric in ("RL", "R1_precision_doc"):
        ax.plot(ks, [curve[k][metric] for k in ks], marker="o", label=f"FAME focus_top,k {metric}")
        if "fame" in table1:
            ax.axhline(table1["fame"][metric], ls="--", lw=0.8, color="gray")
    ax.set_xscale("log")
    ax.set_xlabel("k (|V_k|)")
    ax.legend(fontsize=7)
    ax.set_title("focus_top,k on the local XSum test split (dashed: FAME, beam 4)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


TINY = {"model": "tiny-bart", "docs": 2, "rounds": 1, "new_tokens": 4, "max_source": 64}


@register(
    "focus-speed",
    title="FAME speed against the base model (forward and focus-sampling generate)",
    settings=FocusSpeedSettings,
    scales={"tiny": TINY, "cpu": {}, "gpu": {}},
    cpu_minutes=6,
)
def focus_speed(s: FocusSpeedSettings, run: ExperimentRun) -> None:
    """FAME forward and generate time against the base model."""
    r = run.unit("speed", lambda: speed(s))
    run.text(
        f"{s.model}, {r['documents']} documents, beam {s.beams}, {s.new_tokens} new tokens; "
        "medians of interleaved rounds."
    )
    run.table(
        [{"case": k, "median s": v} for k, v in r["median_seconds"].items()]
        + [
            {"case": "forward ratio (target <= 1.10)", "median s": r["forward_ratio"]},
            {"case": "generate ratio (target <= 1.05)", "median s": r["generate_ratio"]},
        ]
    )


def quality_verdict(runs: list[tuple[FocusQualitySettings, dict]]) -> list[dict]:
    """FAME minus the baseline on Table 1's ROUGE-L and ROUGE-1 precision against the document
    (beam 4), one pair per run (each run its own seed)."""
    pairs = [u["quality"]["table1"] for _, u in runs if "quality" in u]
    rows = []
    for metric, label in (("RL", "ROUGE-L"), ("R1_precision_doc", "R1 precision vs document")):
        diffs = [t["fame"][metric] - t["baseline"][metric] for t in pairs]
        if diffs:
            rows.append(
                {
                    "comparison": f"FAME − baseline, {label}",
                    "pairs": "seeds",
                    "unit": "points",
                    **decide(diffs),
                }
            )
    return rows


@register(
    "focus-quality",
    title="baseline vs FAME on the local XSum split (Tables 1 and 2, focus_top,k)",
    settings=FocusQualitySettings,
    scales={
        "tiny": {
            "model": "tiny-bart",
            "minutes": 0.05,
            "epochs": 1,
            "test_docs": 2,
            "sample_docs": 1,
            "samples": 2,
            "focus_top": (5, 50),
            "max_source": 64,
            "max_target": 8,
            "bertscore": False,
        },
        "cpu": {
            "model": "smollm2-135m",
            "freeze_base": True,
            "minutes": 10.0,
            "test_docs": 40,
            "sample_docs": 8,
            "samples": 5,
            "focus_top": (100, 1000, 10000),
            "max_source": 384,
            "device": "cpu",
        },
        "gpu": {"minutes": 2.5},
    },
    cpu_minutes=90,
    units=lambda s: ["quality"],
    verdict=quality_verdict,
)
def focus_quality(s: FocusQualitySettings, run: ExperimentRun) -> None:
    """Baseline vs FAME: ROUGE, BERTScore, faithfulness and diversity."""
    if s.work_dir is None:
        s.work_dir = str(run.directory)
    result = run.unit("quality", lambda: quality(s))
    run.text(_markdown(result))
    if result["focus_top"]:
        result["focus_top"] = {int(k): v for k, v in result["focus_top"].items()}
        _plot_focus_top(
            result["focus_top"],
            result["table1"],
            run.plot_path("focus_top.png", "focus_top,k curve"),
        )
