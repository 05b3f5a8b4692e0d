"""``gencraft prefix train|generate|eval|analyze``: DASP prefix-tuning (and its fine-tuning
controls) on E2E, DART and XSum."""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gencraft.config import option


@dataclass
class PrefixTrainCommand:
    segmenter: Literal["uniform", "sentence"] = option(
        "uniform", "how tokens get segments (a callable: the Python API)"
    )


@dataclass
class PrefixGenerateCommand:
    source: list[str] | None = option(None, "inputs given as text (instead of a task's split)")


@dataclass
class PrefixDecodeCommand:
    cad_alpha: float | None = option(
        None,
        "context-aware decoding (CAD): contrast with the same model on the input without its "
        "source, weight A >= 0 (greedy or beam search)",
    )

    def __post_init__(self) -> None:
        from gencraft.config import check_cad_alpha

        check_cad_alpha(self.cad_alpha)


@dataclass
class PrefixBaseInput:
    base: str | None = option(
        None,
        "the frozen base the prefixes go on (default: the one the run records; for a run "
        "moved to another machine, or a base moved to another folder)",
    )


@dataclass
class PrefixAnalyzeCommand:
    compare: list[str] = option([], "more checkpoints whose spectra share the plot")


def _prefix_config(args: argparse.Namespace) -> Any:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.prefix import PrefixConfig

    return dataclass_from_args(PrefixConfig, args, segmenter=args.segmenter)


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import batch_note, default_output, say
    from gencraft.prefix.config import PrefixTrainConfig
    from gencraft.prefix.train import train

    cfg = dataclass_from_args(PrefixTrainConfig, args)
    prefix = _prefix_config(args)
    out = default_output(args.output, "prefix", cfg.task, cfg.model, cfg.method)
    note = batch_note(cfg.fit.batch_size, cfg.fit.grad_accum)
    say(f"{cfg.method} on {cfg.model}, {cfg.task}: -> {out}; {note}")
    summary = train(
        cfg, prefix, out, data_dir=args.data_dir, progress=not args.quiet, restart=args.restart
    )
    summary.pop("history", None)
    say(json.dumps(summary, indent=2))


