"""Plain LSTM vs pointer sentinel-LSTM of the same size, under the same time budget.

    python benchmarks/pointer.py --corpus ptb --minutes 20 --threads 1  # the docs/results.md run
    python benchmarks/pointer.py --corpus ptb --minutes 1 --threads 2 # a quick look

For each model: training throughput measured interleaved in this run (plain and pointer steps
alternate, so machine load hits both alike), then training for ``--minutes`` of wall time
(training + validation), then validation/test perplexity of the best checkpoint with one stream
(batch 1), parameters and tokens/s. Writes ``results.json``/``results.md`` and the analysis PNGs
(frequency-bucket gain, a passage's gate and attention) under ``--output``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from gencraft.data import load_lm_corpus
from gencraft.pointer import PointerSentinelLSTM, TrainConfig, Trainer
from gencraft.pointer.analysis import (
    bucket_gains,
    frequency_buckets,
    passage_view,
    plot_bucket_gains,
    plot_passage,
)
from gencraft.pointer.train import evaluate


def build(preset: str, vocab: int, pointer: bool, seed: int) -> PointerSentinelLSTM:
    torch.manual_seed(seed)  # same init for the shared parameters (the pointer's come last)
    return PointerSentinelLSTM.from_preset(preset, vocab, pointer=pointer)


def throughput(corpus, preset: str, cfg: TrainConfig, rounds: int, steps: int) -> dict:
    """Tokens/s of each model's training steps, interleaved: ``rounds`` x ``steps`` each."""
    trainers = {}
    for name, ptr in (("lstm", False), ("pointer", True)):
        m = build(preset, len(corpus.vocab), ptr, cfg.seed)
        trainers[name] = Trainer(m, corpus, cfg, f"/tmp/gencraft-bench-{name}", progress=False)
    schedule = {k: t.steps() for k, t in trainers.items()}
    for k, t in trainers.items():  # warm-up
        for st in schedule[k][:2]:
            t.train_step(st)
    secs = {k: 0.0 for k in trainers}
    toks = {k: 0 for k in trainers}
    for r in range(rounds):
        for k, t in trainers.items():
            before = t.trained_tokens
            t0 = time.perf_counter()
            for st in schedule[k][2 + r * steps : 2 + (r + 1) * steps]:
                t.train_step(st)
            secs[k] += time.perf_counter() - t0
            toks[k] += t.trained_tokens - before
    tps = {k: toks[k] / secs[k] for k in trainers}
    return {
        "lstm_tokens_per_s": tps["lstm"],
        "pointer_tokens_per_s": tps["pointer"],
        "ratio": tps["pointer"] / tps["lstm"],
        "step_seconds": {k: secs[k] / (rounds * steps) for k in secs},
    }


def _device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="ptb", choices=("ptb", "wikitext-2"))
    ap.add_argument("--preset", default="small")
    ap.add_argument("--minutes", type=float, default=20.0, help="budget per model")
    ap.add_argument("--evals", type=int, default=8, help="validations within the budget")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--throughput-rounds", type=int, default=3)
    ap.add_argument("--throughput-steps", type=int, default=8)
    ap.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="streams per step (paper: 32; 8 makes ~4x more updates in a CPU budget)",
    )
    ap.add_argument(
        "--no-revert",
        action="store_true",
        help="keep training from diverged weights (default: reload the best on a worse eval)",
    )
    ap.add_argument(
        "--eval-batch-size",
        type=int,
        default=1,
        help="streams for the final valid/test perplexity (paper: 1)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output or f"outputs/bench-pointer-{args.corpus}-{args.preset}")
    out.mkdir(parents=True, exist_ok=True)
    corpus = load_lm_corpus(args.corpus, args.data_dir)
    base_cfg = TrainConfig(
        seed=args.seed, optimizer=args.optimizer, lr=args.lr, batch_size=args.batch_size
    )
    tp = throughput(corpus, args.preset, base_cfg, args.throughput_rounds, args.throughput_steps)
    print(f"throughput: {json.dumps(tp)}", flush=True)
    budget = args.minutes * 60
    results: dict = {
        "corpus": args.corpus,
        "preset": args.preset,
        "minutes_per_model": args.minutes,
        "optimizer": args.optimizer,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "revert_on_worse": not args.no_revert,
        "eval_batch_size": args.eval_batch_size,
        "threads": torch.get_num_threads(),
        "device": _device_name(),
        "cpu": platform.processor() or platform.machine(),
        "throughput_interleaved": tp,
        "models": {},
    }
    models = {}
    for name, ptr in (("lstm", False), ("pointer", True)):
        step_s = tp["step_seconds"][name]
        eval_every = max(1, int(budget / step_s / args.evals))
        cfg = TrainConfig(
            seed=args.seed,
            optimizer=args.optimizer,
            lr=args.lr,
            max_time=budget,
            eval_every=eval_every,
            batch_size=args.batch_size,
            revert_on_worse=not args.no_revert,
        )
        model = build(args.preset, len(corpus.vocab), ptr, args.seed)
        tr = Trainer(model, corpus, cfg, out / name, progress=True)
        tr.train(resume=False)
        best = PointerSentinelLSTM.from_pretrained(out / name / "best").to(tr.accelerator.device)
        row = {
            "parameters": sum(p.numel() for p in best.parameters()),
            "pointer_parameters": best.num_pointer_parameters(),
            "train_tokens": tr.trained_tokens,
            "train_tokens_per_s": tr.trained_tokens / tr.train_time,
            "epochs_seen": tr.trained_tokens / corpus["train"].numel(),
            "eval_every_steps": eval_every,
            "history": tr.history,
        }
        details = {}
        for split in ("valid", "test"):
            r = evaluate(
                best,
                corpus[split],
                batch_size=args.eval_batch_size,
                progress=True,
                desc=split,
                return_details=split == "test",
            )
            row[f"{split}_ppl"] = r["ppl"]
            details = r if split == "test" else details
        models[name] = (best, details)
        results["models"][name] = row
        print(json.dumps({k: v for k, v in row.items() if k != "history"}), flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))

    lstm, ptr_row = results["models"]["lstm"], results["models"]["pointer"]
    (_, lstm_test), (ptr_model, ptr_test) = models["lstm"], models["pointer"]
    buckets = frequency_buckets(corpus.vocab.counts)
    rows = bucket_gains(
        lstm_test["token_nll"], ptr_test["token_nll"], lstm_test["targets"], buckets
    )
    results["frequency_buckets"] = rows
    title = f"{args.corpus} test, {args.preset} preset, {args.minutes:g} min each"
    plot_bucket_gains(rows, out / "frequency_gain.png", title)
    view = passage_view(ptr_model, corpus, "test", 1000, 40)
    plot_passage(view, out / "passage.png")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    md = [
        f"| model ({args.corpus}, {args.preset}, batch {args.batch_size}, "
        f"{args.minutes:g} min {results['device']}) | parameters | "
        "valid ppl | test ppl | train tokens/s | tokens seen |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in (
        ("LSTM (same size and regularisation)", lstm),
        ("pointer sentinel-LSTM", ptr_row),
    ):
        md.append(
            f"| {name} | {row['parameters']:,} | {row['valid_ppl']:.1f} | "
            f"{row['test_ppl']:.1f} | {row['train_tokens_per_s']:.0f} | "
            f"{row['train_tokens']:,} |"
        )
    md.append(
        f"\nInterleaved throughput ratio pointer / LSTM: {tp['ratio']:.3f} "
        f"({tp['pointer_tokens_per_s']:.0f} / {tp['lstm_tokens_per_s']:.0f} tokens/s)."
    )
    (out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
