"""``gencraft reproduce NAME``: run a named experiment of docs/results/ into a report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from gencraft.config import option
from gencraft.errors import GencraftError


def cmd_reproduce(args: argparse.Namespace, extra: list[str]) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.studies.runner import experiments, get_experiment, reproduce

    if args.name == "claims":
        cmd_claims(args, extra)
        return
    if args.list and args.name:  # one experiment: its settings at each scale
        exp = get_experiment(args.name)
        print(f"{exp.name}: {exp.title} (scales: {', '.join(exp.scales)})")
        print(format_table(_settings_rows(exp)))
        return
    if args.list or not args.name:
        rows = [
            {
                "name": e.name,
                "scales": ",".join(e.scales),
                "CPU min (2 cores)": e.cpu_minutes,
                "processes": "N" if e.shardable else "1",
                "what": e.title,
            }
            for e in experiments().values()
        ]
        print(format_table(rows))
        print("\nclaims: every claim's verdict from the committed runs (no model runs)")
        if not args.list:
            print("\ngencraft reproduce NAME [--scale cpu|gpu|tiny] [--output DIR] [--FIELD V]")
        return
    exp = get_experiment(args.name)
    overrides = _overrides(exp.settings, extra, args.name)
    report = reproduce(
        args.name, scale=args.scale, output=args.output, overrides=overrides, restart=args.restart
    )
    print(report.read_text())
    print(f"wrote {report}")


@dataclass
class ClaimsOptions:
    runs: str | None = option(
        None, "the committed runs (default: docs/results/runs of this checkout)"
    )
    data_dir: str | None = option(None, "datasets directory (labels and references)")


def _default_runs() -> Path:
    import gencraft

    return Path(gencraft.__file__).resolve().parents[1] / "docs" / "results" / "runs"


def cmd_claims(args: argparse.Namespace, extra: list[str]) -> None:
    """``gencraft reproduce claims --output DIR``: claims.json and claims.md from the
    committed runs, every verdict by the one rule."""
    import os

    from gencraft.studies.claims import claim_rows, write_claims
    from gencraft.studies.claims_report import verdict_counts

    opts = _overrides(ClaimsOptions, extra, "claims")
    if not args.output:
        raise GencraftError("reproduce claims needs --output DIR (claims.json, claims.md)")
    runs = Path(opts.get("runs") or _default_runs())
    if not runs.is_dir():
        raise GencraftError(f"no runs folder {runs}: give the committed runs with --runs DIR")
    data_dir = opts.get("data_dir") or os.environ.get("GENCRAFT_DATA_DIR")
    rows = claim_rows(runs, data_dir)
    js, md = write_claims(rows, Path(args.output))
    print(f"{len(rows)} claims: {verdict_counts(rows)}")
    print(f"wrote {js} and {md}")


def _settings_rows(exp: Any) -> list[dict[str, Any]]:
    """One row per setting of ``exp``: its value at each scale."""
    by_scale = {scale: exp.settings_for(scale, None) for scale in exp.scales}
    return [
        {
            "setting": "--" + f.name.replace("_", "-"),
            **{s: getattr(v, f.name) for s, v in by_scale.items()},
        }
        for f in fields(next(iter(by_scale.values())))
    ]


def _overrides(settings: type, extra: list[str], name: str) -> dict[str, Any]:
    """Settings given as ``--field value`` after the experiment's name."""
    import dataclasses

    from gencraft.cli.flags import add_dataclass_arguments

    unset = object()  # not None: `--test-limit none` is a setting given, not left out
    parser = argparse.ArgumentParser(prog=f"gencraft reproduce {name}", add_help=False)
    add_dataclass_arguments(
        parser, settings, defaults={f.name: unset for f in dataclasses.fields(settings)}
    )
    try:
        known, unknown = parser.parse_known_args(extra)
    except SystemExit:
        raise GencraftError(f"bad settings for {name}: {' '.join(extra)}") from None
    if unknown:
        names = ", ".join("--" + f.name.replace("_", "-") for f in dataclasses.fields(settings))
        raise GencraftError(f"{name} has no setting {unknown[0]}; its settings: {names}")
    out = {}
    for k, v in vars(known).items():
        if v is not unset:
            out[k] = tuple(v) if isinstance(v, list) else v
    return out