def _load(checkpoint: str, command: str, args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """The run, on ``--base`` when given (a prefix run's frozen base), on ``--device`` in
    ``--dtype``."""
    from gencraft.errors import GencraftError
    from gencraft.models.method import place
    from gencraft.prefix.variants import rebuild_finetuned
    from gencraft.training import load_run

    base = getattr(args, "base", None)
    device, dtype = getattr(args, "device", None), getattr(args, "dtype", None)

    def build(d: Path, settings: dict) -> Any:
        run = rebuild_finetuned(d, settings)
        if run is not None and base:
            raise GencraftError(
                f"--base does not apply: {checkpoint} is a fine-tuned model with its own weights"
            )
        return run if run is None else run._replace(model=place(run.model, device, dtype))

    return load_run(
        checkpoint,
        method="prefix",
        command=command,
        build=build,
        base=base,
        device=device,
        dtype=dtype,
    )


def _run(args: argparse.Namespace, command: str, partial: Path | None = None) -> dict[str, Any]:
    from gencraft.cli.options import run_task
    from gencraft.prefix.evaluate import evaluate

    model, tok, meta = _load(args.checkpoint, command, args)
    task, fields = run_task(args, meta["train"])
    return evaluate(
        model,
        tok,
        task,
        args.split,
        data_dir=args.data_dir,
        limit=args.limit,
        spread=args.spread,
        num_beams=args.num_beams,
        max_source_tokens=meta["train"]["max_source_tokens"],
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
        lowercase=getattr(args, "lowercase", False),
        **fields,
        partial_dir=partial,
        cad_alpha=args.cad_alpha,
    )


def cmd_generate(args: argparse.Namespace) -> None:
    PrefixDecodeCommand(args.cad_alpha)  # refused in one line before anything loads
    if args.source is not None:
        empty = [str(i + 1) for i, s in enumerate(args.source) if not s.strip()]
        if empty:
            from gencraft.errors import GencraftError

            raise GencraftError(f"--source number {', '.join(empty)} is empty; give an input")
        from gencraft.prefix.evaluate import generate_outputs

        model, tok, _ = _load(args.checkpoint, "generate", args)
        outs = generate_outputs(
            model,
            tok,
            args.source,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens or 64,
            progress=not args.quiet,
            cad_alpha=args.cad_alpha,
        )
        from gencraft.distributed import is_main

        for s, o in zip(args.source, outs, strict=True) if is_main() else []:
            print(json.dumps({"source": s, "output": o}, ensure_ascii=False))
        return
    from gencraft.cli.options import JsonLines, partial_folder
    from gencraft.distributed import is_main

    # an interrupted run keeps its finished batches beside --output; the same run resumes them
    partial = partial_folder(args.output)
    result = _run(args, "generate", partial)
    if not is_main():  # only the main process writes
        return
    with JsonLines(args.output) as out:  # as focus generate writes: id, prediction, references
        for j, (text, refs) in enumerate(zip(result["outputs"], result["references"], strict=True)):
            out.write({"id": j, "prediction": text, "references": refs})
    if partial is not None:
        shutil.rmtree(partial, ignore_errors=True)
    if args.output:
        print(f"{len(out.lines)} outputs -> {args.output}")
    else:
        print("\n".join(out.lines))


def cmd_eval(args: argparse.Namespace) -> None:
    PrefixDecodeCommand(args.cad_alpha)
    from gencraft.cli.evaluate import format_table
    from gencraft.distributed import is_main

    result = _run(args, "eval")
    if not is_main():  # only the main process writes and prints
        return
    outputs = result.pop("outputs")
    result.pop("references")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({**result, "outputs": outputs}, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        scores = dict(result["scores"])
        convention = scores.pop("convention")
        row = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in scores.items()}
        print(
            f"{result['task']} {result['split']}, {result['examples']} inputs, "
            f"beam {args.num_beams}"
            + ("" if args.cad_alpha is None else f", CAD alpha {args.cad_alpha:g}")
        )
        print(format_table([row]))
        print(f"scored by score_task: {convention}")


def run_label(checkpoint: str) -> str:
    """A run's name for a plot: its directory (with best/ or last/ when given), not a path."""
    d = Path(checkpoint).resolve()
    return f"{d.parent.name}/{d.name}" if d.name in ("best", "last") else d.name


def cmd_analyze(args: argparse.Namespace) -> None:
    from gencraft.cli.options import run_task
    from gencraft.data.tasks import source_of, task_examples
    from gencraft.models.prompts import pad_batch
    from gencraft.prefix.analysis import (
        collect_attention,
        plot_attention_maps,
        plot_spectrum,
        spectrum_by_depth,
    )

    out = Path(args.output)
    curves, maps = {}, None
    for checkpoint in [args.checkpoint, *args.compare]:
        model, tok, meta = _load(checkpoint, "analyze", args)
        if not hasattr(model, "recording"):
            from gencraft.errors import GencraftError

            raise GencraftError(f"{checkpoint} is a fine-tuned model without prefixes")
        task, fields = run_task(args, meta["train"])
        examples = task_examples(task, args.split, args.data_dir, **fields)[: args.limit]
        rows = [
            {"input_ids": tok(source_of(e), add_special_tokens=False)["input_ids"][:128]}
            for e in examples
        ]
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        batches = [pad_batch(rows[i : i + 8], pad) for i in range(0, len(rows), 8)]
        attention = collect_attention(model, batches)
        p = model.num_virtual_tokens
        if maps is None:  # the maps of the first checkpoint; the spectrum of every one
            maps = plot_attention_maps(
                attention, p, out / "attention_maps.png", title=run_label(checkpoint)
            )
        label = run_label(checkpoint)
        curves[label] = spectrum_by_depth(attention, p, model.config.lower_layers)
    spec = plot_spectrum(
        curves, out / "spectrum.png", f"{task} {args.split}, {len(examples)} inputs"
    )
    summary = {
        label: {g: [round(float(x), 4) for x in c] for g, c in groups.items()}
        for label, groups in curves.items()
    }
    (out / "spectrum.json").write_text(json.dumps(summary, indent=2))
    print(f"{maps}\n{spec}\n{json.dumps(summary)}")


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions, DecodeOptions, RunInput, RunOptions
    from gencraft.prefix import PrefixConfig
    from gencraft.prefix.config import PrefixTrainConfig

    p = sub.add_parser(
        "prefix", help="DASP prefix-tuning: blocking (UniBlock/HierBlock), sparse attention"
    )
    psub = p.add_subparsers(dest="prefix_command", required=True)
    t = psub.add_parser("train", help="train prefixes (or fine-tune) on e2e, dart or xsum")
    add_dataclass_arguments(t, PrefixTrainConfig)
    add_dataclass_arguments(t, PrefixConfig, exclude=("segmenter",))
    add_dataclass_arguments(t, PrefixTrainCommand)
    add_dataclass_arguments(t, RunOptions, only=("output", "restart", "quiet"))
    add_data_dir(t)
    t.set_defaults(func=cmd_train, output_kind="dir")

    commands = (
        ("generate", cmd_generate, "outputs of a trained run (JSON lines)"),
        ("eval", cmd_eval, "BLEU/NIST/METEOR/ROUGE-L/CIDEr/TER (E2E, DART) or ROUGE (XSum)"),
    )
    for name, func, text in commands:
        g = psub.add_parser(name, help=text)
        add_dataclass_arguments(g, RunInput)
        data = ("task", "source_field", "target_field", "split", "limit", "spread")
        data += ("lowercase",) if name == "eval" else ()
        add_dataclass_arguments(g, DataOptions, only=data)
        decode = {"num_beams": 5, "max_new_tokens": 64, "batch_size": 16}  # the paper's beam
        add_dataclass_arguments(g, DecodeOptions, defaults=decode)
        add_dataclass_arguments(g, PrefixDecodeCommand)
        add_dataclass_arguments(g, PrefixBaseInput)
        what = {
            "generate": "a .jsonl file of the outputs; an interrupted run keeps its finished "
            "batches beside it (F.partial/) and the same command resumes them",
            "eval": "a .json file of the scores and outputs",
        }
        run = ("output", "restart", "quiet", "json", "device", "dtype")
        add_dataclass_arguments(g, RunOptions, only=run, helps={"output": what[name]})
        if name == "generate":
            add_dataclass_arguments(g, PrefixGenerateCommand)
        add_data_dir(g)
        suffix = (".jsonl",) if name == "generate" else (".json",)
        g.set_defaults(func=func, output_kind="file", output_suffixes=suffix)

    a = psub.add_parser("analyze", help="attention maps and the spectrum plot (PNG)")
    add_dataclass_arguments(a, RunInput)
    add_dataclass_arguments(a, PrefixAnalyzeCommand)
    data = {"split": "validation", "limit": 64}  # the paper averages 1000 inputs
    data_flags = ("task", "source_field", "target_field", "split", "limit")
    add_dataclass_arguments(a, DataOptions, only=data_flags, defaults=data)
    out = {"output": "outputs/prefix-analysis"}
    add_dataclass_arguments(a, PrefixBaseInput)
    add_dataclass_arguments(a, RunOptions, only=("output", "device", "dtype"), defaults=out)
    add_data_dir(a)
    a.set_defaults(func=cmd_analyze, output_kind="dir")
