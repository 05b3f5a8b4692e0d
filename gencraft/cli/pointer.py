"""``gencraft pointer train|eval|analyze``: the pointer sentinel-LSTM LM pipeline."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gencraft.config import REQUIRED, option
from gencraft.errors import GencraftError

CORPORA = ("ptb", "wikitext-2", "wikitext-103")


@dataclass
class PointerTrainCommand:
    """The model ``pointer train`` builds (the preset, and fields that override it)."""

    corpus: str = option(
        "ptb",
        "word-level corpus: ptb, wikitext-2, wikitext-103, or a path to your own (a text file, "
        "or a folder with train.txt, valid.txt and test.txt)",
    )

    def __post_init__(self) -> None:
        from gencraft.data.own import own_task

        self.corpus = own_task(self.corpus, CORPORA, "corpus")

    preset: Literal["small", "medium", "tiny"] = option("small", "model size (the paper's)")
    pointer: bool = option(True, "the pointer sentinel (--no-pointer: the plain LSTM baseline)")
    window: int | None = option(None, "pointer window L (default: the preset's, 100)")
    hidden_size: int | None = option(None, "LSTM width (default: the preset's)")
    dropout: float | None = option(None, "locked dropout on layer inputs")
    zoneout: float | None = option(None, "zoneout rate of c and h")
    final_eval_batch_size: int = option(1, "streams for the final valid/test perplexity")
    model: str | None = option(
        None,
        "a pretrained causal LM (registered name, path or hub id): train the pointer sentinel "
        "head on it, the base frozen, in blocks of --bptt tokens (docs/pointer.md) instead of "
        "an LSTM",
    )
    eval_tokens: int | None = option(
        None, "with --model: the first N tokens of the validation and test splits (default: all)"
    )


#: flags of the LSTM that a head on a pretrained LM (``--model``) has no use for
LSTM_ONLY = ("preset", "pointer", "hidden_size", "dropout", "zoneout", "k1", "window_refresh")
LSTM_ONLY += ("optimizer", "weight_decay", "lr_decay", "pointer_loss_weight", "revert_on_worse")


@dataclass
class PointerEvalCommand:
    bptt: int = option(100, "tokens per evaluated chunk (the state carries across them)")

    def __post_init__(self) -> None:
        from gencraft.config import positive

        positive(self, "bptt")


@dataclass
class PointerAnalyzeCommand:
    pointer: str = option(REQUIRED, "the pointer model's run or model directory", positional=True)
    baseline: str | None = option(None, "plain LSTM run (frequency buckets)")
    start: int = option(1000, "first word of the viewed passage")
    length: int = option(40, "words in the viewed passage")
    max_distance: int | None = option(None, "furthest pointer distance drawn")


def _corpus(name: str, data_dir: str | None, splits: tuple[str, ...]) -> Any:
    from gencraft.data import load_lm_corpus

    return load_lm_corpus(name, data_dir, splits)


def cmd_train(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.options import default_output, say
    from gencraft.pointer import PointerSentinelLSTM, PointerTrainer, TrainConfig
    from gencraft.pointer.evaluate import evaluate
    from gencraft.pointer.train import preset_k1
    from gencraft.utils import seed_everything, world_rank

    cfg = dataclass_from_args(TrainConfig, args)  # settings are checked before any loading
    args.corpus = dataclass_from_args(PointerTrainCommand, args).corpus  # a path: absolute
    if args.model is not None:
        return _train_head(args, cfg)
    if args.eval_tokens is not None:
        raise GencraftError("--eval-tokens applies with --model (a head on a pretrained LM)")
    if cfg.k1 != (k1 := preset_k1(args.preset, cfg.k1)):
        cfg.k1 = k1
        say(f"--preset {args.preset}: k1 = {k1} (the paper's schedule; --k1 {cfg.bptt}: k1 = k2)")
    corpus = _corpus(args.corpus, args.data_dir, ("train", "valid", "test"))
    overrides: dict[str, Any] = {"pointer": args.pointer, "extra": {"corpus": args.corpus}}
    for key in ("window", "hidden_size", "dropout", "zoneout"):
        value = getattr(args, key)
        if value is not None:
            if key == "zoneout":
                overrides.update(zoneout_c=value, zoneout_h=value)
            else:
                overrides[key] = value
    seed_everything(args.seed)
    model = PointerSentinelLSTM.from_preset(args.preset, len(corpus.vocab), **overrides)
    tag = "" if args.pointer else "lstm"
    out = default_output(args.output, "pointer", args.corpus, args.preset, tag)
    n_params = sum(p.numel() for p in model.parameters())
    kind = "pointer sentinel-LSTM" if args.pointer else "plain LSTM"
    n_ptr = model.num_pointer_parameters()
    say(f"{kind} ({args.preset}): {n_params:,} parameters ({n_ptr:,} in the pointer) -> {out}")
    trainer = PointerTrainer(model, corpus, cfg, out, progress=not args.quiet)
    trainer.train(restart=args.restart)
    best = PointerSentinelLSTM.from_pretrained(out / "best", device=trainer.accelerator.device)
    result = {
        "parameters": n_params,
        "train_tokens_per_s": trainer.trained_tokens / max(trainer.train_time, 1e-9),
        "epochs": trainer.epoch,
        "steps": trainer.global_step,
    }
    for split in ("valid", "test"):
        r = evaluate(
            best,
            corpus[split],
            batch_size=args.final_eval_batch_size,
            bptt=cfg.bptt,
            progress=not args.quiet,
            desc=split,
            flag="--final-eval-batch-size",
        )
        result[f"{split}_ppl"] = r["ppl"]
    if world_rank() == 0:  # one writer under accelerate launch
        (out / "results.json").write_text(json.dumps(result, indent=2))
    say(json.dumps(result, indent=2))


def unk_share(ids: Any, vocab: Any) -> float:
    """The share of ``ids`` [N] that are the vocabulary's ``<unk>`` (0 without one)."""
    from gencraft.data import UNK

    unk = vocab.stoi.get(UNK)
    return 0.0 if unk is None or ids.numel() == 0 else float((ids == unk).float().mean())


