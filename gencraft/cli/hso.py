"""``gencraft hso eval``: a pretrained causal LM scored on a word-level corpus with hidden-state
optimisation (thesis ch. 3), beside the plain model (and, with ``--dynamic-eval``, dynamic
evaluation), per token and per word, with seconds per token."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

from gencraft.config import option


@dataclass
class HSOEvalCommand:
    dynamic_eval: bool = option(False, "also run dynamic evaluation")
    de_lr: float = option(1e-4, "dynamic evaluation's SGD learning rate")


def _fit_default_contexts(cfg: Any, model: Any, args: argparse.Namespace) -> None:
    """The default ``--reset-every`` (1024) lowered to the model's positions when it has fewer;
    a value the user gave is checked against them instead."""
    from gencraft.models.introspect import context_size

    positions = context_size(model)
    if "reset_every" not in args.given and positions and cfg.reset_every > positions:
        cfg.reset_every = positions


def _scorers(args: argparse.Namespace, model: Any, ids: Any, cfg: Any, context: int) -> list:
    """(name, per-target NLL) of each method ``hso eval`` compares, each sharded over
    accelerate's processes."""
    from gencraft.hso import DynamicEvalConfig, dynamic_eval_nll, hso_nll
    from gencraft.metrics import windowed_nll

    kw = {"progress": not args.quiet, "shard": True}
    size = args.batch_size
    runs = [
        ("baseline", lambda: windowed_nll(model, ids, window=context, batch_size=size, **kw)),
        ("hso", lambda: hso_nll(model, ids, cfg, batch_size=size, **kw).token_nll),
    ]
    if args.dynamic_eval:
        de = DynamicEvalConfig(window=cfg.window, lr=args.de_lr, reset_every=cfg.reset_every)
        runs.append(("dynamic eval", lambda: dynamic_eval_nll(model, ids, de, **kw).token_nll))
    return runs


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.evaluate import format_table
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.data import subword_stream
    from gencraft.distributed import announce, is_main
    from gencraft.hso import HSOConfig
    from gencraft.hso.functional import check_causal_lm, contexts
    from gencraft.metrics.lm import stream_perplexities
    from gencraft.models import load_model

    cfg = dataclass_from_args(HSOConfig, args)
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    model.eval()
    _fit_default_contexts(cfg, model, args)
    ids, words = subword_stream(
        args.corpus, args.split, tok, data_dir=args.data_dir, max_words=args.max_words
    )
    check_causal_lm(model, ids, what="HSO")  # before the baseline: a clear refusal
    spans = contexts(ids.numel() - 1, cfg.reset_every, model)  # refuses contexts too long
    context = cfg.reset_every or ids.numel()
    announce("hso eval (contexts)", len(spans), args.batch_size)
    rows = []
    for name, fn in _scorers(args, model, ids, cfg, context):
        t0 = time.perf_counter()
        nll = fn()
        rows.append({"method": name, **stream_perplexities(nll, words, time.perf_counter() - t0)})
    if not is_main():  # every process has the whole result; only the main one prints
        return
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"{args.model} on {args.corpus} {args.split} ({words} words), contexts of {context}, "
        f"HSO on {args.batch_size} contexts at a time (dynamic evaluation one at a time: it "
        "updates the shared weights)"
    )
    print(format_table(rows))  # floats to 2 decimals


def add_parser(sub: Any, add_data_dir: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions, DecodeOptions, ModelInput, RunOptions
    from gencraft.hso import HSOConfig

    p = sub.add_parser("hso", help="hidden-state optimisation of a frozen LM (ch. 3)")
    psub = p.add_subparsers(dest="hso_command", required=True)
    e = psub.add_parser("eval", help="perplexity: plain model vs HSO (vs dynamic evaluation)")
    add_dataclass_arguments(e, ModelInput, defaults={"model": "smollm2-135m"})
    data = {"corpus": "wikitext-2", "split": "valid"}
    add_dataclass_arguments(
        e,
        DataOptions,
        only=("corpus", "split", "max_words"),
        defaults=data,
        helps={"corpus": "LM corpus to score"},
    )
    add_dataclass_arguments(
        e,
        HSOConfig,
        defaults={"reset_every": 1024},
        helps={
            "reset_every": "tokens per context, the weights reset between them (default 1024, "
            "or the model's positions when fewer)"
        },
    )
    add_dataclass_arguments(e, HSOEvalCommand)
    add_dataclass_arguments(
        e,
        DecodeOptions,
        only=("batch_size",),
        helps={"batch_size": "contexts (of --reset-every tokens) scored or optimised together"},
    )
    add_dataclass_arguments(e, RunOptions, only=("json", "quiet", "device", "dtype"))
    add_data_dir(e)
    e.set_defaults(func=cmd_eval)
