"""``gencraft focus train|generate|eval``: FAME summarization (and its plain baseline)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gencraft.config import option


@dataclass
class FocusEvalCommand:
    bertscore: bool = option(True, "BERTScore beside ROUGE (--no-bertscore: skip it)")


def _examples(args: argparse.Namespace, split: str, limit: int | None, pairs: bool = False) -> list:
    """``split`` of ``--task``: XSum/CNN-DM, or your own data (a path). Own data's documents
    keep all their references for scoring; with ``pairs`` (training) each reference is one
    example."""
    from gencraft.cli.options import task_fields
    from gencraft.data import SummarizationExample, load_summarization
    from gencraft.data.summarization import SUMMARIZATION_DATASETS as SUMMARIZATION
    from gencraft.data.tasks import is_task_path, task_examples

    if args.task not in SUMMARIZATION and is_task_path(args.task):
        rows = task_examples(args.task, split, **task_fields(args))
        if pairs:
            rows = [SummarizationExample(e.id, e.source, r) for e in rows for r in e.references]
    else:
        rows = load_summarization(args.task, split, args.data_dir)
    return rows[:limit] if limit else rows


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import batch_note, default_output, say, task_fields
    from gencraft.data.own import own_task
    from gencraft.data.summarization import SUMMARIZATION_DATASETS as SUMMARIZATION
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.models import load_model
    from gencraft.utils import seed_everything

    cfg = dataclass_from_args(FocusTrainConfig, args)
    seed_everything(cfg.fit.seed)
    train = _examples(args, "train", args.train_examples, pairs=True)
    valid = _examples(args, "validation", args.valid_examples, pairs=True)
    base, tok = load_model(args.model, dtype=cfg.fit.dtype)
    tag = "fame" if cfg.focus else "base"
    out = default_output(args.output, "focus", args.task, args.model, tag)
    say(
        f"{'FAME' if cfg.focus else 'baseline'} on {args.model}: {len(train)} train / "
        f"{len(valid)} valid {args.task} documents -> {out}; "
        + batch_note(cfg.fit.batch_size, cfg.fit.grad_accum)
    )
    data = {"task": own_task(args.task, SUMMARIZATION), **task_fields(args)}
    trainer = FocusTrainer(
        base,
        tok,
        train,
        valid,
        cfg,
        out,
        base_name_or_path=args.model,
        data=data,
        progress=not args.quiet,
    )
    result = trainer.train(restart=args.restart)
    say(json.dumps(result, indent=2))


def _load(args: argparse.Namespace, command: str) -> tuple[Any, Any]:
    from gencraft.focus.train import load_summarizer

    return load_summarizer(args.checkpoint, command, device=args.device, dtype=args.dtype)


def _summaries(
    args: argparse.Namespace, partial: Path | None = None
) -> tuple[list, list[list[str]]]:
    """Every document's summaries, decoded on this process's share of the batches
    (:func:`gencraft.distributed.map_sharded`) and gathered in document order: each batch is
    the one a single process decodes, with its seeds (``--seed`` + 1000·sample + its first
    document's index), so the outputs do not depend on the process count. ``partial``: a
    folder keeping each process's finished batches, so an interrupted run resumes."""
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import output_fingerprint, use_run_task
    from gencraft.distributed import announce, map_sharded
    from gencraft.focus.config import FocusDecodeConfig
    from gencraft.focus.evaluate import summarize
    from gencraft.progress import tqdm

    decode = dataclass_from_args(FocusDecodeConfig, args)  # checked before any loading
    use_run_task(args, args.checkpoint, "xsum")  # the run's own data unless --task says
    model, tok = _load(args, args.func.__name__.removeprefix("cmd_"))
    docs = _examples(args, args.split, args.limit)
    announce(f"focus {decode.decoding}", len(docs), args.batch_size)

    def batch(indices: list[int]) -> list[list[str]]:
        if decode.cad_alpha is not None:  # CAD's beam search, as focus-vs-cad decodes
            return [[s] for s in _cad_batch(model, tok, [docs[i].document for i in indices], args)]
        groups = summarize(
            model,
            tok,
            [docs[i].document for i in indices],
            decoding=decode.decoding,
            samples=decode.samples,
            focus_k=decode.focus_k,
            num_beams=args.num_beams,
            max_source=decode.max_source,
            max_new_tokens=args.max_new_tokens,
            batch_size=len(indices),
            seed=args.seed + indices[0],
            progress=False,
        )
        return groups if decode.mbr_utility is None else _mbr_first(groups, decode.mbr_utility)

    made_by = None
    if partial is not None:  # what makes the summaries: only the same run resumes them
        settings = {**asdict(decode), "num_beams": args.num_beams, "max_new": args.max_new_tokens}
        texts = [d.document for d in docs]
        made_by = output_fingerprint(model, args.checkpoint, texts, settings, args.seed)
    bar = tqdm(total=len(docs), desc=f"summarize ({decode.decoding})", disable=args.quiet)
    groups = map_sharded(
        batch,
        len(docs),
        args.batch_size,
        partial_dir=partial,
        fingerprint=made_by,
        on_batch=bar.update,
    )
    bar.close()
    return docs, groups


def _cad_batch(model: Any, tok: Any, texts: list[str], args: argparse.Namespace) -> list[str]:
    """One batch's CAD summaries (:func:`cad_summaries`), from the command's plain values."""
    import torch

    with torch.no_grad():
        return cad_summaries(
            model.eval(),
            tok,
            texts,
            num_beams=args.num_beams,
            max_source=args.max_source,
            max_new_tokens=args.max_new_tokens,
            batch_size=len(texts),
            cad_alpha=args.cad_alpha,
        )


def _mbr_first(groups: list[list[str]], utility: str) -> list[list[str]]:
    """Each document's summaries with MBR's choice among them moved first (the prediction)."""
    from gencraft.metrics.mbr import mbr_select

    best = mbr_select(groups, utility).index
    return [[g[i], *g[:i], *g[i + 1 :]] for g, i in zip(groups, best, strict=True)]


def cmd_generate(args: argparse.Namespace) -> None:
    from gencraft.cli.options import JsonLines, partial_folder
    from gencraft.distributed import is_main

    def record(d: Any, g: list[str]) -> dict:
        # "prediction": the first summary, so the file feeds `gencraft eval --field prediction`
        refs = list(d.references) if hasattr(d, "references") else [d.summary]
        return {"id": d.id, "prediction": g[0], "summaries": g, "references": refs}

    # an interrupted run keeps its finished batches beside --output; the same run resumes them
    partial = partial_folder(args.output)
    docs, groups = _summaries(args, partial)
    if not is_main():  # only the main process writes
        return
    with JsonLines(args.output) as out:
        for d, g in zip(docs, groups, strict=True):
            out.write(record(d, g))
    if partial is not None:
        shutil.rmtree(partial, ignore_errors=True)
    if args.output:
        print(f"{len(out.lines)} documents -> {args.output}")
    elif args.json:
        print("\n".join(out.lines))
    else:
        for line in out.lines:
            r = json.loads(line)
            print(f"{r['id']}: {r['prediction']}")


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.data.tasks import references_of
    from gencraft.distributed import is_main
    from gencraft.focus.evaluate import diversity_metrics, summary_metrics

    docs, groups = _summaries(args)
    if not is_main():  # only the main process scores and prints
        return

    refs, texts = [references_of(d) for d in docs], [d.document for d in docs]
    empty = sum(not s.strip() for g in groups for s in g)
    total = sum(len(g) for g in groups)
    if empty:
        print(
            f"gencraft: warning: {empty} of {total} summaries are empty; they score 0"
            + (" (all of them: is this model trained?)" if empty == total else ""),
            file=sys.stderr,
        )
    bs = args.bertscore
    if args.samples > 1 and args.mbr_utility is None:
        row = diversity_metrics(groups, refs, texts, with_bertscore=bs, task=args.task)
    else:
        firsts = [g[0] for g in groups]
        row = summary_metrics(firsts, refs, texts, with_bertscore=bs, task=args.task)
    result = {
        "checkpoint": args.checkpoint,
        "data": args.task,
        "split": args.split,
        "documents": len(docs),
        "decoding": args.decoding,
        "samples": args.samples,
        **({"mbr_utility": args.mbr_utility} if args.mbr_utility else {}),
        **row,
    }
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    from gencraft.cli.evaluate import format_table

    head = ("checkpoint", "data", "split", "documents", "decoding", "samples")
    print(", ".join(f"{k} {result[k]}" for k in head))
    print(format_table([{k: v for k, v in result.items() if k not in head}]))


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions, DecodeOptions, ModelInput, RunInput, RunOptions
    from gencraft.focus.config import FocusDecodeConfig, FocusTrainConfig

    p = sub.add_parser("focus", help="FAME focus attention and focus sampling (summarization)")
    fsub = p.add_subparsers(dest="focus_command", required=True)

    t = fsub.add_parser("train", help="fine-tune a model with FAME (or the plain baseline)")
    add_dataclass_arguments(t, ModelInput)
    tasks = ("task", "source_field", "target_field", "train_examples", "valid_examples")
    add_dataclass_arguments(t, DataOptions, only=tasks, defaults={"task": "xsum"})
    add_dataclass_arguments(t, FocusTrainConfig)
    add_dataclass_arguments(t, RunOptions, only=("output", "restart", "quiet"))
    add_data_dir(t)
    t.set_defaults(func=cmd_train, output_kind="dir")

    commands = (
        ("generate", cmd_generate, "write summaries as JSON lines"),
        ("eval", cmd_eval, "summaries + FAME's Table 1/2 metrics"),
    )
    for name, func, text in commands:
        g = fsub.add_parser(name, help=text)
        add_dataclass_arguments(g, RunInput)
        data = ("task", "source_field", "target_field", "split", "limit")
        add_dataclass_arguments(g, DataOptions, only=data)
        add_dataclass_arguments(g, FocusDecodeConfig)
        add_dataclass_arguments(g, DecodeOptions)
        run = ("seed", "device", "dtype", "output", "restart", "quiet", "json")
        what = {
            "generate": "a .jsonl file of the summaries; an interrupted run keeps its finished "
            "batches beside it (F.partial/) and the same command resumes them",
            "eval": "a .json file of the scores",
        }
        add_dataclass_arguments(g, RunOptions, only=run, helps={"output": what[name]})
        if name == "eval":
            add_dataclass_arguments(g, FocusEvalCommand)
        add_data_dir(g)
        suffix = (".jsonl",) if name == "generate" else (".json",)
        g.set_defaults(func=func, output_kind="file", output_suffixes=suffix)


def cad_summaries(
    model: Any,
    tok: Any,
    docs: list[str],
    *,
    num_beams: int,
    max_source: int,
    max_new_tokens: int,
    batch_size: int,
    cad_alpha: float | None = None,
) -> list[str]:
    """Beam-search summaries of ``docs`` (gencraft's beam search, ``generate``'s defaults:
    length penalty 1, no early stopping), plain (``cad_alpha`` None) or with CAD by two
    streams, whose context-free stream is the same model's base (FAME's without the focus
    bias) on the empty source (the tokenizer's encoding of ``""``, or EOS)."""
    from gencraft.focus.data import SummaryEncoder, collate
    from gencraft.models.cad import CADSettings, ContrastStepper, context_free_inputs
    from gencraft.models.stepping import HFStepper
    from gencraft.search import beam_search_batch

    cad = None if cad_alpha is None else CADSettings(cad_alpha)
    base = getattr(model, "base", model)
    ed = bool(base.config.is_encoder_decoder)  # a causal LM's prompts pad on the left
    enc = SummaryEncoder(tok, ed, max_source=max_source)
    pad = tok.pad_token_id if tok.pad_token_id is not None else enc.eos_id
    kw = dict(max_new_tokens=max_new_tokens)
    out = []
    for i in range(0, len(docs), batch_size):
        chunk = docs[i : i + batch_size]
        batch = collate(
            [{"input_ids": enc.encode(d)["input_ids"]} for d in chunk], pad, left=not ed
        )
        stepper: Any = HFStepper(
            model, batch["input_ids"], attention_mask=batch["attention_mask"], **kw
        )
        if cad is not None:
            empty = [enc.encode("")["input_ids"]] * len(chunk)
            ids, mask = context_free_inputs(empty, pad, left=not ed, empty=enc.eos_id)
            plain = HFStepper(base, ids, attention_mask=mask, **kw)
            # FAME's own state stays out of the context-free stream's calls of its base
            stepper = ContrastStepper(stepper, plain, cad, getattr(model, "bypassed", None))
        hyps = beam_search_batch(
            stepper,
            num_beams=num_beams,
            eos_token_id=enc.eos_id,
            length_penalty=1.0,
            early_stopping=False,
            **kw,
        )
        out += [tok.decode(h[0].tokens, skip_special_tokens=True).strip() for h in hyps]
    return out