def _head_fit_config(args: argparse.Namespace, cfg: Any) -> Any:
    """The training loop's settings for a head: ``pointer train``'s own
    (:meth:`TrainConfig.fit_config`), one epoch unless ``--max-epochs`` says, and
    ``--patience`` as early stopping (there is no plateau rule for a head)."""
    from dataclasses import replace

    epochs = cfg.max_epochs if "max_epochs" in args.given else 1
    return replace(cfg.fit_config(), epochs=epochs, patience=cfg.patience)


def _train_head(args: argparse.Namespace, cfg: Any) -> None:
    """``pointer train --model NAME``: the head's recipe on a pretrained LM (the base frozen,
    Adam on the pointer's parameters, blocks of ``--bptt`` tokens), then the validation and
    test token perplexity of the head against its base alone."""
    from gencraft.cli.flags import given_among
    from gencraft.cli.options import default_output, say
    from gencraft.models import load_model
    from gencraft.pointer import PointerSentinelHead
    from gencraft.pointer.evaluate import evaluate_head, token_blocks
    from gencraft.pointer.train import train_head
    from gencraft.training import load_run
    from gencraft.utils import seed_everything, world_rank

    given = sorted(given_among(args, LSTM_ONLY))
    if given:
        raise GencraftError(f"{', '.join(given)} set the LSTM; they do not apply with --model")
    lr = cfg.lr if "lr" in args.given else 1e-3  # the LSTM's SGD default (20) is no Adam rate
    fit_cfg = _head_fit_config(args, cfg)
    corpus = _corpus(args.corpus, args.data_dir, ("train", "valid", "test"))
    out = default_output(args.output, "pointer", args.corpus, args.model, "head")
    seed_everything(cfg.seed)
    base, tok = load_model(args.model, device=cfg.device, dtype=cfg.dtype)
    head = PointerSentinelHead(base, window=args.window or 100, base_name_or_path=args.model)
    blocks = {
        "train": token_blocks(tok, corpus.text("train"), cfg.bptt),
        "valid": token_blocks(tok, corpus.text("valid"), cfg.bptt, args.eval_tokens),
        "test": token_blocks(tok, corpus.text("test"), cfg.bptt, args.eval_tokens),
    }
    say(
        f"pointer head on {args.model}: {head.num_pointer_parameters():,} new parameters, "
        f"{blocks['train'].shape[0]} training blocks of {cfg.bptt} tokens -> {out}"
    )
    run = {"model": args.model, "corpus": args.corpus, "block": cfg.bptt}
    fitted = train_head(
        head,
        blocks,
        out,
        lr=lr,
        config=fit_cfg,
        settings=run,
        progress=not args.quiet,
        restart=args.restart,
    )
    best = load_run(out, method="pointer", command="eval", device=cfg.device).model
    result: dict[str, Any] = {"steps": fitted.steps, "stopped": fitted.stopped}
    size = args.final_eval_batch_size
    for split in ("valid", "test"):
        result[split] = evaluate_head(
            best, blocks[split], batch_size=size, desc=split, progress=not args.quiet
        )
    if world_rank() == 0:
        (out / "results.json").write_text(json.dumps(result, indent=2))
    say(json.dumps(result, indent=2))


