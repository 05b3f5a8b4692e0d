"""``gencraft nar train|generate|eval``: non-autoregressive generation from a masked LM
(RUM-SUNDAE, thesis ch. 4), with Mask-Predict and an autoregressive BERT2BERT beside it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

METHODS = ("auto", "sundae", "mask-predict", "beam")


def _load(name_or_dir: str, seed: int = 0) -> tuple[Any, Any]:
    from gencraft.nar import load_mlm_seq2seq
    from gencraft.training import load_run

    if Path(name_or_dir).is_dir():  # a trained run (its best/) or one of its model directories
        model, tok, _ = load_run(name_or_dir)
        return model, tok
    # a masked LM converted on the spot (untrained for generation)
    return load_mlm_seq2seq(name_or_dir, seed=seed)


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.nar import ConvertConfig, ObjectiveConfig
    from gencraft.nar.config import NARTrainConfig
    from gencraft.nar.train import train

    cfg = dataclass_from_args(NARTrainConfig, args)
    convert = dataclass_from_args(ConvertConfig, args)
    objective = dataclass_from_args(ObjectiveConfig, args)
    init = "mlm" if convert.pretrained else "scratch"
    out = Path(
        args.output or f"outputs/nar-{cfg.task}-{Path(cfg.model).name}-{objective.objective}-{init}"
    )
    print(f"{objective.objective} on {cfg.task} from {cfg.model} ({init}): -> {out}")
    summary = train(
        cfg,
        convert,
        objective,
        out,
        data_dir=args.data_dir,
        progress=not args.quiet,
        restart=args.restart,
    )
    summary.pop("history", None)
    print(json.dumps(summary, indent=2))


def cmd_generate(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.nar import SamplingConfig
    from gencraft.nar.evaluate import decode

    sampling = dataclass_from_args(SamplingConfig, args)
    model, tok = _load(args.model)
    texts, out = decode(
        model,
        tok,
        list(args.sources),
        sampling,
        method=args.method,
        num_beams=args.beams,
        progress=False,
    )
    rows = [
        {"source": s, "output": t, "score": sc, "model_calls": c, "seconds": sec}
        for s, t, sc, c, sec in zip(
            args.sources, texts, out.scores, out.model_calls, out.seconds, strict=True
        )
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(
            f"{r['source']}\n  -> {r['output']}  ({r['model_calls']} model calls, "
            f"{r['seconds']:.2f} s)"
        )


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.nar import SamplingConfig
    from gencraft.nar.evaluate import evaluate

    sampling = dataclass_from_args(SamplingConfig, args)
    model, tok = _load(args.model)
    r = evaluate(
        model,
        tok,
        task=args.task,
        split=args.split,
        limit=args.limit,
        sampling=sampling,
        method=args.method,
        num_beams=args.beams,
        data_dir=args.data_dir,
        progress=not args.quiet,
    )
    preds = r.pop("predictions")
    if args.predictions:
        Path(args.predictions).write_text("\n".join(preds) + "\n")
    if args.json:
        print(json.dumps(r, indent=2))
        return
    convention = r.pop("convention")
    print(f"{args.model} on {args.task} {args.split} ({r['outputs']} inputs)")
    print(format_table([r]))
    print(f"scored by score_task: {convention}")


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.nar import ConvertConfig, ObjectiveConfig, SamplingConfig
    from gencraft.nar.config import NAR_TASKS, NARTrainConfig

    p = sub.add_parser("nar", help="non-autoregressive generation from a masked LM (ch. 4)")
    psub = p.add_subparsers(dest="nar_command", required=True)
    t = psub.add_parser("train", help="convert a masked LM and train it (SUNDAE, Mask-Predict, AR)")
    add_dataclass_arguments(t, NARTrainConfig)
    add_dataclass_arguments(t, ConvertConfig)
    add_dataclass_arguments(t, ObjectiveConfig)
    t.add_argument("--output", default=None, help="output directory (a re-run resumes it)")
    t.add_argument("--restart", action="store_true", help="discard a run already in --output")
    t.add_argument("--quiet", action="store_true")
    add_data_dir(t)
    t.set_defaults(func=cmd_train)

    def decoding_flags(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "model", help="a trained run's best/ or last/, or a masked LM (converted, untrained)"
        )
        q.add_argument(
            "--method",
            choices=METHODS,
            default="auto",
            help="auto: beam for a causal decoder, else SUNDAE",
        )
        q.add_argument("--beams", type=int, default=4, help="beam size of the autoregressive model")
        add_dataclass_arguments(q, SamplingConfig)
        q.add_argument("--json", action="store_true")

    g = psub.add_parser("generate", help="decode the given sources")
    decoding_flags(g)
    g.add_argument("--sources", nargs="+", required=True, help="source texts (linearised inputs)")
    g.set_defaults(func=cmd_generate)

    e = psub.add_parser("eval", help="BLEU, ROUGE-L, seconds and model calls per output")
    decoding_flags(e)
    e.add_argument("--task", choices=NAR_TASKS, default="e2e")
    e.add_argument("--split", default="test")
    e.add_argument("--limit", type=int, default=None, help="N inputs, evenly spaced")
    e.add_argument("--predictions", default=None, help="write the outputs here, one per line")
    e.add_argument("--quiet", action="store_true")
    add_data_dir(e)
    e.set_defaults(func=cmd_eval)
