"""``gencraft focus train|generate|eval``: FAME summarization (and its plain baseline)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _examples(name: str, split: str, data_dir: str | None, limit: int | None) -> list:
    from gencraft.data import load_summarization

    rows = load_summarization(name, split, data_dir)
    return rows[:limit] if limit else rows


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.models import load_model
    from gencraft.utils import seed_everything

    cfg = dataclass_from_args(FocusTrainConfig, args)
    seed_everything(cfg.fit.seed)
    train = _examples(args.data, "train", args.data_dir, args.max_train)
    valid = _examples(args.data, "validation", args.data_dir, args.max_valid)
    base, tok = load_model(args.model)
    tag = "fame" if cfg.focus else "base"
    out = Path(args.output or f"outputs/focus-{args.data}-{Path(args.model).name}-{tag}")
    print(
        f"{'FAME' if cfg.focus else 'baseline'} on {args.model}: {len(train)} train / "
        f"{len(valid)} valid {args.data} documents -> {out}"
    )
    trainer = FocusTrainer(
        base, tok, train, valid, cfg, out, base_name_or_path=args.model, progress=not args.quiet
    )
    result = trainer.train(restart=args.restart)
    print(json.dumps(result, indent=2))


def _load(checkpoint: str, device: str | None) -> tuple[Any, Any]:
    from gencraft.focus.train import load_summarizer

    return load_summarizer(checkpoint, device=device) if device else load_summarizer(checkpoint)


def _summaries(args: argparse.Namespace) -> tuple[list, list[list[str]]]:
    from gencraft.focus.evaluate import summarize

    model, tok = _load(args.checkpoint, args.device)
    docs = _examples(args.data, args.split, args.data_dir, args.limit)
    groups = summarize(
        model,
        tok,
        [d.document for d in docs],
        decoding=args.decoding,
        samples=args.samples,
        focus_k=args.focus_k,
        num_beams=args.num_beams,
        max_source=args.max_source,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.quiet,
    )
    return docs, groups


def cmd_generate(args: argparse.Namespace) -> None:
    docs, groups = _summaries(args)
    # "prediction": the first summary, so the file feeds `gencraft eval --field prediction`
    lines = [
        json.dumps({"id": d.id, "prediction": g[0], "summaries": g, "reference": d.summary})
        for d, g in zip(docs, groups, strict=True)
    ]
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("\n".join(lines) + "\n")
        print(f"{len(lines)} documents -> {args.output}")
    else:
        print("\n".join(lines))


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.focus.evaluate import diversity_metrics, summary_metrics

    docs, groups = _summaries(args)
    refs, texts = [d.summary for d in docs], [d.document for d in docs]
    empty = sum(not s.strip() for g in groups for s in g)
    total = sum(len(g) for g in groups)
    if empty:
        import sys

        print(
            f"gencraft: warning: {empty} of {total} summaries are empty; they score 0"
            + (" (all of them: is this model trained?)" if empty == total else ""),
            file=sys.stderr,
        )
    bs = not args.no_bertscore
    if args.samples > 1:
        row = diversity_metrics(groups, refs, texts, with_bertscore=bs)
    else:
        row = summary_metrics([g[0] for g in groups], refs, texts, with_bertscore=bs)
    result = {
        "checkpoint": args.checkpoint,
        "data": args.data,
        "split": args.split,
        "documents": len(docs),
        "decoding": args.decoding,
        "samples": args.samples,
        **row,
    }
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.focus.config import FocusTrainConfig
    from gencraft.focus.evaluate import DECODINGS

    p = sub.add_parser("focus", help="FAME focus attention and focus sampling (summarization)")
    fsub = p.add_subparsers(dest="focus_command", required=True)

    t = fsub.add_parser("train", help="fine-tune a model with FAME (or the plain baseline)")
    t.add_argument(
        "--model",
        required=True,
        help="minilm-l6-bert2bert, smollm2-135m, a tiny-* model, a path or hub id",
    )
    t.add_argument("--data", choices=("xsum", "cnndm"), default="xsum")
    add_dataclass_arguments(t, FocusTrainConfig)
    t.add_argument("--max-train", type=int, default=None, help="use the first N train docs")
    t.add_argument("--max-valid", type=int, default=None)
    t.add_argument("--output", default=None, help="output directory (a re-run resumes it)")
    t.add_argument("--restart", action="store_true", help="discard a run already in --output")
    t.add_argument("--quiet", action="store_true")
    add_data_dir(t)
    t.set_defaults(func=cmd_train)

    commands = (
        ("generate", cmd_generate, "write summaries as JSON lines"),
        ("eval", cmd_eval, "summaries + FAME's Table 1/2 metrics"),
    )
    for name, func, text in commands:
        g = fsub.add_parser(name, help=text)
        g.add_argument("checkpoint", help="a trained directory (best/, last/) or a model name")
        g.add_argument("--data", choices=("xsum", "cnndm"), default="xsum")
        g.add_argument("--split", default="test")
        g.add_argument("--decoding", choices=DECODINGS, default="beam")
        g.add_argument("--samples", type=int, default=1, help="summaries per document")
        g.add_argument(
            "--focus-k",
            type=int,
            default=None,
            help="|V_k| (default 10,000, or the whole vocabulary when it is smaller)",
        )
        g.add_argument("--num-beams", type=int, default=4)
        g.add_argument("--max-source", type=int, default=512)
        g.add_argument("--max-new-tokens", type=int, default=64)
        g.add_argument("--batch-size", type=int, default=8)
        g.add_argument("--limit", type=int, default=None, help="first N documents")
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--device", default=None)
        g.add_argument("--output", default=None)
        g.add_argument("--quiet", action="store_true")
        if name == "eval":
            g.add_argument("--no-bertscore", action="store_true")
        add_data_dir(g)
        g.set_defaults(func=func)
