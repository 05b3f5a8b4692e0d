"""The recurrence experiment of docs/results/recurrence.md, runnable with ``gencraft reproduce``:

* ``recurrence-lm``: a Table 2.1 analogue. The base model fine-tuned on a word-level corpus
  (one subword stream) with and without recurrence at one window size, under the same budget;
  both evaluated at several overlaps: per-token and per-word perplexity against FLOPs/token,
  plotted (PNG). One unit per trained model and per (model, split): a stopped run goes on
  where it stopped, and the training itself resumes from its checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gencraft.metrics.stats import decide
from gencraft.recurrence.config import RecurrenceConfig, RecurrenceTrainConfig
from gencraft.recurrence.evaluate import BLOCK, evaluate
from gencraft.recurrence.train import train
from gencraft.studies.runner import ExperimentRun, kept_models, register, settings_field
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
    insert_layer: int = settings_field(
        1, "0-based layer that gets h_prev (1: the thesis's ℓ_ins = 2, counted from 1)"
    )
    lr: float = settings_field(5e-5, "Adam learning rate (both models)")
    recurrence_lr: float | None = settings_field(1e-3, "learning rate of α and the FFN")
    max_time: float | None = settings_field(None, "training seconds per model")
    max_steps: int | None = settings_field(200, "optimizer steps per model (the same for both)")
    eval_every_tokens: int = settings_field(100_000, "validate every this many tokens")
    valid_words: int | None = settings_field(5000, "validation words for early stopping")
    train_words: int | None = settings_field(
        None, "first N words of the training split (None: all)"
    )
    eval_words: int | None = settings_field(8000, "words of valid and test evaluated")
    splits: tuple[str, ...] = settings_field(("valid", "test"), "splits evaluated")
    verdict_words: int | None = settings_field(
        0,
        "test words evaluated again at the trained overlap alone, for the verdict's pairs "
        "(0: none; None: the whole split)",
    )
    seed: int = settings_field(0, "training seed (both models)")
    epochs: int = settings_field(2, "epochs at most (max_steps may stop sooner)")
    data_dir: str | None = settings_field(None, "datasets directory")


MODELS = (("baseline", False), ("recurrent", True))


def _lm_units(s: RecurrenceLMSettings) -> list[str]:
    """The unit keys of a run: each model's training, then its evaluation on each split, then
    (``verdict_words`` ≠ 0) its test evaluation at the trained overlap for the verdict."""
    verdict = ("verdict",) if s.verdict_words != 0 else ()
    return [
        k
        for name, _ in MODELS
        for k in (f"train {name}", *(f"eval {name} {sp}" for sp in (*s.splits, *verdict)))
    ]


def lm_verdict(runs: list[tuple[RecurrenceLMSettings, dict]]) -> list[dict]:
    """Recurrent minus baseline NLL (nats/token) at the overlap the models were trained at,
    paired block by block (``BLOCK`` tokens) on the verdict's test evaluation when both
    models have it (``verdict_words``), else on the test split (else the first evaluated),
    pooled over runs (seeds); ``run_means``: each run's mean difference."""
    diffs: list[float] = []
    means: list[float] = []
    for s, units in runs:
        split = "test" if "test" in s.splits else s.splits[0]
        got = [units.get(f"eval {name} verdict") for name, _ in MODELS]
        if None in got:
            got = [units.get(f"eval {name} {split}") for name, _ in MODELS]
        if None in got:
            continue
        base, rec = (next(r for r in rows if r["overlap"] == s.train_overlap) for rows in got)
        if "block_nll" in base and "block_nll" in rec:
            run = [r - b for r, b in zip(rec["block_nll"], base["block_nll"], strict=True)]
            diffs += run
            means.append(sum(run) / len(run))
    if not diffs:
        return []
    return [
        {
            "comparison": "recurrent − baseline, test NLL",
            "pairs": f"blocks of {BLOCK} tokens",
            "unit": "nats/token",
            **decide(diffs, expected=-1),
            "run_means": means,
        }
    ]


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
            "train_words": 2000,
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
    units=_lm_units,
    kept=lambda s: kept_models(_lm_units(s)),
    verdict=lm_verdict,
    volatile=("verdict_words",),  # adds units, changes none: a started run may take it on
)
def recurrence_lm(s: RecurrenceLMSettings, run: ExperimentRun) -> None:
    """Train baseline and recurrent; evaluate both at every overlap on each split."""
    rows = []
    for name, recurrent in MODELS:
        cfg, rec = _configs(s, recurrent)
        out = Path(run.directory) / name

        def fit_one(callbacks, cfg=cfg, rec=rec, out=out):
            summary = train(cfg, rec, out, data_dir=s.data_dir, progress=True, callbacks=callbacks)
            return {k: v for k, v in summary.items() if k != "history"}

        summary = run.unit(f"train {name}", fit_one, resumes=True)
        for split in s.splits:
            score = _scorer(s, out, split, s.overlaps, s.eval_words)
            for r in run.unit(f"eval {name} {split}", score):
                rows.append({"model": name, "split": split, "steps": summary["steps"], **r})
        if s.verdict_words != 0:  # its blocks are the verdict's pairs
            score = _scorer(s, out, "test", (s.train_overlap,), s.verdict_words)
            for r in run.unit(f"eval {name} verdict", score):
                rows.append(
                    {"model": name, "split": "test, verdict", "steps": summary["steps"], **r}
                )
    run.text(
        f"{s.model} fine-tuned on {s.corpus} (windows of {s.window}, {s.bptt_windows} windows "
        f"per sequence, trained at overlap {s.train_overlap}, the same budget for both), "
        f"evaluated on the first {s.eval_words or 'all'} words of each split. A recurrent "
        "model evaluated at another overlap than it was trained at pools the T − o positions "
        "the next window does not repeat (the thesis trains one model per overlap)."
        + (
            f" The verdict pairs the {BLOCK}-token blocks of the first "
            f"{s.verdict_words or 'all'} test words at overlap {s.train_overlap}."
            if s.verdict_words != 0
            else ""
        )
    )
    run.table(rows, ["model", "split", "steps", "overlap", "token ppl", "word ppl", "flops/token"])
    _plot(run, rows, s)


