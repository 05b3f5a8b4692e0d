"""The pointer experiment of docs/results/pointer.md, runnable with ``gencraft reproduce``:

``pointer-vs-lstm``: a plain LSTM and a pointer sentinel-LSTM of the same size, under the same
time budget. Training throughput is measured interleaved in this run (plain and pointer steps
alternate, so machine load hits both alike); each model then trains for ``minutes`` of wall
time (training + validation); the best checkpoint's validation/test perplexity is measured
with ``eval_batch_size`` streams (paper: 1). Also the frequency-bucket gains (Fig. 4 style) and
a passage's gate/attention view as PNGs. Each model is one unit; a model's training resumes
from its own checkpoint when the run is stopped.

``pointer-confirm``: the confirmatory comparison: both models trained to early stopping on
validation perplexity (at most ``max_epochs``) under several seeds, each test word's NLL at
batch 1 saved, and the paired comparison over seeds and test sentences (a two-level
bootstrap), with the gain per word-frequency bucket under Holm.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gencraft.metrics.stats import compare_paired, holm, p_text
from gencraft.pointer.evaluate import evaluate
from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.pointer.train import PointerTrainer, TrainConfig, preset_k1
from gencraft.studies.runner import ExperimentRun, kept_models, register, settings_field
from gencraft.studies.timing import running_clock


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


@dataclass
class PointerConfirmSettings:
    corpus: str = settings_field("ptb", "ptb or wikitext-2")
    preset: str = settings_field("small", "model preset (small, medium, tiny)")
    seeds: tuple[int, ...] = settings_field((0, 1, 2), "training seeds (each trains both models)")
    max_epochs: int = settings_field(20, "passes over the training stream at most")
    patience: int = settings_field(3, "stop after this many validations without improvement")
    optimizer: str = settings_field("adam", "adam or sgd")
    lr: float = settings_field(3e-3, "learning rate")
    batch_size: int = settings_field(8, "streams per step (paper: 32)")
    k1: int | None = settings_field(None, "tokens per TBPTT step (None: k2)")
    zoneout: float | None = settings_field(None, "zoneout rate of c and h (None: the preset's)")
    revert: bool = settings_field(True, "reload the best weights on a worse validation")
    max_steps: int | None = settings_field(None, "steps per model at most (None: no limit)")
    resamples: int = settings_field(10_000, "bootstrap resamples")
    data_dir: str | None = settings_field(None, "datasets directory")


def _confirm_units(s: PointerConfirmSettings) -> list[str]:
    """``train NAME`` then ``test NAME`` for each model and seed (NAME: ``lstm-s0`` ...)."""
    names = [f"{m}-s{seed}" for seed in s.seeds for m in ("lstm", "pointer")]
    return [f"{kind} {n}" for n in names for kind in ("train", "test")]


@register(
    "pointer-confirm",
    title="pointer sentinel-LSTM vs LSTM, confirmatory: early stopping, seeds, batch-1 test",
    settings=PointerConfirmSettings,
    scales={
        "tiny": {
            "preset": "tiny",
            "seeds": (0, 1),
            "max_epochs": 1,
            "max_steps": 3,
            "batch_size": 4,
            "resamples": 200,
        },
        "cpu": {},
        "gpu": {"batch_size": 32},
    },
    cpu_minutes=600,
    units=_confirm_units,
    kept=lambda s: kept_models(_confirm_units(s)),
)
def pointer_confirm(s: PointerConfirmSettings, run: ExperimentRun) -> None:
    """Both models per seed to early stopping; each test word's NLL at batch 1."""
    from gencraft.data import load_lm_corpus

    corpus = load_lm_corpus(s.corpus, s.data_dir)
    for seed in s.seeds:
        for model, ptr in (("lstm", False), ("pointer", True)):
            name = f"{model}-s{seed}"
            out = run.directory / name
            run.unit(
                f"train {name}", lambda p=ptr, o=out, sd=seed: _train_full(s, corpus, p, o, sd)
            )
            run.unit(f"test {name}", lambda o=out: _test_words(o / "best", corpus))
    _report_pointer_confirm(s, run, corpus)


def _train_full(s: PointerConfirmSettings, corpus, ptr: bool, out: Path, seed: int) -> dict:
    """Unit ``train NAME``: one model to early stopping, validated every epoch."""
    cfg = TrainConfig(
        seed=seed,
        optimizer=s.optimizer,
        lr=s.lr,
        batch_size=s.batch_size,
        k1=s.k1,
        max_epochs=s.max_epochs,
        patience=s.patience,
        revert_on_worse=s.revert,
        max_steps=s.max_steps,
    )
    model = build(s.preset, len(corpus.vocab), ptr, seed, s.zoneout)
    tr = PointerTrainer(model, corpus, cfg, out, progress=True)
    history = tr.train()
    valid = [h["valid_ppl"] for h in history if "valid_ppl" in h]
    return {
        "epochs": tr.result.epochs_done,
        "steps": tr.global_step,
        "train tokens": tr.trained_tokens,
        "best valid ppl": min(valid) if valid else None,
        "stopped by": tr.result.stopped,
    }


