"""``gencraft search beam|mode|errors``: gencraft's beam search, exact mode search, and search
errors (each beam width's output against the proven mode) on prompts, in batches of
``--batch-size`` (left-padded, one model call per step for the batch)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from gencraft.config import REQUIRED, option


@dataclass
class PromptInput:
    prompt: list[str] = option(
        REQUIRED, "the instructions (one user turn each for chat models)", positional=True
    )


@dataclass
class ErrorOptions:
    beams: tuple[int, ...] = option((1, 4), "beam widths (1: greedy)")
    seed_bound: bool = option(True, "exact search starts from the best finished beam output")


def _load(args: argparse.Namespace) -> tuple[Any, Any, list[list[int]]]:
    from gencraft.errors import GencraftError
    from gencraft.models import load_model
    from gencraft.search.prompts import encode_prompt

    if not args.prompt or any(not p.strip() for p in args.prompt):
        raise GencraftError("give one or more non-empty prompts")
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    prompts = [
        encode_prompt(tok, p)[0].tolist() if not args.raw else tok(p)["input_ids"]
        for p in args.prompt
    ]
    return model, tok, prompts


def _sharded(model: Any, tok: Any, prompts: list[list[int]], args: Any, desc: str, decode):
    """``decode(ids [b, P], mask [b, P]) -> one result per row`` over the prompts in
    left-padded batches of ``--batch-size``, shared among accelerate's processes
    (:func:`gencraft.distributed.map_sharded`: the one-process batches); every process gets
    every result, in prompt order."""
    from gencraft.distributed import announce, map_sharded
    from gencraft.models.prompts import left_padded_batches
    from gencraft.progress import tqdm

    announce(f"search {desc}", len(prompts), args.batch_size)
    bar = tqdm(total=len(prompts), desc=desc, disable=len(prompts) < 2)

    def batch(idx: list[int]) -> list[Any]:
        _, ids, mask = next(left_padded_batches(model, tok, [prompts[i] for i in idx], len(idx)))
        return list(decode(ids, mask))

    out = map_sharded(batch, len(prompts), args.batch_size, on_batch=bar.update)
    bar.close()
    return out


def _classifier(args: argparse.Namespace, model: Any) -> Any:
    """The trained classifier of ``--classifier DIR`` (``DIR`` or ``DIR/best``), aimed at
    ``--attribute``: a length (exactly N tokens) or ``not-degenerate``."""

    from gencraft.errors import GencraftError
    from gencraft.search.classifier import AttributeClassifier
    from gencraft.training import load_run

    if args.classifier is None:
        if args.attribute is not None:
            raise GencraftError("--attribute needs --classifier DIR")
        return None
    clf = load_run(args.classifier, method="search", command="beam --classifier", base=model).model
    if not isinstance(clf, AttributeClassifier):
        raise GencraftError(f"{args.classifier} holds a {type(clf).__name__}, not a classifier")
    kind = clf.config.attribute
    if kind == "length":
        n = args.force_length if args.attribute is None else None
        if args.attribute is not None:
            try:
                n = int(args.attribute)
            except ValueError:
                raise GencraftError(
                    f"a length classifier takes --attribute N (tokens), got {args.attribute!r}"
                ) from None
        if n is None or n < 0:
            raise GencraftError("a length classifier needs --attribute N (or --force-length N)")
        return clf.for_length(n, includes_eos=args.length_includes_eos)
    if args.attribute not in (None, "not-degenerate", "degenerate"):
        raise GencraftError(
            f"a degenerate classifier takes --attribute not-degenerate|degenerate, got "
            f"{args.attribute!r}"
        )
    clf.target_class = 1 if args.attribute == "degenerate" else 0
    return clf


def cmd_beam(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from gencraft.distributed import is_main
    from gencraft.search import BeamSettings, beam_search_batch

    conditional = args.classifier is not None
    settings = BeamSettings(  # checked here, before anything loads
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        finished=args.finished or ("on_beam" if conditional else "aside"),
        force_length=args.force_length,
        forced_eos=args.forced_eos,
        length_includes_eos=args.length_includes_eos,
        forced_ranking=args.forced_ranking,
    )
    model, tok, prompts = _load(args)
    clf = _classifier(args, model)
    if clf is not None:
        settings = replace(settings, classifier=clf, k=args.k)
    several = len(prompts) > 1

    def decode(ids: Any, mask: Any) -> list[Any]:
        return beam_search_batch(model, ids, mask, settings)

    found = _sharded(model, tok, prompts, args, "beam", decode)
    for i, hyps in enumerate(found if is_main() else []):  # only the main process prints
        for h in hyps:
            row = {
                "text": tok.decode(h.tokens),
                "log_prob": round(h.score, 4),
                "tokens": len(h.tokens),
                "finished": h.finished,
            }
            print(json.dumps({"input": i, **row} if several else row, ensure_ascii=False))


def cmd_mode(args: argparse.Namespace) -> None:
    from gencraft.distributed import is_main
    from gencraft.search import exact_mode_batch

    model, tok, prompts = _load(args)
    several = len(prompts) > 1

    def decode(ids: Any, mask: Any) -> list[Any]:
        return exact_mode_batch(
            model,
            ids,
            mask,
            max_new_tokens=args.max_new_tokens,
            length=args.length,
            max_nodes=args.max_nodes,
            length_includes_eos=args.length_includes_eos,
        )

    found = _sharded(model, tok, prompts, args, "mode", decode)
    for i, r in enumerate(found if is_main() else []):  # only the main process prints
        row = {
            "text": tok.decode(r.tokens),
            "log_prob": round(r.log_prob, 4),
            "tokens": len(r.tokens),
            "exact": r.exact,
            "nodes": r.nodes,
            "seconds": round(r.seconds, 2),
        }
        print(json.dumps({"input": i, **row} if several else row, ensure_ascii=False))


def cmd_errors(args: argparse.Namespace) -> None:
    """One JSON line per prompt: whether its mode was proven, the mode, and each width's
    output with its verdict (cut, unknown, equal, below); then the summary table."""
    from gencraft.distributed import is_main
    from gencraft.search.errors import check_beams, error_table, search_errors

    check_beams(args.beams)  # checked before the model loads
    model, tok, prompts = _load(args)

    def decode(ids: Any, mask: Any) -> list[Any]:
        return search_errors(
            model,
            ids,
            mask,
            beams=args.beams,
            max_nodes=args.max_nodes,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed_bound,
        )

    rows = _sharded(model, tok, prompts, args, "errors", decode)
    if not is_main():  # only the main process prints
        return
    for i, r in enumerate(rows):
        line = {
            "input": i,
            "proven": r.proven,
            "mode": tok.decode(r.mode_tokens),
            "mode_logprob": round(r.mode_logprob, 4),
            "mode_empty": r.mode_empty,
            "nodes": r.nodes,
            "searches": {
                k: {"text": tok.decode(o.tokens), "logprob": round(o.logprob, 4), "error": o.error}
                for k, o in r.searches.items()
            },
        }
        print(json.dumps(line, ensure_ascii=False))
    for line in error_table(rows):
        print(json.dumps({"summary": True, **line}, ensure_ascii=False))


def _classifier_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts a classifier's samples come from: the first ``--num-prompts`` of
    ``--prompt-file`` (one a line), of ``--task``'s training inputs, or of the XSum/E2E
    instruction prompts (``--prompts``). Refused in one line when two sources are given or
    none holds a prompt."""
    from gencraft.cli.flags import given_among
    from gencraft.errors import GencraftError
    from gencraft.search.prompts import instruction_texts

    clash = given_among(args, ("prompt_file", "task", "prompts"))
    if len(clash) > 1:
        raise GencraftError(f"{' and '.join(clash)} each give the prompts: give one")
    if args.prompt_file is not None:
        from gencraft.cli.options import read_prompt_file

        return read_prompt_file(args.prompt_file)[: args.num_prompts]
    if args.task is not None:
        from gencraft.data.tasks import source_of, task_examples

        examples = task_examples(args.task, "train", args.data_dir, source_field=args.source_field)
        texts = [source_of(e) for e in examples]
    else:
        kinds = ("xsum", "e2e") if args.prompts == "both" else (args.prompts,)
        n = args.num_prompts // len(kinds)
        return [t for k in kinds for t in instruction_texts(k, n, args.data_dir, split="train")]
    if not texts:
        raise GencraftError(f"--task {args.task} holds no prompt")
    return texts[: args.num_prompts]


