"""The pointer experiment of docs/results/pointer.md, runnable with ``gencraft reproduce``:

``pointer-vs-lstm``: a plain LSTM and a pointer sentinel-LSTM of the same size, under the same
time budget. Training throughput is measured interleaved in this run (plain and pointer steps
alternate, so machine load hits both alike); each model then trains for ``minutes`` of wall
time (training + validation); the best checkpoint's validation/test perplexity is measured
with ``eval_batch_size`` streams (paper: 1). Also the frequency-bucket gains (Fig. 4 style) and
a passage's gate/attention view as PNGs. Each model is one unit; a model's training resumes
from its own checkpoint when the run is stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gencraft.experiments import ExperimentRun, register, settings_field
from gencraft.pointer.evaluate import evaluate
from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.pointer.train import PointerTrainer, TrainConfig, preset_k1
from gencraft.timing import running_clock


@dataclass
class PointerSettings:
    corpus: str = settings_field("ptb", "ptb or wikitext-2")
    preset: str = settings_field("small", "model preset (small, medium, tiny)")
    minutes: float = settings_field(20.0, "training budget per model (wall time)")
    evals: int = settings_field(8, "validations within the budget")
    throughput_rounds: int = settings_field(3, "interleaved throughput rounds")
    throughput_steps: int = settings_field(8, "steps per throughput round")
    optimizer: str = settings_field("adam", "adam or sgd")
    lr: float = settings_field(3e-3, "learning rate")
    batch_size: int = settings_field(8, "streams per step (paper: 32)")
    k1: int | None = settings_field(
        None, "tokens per TBPTT step (None: k2, or the paper's 1 for the medium preset)"
    )
    zoneout: float | None = settings_field(None, "zoneout rate of c and h (None: the preset's)")
    revert: bool = settings_field(True, "reload the best weights on a worse validation")
    eval_batch_size: int = settings_field(1, "streams for the final perplexities (paper: 1)")
    seed: int = settings_field(0, "seed")
    data_dir: str | None = settings_field(None, "datasets directory")


def build(
    preset: str, vocab: int, pointer: bool, seed: int, zoneout: float | None = None
) -> PointerSentinelLSTM:
    torch.manual_seed(seed)  # same init for the shared parameters (the pointer's come last)
    extra = {} if zoneout is None else {"zoneout_c": zoneout, "zoneout_h": zoneout}
    return PointerSentinelLSTM.from_preset(preset, vocab, pointer=pointer, **extra)


def throughput(
    corpus, preset: str, cfg: TrainConfig, rounds: int, steps: int, tmp, zoneout=None
) -> dict:
    """Tokens/s of each model's training steps, interleaved: ``rounds`` x ``steps`` each."""
    trainers = {}
    for name, ptr in (("lstm", False), ("pointer", True)):
        m = build(preset, len(corpus.vocab), ptr, cfg.seed, zoneout)
        trainers[name] = PointerTrainer(m, corpus, cfg, tmp / name, progress=False)
    schedule = {k: t.steps() for k, t in trainers.items()}
    for k, t in trainers.items():  # warm-up
        for st in schedule[k][:2]:
            t.train_step(st)
    secs = {k: 0.0 for k in trainers}
    toks = {k: 0 for k in trainers}
    for r in range(rounds):
        for k, t in trainers.items():
            before = t.trained_tokens
            t0 = running_clock()
            for st in schedule[k][2 + r * steps : 2 + (r + 1) * steps]:
                t.train_step(st)
            secs[k] += running_clock() - t0
            toks[k] += t.trained_tokens - before
    tps = {k: toks[k] / secs[k] for k in trainers}
    return {
        "lstm_tokens_per_s": tps["lstm"],
        "pointer_tokens_per_s": tps["pointer"],
        "ratio": tps["pointer"] / tps["lstm"],
        "step_seconds": {k: secs[k] / (rounds * steps) for k in secs},
    }


