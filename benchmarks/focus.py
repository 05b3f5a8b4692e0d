"""FAME: speed against the base model, and baseline-vs-FAME quality on the local XSum split.

    python benchmarks/focus.py speed --model minilm-l6-bert2bert          # the docs run
    python benchmarks/focus.py speed --model smollm2-135m --docs 4
    python benchmarks/focus.py quality --model minilm-l6-bert2bert --minutes 30
    python benchmarks/focus.py quality --model minilm-l6-bert2bert --data cnndm --seed 1

Runs on the GPU when there is one (``--device`` to choose).

``speed``: interleaved rounds (so machine load hits both alike) of
  * a forward pass with labels: the base vs FAME (topic loss included);
  * ``generate`` with beam search: the base with ``num_beams`` vs FAME with focus_sample,k
    (k = 10,000) and the same beam size.
  Prints the ratios (targets: forward <= 1.10x, generate <= 1.05x) and writes ``speed.json``.

``quality``: fine-tunes the baseline and FAME for ``--minutes`` each on the train split
(sha1-80/10/10 of xsum-1000), then on the test split: Table 1 (beam 4), Table 2 (``--samples``
per document for top-k, nucleus, focus_sample and the combinations) and the focus_top,k curve
(``focus_top.png``). With ``--freeze-base`` (causal LMs such as SmolLM2) the baseline is the
base itself and FAME trains only the head. Writes ``quality.json`` and ``quality.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from statistics import median

import torch

from gencraft.data import load_summarization
from gencraft.focus import FocusForConditionalGeneration
from gencraft.focus.data import SummaryEncoder, collate
from gencraft.models import load_model


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


def speed(args: argparse.Namespace) -> dict:
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
                t0 = time.perf_counter()
                fn()
                _sync(args.device)
                times[k].append(time.perf_counter() - t0)
    med = {k: median(v) for k, v in times.items()}
    result = {
        "model": args.model,
        "documents": len(docs),
        "max_source": args.max_source,
        "beams": args.beams,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "device": _device_name(args.device),
        "median_seconds": med,
        "forward_ratio": med["forward_fame"] / med["forward_base"],
        "generate_ratio": med["generate_fame_focus_sample"] / med["generate_base"],
    }
    return result


def quality(args: argparse.Namespace) -> dict:
    from gencraft.focus.evaluate import diversity_metrics, summarize, summary_metrics
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer, load_summarizer

    out = Path(args.output)
    train = load_summarization(args.data, "train", args.data_dir)
    valid = load_summarization(args.data, "validation", args.data_dir)
    test = load_summarization(args.data, "test", args.data_dir)[: args.test_docs]
    common = dict(
        max_time=args.minutes * 60,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        max_source=args.max_source,
        max_target=args.max_target,
        seed=args.seed,
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
    }
    for name, path in systems.items():
        model, tok = load_summarizer(path)
        model.to(args.device)
        preds = [g[0] for g in summarize(model, tok, docs, decoding="beam", **gen)]
        result["table1"][name] = summary_metrics(preds, refs, docs)
        decodings = ["top_k", "nucleus"]
        if name == "fame":
            decodings += ["focus_sample", "focus_sample+top_k", "focus_sample+nucleus"]
        sub = slice(0, args.sample_docs)
        for dec in decodings:
            groups = summarize(model, tok, docs[sub], decoding=dec, samples=args.samples, **gen)
            result["table2"][f"{name} ({dec})"] = diversity_metrics(groups, refs[sub], docs[sub])
        if name == "fame":
            for k in args.focus_top:
                preds = [
                    g[0]
                    for g in summarize(model, tok, docs, decoding="focus_top", focus_k=k, **gen)
                ]
                result["focus_top"][k] = summary_metrics(preds, refs, docs, with_bertscore=False)
        (out / "quality.json").write_text(json.dumps(result, indent=2))
    _plot_focus_top(result["focus_top"], result["table1"], out / "focus_top.png")
    (out / "quality.md").write_text(_markdown(result))
    return result


def _markdown(result: dict) -> str:
    lines = []
    for title, table in (
        ("Table 1 (beam 4)", result["table1"]),
        ("Table 2 (samples per document)", result["table2"]),
        ("focus_top,k (beam 4)", result["focus_top"]),
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--model", default="minilm-l6-bert2bert")
    s.add_argument("--docs", type=int, default=8)
    s.add_argument("--beams", type=int, default=4)
    s.add_argument("--new-tokens", type=int, default=32)
    s.add_argument("--rounds", type=int, default=5)
    q = sub.add_parser("quality")
    q.add_argument("--model", default="minilm-l6-bert2bert")
    q.add_argument("--data", default="xsum", choices=("xsum", "cnndm"))
    q.add_argument("--seed", type=int, default=0, help="training and sampling seed")
    q.add_argument(
        "--max-target",
        type=int,
        default=None,
        help="summary tokens for training and generation (default 64 xsum, 128 cnndm)",
    )
    q.add_argument("--minutes", type=float, default=30.0)
    q.add_argument("--epochs", type=int, default=20)
    q.add_argument("--lr", type=float, default=1e-4)
    q.add_argument("--head-lr", type=float, default=1e-3)
    q.add_argument("--batch-size", type=int, default=8)
    q.add_argument("--freeze-base", action="store_true")
    q.add_argument("--test-docs", type=int, default=100)
    q.add_argument("--sample-docs", type=int, default=20)
    q.add_argument("--samples", type=int, default=10)
    q.add_argument("--eval-batch-size", type=int, default=8)
    q.add_argument("--focus-top", type=int, nargs="+", default=[50, 100, 200, 500, 1000, 10000])
    for p in (s, q):
        p.add_argument("--max-source", type=int, default=512)
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--data-dir", default=None)
        p.add_argument("--output", default=None)
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.what == "quality" and args.max_target is None:
        args.max_target = 64 if args.data == "xsum" else 128
    if args.threads:
        torch.set_num_threads(args.threads)
    args.output = args.output or f"outputs/bench-focus-{args.what}-{Path(args.model).name}"
    Path(args.output).mkdir(parents=True, exist_ok=True)
    result = speed(args) if args.what == "speed" else quality(args)
    (Path(args.output) / f"{args.what}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("table2",)}, indent=2))


if __name__ == "__main__":
    main()