def cmd_train_classifier(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import default_output
    from gencraft.models import load_model
    from gencraft.search.prompts import encode_prompt
    from gencraft.search.train import (
        ClassifierTrainConfig,
        classifier_for,
        sample_training_data,
        train_classifier,
    )
    from gencraft.utils import seed_everything

    cfg = dataclass_from_args(ClassifierTrainConfig, args)  # checked before any loading
    texts = _classifier_prompts(args)
    seed_everything(args.seed)
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    prompts = [encode_prompt(tok, t) for t in texts]
    out = default_output(args.output, "search-clf", args.attribute, args.model)
    print(
        f"{args.attribute} classifier for {args.model}: {len(prompts)} train prompts x "
        f"{args.samples_per_prompt} samples -> {out}"
    )
    rows = sample_training_data(
        model,
        tok,
        prompts,
        attribute=args.attribute,
        samples_per_prompt=args.samples_per_prompt,
        max_new_tokens=args.max_new_tokens,
        prompt_texts=texts,
        censored=args.censored,
        seed=args.seed,
        batch_size=args.sample_batch,
    )
    clf = classifier_for(model, args.attribute)
    result = train_classifier(clf, rows, cfg, out, restart=args.restart)
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=2))


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DecodeOptions, ModelInput, RunOptions
    from gencraft.search.config import (
        ClassifierDataConfig,
        ClassifierTrainConfig,
        SearchDecodeConfig,
    )

    p = sub.add_parser("search", help="beam search and exact mode search (Yoshida 2023 ch. 6-7)")
    ssub = p.add_subparsers(dest="search_command", required=True)
    scoring = {
        "beam": "Beam search, each hypothesis scored by the sum of its tokens' log-probabilities, "
        "the EOS step included (no length normalisation: length_penalty 0); a row stops once "
        "--num-beams hypotheses have finished (early_stopping True). This is the thesis's "
        "scoring, and equals generate's beam search under those two settings.",
        "mode": "The exact mode: the highest-scoring output (sum of its tokens' "
        "log-probabilities) by depth-first search pruned by the best found so far.",
    }
    for name, func, text in (
        ("beam", cmd_beam, "beam search (identical to generate's with length_penalty=0)"),
        ("mode", cmd_mode, "the exact mode by DFS with pruning"),
    ):
        g = ssub.add_parser(name, help=text, description=scoring[name])
        add_dataclass_arguments(g, PromptInput)
        add_dataclass_arguments(g, ModelInput, defaults={"model": "smollm2-135m"})
        beam = ("num_beams", "max_new_tokens") if name == "beam" else ("max_new_tokens",)
        add_dataclass_arguments(
            g, DecodeOptions, only=(*beam, "batch_size"), defaults={"max_new_tokens": 32}
        )
        mode = {"raw", "length_includes_eos", "length", "max_nodes"}
        if name == "beam":
            add_dataclass_arguments(g, SearchDecodeConfig, exclude={"length", "max_nodes"})
        else:
            add_dataclass_arguments(g, SearchDecodeConfig, only=mode)
        add_dataclass_arguments(g, RunOptions, only=("device", "dtype"))
        g.set_defaults(func=func)

    e = ssub.add_parser("errors", help="search errors: greedy and beam outputs vs the exact mode")
    add_dataclass_arguments(e, PromptInput)
    add_dataclass_arguments(e, ModelInput, defaults={"model": "smollm2-135m"})
    add_dataclass_arguments(e, ErrorOptions)
    add_dataclass_arguments(
        e, DecodeOptions, only=("max_new_tokens", "batch_size"), defaults={"max_new_tokens": 32}
    )
    add_dataclass_arguments(e, SearchDecodeConfig, only={"raw", "max_nodes"})
    add_dataclass_arguments(e, RunOptions, only=("device", "dtype"))
    e.set_defaults(func=cmd_errors)

    t = ssub.add_parser(
        "train-classifier", help="train an attribute classifier on the model's own samples"
    )
    add_dataclass_arguments(t, ModelInput, defaults={"model": "smollm2-135m"})
    add_dataclass_arguments(t, ClassifierTrainConfig)
    add_dataclass_arguments(t, ClassifierDataConfig)
    add_dataclass_arguments(t, DecodeOptions, only=("max_new_tokens",))
    add_dataclass_arguments(t, RunOptions, only=("output", "restart"))
    add_data_dir(t)
    t.set_defaults(func=cmd_train_classifier, output_kind="dir")