def _configs(
    s: RecurrenceLMSettings, recurrent: bool
) -> tuple[RecurrenceTrainConfig, RecurrenceConfig]:
    """The training and the recurrence configuration of one model, under the same budget."""
    rec = RecurrenceConfig(
        window=s.window,
        overlap=s.train_overlap,
        insert_layer=s.insert_layer,
        ffn_hidden=s.ffn_hidden,
        bptt_windows=s.bptt_windows,
        recurrent=recurrent,
    )
    fit = FitConfig(
        epochs=s.epochs,
        seed=s.seed,
        batch_size=1,
        max_time=s.max_time,
        max_steps=s.max_steps,
        warmup=min(100, s.max_steps or 100),
        decay="constant",
        patience=3,
    )
    cfg = RecurrenceTrainConfig(
        model=s.model,
        corpus=s.corpus,
        lr=s.lr,
        recurrence_lr=s.recurrence_lr,
        eval_every_tokens=s.eval_every_tokens,
        valid_words=s.valid_words,
        train_words=s.train_words,
        fit=fit,
    )
    return cfg, rec


def _scorer(
    s: RecurrenceLMSettings, out: Path, split: str, overlaps: tuple[int, ...], words: int | None
):
    """The evaluation unit of the model saved in ``out``: its best checkpoint on the first
    ``words`` words of ``split`` (None: all) at each of ``overlaps``."""

    def score():
        model, tok, _ = load_run(out / "best")
        return evaluate(
            model,
            tok,
            corpus=s.corpus,
            split=split,
            window=s.window,
            overlaps=overlaps,
            max_words=words,
            data_dir=s.data_dir,
            progress=True,
        )

    return score


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


@dataclass
class RecurrenceSpeedSettings:
    model: str = settings_field("smollm2-135m", "base model")
    window: int = settings_field(128, "T: tokens per window")
    bptt_windows: int = settings_field(4, "windows per training sequence")
    insert_layer: int = settings_field(
        1, "0-based layer that gets h_prev (1: the thesis's ℓ_ins = 2, counted from 1)"
    )
    memory_windows: tuple[int, ...] = settings_field((1, 2, 4, 8), "sequence lengths (windows)")
    rounds: int = settings_field(7, "interleaved rounds (each variant once per round)")
    threads: int | None = settings_field(None, "torch CPU threads (default: torch's)")


