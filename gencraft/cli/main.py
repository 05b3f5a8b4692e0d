"""The ``gencraft`` command line: ``gencraft --help`` lists the commands."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gencraft.config import REQUIRED, option
from gencraft.errors import GencraftError, Interrupted

#: command modules with ``add_parser(subparsers, add_data_dir)``; a new method adds its own
METHOD_COMMANDS = (
    "gencraft.cli.pointer",
    "gencraft.cli.focus",
    "gencraft.cli.search",
    "gencraft.cli.prefix",
    "gencraft.cli.recurrence",
    "gencraft.cli.hso",
    "gencraft.cli.nar",
    "gencraft.studies.cli",
    "gencraft.studies.payload_cli",
)


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions

    add_dataclass_arguments(p, DataOptions, only=("data_dir",))


@dataclass
class DataStatsCommand:
    name: str = option(
        REQUIRED, "wikitext-2, wikitext-103, ptb, xsum, cnndm, e2e, webnlg or dart", positional=True
    )
    split: str | None = option(None, "one split only (default: all)")


@dataclass
class DataExportCommand:
    name: str = option(
        REQUIRED,
        "a named dataset: wikitext-2, wikitext-103, ptb (a text file per split), or xsum, "
        "cnndm, e2e, webnlg, dart (JSON lines of source and target)",
        positional=True,
    )
    output: str = option(REQUIRED, "the file to write (.jsonl, .csv or .tsv for a task; .txt)")
    split: str = option("test", "the split to write")


@dataclass
class GenerateCommand:
    model: str = option(REQUIRED, "registered name, local path or hub id")
    prompt: list[str] = option([], "a prompt (repeatable)", repeat=True)
    prompt_file: str | None = option(None, "a text file with one prompt per line")
    context: list[str] = option(
        [],
        "a context (source) put before the prompt by --context-template: one per prompt "
        "(repeatable, in order) or one for all; --cad-alpha contrasts with the prompt alone",
        repeat=True,
    )
    context_template: str = option(
        "{context}\n\n{prompt}",
        "how a context and its prompt make the model's input: {context} and {prompt} are "
        "replaced, a typed \\n is a newline (default: '{context}\\n\\n{prompt}')",
    )


@dataclass
class EvalCommand:
    predictions: str = option(REQUIRED, ".txt (one per line) or .jsonl")
    references: str = option(
        REQUIRED, ".txt or .jsonl (a 'references' list allows several per item)"
    )
    sources: str | None = option(None, "source documents (for novel, r1p_source)")
    metrics: str = option(
        "rouge,bleu,length",
        "comma-separated: rouge,bleu,bertscore,distinct,repetition,length,novel,r1p_source",
    )
    field: str | None = option(None, "jsonl field holding the predictions")


@dataclass
class DemoCommand:
    ppl_tokens: int = option(2000, "WikiText-2 test words to score")
    fame_seconds: float = option(12.0, "FAME head training budget (seconds)")
    pointer_seconds: float = option(10.0, "pointer head training budget (seconds)")
    prefix_seconds: float = option(12.0, "prefix training budget (seconds)")
    nar_seconds: float = option(12.0, "RUM-SUNDAE training budget (seconds)")


def data_stats(name: str, split: str | None, data_dir: str | None) -> list[dict]:
    """Rows of statistics for dataset ``name`` (Table-1 style for LM corpora)."""
    from gencraft import data
    from gencraft.metrics import mean_length

    if name in data.LM_CORPORA:
        splits = (split,) if split else ("train", "valid", "test")
        corpus = data.load_lm_corpus(name, data_dir, splits)
        return [{"split": s, **v} for s, v in corpus.stats().items()]
    rows = []
    if name in data.SUMMARIZATION_DATASETS:
        for s in (split,) if split else ("train", "validation", "test"):
            ex = data.load_summarization(name, s, data_dir)
            rows.append(
                {
                    "split": s,
                    "examples": len(ex),
                    "doc_words": mean_length([e.document for e in ex]),
                    "summary_words": mean_length([e.summary for e in ex]),
                }
            )
        return rows
    if name in data.DATA_TO_TEXT_DATASETS:
        for s in (split,) if split else ("train", "validation", "test"):
            try:
                ex = data.load_data_to_text(name, s, data_dir)
            except GencraftError as err:
                if split:
                    raise
                rows.append({"split": s, "examples": None, "note": str(err)})
                continue
            rows.append(
                {
                    "split": s,
                    "examples": len(ex),
                    "references": sum(len(e.references) for e in ex),
                    "input_words": mean_length([e.input for e in ex]),
                }
            )
        return rows
    raise GencraftError(f"unknown dataset {name!r}; choose one of {', '.join(data.DATASETS)}")


def export_dataset(name: str, split: str, output: str, data_dir: str | None) -> int:
    """Write ``split`` of a named dataset in the own-data formats (docs/datasets.md): an LM
    corpus as plain text, one line per line, ``<unk>`` kept; a task as ``source`` and
    ``target`` fields, several references as a list (.jsonl) or repeated rows (.csv/.tsv).
    Returns the lines written."""
    import csv

    from gencraft import data
    from gencraft.data.tasks import references_of, source_of, task_examples

    out = Path(output)
    if name in data.LM_CORPORA:
        corpus = data.load_lm_corpus(name, data_dir, (split,))
        lines = corpus.lines[data.lm.normalize_split(split, data.lm.LM_SPLITS)]
        out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return len(lines)
    examples = task_examples(name, split, data_dir)
    if out.suffix in (".csv", ".tsv"):
        with out.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter="\t" if out.suffix == ".tsv" else ",")
            w.writerow(["source", "target"])
            rows = [(source_of(e), r) for e in examples for r in references_of(e)]
            w.writerows(rows)
        return len(rows)
    with out.open("w", encoding="utf-8") as f:
        for e in examples:
            refs = references_of(e)
            target = refs if len(refs) > 1 else refs[0]
            f.write(
                json.dumps({"source": source_of(e), "target": target}, ensure_ascii=False) + "\n"
            )
    return len(examples)


#: what ``data export`` writes: a task's JSON lines, CSV or TSV, or a corpus's text
EXPORT_SUFFIXES = (".jsonl", ".csv", ".tsv", ".txt")


def cmd_data_export(args: argparse.Namespace) -> None:
    from gencraft import data

    corpus = args.name in data.LM_CORPORA
    if (Path(args.output).suffix.lower() == ".txt") != corpus:
        want = ".txt (a text corpus)" if corpus else ".jsonl, .csv or .tsv (a task)"
        raise GencraftError(f"--output {args.output}: {args.name} is written as {want}")
    n = export_dataset(args.name, args.split, args.output, args.data_dir)
    print(f"{args.name} {args.split}: {n} lines -> {args.output}")


def cmd_data_stats(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table

    rows = data_stats(args.name, args.split, args.data_dir)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))


def cmd_models(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.models import list_models

    rows = [{"name": m.name, "task": m.task, "description": m.description} for m in list_models()]
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))


def _with_contexts(
    args: argparse.Namespace, prompts: list[str], settings: Any, model: Any
) -> tuple[list[str], list[str] | None]:
    """The model's inputs (each prompt with its ``--context`` by ``--context-template``) and,
    with ``--cad-alpha``, CAD's context-free inputs: the prompts alone, or an empty source for
    an encoder-decoder without ``--context``."""
    from gencraft.models.introspect import is_encoder_decoder

    contexts = list(args.context)
    if contexts and len(contexts) not in (1, len(prompts)):
        raise GencraftError(
            f"give one --context per prompt ({len(prompts)}) or one for all, not {len(contexts)}"
        )
    contexts = contexts * len(prompts) if len(contexts) == 1 else contexts
    inputs = (
        [
            args.context_template.replace("{context}", c).replace("{prompt}", p)
            for c, p in zip(contexts, prompts, strict=True)
        ]
        if contexts
        else prompts
    )
    if settings.cad_alpha is None:
        return inputs, None
    if contexts:
        return inputs, prompts
    if is_encoder_decoder(model):
        return inputs, [""] * len(prompts)
    raise GencraftError(
        "--cad-alpha needs --context for a decoder-only model: CAD contrasts the prompt with "
        "its context against the prompt alone"
    )


def _cad_kwargs(alpha: float) -> dict[str, Any]:
    from gencraft.search.custom_generate import context_aware

    return {"custom_generate": context_aware, "cad_alpha": alpha}


def _prompts(args: argparse.Namespace) -> list[str]:
    """The prompts of ``--prompt`` and ``--prompt-file``, refused in one line when none is
    given or one is empty."""
    prompts = list(args.prompt or [])
    if args.prompt_file:
        from gencraft.cli.options import read_prompt_file

        prompts += read_prompt_file(args.prompt_file)
    if not prompts:
        raise GencraftError("give at least one --prompt or a --prompt-file")
    empty = [str(i + 1) for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        raise GencraftError(f"--prompt number {', '.join(empty)} is empty; give text to continue")
    return prompts


def _refuse_run_folder(model: str) -> None:
    """A method's run folder given as ``--model`` names the command that generates with it:
    a plug-in (FAME, a prefix...) is no plain transformers checkpoint, and a run folder holds
    its model in ``best/``."""
    from gencraft.models.method import LEGACY_CONFIGS, METHOD_CONFIG
    from gencraft.training.run import RUN_COMMANDS, run_method

    folder = Path(model).expanduser()
    d = folder / "best" if (folder / "best").is_dir() else folder
    found = run_method(d) if folder.is_dir() else None
    if found is None:
        return
    plug_in = any((d / f).is_file() for f in (METHOD_CONFIG, *LEGACY_CONFIGS))
    plain = not plug_in and (d / "config.json").is_file()
    if plain and d == folder:
        return  # a fine-tuned control's model folder: a transformers checkpoint
    verb = RUN_COMMANDS.get(found, ("--help",))[0]
    also = f", or give its model folder, --model {d}" if plain else ""
    raise GencraftError(
        f"--model {model} is a gencraft {found} run, not a plain model; generate with it by "
        f"`gencraft {found} {verb} {model}`{also}"
    )


def _template(args: argparse.Namespace) -> str:
    """``--context-template`` with ``\\n``/``\\t`` typed on a command line made real, refused
    when it lacks ``{context}`` or ``{prompt}`` or names another ``{field}``."""
    import re

    template = args.context_template.replace("\\n", "\n").replace("\\t", "\t")
    if args.context:
        unknown = sorted(set(re.findall(r"\{(\w*)\}", template)) - {"context", "prompt"})
        if unknown:
            raise GencraftError(
                f"--context-template names {', '.join('{' + u + '}' for u in unknown)}; "
                "it takes only {context} and {prompt}"
            )
        if not all(k in template for k in ("{context}", "{prompt}")):
            raise GencraftError("--context-template must hold {context} and {prompt}")
    return template


def _generate_all(
    args: argparse.Namespace,
    settings: Any,
    model: Any,
    tok: Any,
    inputs: list,
    negatives: list | None,
) -> list[str]:
    """Every input's text, a ``generate`` call per batch, sharded over the processes; with
    ``--output``, finished batches are kept beside it and only the same run resumes them."""
    from gencraft.cli.options import output_fingerprint, partial_folder
    from gencraft.distributed import announce, map_sharded
    from gencraft.models.generate import generate_text
    from gencraft.progress import tqdm
    from gencraft.search.mbr import mbr_generate_text

    chat = {"auto": None, "on": True, "off": False}[settings.chat]
    extra = {} if settings.cad_alpha is None else _cad_kwargs(settings.cad_alpha)

    def batch_texts(indices: list[int]) -> list[str]:  # one generate call per batch
        texts, seed = [inputs[i] for i in indices], settings.seed + indices[0]
        kw = dict(chat=chat, seed=seed, **settings.generate_kwargs())
        if settings.mbr:
            mbr = dict(n=settings.mbr, utility=settings.mbr_utility, epsilon=settings.epsilon)
            return mbr_generate_text(model, tok, texts, **mbr, **kw)
        free = None if negatives is None else [negatives[i] for i in indices]
        return generate_text(model, tok, texts, negative_prompts=free, **kw, **extra)

    announce("generate", len(inputs), args.batch_size)
    partial, made_by = partial_folder(args.output), None
    if partial is not None:
        decoding = {k: v for k, v in asdict(settings).items() if k != "seed"}
        given = {"inputs": inputs, "context-free inputs": negatives}
        made_by = output_fingerprint(model, args.model, given, decoding, settings.seed)
    bar = tqdm(total=len(inputs), desc="generate", disable=len(inputs) < 2)
    texts = map_sharded(
        batch_texts,
        len(inputs),
        args.batch_size,
        partial_dir=partial,
        fingerprint=made_by,
        on_batch=bar.update,
    )
    bar.close()
    return texts


def cmd_generate(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import JsonLines, partial_folder
    from gencraft.distributed import is_main
    from gencraft.models import load_model
    from gencraft.models.settings import GenerationSettings

    settings = dataclass_from_args(GenerationSettings, args)
    prompts = _prompts(args)
    args.context_template = _template(args)  # refused before the model loads
    _refuse_run_folder(args.model)
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    inputs, negatives = _with_contexts(args, prompts, settings, model)
    texts = _generate_all(args, settings, model, tok, inputs, negatives)
    if not is_main():  # only the main process writes
        return
    with JsonLines(args.output) as out:
        for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
            given = args.context[i if len(args.context) > 1 else 0] if args.context else None
            out.write(
                {"id": i, "prompt": prompt, **({"context": given} if given else {}), "output": text}
            )
    if args.output:
        shutil.rmtree(partial_folder(args.output), ignore_errors=True)
        print(f"{len(out.lines)} outputs -> {args.output}")
    for line in [] if args.output else out.lines:
        row = json.loads(line)
        print(line if args.json else f">>> {row['prompt']}\n{row['output']}\n")


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import evaluate_files, format_table

    names = [m.strip() for m in args.metrics.split(",") if m.strip()]
    results = evaluate_files(args.predictions, args.references, args.sources, names, args.field)
    if args.json:
        print(json.dumps(results))
    else:
        print(format_table([{"metric": k, "value": v} for k, v in results.items()]))


def cmd_demo(args: argparse.Namespace) -> None:
    from gencraft.cli.demo import run_demo

    run_demo(
        data_dir=args.data_dir,
        ppl_tokens=args.ppl_tokens,
        device=args.device,
        output=args.output,
        fame_seconds=args.fame_seconds,
        pointer_seconds=args.pointer_seconds,
        prefix_seconds=args.prefix_seconds,
        nar_seconds=args.nar_seconds,
    )


def _add_data_parser(sub: Any) -> None:
    """``gencraft data stats|export``."""
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import RunOptions

    p = sub.add_parser("data", help="dataset utilities")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    s = dsub.add_parser("stats", help="statistics of a dataset (Table-1 style for LM corpora)")
    add_dataclass_arguments(s, DataStatsCommand)
    add_dataclass_arguments(s, RunOptions, only=("json",))
    _add_data_dir(s)
    s.set_defaults(func=cmd_data_stats)
    x = dsub.add_parser("export", help="write a named dataset in the own-data formats")
    add_dataclass_arguments(x, DataExportCommand)
    add_dataclass_arguments(x, RunOptions, only=("restart",))
    _add_data_dir(x)
    x.set_defaults(func=cmd_data_export, output_kind="file", output_suffixes=EXPORT_SUFFIXES)


def build_parser() -> argparse.ArgumentParser:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DecodeOptions, RunOptions
    from gencraft.models.settings import GenerationSettings

    parser = argparse.ArgumentParser(prog="gencraft", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list registered model names")
    add_dataclass_arguments(p, RunOptions, only=("json",))
    p.set_defaults(func=cmd_models)

    _add_data_parser(sub)

    p = sub.add_parser("generate", help="generate text with a model")
    add_dataclass_arguments(p, GenerateCommand)
    add_dataclass_arguments(p, GenerationSettings)
    add_dataclass_arguments(
        p,
        DecodeOptions,
        only=("batch_size",),
        helps={
            "batch_size": "prompts per generate call (sampling: a batch is seeded with --seed "
            "plus its first prompt's index)"
        },
    )
    add_dataclass_arguments(
        p,
        RunOptions,
        only=("device", "dtype", "json", "output", "restart"),
        helps={
            "output": "a .jsonl file of id, prompt and output; an interrupted run keeps its "
            "finished batches beside it (F.partial/) and the same command resumes them"
        },
    )
    p.set_defaults(func=cmd_generate, output_kind="file", output_suffixes=(".jsonl",))

    p = sub.add_parser("eval", help="score predictions against references")
    add_dataclass_arguments(p, EvalCommand)
    add_dataclass_arguments(p, RunOptions, only=("json",))
    p.set_defaults(func=cmd_eval)

    for module in METHOD_COMMANDS:  # each method (and reproduce) adds its own subcommands
        importlib.import_module(module).add_parser(sub, _add_data_dir)

    p = sub.add_parser("demo", help="the offline walk through every method (SmolLM2-135M)")
    add_dataclass_arguments(p, DemoCommand)
    add_dataclass_arguments(
        p,
        RunOptions,
        only=("output", "device"),
        defaults={"output": "outputs/demo"},
        helps={"output": "the folder the demo writes its runs and outputs to"},
    )
    _add_data_dir(p)
    p.set_defaults(func=cmd_demo, output_kind="dir")
    return parser


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)subcommand parser ``args`` went through, whose usage fits an error."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(getattr(args, action.dest, None) or "")
            if sub is not None:
                return _chosen(sub, args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gencraft.cli.flags import given_flags

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser.parse_known_args(argv)
    args.given = given_flags(parser, argv)  # flags written out, for "does not apply" checks
    if not sys.stderr.isatty():  # transformers' and the hub's own bars: no \r lines in logs
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if extra and not getattr(args, "takes_extra", False):  # the subcommand's usage (exit 2)
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        from gencraft.cli.options import check_options

        check_options(args)
        kind = getattr(args, "output_kind", None)
        if kind and getattr(args, "output", None):  # before anything loads or trains
            from gencraft.cli.options import check_output

            check_output(args.output, kind)
            if kind == "file":
                from gencraft.cli.options import claim_output

                claim_output(args)
        if getattr(args, "takes_extra", False):
            args.func(args, extra)
        else:
            args.func(args)
    except Interrupted as err:  # Ctrl-C during training: saved, one line, no traceback
        from gencraft.utils import world_rank

        if world_rank() == 0:  # one process says it
            print(f"gencraft: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("gencraft: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail
        return 141  # 128 + SIGPIPE
    except (GencraftError, ValueError) as err:
        print(f"gencraft: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
