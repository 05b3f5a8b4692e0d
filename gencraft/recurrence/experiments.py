"""The recurrence experiment of docs/results.md, runnable with ``gencraft reproduce``:

* ``recurrence-lm``: a Table 2.1 analogue. The base model fine-tuned on a word-level corpus
  (one subword stream) with and without recurrence at one window size, under the same budget;
  both evaluated at several overlaps: per-token and per-word perplexity against FLOPs/token,
  plotted (PNG). One unit per trained model and per (model, split): a stopped run goes on
  where it stopped, and the training itself resumes from its checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gencraft.experiments import ExperimentRun, register, settings_field
from gencraft.recurrence.config import RecurrenceConfig, RecurrenceTrainConfig
from gencraft.recurrence.evaluate import evaluate
from gencraft.recurrence.train import train
from gencraft.training import FitConfig, load_run


@dataclass
class RecurrenceLMSettings:
    model: str = settings_field("smollm2-135m", "base model")
    corpus: str = settings_field("wikitext-2", "word-level corpus")
    window: int = settings_field(128, "T: tokens per window")
    train_overlap: int = settings_field(0, "overlap the models are trained at")
    overlaps: tuple[int, ...] = settings_field((0, 5, 10, 30, 50), "overlaps evaluated")
    bptt_windows: int = settings_field(4, "windows per training sequence")
    ffn_hidden: tuple[int, ...] = settings_field((200, 200, 200), "recurrence FFN widths")
    insert_layer: int = settings_field(2, "layer that gets h_prev")
    lr: float = settings_field(5e-5, "Adam learning rate (both models)")
    recurrence_lr: float | None = settings_field(1e-3, "learning rate of α and the FFN")
    max_time: float | None = settings_field(None, "training seconds per model")
    max_steps: int | None = settings_field(200, "optimizer steps per model (the same for both)")
    eval_every_tokens: int = settings_field(100_000, "validate every this many tokens")
    valid_words: int | None = settings_field(5000, "validation words for early stopping")
    eval_words: int | None = settings_field(8000, "words of valid and test evaluated")
    splits: tuple[str, ...] = settings_field(("valid", "test"), "splits evaluated")
    data_dir: str | None = settings_field(None, "datasets directory")


@register(
    "recurrence-lm",
    title="fine-tuning with and without recurrence: perplexity vs FLOPs/token (Table 2.1)",
    settings=RecurrenceLMSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "window": 16,
            "overlaps": (0, 4),
            "bptt_windows": 3,
            "ffn_hidden": (8,),
            "insert_layer": 1,
            "lr": 1e-3,
            "max_steps": 4,
            "eval_every_tokens": 100,
            "valid_words": 200,
            "eval_words": 200,
        },
        "cpu": {},
        "gpu": {
            "window": 300,
            "bptt_windows": 20,
            "max_steps": None,
            "eval_every_tokens": 2_000_000,
            "valid_words": 50_000,
            "eval_words": None,
        },
    },
    cpu_minutes=70,
)
def recurrence_lm(s: RecurrenceLMSettings, run: ExperimentRun) -> None:
    """Train baseline and recurrent; evaluate both at every overlap on each split."""
    rows = []
    for name, recurrent in (("baseline", False), ("recurrent", True)):
        rec = RecurrenceConfig(
            window=s.window,
            overlap=s.train_overlap,
            insert_layer=s.insert_layer,
            ffn_hidden=s.ffn_hidden,
            bptt_windows=s.bptt_windows,
            recurrent=recurrent,
        )
        cfg = RecurrenceTrainConfig(
            model=s.model,
            corpus=s.corpus,
            lr=s.lr,
            recurrence_lr=s.recurrence_lr,
            eval_every_tokens=s.eval_every_tokens,
            valid_words=s.valid_words,
            fit=FitConfig(
                epochs=2,
                batch_size=1,
                max_time=s.max_time,
                max_steps=s.max_steps,
                warmup=min(100, s.max_steps or 100),
                decay="constant",
                patience=3,
            ),
        )
        out = Path(run.directory) / name

        def fit_one(cfg=cfg, rec=rec, out=out):
            summary = train(cfg, rec, out, data_dir=s.data_dir, progress=True)
            return {k: v for k, v in summary.items() if k != "history"}

        summary = run.unit(f"train {name}", fit_one)
        for split in s.splits:

            def score(split=split, out=out):
                model, tok, _ = load_run(out / "best")
                return evaluate(
                    model,
                    tok,
                    corpus=s.corpus,
                    split=split,
                    window=s.window,
                    overlaps=s.overlaps,
                    max_words=s.eval_words,
                    data_dir=s.data_dir,
                    progress=True,
                )

            for r in run.unit(f"eval {name} {split}", score):
                rows.append({"model": name, "split": split, "steps": summary["steps"], **r})
    run.text(
        f"{s.model} fine-tuned on {s.corpus} (windows of {s.window}, {s.bptt_windows} windows "
        f"per sequence, trained at overlap {s.train_overlap}, the same budget for both), "
        f"evaluated on the first {s.eval_words or 'all'} words of each split. A recurrent "
        "model evaluated at another overlap than it was trained at pools the T − o positions "
        "the next window does not repeat (the thesis trains one model per overlap)."
    )
    run.table(rows, ["model", "split", "steps", "overlap", "token ppl", "word ppl", "flops/token"])
    _plot(run, rows, s)


def _plot(run: ExperimentRun, rows: list[dict], s: RecurrenceLMSettings) -> None:
    from gencraft.plotting import pyplot

    plt = pyplot()

    split = s.splits[0]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, marker in (("baseline", "o"), ("recurrent", "s")):
        pts = [
            (r["flops/token"], r["word ppl"], r["overlap"])
            for r in rows
            if r["model"] == name and r["split"] == split
        ]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=name)
        for x, y, o in pts:
            ax.annotate(str(o), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xlabel("FLOPs per token")
    ax.set_ylabel(f"per-word perplexity ({split})")
    ax.set_title(f"{s.model}, window {s.window}: overlap labelled")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run.plot_path("ppl_vs_flops.png", "perplexity vs FLOPs/token"), dpi=120)
    plt.close(fig)