@dataclass
class ReproduceCommand:
    name: str | None = option(None, "the experiment (see --list)", positional=True)
    list: bool = option(False, "list the experiments")
    scale: Literal["tiny", "cpu", "gpu", "slot"] = option(
        "cpu", "the experiment's size (slot: the campaign's GPU-slot sizes)"
    )


@dataclass
class VerdictCommand:
    folders: tuple[str, ...] = option(
        (), "the runs' output folders (each holding results.json)", positional=True
    )


def cmd_verdict(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.metrics.stats import verdict_cells
    from gencraft.studies.runner import folder_verdicts

    got = folder_verdicts(args.folders, args.data_dir)
    runs = f"{len(args.folders)} run{'s' if len(args.folders) > 1 else ''}"
    if got.expected is not None:
        runs += f", {got.finished} of {got.expected} units finished"
        if got.finished < got.expected:
            runs += " (interim)"
    if not got.rows:
        print(f"{got.experiment.name}, {runs}: no comparison finished yet")
        return
    print(f"{got.experiment.name}, {runs} (95% intervals; p two-sided):")
    print(format_table([verdict_cells(v) for v in got.rows]))


@dataclass
class BenchmarkCommand:
    threads: int | None = option(None, "torch CPU threads")


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import RunOptions

    p = sub.add_parser(
        "reproduce",
        help="run a named experiment of docs/results/ and write its report",
        description="Run a named experiment (`--list` shows them) into OUTPUT/report.md with "
        "its tables and PNG plots; re-running resumes. Settings of the experiment can follow "
        "as --field value (e.g. --model tiny-llama).",
    )
    add_dataclass_arguments(p, ReproduceCommand)
    add_dataclass_arguments(p, RunOptions, only=("output", "restart"))
    p.set_defaults(func=cmd_reproduce, takes_extra=True, output_kind="dir")
    v = sub.add_parser(
        "verdict",
        help="the claims' verdicts pooled over saved runs (e.g. one per training seed)",
        description="The paired verdicts of one experiment's claims, pooled over the runs "
        "saved in FOLDERS (outputs of `gencraft reproduce`, e.g. the same command under "
        "several --seed), as the campaign pools a claim's runs.",
    )
    add_dataclass_arguments(v, VerdictCommand)
    add_data_dir(v)
    v.set_defaults(func=cmd_verdict)


def benchmark_main(doc: str, commands: dict[str, str], argv: list[str] | None = None) -> None:
    """The thin ``benchmarks/*.py`` scripts: ``python benchmarks/X.py COMMAND [--field V]``
    runs experiment ``commands[COMMAND]`` (flags generated from its settings) and prints the
    report. The experiments themselves live in the library (``gencraft reproduce``)."""
    import sys

    import torch

    from gencraft.cli.flags import add_dataclass_arguments, dataclass_from_args
    from gencraft.cli.options import RunOptions
    from gencraft.studies.runner import get_experiment, reproduce

    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for command, name in commands.items():
        exp = get_experiment(name)
        p = sub.add_parser(command, help=f"{name}: {exp.title}")
        add_dataclass_arguments(p, exp.settings)  # defaults: the settings dataclass's
        own = {f.name for f in fields(exp.settings)}
        add_dataclass_arguments(p, BenchmarkCommand, exclude=own)  # unless a setting
        add_dataclass_arguments(p, RunOptions, only=("output", "restart"))
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(commands) == 1 and (not argv or argv[0] not in commands):
        argv.insert(0, next(iter(commands)))  # a single experiment needs no command word
    args = ap.parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    name = commands[args.command]
    try:
        settings = dataclass_from_args(get_experiment(name).settings, args)
        values = {k: getattr(settings, k) for k in vars(args) if hasattr(settings, k)}
        report = reproduce(
            name, scale="cpu", output=args.output, overrides=values, restart=args.restart
        )
    except GencraftError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(report.read_text())