def recurrence_speed_unit(s: RecurrenceSpeedSettings) -> dict:
    """A training step with recurrence (with and without bottleneck checkpointing) against
    the same windows without it, interleaved; the bytes autograd saves against length."""
    import torch

    from gencraft.models import load_model
    from gencraft.models.introspect import model_shape
    from gencraft.recurrence import RecurrentLM
    from gencraft.studies.runner import machine
    from gencraft.studies.timing import interleaved, saved_tensor_bytes
    from gencraft.utils import default_device

    if s.threads:
        torch.set_num_threads(s.threads)
    torch.manual_seed(0)
    base, _ = load_model(s.model)
    layer = min(s.insert_layer, model_shape(base).layers - 1)
    model = RecurrentLM(base, RecurrenceConfig(window=s.window, insert_layer=layer))
    model = model.to(default_device()).train()
    vocab = base.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, s.window * s.bptt_windows + 1), generator=g)
    ids = ids.to(default_device())
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    modes = {
        "plain windows": (False, False),
        "recurrent": (True, False),
        "recurrent, checkpointed": (True, True),
    }

    def step(mode: str) -> None:
        model.config.recurrent, model.config.checkpoint = modes[mode]
        opt.zero_grad(set_to_none=True)
        model(ids, return_logits=False).loss.backward()
        opt.step()

    cases = {k: (lambda k=k: step(k)) for k in modes}
    timings = interleaved(cases, "plain windows", rounds=s.rounds)
    memory = []
    for w in s.memory_windows:
        x = torch.randint(3, vocab, (1, s.window * w + 1), generator=g).to(default_device())
        row: dict = {"windows": w, "tokens": x.shape[1]}
        for name, (rec, ckpt) in modes.items():
            model.config.recurrent, model.config.checkpoint = rec, ckpt
            row[f"{name} MiB"] = saved_tensor_bytes(lambda x=x: model(x, return_logits=False).loss)
            row[f"{name} MiB"] /= 2**20
            model.zero_grad(set_to_none=True)
        memory.append(row)
    return {"train": {k: t.row() for k, t in timings.items()}, "memory": memory, **machine()}


@register(
    "recurrence-speed",
    title="the cost of recurrence: training-step time and activation memory (§2.4)",
    settings=RecurrenceSpeedSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "window": 16,
            "bptt_windows": 3,
            "insert_layer": 1,
            "memory_windows": (1, 2),
            "rounds": 3,
        },
        "cpu": {},
        "gpu": {"window": 300, "bptt_windows": 20, "memory_windows": (1, 5, 10, 20), "rounds": 21},
    },
    cpu_minutes=6,
)
def recurrence_speed(s: RecurrenceSpeedSettings, run: ExperimentRun) -> None:
    """Recurrent training steps against plain windowed fine-tuning, interleaved in one
    process; saved activations against sequence length, with and without checkpointing."""
    r = run.unit("speed", lambda: recurrence_speed_unit(s))
    run.text(
        f"{s.model}, windows of {s.window}, {s.bptt_windows} windows per sequence, "
        f"{s.rounds} interleaved rounds on {r['device']} ({r['threads']} threads). Ratio: the "
        "median over rounds of the time ratio to an adjacent plain-windows step (the same "
        "windows and loss, no state carried), q25–q75 beside it (target without "
        "checkpointing: <= 1.10)."
    )
    run.table([{"variant": k, **v} for k, v in r["train"].items()])
    run.text("Bytes autograd saves for backward in one step (MiB), by sequence length:")
    run.table(r["memory"])
    from gencraft.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = [m["tokens"] for m in r["memory"]]
    for name, marker in (
        ("plain windows", "^"),
        ("recurrent", "o"),
        ("recurrent, checkpointed", "s"),
    ):
        ax.plot(x, [m[f"{name} MiB"] for m in r["memory"]], marker=marker, label=name)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("bytes saved for backward (MiB)")
    ax.set_title(f"{s.model}, windows of {s.window}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run.plot_path("memory.png", "activation memory against length"), dpi=120)
    plt.close(fig)