def _test_words(best: Path, corpus) -> dict:
    """Unit ``test NAME``: the best checkpoint's NLL of each test word at batch 1 (one stream,
    the window carried through the split), rounded to 1e-5 nats."""
    model = PointerSentinelLSTM.from_pretrained(best)
    r = evaluate(model, corpus["test"], batch_size=1, return_details=True, desc="test")
    return {"ppl": r["ppl"], "token_nll": [round(x, 5) for x in r["token_nll"][0].tolist()]}


def sentence_of_words(ids: torch.Tensor, eos: int) -> list[int]:
    """The sentence of each scored test word (targets ``ids[1:]``): a sentence ends with its
    ``<eos>`` target."""
    out, k = [], 0
    for t in ids[1:].tolist():
        out.append(k)
        k += t == eos
    return out


def pointer_confirm_analysis(
    units: dict, corpus, seeds, resamples: int = 10_000, n_buckets: int = 10
) -> dict[str, Any] | None:
    """The registered analysis (None until every seed's two test units are in ``units``):
    pointer − LSTM NLL per word, two levels (seeds, then test sentences: each sentence's mean
    per word); secondary: the gain LSTM − pointer in each word-frequency bucket (1 = most
    frequent types), the same two levels; Holm over all of them."""
    from gencraft.data import EOS
    from gencraft.pointer.analysis import frequency_buckets

    keys = [(f"test pointer-s{sd}", f"test lstm-s{sd}") for sd in seeds]
    if not all(a in units and b in units for a, b in keys):
        return None
    test = corpus["test"]
    sent = sentence_of_words(test, corpus.vocab.stoi[EOS])
    bucket = frequency_buckets(corpus.vocab.counts, n_buckets)[test[1:]].tolist()
    rows = [
        (units[a]["token_nll"], units[b]["token_nll"], sd)
        for (a, b), sd in zip(keys, seeds, strict=True)
    ]
    ptr = [x for p, _, _ in rows for x in p]
    lstm = [x for _, q, _ in rows for x in q]
    clusters = sent * len(seeds)
    seed_of = [sd for _, q, sd in rows for _ in q]
    primary = compare_paired(ptr, lstm, clusters=clusters, seeds=seed_of, resamples=resamples)
    buckets = []
    for b in range(n_buckets):
        pick = [i for i, k in enumerate(bucket * len(seeds)) if k == b]
        r = compare_paired(
            [lstm[i] for i in pick],
            [ptr[i] for i in pick],
            clusters=[clusters[i] for i in pick],
            seeds=[seed_of[i] for i in pick],
            resamples=resamples,
        )
        buckets.append({"bucket": b + 1, "words": len(pick) // len(seeds), "result": r})
    adjusted = holm([primary.p, *(x["result"].p for x in buckets)])
    for x, q in zip(buckets, adjusted[1:], strict=True):
        x["p_holm"] = q
    return {"primary": primary, "p_holm": adjusted[0], "buckets": buckets}


def _report_pointer_confirm(s: PointerConfirmSettings, run: ExperimentRun, corpus) -> None:
    a = pointer_confirm_analysis(run.units, corpus, s.seeds, s.resamples)
    run.text(
        f"{s.corpus}, preset {s.preset}, seeds {list(s.seeds)}: each model trained to early "
        f"stopping (validation every epoch, patience {s.patience}, at most {s.max_epochs} "
        f"epochs; {s.optimizer} {s.lr:g}, batch {s.batch_size}); the best checkpoint scores "
        "the test split as one stream (batch 1).\n\n**Planned analysis** (registered before "
        "the run): pointer − LSTM NLL per word (nats), two levels: seeds, then test sentences "
        f"(each sentence's mean per word); the crossed bootstrap, {s.resamples:,} resamples; "
        "secondary: the gain LSTM − pointer per word-frequency bucket (1 = most frequent "
        "types), the same two levels; Holm over all of them."
    )
    rows = [_confirm_row("pointer − LSTM, nats/word (primary)", a["primary"], a["p_holm"], s)]
    rows += [
        _confirm_row(
            f"gain in bucket {b['bucket']} ({b['words']} words)", b["result"], b["p_holm"], s
        )
        for b in a["buckets"]
    ]
    run.table(rows)
    run.text("**Exploratory** (not part of the plan): each model's training and test perplexity.")
    run.table(
        [
            {
                "model": k.split()[1],
                **run.units[k],
                "test ppl (batch 1)": run.units["test" + k[5:]]["ppl"],
            }
            for k in run.units
            if k.startswith("train ")
        ]
    )


def _confirm_row(name: str, r: Any, p_holm: float, s: PointerConfirmSettings) -> dict:
    return {
        "comparison": name,
        "mean": r.mean,
        "95% interval": f"[{r.low:+.4f}, {r.high:+.4f}]",
        "p (Holm)": p_text(p_holm, s.resamples),
        "seeds": r.seeds,
        "sentences": r.units,
    }