def _eval_head(args: argparse.Namespace, loaded: Any) -> None:
    """``pointer eval`` of a head run: the token perplexity of the head and of its base alone
    on ``--split`` of the run's corpus (or ``--corpus``), in blocks of ``--bptt`` tokens (the
    first ``--limit`` tokens)."""
    from gencraft.distributed import is_main
    from gencraft.pointer.evaluate import evaluate_head, token_blocks

    recorded = loaded.settings.get("head", {})
    corpus_name = args.corpus or recorded.get("corpus")
    if not corpus_name:
        raise GencraftError("the checkpoint records no corpus; pass --corpus")
    corpus = _corpus(corpus_name, args.data_dir, (args.split,))
    blocks = token_blocks(loaded.tokenizer, corpus.text(args.split), args.bptt, args.limit)
    r = evaluate_head(
        loaded.model, blocks, batch_size=args.batch_size, desc=args.split, progress=not args.quiet
    )
    if not is_main():
        return
    row = {"corpus": corpus_name, "split": args.split, **r}
    if args.json:
        print(json.dumps(row, ensure_ascii=False))
    else:
        from gencraft.cli.evaluate import format_table

        print(format_table([row]))


def cmd_eval(args: argparse.Namespace) -> None:
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.distributed import is_main
    from gencraft.pointer.evaluate import evaluate
    from gencraft.training import load_run

    dataclass_from_args(PointerEvalCommand, args)  # --bptt checked before anything loads
    place = {"device": args.device, "dtype": args.dtype}
    loaded = load_run(args.checkpoint, method="pointer", command="eval", **place)
    model = loaded.model
    if not hasattr(model, "config"):  # a head on a pretrained LM: its tokens, against its base
        return _eval_head(args, loaded)
    corpus_name = args.corpus or model.config.extra.get("corpus")
    if not corpus_name:
        raise GencraftError("the checkpoint records no corpus; pass --corpus")
    corpus = _corpus(corpus_name, args.data_dir, (args.split,))
    if len(corpus.vocab) != model.config.vocab_size:
        raise GencraftError(
            f"vocabulary mismatch: the checkpoint has {model.config.vocab_size} words, "
            f"{corpus_name} has {len(corpus.vocab)}"
        )
    ids = corpus[args.split] if args.limit is None else corpus[args.split][: args.limit]
    r = evaluate(
        model,
        ids,
        batch_size=args.batch_size,
        bptt=args.bptt,
        progress=not args.quiet,
        desc=args.split,
        shard=True,
    )
    if not is_main():  # every process has the sum; only the main one prints
        return
    row = {
        "corpus": corpus_name,
        "split": args.split,
        "ppl": r["ppl"],
        "tokens": r["tokens"],
        # words outside the training vocabulary are scored as <unk>: a high share flatters ppl
        "unk_share": unk_share(ids, corpus.vocab),
    }
    if args.json:
        print(json.dumps(row, ensure_ascii=False))
    else:
        from gencraft.cli.evaluate import format_table

        print(format_table([row]))


