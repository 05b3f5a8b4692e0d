"""``focus-vs-cad``, FAME against context-aware decoding on XSum.

Four systems decode the same test documents with the same beam search
(:func:`gencraft.cli.focus.cad_summaries`: :func:`gencraft.search.beam_search_batch`,
``generate``'s defaults: length penalty 1, no early
stopping): the fine-tuned base, FAME, CAD on the base (α = ``cad_alpha``) and FAME + CAD. CAD's
context-free stream is the model given an empty source (the encoder input of ``""``); for
FAME + CAD that stream is FAME's base model without the focus bias (FAME's bias is computed
from the source document, which the context-free stream does not have; a deviation named in
docs/focus.md). Each system is one unit, so a run resumes system by system.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gencraft.studies.runner import ExperimentRun, register, settings_field

#: the systems in report order: (name, FAME model?, CAD?)
SYSTEMS = (
    ("base", False, False),
    ("FAME", True, False),
    ("CAD", False, True),
    ("FAME+CAD", True, True),
)


@dataclass
class FocusCadSettings:
    model: str = settings_field("minilm-l6-bert2bert", "the encoder-decoder fine-tuned")
    seed: int = settings_field(0, "training seed")
    minutes: float = settings_field(30.0, "training budget per system")
    epochs: int = settings_field(20, "epochs at most")
    lr: float = settings_field(1e-4, "learning rate")
    batch_size: int = settings_field(8, "training batch size")
    test_docs: int | None = settings_field(None, "XSum test documents (None: every one available)")
    cad_alpha: float = settings_field(0.5, "CAD's alpha")
    num_beams: int = settings_field(4, "beam size of every system")
    max_source: int = settings_field(512, "source tokens")
    max_target: int = settings_field(64, "summary tokens")
    eval_batch_size: int = settings_field(8, "documents decoded together")
    faithful: float = settings_field(80.0, "no-conflict control: base R1 precision vs doc >= this")
    systems_dir: str | None = settings_field(None, "a focus-quality work folder to reuse")
    data_dir: str | None = settings_field(None, "datasets directory")
    work_dir: str | None = settings_field(None, "where the trained systems go (default: the run)")


def _train(s: FocusCadSettings, name: str, out: Path) -> str:
    """The fine-tuned base ("baseline") or FAME ("fame"), as focus-quality trains them."""
    from gencraft.data import load_summarization
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.models import load_model
    from gencraft.training import FitConfig

    fit = FitConfig(max_time=s.minutes * 60, epochs=s.epochs, batch_size=s.batch_size, seed=s.seed)
    cfg = FocusTrainConfig(
        focus=name == "fame", fit=fit, lr=s.lr, max_source=s.max_source, max_target=s.max_target
    )
    base, tok = load_model(s.model, seed=s.seed)
    train = load_summarization("xsum", "train", s.data_dir)
    valid = load_summarization("xsum", "validation", s.data_dir)
    FocusTrainer(base, tok, train, valid, cfg, out / name, base_name_or_path=s.model).train()
    return str(out / name / "best")


def _per_doc(preds: list[str], refs: list[str], docs: list[str]) -> dict[str, list[float]]:
    """Per document: ROUGE-L and ROUGE-1 F1 against the reference, ROUGE-1 precision against
    the document (x100), and the length in words."""
    from gencraft.metrics.text import rouge1_precision_vs_source, rouge_per_example

    return {
        "RL": rouge_per_example(preds, refs, "rougeL"),
        "R1": rouge_per_example(preds, refs, "rouge1"),
        "R1 precision vs doc": [
            rouge1_precision_vs_source([p], [d]) for p, d in zip(preds, docs, strict=True)
        ],
        "length": [float(len(p.split())) for p in preds],
    }


def _differences(scores: dict[str, dict[str, list[float]]], keep: list[int]) -> list[dict]:
    """Each system minus the base, per metric, over the documents ``keep``: mean, 95% paired-t
    interval, p, and how many documents got worse."""
    from gencraft.metrics.stats import paired_t

    rows = []
    for name in [n for n, _, _ in SYSTEMS[1:]]:
        for metric in ("RL", "R1 precision vs doc", "length"):
            diffs = [scores[name][metric][i] - scores["base"][metric][i] for i in keep]
            if not diffs:
                continue
            t = paired_t(diffs)
            interval = f"[{t['low']:.2f}, {t['high']:.2f}]"
            row = {"system": name, "metric": metric, "docs": len(diffs), "mean diff": t["mean"]}
            rows.append(
                {**row, "95% interval": interval, "p": t["p"], "worse": sum(d < 0 for d in diffs)}
            )
    return rows


@register(
    "focus-vs-cad",
    title="FAME against context-aware decoding (CAD) and both, on XSum",
    settings=FocusCadSettings,
    scales={
        "tiny": {
            "model": "tiny-bert2bert",
            "minutes": 0.05,
            "epochs": 1,
            "test_docs": 3,
            "max_source": 32,
            "max_target": 6,
            "num_beams": 2,
            "batch_size": 4,
        },
        "cpu": {"test_docs": 200},
        "gpu": {},
    },
    cpu_minutes=120,
)
def focus_vs_cad(s: FocusCadSettings, run: ExperimentRun) -> None:
    """Train (or reuse) the base and FAME, decode the test documents four ways, and compare
    each with the base, paired by document, on all documents and on the no-conflict control."""
    from gencraft.cli.focus import cad_summaries
    from gencraft.data import load_summarization
    from gencraft.focus.train import load_summarizer

    out = Path(s.work_dir or s.systems_dir or run.directory)
    trained = {}
    for name in ("baseline", "fame"):
        given = Path(s.systems_dir, name, "best") if s.systems_dir else None
        trained[name] = (
            str(given) if given else run.unit(f"train {name}", lambda n=name: _train(s, n, out))
        )
    test = load_summarization("xsum", "test", s.data_dir)[: s.test_docs]
    docs, refs = [d.document for d in test], [d.summary for d in test]
    scores = {}
    for name, fame, cad in SYSTEMS:

        def decode(fame=fame, cad=cad):
            model, tok = load_summarizer(trained["fame" if fame else "baseline"])
            with torch.no_grad():
                return cad_summaries(
                    model.eval(),
                    tok,
                    docs,
                    num_beams=s.num_beams,
                    max_source=s.max_source,
                    max_new_tokens=s.max_target,
                    batch_size=s.eval_batch_size,
                    cad_alpha=s.cad_alpha if cad else None,
                )

        scores[name] = _per_doc(run.unit(f"decode {name}", decode), refs, docs)
    _report(s, run, scores, len(docs))


def _report(s: FocusCadSettings, run: ExperimentRun, scores: dict, n: int) -> None:
    run.text(
        f"{s.model} fine-tuned on XSum (base) and with FAME, {n} test documents, beam "
        f"{s.num_beams}; CAD alpha {s.cad_alpha} (context-free stream: the base on an empty "
        "source). Means per system:"
    )
    run.table(
        [
            {"system": name, **{k: sum(v) / n for k, v in scores[name].items()}}
            for name, _, _ in SYSTEMS
        ]
    )
    run.text("Each system minus the base, paired by document (95% paired-t interval):")
    run.table(_differences(scores, list(range(n))))
    keep = [i for i in range(n) if scores["base"]["R1 precision vs doc"][i] >= s.faithful]
    run.text(
        f"No-conflict control: the {len(keep)} documents whose base summary is already faithful "
        f"(R1 precision vs the document >= {s.faithful}); 'worse' counts the documents a "
        "system makes worse there:"
    )
    run.table(_differences(scores, keep) or [{"system": "-", "metric": "no such document"}])
