"""``gencraft search beam|mode``: gencraft's beam search and exact mode search on one prompt."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from gencraft.models import load_model
    from gencraft.search.prompts import encode_prompt

    model, tok = load_model(args.model, device=args.device)
    text = args.prompt if not args.raw else None
    ids = (
        encode_prompt(tok, text)
        if text is not None
        else tok(args.prompt, return_tensors="pt")["input_ids"]
    )
    return model, tok, ids


def cmd_beam(args: argparse.Namespace) -> None:
    from gencraft.search import beam_search

    model, tok, ids = _load(args)
    hyps = beam_search(model, ids, num_beams=args.beams, max_new_tokens=args.max_new_tokens,
                       finished=args.finished, force_length=args.force_length)  # fmt: skip
    for h in hyps:
        print(json.dumps({"text": tok.decode(h.tokens), "log_prob": round(h.score, 4),
                          "tokens": len(h.tokens), "finished": h.finished}))  # fmt: skip


def cmd_mode(args: argparse.Namespace) -> None:
    from gencraft.search import exact_mode

    model, tok, ids = _load(args)
    r = exact_mode(model, ids, max_new_tokens=args.max_new_tokens, length=args.length,
                   max_nodes=args.max_nodes)  # fmt: skip
    print(json.dumps({"text": tok.decode(r.tokens), "log_prob": round(r.log_prob, 4),
                      "tokens": len(r.tokens), "exact": r.exact, "nodes": r.nodes,
                      "seconds": round(r.seconds, 2)}))  # fmt: skip


def add_parser(sub: Any, add_data_dir: Any) -> None:
    p = sub.add_parser("search", help="beam search and exact mode search (Yoshida 2023 ch. 6-7)")
    ssub = p.add_subparsers(dest="search_command", required=True)
    for name, func, text in (
        ("beam", cmd_beam, "beam search (identical to generate's with length_penalty=0)"),
        ("mode", cmd_mode, "the exact mode by DFS with pruning"),
    ):
        g = ssub.add_parser(name, help=text)
        g.add_argument("prompt", help="the instruction (one user turn for chat models)")
        g.add_argument("--model", default="smollm2-135m")
        g.add_argument("--raw", action="store_true", help="no chat template: the prompt as is")
        g.add_argument("--max-new-tokens", type=int, default=32)
        g.add_argument("--device", default=None)
        if name == "beam":
            g.add_argument("--beams", type=int, default=4)
            g.add_argument("--finished", choices=("aside", "on_beam"), default="aside")
            g.add_argument("--force-length", type=int, default=None,
                           help="exactly N tokens before EOS")  # fmt: skip
        else:
            g.add_argument("--length", type=int, default=None,
                           help="the best output of exactly N tokens")  # fmt: skip
            g.add_argument("--max-nodes", type=int, default=None)
        g.set_defaults(func=func)
