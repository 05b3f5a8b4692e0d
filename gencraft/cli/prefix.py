"""``gencraft prefix train|generate|eval|analyze``: DASP prefix-tuning (and its fine-tuning
controls) on E2E, DART and XSum."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _prefix_config(args: argparse.Namespace) -> Any:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.prefix import PrefixConfig

    return dataclass_from_args(PrefixConfig, args, segmenter=args.segmenter)


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.prefix.config import PrefixTrainConfig
    from gencraft.prefix.train import train

    cfg = dataclass_from_args(PrefixTrainConfig, args)
    prefix = _prefix_config(args)
    out = Path(args.output or f"outputs/prefix-{cfg.task}-{Path(cfg.model).name}-{cfg.method}")
    print(f"{cfg.method} on {cfg.model}, {cfg.task}: -> {out}")
    summary = train(
        cfg, prefix, out, data_dir=args.data_dir, progress=not args.quiet, restart=args.restart
    )
    summary.pop("history", None)
    print(json.dumps(summary, indent=2))


def _load(checkpoint: str) -> tuple[Any, Any, dict]:
    from gencraft.prefix.variants import rebuild_finetuned
    from gencraft.training import load_run

    return load_run(checkpoint, build=rebuild_finetuned)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from gencraft.prefix.evaluate import evaluate

    model, tok, meta = _load(args.checkpoint)
    task = args.task or meta["train"]["task"]
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
    )


def cmd_generate(args: argparse.Namespace) -> None:
    if args.source:
        from gencraft.prefix.evaluate import generate_outputs

        model, tok, _ = _load(args.checkpoint)
        outs = generate_outputs(
            model,
            tok,
            args.source,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens or 64,
            progress=not args.quiet,
        )
        for s, o in zip(args.source, outs, strict=True):
            print(json.dumps({"source": s, "output": o}))
        return
    result = _run(args)
    lines = [json.dumps({"prediction": o}) for o in result["outputs"]]
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("\n".join(lines) + "\n")
        print(f"{len(lines)} outputs -> {args.output}")
    else:
        print("\n".join(lines))


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table

    result = _run(args)
    outputs = result.pop("outputs")
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
        )
        print(format_table([row]))
        print(f"scored by score_task: {convention}")


def cmd_analyze(args: argparse.Namespace) -> None:
    from gencraft.data.tasks import source_of, task_examples
    from gencraft.models.prompts import pad_batch
    from gencraft.prefix.analysis import (
        collect_attention,
        plot_attention_maps,
        plot_spectrum,
        spectrum_by_depth,
    )

    out = Path(args.output_dir)
    curves, maps = {}, None
    for checkpoint in [args.checkpoint, *args.compare]:
        model, tok, meta = _load(checkpoint)
        if not hasattr(model, "recording"):
            from gencraft.errors import GencraftError

            raise GencraftError(f"{checkpoint} is a fine-tuned model without prefixes")
        task = args.task or meta["train"]["task"]
        examples = task_examples(task, args.split, args.data_dir)[: args.limit]
        rows = [
            {"input_ids": tok(source_of(e), add_special_tokens=False)["input_ids"][:128]}
            for e in examples
        ]
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        batches = [pad_batch(rows[i : i + 8], pad) for i in range(0, len(rows), 8)]
        attention = collect_attention(model, batches)
        p = model.num_virtual_tokens
        if maps is None:  # the maps of the first checkpoint; the spectrum of every one
            maps = plot_attention_maps(attention, p, out / "attention_maps.png", title=checkpoint)
        label = "/".join(Path(checkpoint).parts[-2:])  # e.g. dense/best
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
    from gencraft.prefix import PrefixConfig
    from gencraft.prefix.config import PrefixTrainConfig

    p = sub.add_parser(
        "prefix", help="DASP prefix-tuning: blocking (UniBlock/HierBlock), sparse attention"
    )
    psub = p.add_subparsers(dest="prefix_command", required=True)
    t = psub.add_parser("train", help="train prefixes (or fine-tune) on e2e, dart or xsum")
    add_dataclass_arguments(t, PrefixTrainConfig)
    add_dataclass_arguments(t, PrefixConfig, exclude=("segmenter",))
    t.add_argument(
        "--segmenter",
        choices=("uniform", "sentence"),
        default="uniform",
        help="how tokens get segments (default: uniform)",
    )
    t.add_argument("--output", default=None, help="output directory (a re-run resumes it)")
    t.add_argument("--restart", action="store_true", help="discard a run already in --output")
    t.add_argument("--quiet", action="store_true")
    add_data_dir(t)
    t.set_defaults(func=cmd_train)

    commands = (
        ("generate", cmd_generate, "outputs of a trained run (JSON lines)"),
        ("eval", cmd_eval, "BLEU/NIST/METEOR/ROUGE-L/CIDEr/TER (E2E, DART) or ROUGE (XSum)"),
    )
    for name, func, text in commands:
        g = psub.add_parser(name, help=text)
        g.add_argument("checkpoint", help="a trained directory (best/ or last/)")
        g.add_argument(
            "--task",
            choices=("e2e", "dart", "xsum"),
            default=None,
            help="default: the task it was trained on",
        )
        g.add_argument("--split", default="test")
        g.add_argument("--limit", type=int, default=None, help="first N inputs")
        g.add_argument(
            "--spread",
            action="store_true",
            help="with --limit: N inputs evenly spaced over the split",
        )
        g.add_argument("--num-beams", type=int, default=5, help="beam size (paper: 5)")
        g.add_argument("--max-new-tokens", type=int, default=None)
        g.add_argument("--batch-size", type=int, default=16)
        g.add_argument("--output", default=None)
        g.add_argument("--quiet", action="store_true")
        if name == "generate":
            g.add_argument("--source", nargs="+", default=None, help="inputs given as text")
        else:
            g.add_argument("--json", action="store_true")
        add_data_dir(g)
        g.set_defaults(func=func)

    a = psub.add_parser("analyze", help="attention maps and the spectrum plot (PNG)")
    a.add_argument("checkpoint")
    a.add_argument(
        "--compare", nargs="+", default=[], help="more checkpoints whose spectra share the plot"
    )
    a.add_argument("--task", choices=("e2e", "dart", "xsum"), default=None)
    a.add_argument("--split", default="validation")
    a.add_argument("--limit", type=int, default=64, help="inputs averaged (paper: 1000)")
    a.add_argument("--output-dir", required=True)
    add_data_dir(a)
    a.set_defaults(func=cmd_analyze)