@register(
    "pointer-vs-lstm",
    title="pointer sentinel-LSTM vs LSTM under one time budget",
    settings=PointerSettings,
    scales={
        "tiny": {
            "preset": "tiny",
            "minutes": 0.05,
            "evals": 2,
            "throughput_rounds": 1,
            "throughput_steps": 2,
            "batch_size": 4,
        },
        "cpu": {},
        "gpu": {"minutes": 3.0, "batch_size": 32},
    },
    cpu_minutes=42,
)
def pointer_vs_lstm(s: PointerSettings, run: ExperimentRun) -> None:
    """Plain LSTM vs pointer sentinel-LSTM of the same size, same time budget."""
    from gencraft.data import load_lm_corpus

    corpus = load_lm_corpus(s.corpus, s.data_dir)
    s.k1 = preset_k1(s.preset, s.k1)
    base_cfg = TrainConfig(
        seed=s.seed, optimizer=s.optimizer, lr=s.lr, batch_size=s.batch_size, k1=s.k1
    )
    tp = run.unit(
        "throughput",
        lambda: throughput(
            corpus,
            s.preset,
            base_cfg,
            s.throughput_rounds,
            s.throughput_steps,
            run.directory / "throughput",
            s.zoneout,
        ),
    )
    rows, tests = {}, {}
    for name, ptr in (("lstm", False), ("pointer", True)):
        out = run.directory / name
        step_s = tp["step_seconds"][name]
        rows[name] = run.unit(
            f"train {name}", lambda p=ptr, o=out, t=step_s: _train_model(s, corpus, p, o, t)
        )
        best = PointerSentinelLSTM.from_pretrained(out / "best")
        tests[name] = (best, evaluate(best, corpus["test"], batch_size=1, return_details=True))
    run.text(
        f"{s.corpus}, preset {s.preset}, batch {s.batch_size}, k1 = {s.k1 or 'k2'}, zoneout "
        f"{'preset' if s.zoneout is None else s.zoneout}, {s.minutes:g} min per model; "
        f"interleaved throughput ratio pointer / LSTM {tp['ratio']:.3f}."
    )
    run.table(
        [
            {"model": "LSTM (same size and regularisation)", **rows["lstm"]},
            {"model": "pointer sentinel-LSTM", **rows["pointer"]},
        ]
    )
    _analysis(s, run, corpus, tests)


def _train_model(s: PointerSettings, corpus, ptr: bool, out: Path, step_s: float) -> dict:
    """Unit ``train NAME``: one model trained for ``s.minutes`` (validated ``s.evals`` times,
    spaced by the measured ``step_s``), its best checkpoint scored on valid and test."""
    budget = s.minutes * 60
    cfg = TrainConfig(
        seed=s.seed,
        optimizer=s.optimizer,
        lr=s.lr,
        max_time=budget,
        eval_every=max(1, int(budget / step_s / s.evals)),
        batch_size=s.batch_size,
        k1=s.k1,
        revert_on_worse=s.revert,
    )
    model = build(s.preset, len(corpus.vocab), ptr, s.seed, s.zoneout)
    tr = PointerTrainer(model, corpus, cfg, out, progress=True)
    tr.train()
    best = PointerSentinelLSTM.from_pretrained(out / "best").to(tr.accelerator.device)
    row = {
        "parameters": sum(p.numel() for p in best.parameters()),
        "train tokens": tr.trained_tokens,
        "train tokens/s": tr.trained_tokens / tr.train_time,
    }
    for split in ("valid", "test"):
        r = evaluate(best, corpus[split], batch_size=s.eval_batch_size, desc=split)
        row[f"{split} ppl"] = r["ppl"]
    return row


def _analysis(s: PointerSettings, run: ExperimentRun, corpus, tests: dict) -> None:
    """The pointer's gain by word-frequency bucket on test, and its gate and attention on a
    test passage. ``tests``: name -> (best model, its test details)."""
    from gencraft.pointer.analysis import (
        bucket_gains,
        frequency_buckets,
        passage_view,
        plot_bucket_gains,
        plot_passage,
    )

    (_, lstm_test), (ptr_model, ptr_test) = tests["lstm"], tests["pointer"]
    buckets = bucket_gains(
        lstm_test["token_nll"],
        ptr_test["token_nll"],
        lstm_test["targets"],
        frequency_buckets(corpus.vocab.counts),
    )
    run.text("Gain of the pointer model by word-frequency bucket (test, one stream):")
    run.table(buckets)
    plot_bucket_gains(
        buckets,
        run.plot_path("frequency_gain.png", "gain by frequency bucket"),
        f"{s.corpus} test, {s.preset} preset, {s.minutes:g} min each",
    )
    start = min(1000, max(0, corpus["test"].numel() - 41))
    view = passage_view(ptr_model, corpus, "test", start, 40)
    plot_passage(view, run.plot_path("passage.png", "gate and pointer attention on a passage"))
