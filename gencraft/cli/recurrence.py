"""``gencraft recurrence train|eval``: recurrence between windows of a pretrained LM (thesis
ch. 2), trained on a word-level corpus and scored by overlap evaluation."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencraft.config import REQUIRED, option


@dataclass
class RecurrenceEvalCommand:
    model: str = option(
        REQUIRED,
        "a trained run's best/ or last/, or any causal LM (with --window)",
        positional=True,
    )
    window: int | None = option(None, "T (default: the run's)")
    overlaps: tuple[int, ...] = option((0,), "overlaps o to score")


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import batch_note, default_output, say
    from gencraft.recurrence import RecurrenceConfig
    from gencraft.recurrence.config import RecurrenceTrainConfig
    from gencraft.recurrence.train import train

    cfg = dataclass_from_args(RecurrenceTrainConfig, args)
    rec = dataclass_from_args(RecurrenceConfig, args)
    kind = "recurrent" if rec.recurrent else "baseline"
    out = default_output(args.output, "recurrence", cfg.corpus, cfg.model, kind)
    note = batch_note(cfg.fit.batch_size, cfg.fit.grad_accum)
    say(f"{kind} {cfg.model} on {cfg.corpus}, windows of {rec.window}: -> {out}; {note}")
    summary = train(
        cfg, rec, out, data_dir=args.data_dir, progress=not args.quiet, restart=args.restart
    )
    summary.pop("history", None)
    say(json.dumps(summary, indent=2))


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.distributed import is_main
    from gencraft.errors import GencraftError
    from gencraft.models import load_model
    from gencraft.recurrence.evaluate import evaluate
    from gencraft.training import load_run

    place = {"device": args.device, "dtype": args.dtype}
    run = None
    if Path(args.model).is_dir():  # a trained run (its best/), or any model folder
        run = load_run(args.model, method="recurrence", command="eval", **place)
    if run is not None and "recurrence" in run.settings:
        model, tok, meta = run
        window = args.window or meta["recurrence"]["window"]
        corpus = args.corpus or meta.get("train", {}).get("corpus") or "wikitext-2"
    else:  # any causal LM (a name or a folder of your own), each window run alone
        if args.window is None:
            raise GencraftError(
                "--window is needed for a model that is not a trained recurrence run"
            )
        model, tok = run[:2] if run is not None else load_model(args.model, **place)
        window, corpus = args.window, args.corpus or "wikitext-2"
    rows = evaluate(
        model,
        tok,
        corpus=corpus,
        split=args.split,
        window=window,
        overlaps=tuple(args.overlaps),
        max_words=args.max_words,
        data_dir=args.data_dir,
        progress=not args.quiet,
        batch_size=args.batch_size,
        shard=True,
    )
    if not is_main():  # every process has every row; only the main one prints
        return
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.model} on {corpus} {args.split}, windows of {window}")
    print(format_table([{k: v for k, v in r.items() if k != "block_nll"} for r in rows]))


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions, DecodeOptions, RunOptions
    from gencraft.recurrence import RecurrenceConfig
    from gencraft.recurrence.config import RecurrenceTrainConfig

    p = sub.add_parser("recurrence", help="recurrence between windows of a pretrained LM (ch. 2)")
    psub = p.add_subparsers(dest="recurrence_command", required=True)
    t = psub.add_parser("train", help="fine-tune with (or --no-recurrent, without) recurrence")
    add_dataclass_arguments(t, RecurrenceTrainConfig)
    add_dataclass_arguments(t, RecurrenceConfig)
    add_dataclass_arguments(t, RunOptions, only=("output", "restart", "quiet"))
    add_data_dir(t)
    t.set_defaults(func=cmd_train, output_kind="dir")

    e = psub.add_parser("eval", help="per-token/per-word perplexity and FLOPs/token by overlap")
    add_dataclass_arguments(e, RecurrenceEvalCommand)
    add_dataclass_arguments(e, DataOptions, only=("corpus", "split", "max_words"))
    add_dataclass_arguments(
        e,
        DecodeOptions,
        only=("batch_size",),
        defaults={"batch_size": 4},
        helps={
            "batch_size": "windows per forward of a plain LM (a recurrent model carries its "
            "state from window to window, so it runs them one at a time)"
        },
    )
    add_dataclass_arguments(e, RunOptions, only=("json", "quiet", "device", "dtype"))
    add_data_dir(e)
    e.set_defaults(func=cmd_eval)