def cmd_analyze(args: argparse.Namespace) -> None:
    from gencraft.pointer.analysis import (
        bucket_gains,
        frequency_buckets,
        passage_view,
        plot_bucket_gains,
        plot_passage,
    )
    from gencraft.pointer.evaluate import evaluate
    from gencraft.training import load_run

    place = {"device": args.device, "dtype": args.dtype}
    ptr = load_run(args.pointer, method="pointer", command="analyze", **place).model
    name = args.corpus or ptr.config.extra.get("corpus")
    if not name:
        raise GencraftError("the checkpoint records no corpus; pass --corpus")
    corpus = _corpus(name, args.data_dir, (args.split,))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"corpus": name, "split": args.split}
    if args.baseline:
        base = load_run(args.baseline, method="pointer", command="analyze", **place).model
        if base.config.vocab_size != ptr.config.vocab_size:
            raise GencraftError("the two checkpoints have different vocabularies")
        ids = corpus[args.split]
        a = evaluate(base, ids, batch_size=args.batch_size, return_details=True, progress=True)
        b = evaluate(ptr, ids, batch_size=args.batch_size, return_details=True, progress=True)
        rows = bucket_gains(
            a["token_nll"], b["token_nll"], a["targets"], frequency_buckets(corpus.vocab.counts)
        )
        plot_bucket_gains(rows, out / "frequency_gain.png", f"{name} {args.split}")
        summary.update(lstm_ppl=a["ppl"], pointer_ppl=b["ppl"], buckets=rows)
        print(f"wrote {out / 'frequency_gain.png'}")
    view = passage_view(ptr, corpus, args.split, args.start, args.length)
    plot_passage(
        view, out / "passage.png", max_distance=args.max_distance, title=Path(args.pointer).name
    )
    summary["passage"] = [
        {
            "input": i,
            "target": t,
            "gate": round(float(g), 4),
            "top_word": w,
            "distance": d,
            "attention": round(a, 4),
        }
        for i, t, g, (w, d, a) in zip(view.inputs, view.targets, view.gate, view.top, strict=True)
    ]
    (out / "analysis.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out / 'passage.png'} and {out / 'analysis.json'}")
    for row in summary["passage"]:
        copied = (
            f"copies {row['top_word']!r} from {row['distance']} back" if row["gate"] < 0.5 else ""
        )
        print(f"{row['input']:>15} -> {row['target']:<15} g={row['gate']:.2f} {copied}")


def add_parser(sub: Any, data_dir_arg: Any) -> None:
    from gencraft.cli.flags import add_dataclass_arguments
    from gencraft.cli.options import DataOptions, DecodeOptions, RunInput, RunOptions
    from gencraft.pointer.config import TrainConfig

    p = sub.add_parser("pointer", help="pointer sentinel-LSTM language models (Merity et al.)")
    psub = p.add_subparsers(dest="pointer_command", required=True, metavar="SUBCOMMAND")

    t = psub.add_parser("train", help="train a pointer sentinel-LSTM (or --no-pointer LSTM)")
    add_dataclass_arguments(t, PointerTrainCommand)
    add_dataclass_arguments(t, TrainConfig)
    add_dataclass_arguments(t, RunOptions, only=("output", "restart", "quiet"))
    data_dir_arg(t)
    t.set_defaults(func=cmd_train, output_kind="dir")

    e = psub.add_parser("eval", help="perplexity of a trained checkpoint")
    add_dataclass_arguments(e, RunInput)
    add_dataclass_arguments(
        e,
        DataOptions,
        only=("split", "corpus", "limit"),
        helps={"limit": "the first N word tokens of the split (<eos> counted; default: all)"},
    )
    add_dataclass_arguments(e, DecodeOptions, only=("batch_size",), defaults={"batch_size": 1})
    add_dataclass_arguments(e, PointerEvalCommand)
    add_dataclass_arguments(e, RunOptions, only=("device", "dtype", "json", "quiet"))
    data_dir_arg(e)
    e.set_defaults(func=cmd_eval)

    a = psub.add_parser("analyze", help="frequency-bucket gains and a pointer/gate view (PNG)")
    add_dataclass_arguments(a, PointerAnalyzeCommand)
    add_dataclass_arguments(a, DataOptions, only=("split", "corpus"))
    add_dataclass_arguments(a, DecodeOptions, only=("batch_size",), defaults={"batch_size": 1})
    out = {"output": "outputs/pointer-analysis"}
    add_dataclass_arguments(a, RunOptions, only=("output", "device", "dtype"), defaults=out)
    data_dir_arg(a)
    a.set_defaults(func=cmd_analyze, output_kind="dir")
