"""``gencraft nar train|generate|eval``: non-autoregressive generation from a masked LM
(RUM-SUNDAE, thesis ch. 4), with Mask-Predict and an autoregressive BERT2BERT beside it."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gencraft.config import REQUIRED, option
from gencraft.errors import GencraftError

METHODS = ("auto", "sundae", "mask-predict", "beam")


@dataclass
class NARDecodeCommand:
    model: str = option(
        REQUIRED,
        "a trained run's best/ or last/, or a masked LM (converted, untrained)",
        positional=True,
    )
    method: Literal["auto", "sundae", "mask-predict", "beam"] = option(
        "auto", "auto: beam for a causal decoder, else SUNDAE"
    )


@dataclass
class NARGenerateCommand:
    sources: list[str] | None = option(
        None,
        "source texts (linearised inputs); without them, the inputs of --task's --split "
        "(the first --limit)",
    )


def _load(args: argparse.Namespace, command: str, seed: int = 0) -> tuple[Any, Any]:
    from gencraft.nar import load_mlm_seq2seq
    from gencraft.training import load_run

    name_or_dir, place = args.model, {"device": args.device, "dtype": args.dtype}
    if Path(name_or_dir).is_dir():  # a trained run (its best/) or one of its model directories
        model, tok, _ = load_run(name_or_dir, method="nar", command=command, **place)
        return model, tok
    # a masked LM converted on the spot (untrained for generation)
    return load_mlm_seq2seq(name_or_dir, seed=seed, **place)


def _check_flags(model: Any, sampling: Any, args: argparse.Namespace) -> None:
    """Refuse the decoding flags written out that the chosen --method does not read."""
    from gencraft.nar.evaluate import check_settings_apply, resolve_method

    method = resolve_method(model, args.method)
    check_settings_apply(method, sampling, args.num_beams, given=getattr(args, "given", None))


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import batch_note, default_output, say
    from gencraft.nar import ConvertConfig, ObjectiveConfig
    from gencraft.nar.config import NARTrainConfig
    from gencraft.nar.train import train

    cfg = dataclass_from_args(NARTrainConfig, args)
    convert = dataclass_from_args(ConvertConfig, args)
    objective = dataclass_from_args(ObjectiveConfig, args)
    init = "mlm" if convert.pretrained else "scratch"
    out = default_output(args.output, "nar", cfg.task, cfg.model, objective.objective, init)
    note = batch_note(cfg.fit.batch_size, cfg.fit.grad_accum)
    say(f"{objective.objective} on {cfg.task} from {cfg.model} ({init}): -> {out}; {note}")
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
    say(json.dumps(summary, indent=2))


def cmd_generate(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.distributed import announce, is_main
    from gencraft.nar import SamplingConfig
    from gencraft.nar.evaluate import decode_sharded

    sampling = dataclass_from_args(SamplingConfig, args)
    args.sources = _sources(args)
    model, tok = _load(args, "generate")
    _check_flags(model, sampling, args)
    announce("nar generate", len(args.sources), args.batch_size)
    texts, out = decode_sharded(
        model,
        tok,
        list(args.sources),
        sampling,
        method=args.method,
        num_beams=args.num_beams,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )
    rows = [
        {"source": s, "output": t, "score": sc, "model_calls": c, "seconds": sec}
        for s, t, sc, c, sec in zip(
            args.sources, texts, out.scores, out.model_calls, out.seconds, strict=True
        )
    ]
    if not is_main():  # only the main process prints
        return
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(
            f"{r['source']}\n  -> {r['output']}  ({r['model_calls']} model calls, "
            f"{r['seconds']:.2f} s)"
        )


def _sources(args: argparse.Namespace) -> list[str]:
    """The sources to decode: ``--sources`` (none empty), else the inputs of the task's split
    (the run's own task unless ``--task`` says; the first ``--limit``)."""
    from gencraft.cli.flags import given_among

    if args.sources is not None:
        task_flags = ("task", "split", "limit", "source_field", "target_field")
        clash = given_among(args, task_flags)
        if clash:
            raise GencraftError(
                f"--sources gives the inputs; {', '.join(clash)} picks a task's inputs instead: "
                "give one or the other"
            )
        empty = [str(i + 1) for i, s in enumerate(args.sources) if not s.strip()]
        if empty:  # training refuses empty sources too: nothing to condition on
            raise GencraftError(f"--sources number {', '.join(empty)} is empty; give an input")
        return list(args.sources)
    from gencraft.cli.options import use_run_task
    from gencraft.data.tasks import pick_examples, source_of, task_examples

    use_run_task(args, args.model, "e2e")
    fields = {
        "source_field": args.source_field or "source",
        "target_field": args.target_field or "target",
    }
    examples = task_examples(args.task, args.split, args.data_dir, **fields)
    return [source_of(e) for e in pick_examples(examples, args.limit)]


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import use_run_task
    from gencraft.distributed import announce, is_main
    from gencraft.nar import SamplingConfig
    from gencraft.nar.evaluate import evaluate

    sampling = dataclass_from_args(SamplingConfig, args)
    use_run_task(args, args.model, "e2e")  # the run's own data unless --task says
    model, tok = _load(args, "eval")
    _check_flags(model, sampling, args)
    r = evaluate(
        model,
        tok,
        task=args.task,
        split=args.split,
        limit=args.limit,
        sampling=sampling,
        method=args.method,
        num_beams=args.num_beams,
        data_dir=args.data_dir,
        lowercase=args.lowercase,
        progress=not args.quiet,
        batch_size=args.batch_size,
        source_field=args.source_field,
        target_field=args.target_field,
    )
    if not is_main():  # only the main process writes and prints
        return
    announce("nar eval", r["outputs"], args.batch_size)
    preds = r.pop("predictions")
    if args.output and Path(args.output).suffix.lower() == ".jsonl":
        from gencraft.cli.options import JsonLines

        with JsonLines(args.output) as out:
            for i, text in enumerate(preds):
                out.write({"id": i, "prediction": text})
    elif args.output:  # one line each: a line break inside an output becomes a space
        Path(args.output).write_text("".join(" ".join(p.splitlines()) + "\n" for p in preds))
    if args.json:
        print(json.dumps(r, indent=2))
        return
    convention = r.pop("convention")
    print(f"{args.model} on {args.task} {args.split} ({r['outputs']} inputs)")
    print(format_table([r]))
    print(f"scored by score_task: {convention}")


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions, DecodeOptions, RunOptions
    from gencraft.nar import ConvertConfig, ObjectiveConfig, SamplingConfig
    from gencraft.nar.config import NARTrainConfig

    p = sub.add_parser("nar", help="non-autoregressive generation from a masked LM (ch. 4)")
    psub = p.add_subparsers(dest="nar_command", required=True)
    t = psub.add_parser("train", help="convert a masked LM and train it (SUNDAE, Mask-Predict, AR)")
    add_dataclass_arguments(t, NARTrainConfig)
    add_dataclass_arguments(t, ConvertConfig)
    add_dataclass_arguments(t, ObjectiveConfig)
    add_dataclass_arguments(t, RunOptions, only=("output", "restart", "quiet"))
    add_data_dir(t)
    t.set_defaults(func=cmd_train, output_kind="dir")

    def decoding_flags(q: argparse.ArgumentParser) -> None:
        add_dataclass_arguments(q, NARDecodeCommand)
        add_dataclass_arguments(
            q,
            DecodeOptions,
            only=("num_beams", "batch_size"),
            defaults={"num_beams": None, "batch_size": 16},
            helps={
                "num_beams": "beam size (1: greedy) of --method beam (default: 4)",
                "batch_size": "sources decoded together (one decoder call per step)",
            },
        )
        add_dataclass_arguments(q, SamplingConfig)
        add_dataclass_arguments(q, RunOptions, only=("json", "device", "dtype", "quiet"))

    g = psub.add_parser("generate", help="decode the given sources, or a task's split")
    decoding_flags(g)
    add_dataclass_arguments(g, NARGenerateCommand)
    add_dataclass_arguments(
        g, DataOptions, only=("task", "source_field", "target_field", "split", "limit")
    )
    add_data_dir(g)
    g.set_defaults(func=cmd_generate)

    e = psub.add_parser("eval", help="BLEU, ROUGE-L, seconds and model calls per output")
    decoding_flags(e)
    add_dataclass_arguments(
        e,
        DataOptions,
        only=("task", "source_field", "target_field", "split", "limit", "lowercase"),
    )
    out = "the predictions: a .txt file (one a line) or a .jsonl file (id and prediction)"
    add_dataclass_arguments(e, RunOptions, only=("output", "restart"), helps={"output": out})
    add_data_dir(e)
    e.set_defaults(func=cmd_eval, output_kind="file", output_suffixes=(".txt", ".jsonl"))
