"""Search: beam-search speed against ``generate``, exact-search memory, and empty modes.

    python benchmarks/search.py speed --model smollm2-135m --prompts 8 --beams 4 --new-tokens 32
    python benchmarks/search.py memory --model smollm2-135m --depths 16 64 256
    python benchmarks/search.py empty --model smollm2-135m --prompts 40 --words 25 50 100 200

``speed``: interleaved rounds (machine load hits both alike) of gencraft's ``beam_search`` and
``model.generate(num_beams=B, do_sample=False, length_penalty=0.0, early_stopping=True)`` on
the same instruction prompts (their outputs are identical, checked each round); prints the
time ratio (target <= 1.15).

``memory``: the key/value bytes that exact search holds on its first (greedy) path of depth d
(length-conditional search, stopped after d + 1 nodes), against storing a full cache at every
node of the path (the naive O(d^2) scheme the thesis's §6.2 avoids).

``empty``: the exact mode (DFS, ``--max-nodes`` per prompt) of "Summarize in one sentence:" +
an XSum document cut to each of ``--words`` words, and of "Describe this restaurant:" + E2E
MRs: the fraction whose mode is the empty output, by prompt length (thesis §6.5 analogue).
Writes ``empty.json`` after every prompt, then ``empty.md`` and ``empty_by_length.png``; a
rerun into the same ``--output`` with the same settings keeps the sets already there and goes
on where it stopped (so more sets or prompts can be added later).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from statistics import median

import torch
from tqdm import tqdm

from gencraft.models import load_model
from gencraft.search import beam_search, exact_mode
from gencraft.search.prompts import encode_prompt, instruction_texts


def _machine() -> dict:
    return {"threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}


def speed(args: argparse.Namespace) -> dict:
    model, tok = load_model(args.model)
    texts = instruction_texts("e2e", args.prompts // 2, args.data_dir) + instruction_texts(
        "xsum", args.prompts - args.prompts // 2, args.data_dir, max_source_words=60
    )
    prompts = [encode_prompt(tok, t) for t in texts]
    eos = model.generation_config.eos_token_id

    def ours():
        return [
            beam_search(model, p, num_beams=args.beams, max_new_tokens=args.new_tokens)
            for p in prompts
        ]

    def theirs():
        with torch.no_grad():
            return [
                model.generate(
                    p,
                    attention_mask=torch.ones_like(p),
                    num_beams=args.beams,
                    do_sample=False,
                    length_penalty=0.0,
                    early_stopping=True,
                    max_new_tokens=args.new_tokens,
                )
                for p in prompts
            ]

    def same(hyps, outs) -> bool:
        for h, o, p in zip(hyps, outs, prompts, strict=True):
            want = o[0, p.shape[1] :].tolist()
            got = h[0].tokens + ([eos] if h[0].finished else [])
            if want[: len(got)] != got:
                return False
        return True

    times: dict[str, list[float]] = {"gencraft": [], "generate": []}
    ours(), theirs()  # warm-up
    agree = True
    for _ in tqdm(range(args.rounds), desc="rounds"):
        t0 = time.perf_counter()
        h = ours()
        times["gencraft"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        o = theirs()
        times["generate"].append(time.perf_counter() - t0)
        agree &= same(h, o)
    med = {k: median(v) for k, v in times.items()}
    return {
        "model": args.model,
        "prompts": len(prompts),
        "beams": args.beams,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        **_machine(),
        "median_seconds": med,
        "ratio": med["gencraft"] / med["generate"],
        "identical_outputs": agree,
    }


def memory(args: argparse.Namespace) -> dict:
    model, tok = load_model(args.model)
    prompt = encode_prompt(tok, instruction_texts("e2e", 1, args.data_dir)[0])
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    per_pos = 2 * cfg.num_hidden_layers * heads * (cfg.hidden_size // cfg.num_attention_heads)
    per_pos *= next(model.parameters()).element_size()
    rows = []
    for d in tqdm(args.depths, desc="depths"):
        r = exact_mode(model, prompt, max_new_tokens=d, length=d, max_nodes=d + 1)
        p = prompt.shape[1]
        naive = sum((p + i) * per_pos for i in range(d + 1))
        rows.append(
            {
                "depth": d,
                "prompt_tokens": p,
                "peak_kv_bytes": r.peak_kv_bytes,
                "naive_full_cache_per_node_bytes": naive,
                "ratio_to_naive": r.peak_kv_bytes / naive,
                "bytes_per_position": r.peak_kv_bytes / (p + d),
            }
        )
    return {"model": args.model, **_machine(), "rows": rows}


def empty(args: argparse.Namespace) -> dict:
    model, tok = load_model(args.model)
    sets = {
        f"xsum, {w} words": instruction_texts(
            "xsum", args.prompts, args.data_dir, max_source_words=w
        )
        for w in args.words
    }
    e2e = args.prompts if args.e2e_prompts is None else args.e2e_prompts
    if e2e:
        sets["e2e MR"] = instruction_texts("e2e", e2e, args.data_dir)
    out: dict = {
        "model": args.model,
        "max_nodes": args.max_nodes,
        "max_new_tokens": args.max_new_tokens,
        **_machine(),
        "sets": {},
    }
    previous = Path(args.output, "empty.json")
    if previous.is_file():  # same settings: keep its sets and go on where it stopped
        old = json.loads(previous.read_text())
        if all(old.get(k) == out[k] for k in ("model", "max_nodes", "max_new_tokens")):
            out["sets"] = old["sets"]
    for name, texts in sets.items():
        rows: list[dict] = list(out["sets"].get(name, {}).get("rows", []))[: len(texts)]
        for t in tqdm(texts[len(rows) :], desc=name, initial=len(rows), total=len(texts)):
            ids = encode_prompt(tok, t)
            r = exact_mode(model, ids, max_new_tokens=args.max_new_tokens, max_nodes=args.max_nodes)
            rows.append(
                {
                    "prompt_tokens": ids.shape[1],
                    "empty": not r.tokens,
                    "exact": r.exact,
                    "log_prob": r.log_prob,
                    "nodes": r.nodes,
                    "seconds": r.seconds,
                    "mode": tok.decode(r.tokens),
                }
            )
            # written after every prompt, so a long sweep that is stopped still reports
            out["sets"][name] = _empty_summary(rows)
            Path(args.output, "empty.json").write_text(json.dumps(out, indent=2))
        if rows:  # a kept set cut to fewer prompts than before: summarise what is reported
            out["sets"][name] = _empty_summary(rows)
    _plot_empty(out, Path(args.output) / "empty_by_length.png")
    lines = [
        "| prompts | n | mean prompt tokens | empty mode | of which proven | proven exact |"
        " mean nodes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in out["sets"].items():
        lines.append(
            f"| {name} | {s['prompts']} | {s['mean_prompt_tokens']:.0f} | "
            f"{100 * s['empty_fraction']:.0f}% | "
            f"{100 * s['empty_fraction_proven']:.0f}% | "
            f"{100 * s['proven_exact_fraction']:.0f}% | "
            f"{s['mean_nodes']:.0f} |"
        )
    Path(args.output, "empty.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


def _empty_summary(rows: list[dict]) -> dict:
    n = len(rows)
    return {
        "prompts": n,
        "mean_prompt_tokens": sum(r["prompt_tokens"] for r in rows) / n,
        "empty_fraction": sum(r["empty"] for r in rows) / n,
        "empty_fraction_proven": sum(r["empty"] and r["exact"] for r in rows) / n,
        "proven_exact_fraction": sum(r["exact"] for r in rows) / n,
        "mean_nodes": sum(r["nodes"] for r in rows) / n,
        "rows": rows,
    }


def conditional(args: argparse.Namespace) -> dict:
    """Beam vs conditional beam search: degenerate rate, and length-controlled generation."""
    from gencraft.search.stepper import eos_ids
    from gencraft.search.train_classifier import (
        ClassifierTrainConfig,
        classifier_for,
        relabel_degenerate,
        sample_training_data,
        train_classifier,
    )

    model, tok = load_model(args.model)
    eos = eos_ids(model, None)
    out_dir = Path(args.output)
    if args.classifiers:  # reuse trained classifiers: skip sampling and training
        from gencraft.search.classifier import AttributeClassifier

        clfs = {
            a: AttributeClassifier.from_pretrained(
                Path(args.classifiers, f"clf-{a}", "best"), model
            )
            for a in args.studies
        }
        result: dict = {"model": args.model, **_machine(), "classifiers": args.classifiers}
        return _conditional_eval(args, model, tok, clfs, result, out_dir)
    half = args.train_prompts // 2
    train_texts = instruction_texts("e2e", half, args.data_dir, split="train") + instruction_texts(
        "xsum",
        args.train_prompts - half,
        args.data_dir,
        split="train",
        max_source_words=args.max_source_words,
    )
    samples = Path(args.samples) if args.samples else None
    if samples is not None and samples.is_file():  # reuse a previous run's samples
        rows = torch.load(samples)
        if not args.censored:  # cut samples carry no length labels then
            rows = [
                {**r, "labels": torch.full_like(r["labels"], -100), "censored": torch.tensor(False)}
                if bool(r["censored"])
                else r
                for r in rows
            ]
    else:
        rows = sample_training_data(
            model,
            tok,
            [encode_prompt(tok, t) for t in train_texts],
            attribute="length",
            samples_per_prompt=args.samples_per_prompt,
            max_new_tokens=args.sample_tokens,
            prompt_texts=train_texts,
            censored=args.censored,
            seed=0,
        )
        if samples is not None:
            torch.save(rows, samples)
    result: dict = {
        "model": args.model,
        **_machine(),
        "train_prompts": len(train_texts),
        "censored_length_labels": any(bool(r["censored"]) for r in rows),
        "samples": len(rows),
        "finished_samples": sum(bool(r["finished"]) for r in rows),
    }
    cfg = ClassifierTrainConfig(epochs=args.epochs)
    clfs = {}
    for attr in args.studies:
        data = rows if attr == "length" else relabel_degenerate(rows, tok, train_texts, eos)
        clf = classifier_for(model, attr)
        result[f"{attr}_classifier"] = {
            k: v
            for k, v in train_classifier(clf, data, cfg, out_dir / f"clf-{attr}").items()
            if k != "config"
        }
        if attr == "degenerate":
            result["degenerate_training_rate"] = sum(int(r["labels"][0]) for r in data) / len(data)
        clfs[attr] = clf.eval()
        (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    return _conditional_eval(args, model, tok, clfs, result, out_dir)


def _conditional_eval(args, model, tok, clfs: dict, result: dict, out_dir: Path) -> dict:
    from gencraft.search.prompts import instruction_references

    def prompts(total: int) -> list[tuple[str, str]]:
        half = total // 2
        return [
            (t, r)
            for kind, n in (("e2e", half), ("xsum", total - half))
            for t, r in zip(
                instruction_texts(kind, n, args.data_dir, max_source_words=args.max_source_words),
                instruction_references(kind, n, args.data_dir),
                strict=True,
            )
        ]

    tests = prompts(args.test_prompts)
    if "degenerate" in args.studies:
        _degenerate_study(args, model, tok, clfs["degenerate"], tests, result, out_dir)
    if "length" in args.studies:
        _length_study(args, model, tok, clfs["length"], prompts, result, out_dir)
    (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    md = []
    if "degenerate" in result:
        md += [
            f"Degenerate outputs (beam {args.beams[0]}, {len(tests)} test prompts): beam "
            f"{100 * result['degenerate']['beam_rate']:.0f}%, conditional beam "
            f"{100 * result['degenerate']['conditional_rate']:.0f}%",
            "",
        ]
    if "summary" in result.get("length", {}):
        md += [
            f"Length control ({result['length']['prompts']} test prompts):",
            "",
            "| beams | length / reference | conditional higher | beam higher | tie |",
            "|---:|---:|---:|---:|---:|",
        ]
        md += [
            f"| {r['beams']} | {r['ratio']:.1f} | {100 * r['conditional_higher']:.0f}% | "
            f"{100 * r['beam_higher']:.0f}% | {100 * r['tie']:.0f}% |"
            for r in result["length"]["summary"]
        ]
    (out_dir / "conditional.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


def _degenerate_study(args, model, tok, clf, tests, result: dict, out_dir: Path) -> None:
    """(a) degenerate rate: beam vs conditional beam towards "not degenerate" (class 0)."""
    from gencraft.search.classifier import degenerate

    clf.target_class = 0
    rates = {"beam": 0, "conditional": 0}
    examples = []
    for text, _ in tqdm(tests, desc="degenerate"):
        ids = encode_prompt(tok, text)
        row = {}
        for name, kw in (
            ("beam", {}),
            ("conditional", dict(classifier=clf, k=args.k, finished="on_beam")),
        ):
            h = beam_search(
                model, ids, num_beams=args.beams[0], max_new_tokens=args.max_new_tokens, **kw
            )[0]
            out_text = tok.decode(h.tokens, skip_special_tokens=True)
            bad = degenerate(out_text, text, h.finished)
            rates[name] += bad
            row[name] = {"text": out_text, "degenerate": bad, "log_prob": h.score}
        examples.append(row)
        result["degenerate"] = {"prompts_done": len(examples), **rates}
        (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    result["degenerate"] = {
        "beam_size": args.beams[0],
        "k": args.k,
        "prompts": len(tests),
        "beam_rate": rates["beam"] / len(tests),
        "conditional_rate": rates["conditional"] / len(tests),
        "examples": examples,
    }
    (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))


def _length_study(args, model, tok, clf, prompts, result: dict, out_dir: Path) -> None:
    """(b) length control: both forced to n tokens; who finds the higher log-likelihood?"""
    length_rows: list[dict] = []
    length_tests = prompts(args.length_prompts or args.test_prompts)
    for text, ref in tqdm(length_tests, desc="length"):
        ids = encode_prompt(tok, text)
        ref_len = len(tok(ref, add_special_tokens=False)["input_ids"])
        for ratio in args.ratios:
            n = max(1, round(ratio * ref_len))
            for b in args.beams:
                plain = beam_search(
                    model,
                    ids,
                    num_beams=b,
                    max_new_tokens=n + 1,
                    force_length=n,
                    forced_eos=args.forced_eos,
                )[0]
                cond = beam_search(
                    model,
                    ids,
                    num_beams=b,
                    max_new_tokens=n + 1,
                    force_length=n,
                    forced_eos=args.forced_eos,
                    classifier=clf.for_length(n),
                    k=args.k,
                    finished="on_beam",
                )[0]
                length_rows.append(
                    {
                        "ratio": ratio,
                        "beams": b,
                        "length": n,
                        "beam_log_prob": plain.score,
                        "cond_log_prob": cond.score,
                        "beam_text": tok.decode(plain.tokens),
                        "cond_text": tok.decode(cond.tokens),
                    }
                )
        result["length"] = {"k": args.k, "rows": length_rows}
        (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    summary = []
    for b in args.beams:
        for ratio in args.ratios:
            sel = [r for r in length_rows if r["beams"] == b and r["ratio"] == ratio]
            wins = sum(r["cond_log_prob"] > r["beam_log_prob"] + 1e-4 for r in sel)
            losses = sum(r["cond_log_prob"] < r["beam_log_prob"] - 1e-4 for r in sel)
            summary.append(
                {
                    "beams": b,
                    "ratio": ratio,
                    "n": len(sel),
                    "conditional_higher": wins / len(sel),
                    "beam_higher": losses / len(sel),
                    "tie": (len(sel) - wins - losses) / len(sel),
                }
            )
    result["length"] = {
        "k": args.k,
        "forced_eos": args.forced_eos,
        "prompts": len(length_tests),
        "summary": summary,
        "rows": length_rows,
    }
    (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    _plot_length(summary, out_dir / "length_control.png", args.model)


def _plot_length(summary: list[dict], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    labels = [f"B={r['beams']}\n{r['ratio']:.1f}x" for r in summary]
    xs = range(len(summary))
    ax.bar(
        [x - 0.2 for x in xs],
        [100 * r["conditional_higher"] for r in summary],
        0.4,
        label="conditional beam higher",
    )
    ax.bar(
        [x + 0.2 for x in xs], [100 * r["beam_higher"] for r in summary], 0.4, label="beam higher"
    )
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("% of prompts")
    ax.legend(fontsize=8)
    ax.set_title(f"{model}: higher log-likelihood at the forced length", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_empty(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [
        (s["mean_prompt_tokens"], 100 * s["empty_fraction"], n)
        for n, s in out["sets"].items()
        if n.startswith("xsum")
    ]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([x for x, _, _ in xs], [y for _, y, _ in xs], marker="o", label="XSum prompts")
    if "e2e MR" in out["sets"]:
        s = out["sets"]["e2e MR"]
        ax.scatter(
            [s["mean_prompt_tokens"]],
            [100 * s["empty_fraction"]],
            color="C1",
            label="E2E prompts",
            zorder=3,
        )
    ax.set_xlabel("mean prompt length (tokens)")
    ax.set_ylabel("best output found is empty (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.set_title(f"{out['model']}: empty modes (DFS, {out['max_nodes']} nodes max)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--prompts", type=int, default=8)
    s.add_argument("--beams", type=int, default=4)
    s.add_argument("--new-tokens", type=int, default=32)
    s.add_argument("--rounds", type=int, default=3)
    m = sub.add_parser("memory")
    m.add_argument("--depths", type=int, nargs="+", default=[16, 64, 256])
    e = sub.add_parser("empty")
    e.add_argument("--prompts", type=int, default=40)
    e.add_argument("--words", type=int, nargs="+", default=[25, 50, 100, 200])
    e.add_argument("--e2e-prompts", type=int, default=None, help="default: --prompts; 0: none")
    e.add_argument("--max-nodes", type=int, default=300)
    e.add_argument("--max-new-tokens", type=int, default=64)
    c = sub.add_parser("conditional")
    c.add_argument("--train-prompts", type=int, default=100)
    c.add_argument("--samples-per-prompt", type=int, default=8)
    c.add_argument("--sample-tokens", type=int, default=64)
    c.add_argument("--epochs", type=int, default=8)
    c.add_argument(
        "--censored",
        action="store_true",
        help="length classifier: train on the lower-bound labels of samples cut at "
        "--sample-tokens instead of ignoring them",
    )
    c.add_argument(
        "--samples",
        default=None,
        help="a .pt file: load the training samples from it if it exists, else save them there",
    )
    c.add_argument("--test-prompts", type=int, default=20)
    c.add_argument(
        "--length-prompts",
        type=int,
        default=None,
        help="test prompts for length control (default: --test-prompts)",
    )
    c.add_argument("--beams", type=int, nargs="+", default=[5, 20])
    c.add_argument("--k", type=int, default=100)
    c.add_argument("--ratios", type=float, nargs="+", default=[0.8, 1.0, 1.2])
    c.add_argument("--max-new-tokens", type=int, default=64)
    c.add_argument("--max-source-words", type=int, default=100)
    c.add_argument(
        "--forced-eos",
        choices=("model", "free"),
        default="model",
        help="length study: the forced EOS scores the model's log P(EOS), or 0",
    )
    c.add_argument(
        "--studies", nargs="+", choices=("degenerate", "length"), default=["degenerate", "length"]
    )
    c.add_argument(
        "--classifiers",
        default=None,
        help="a previous run's output dir: reuse its trained classifiers",
    )
    for p in (s, m, e, c):
        p.add_argument("--model", default="smollm2-135m")
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--data-dir", default=None)
        p.add_argument("--output", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.output = args.output or f"outputs/bench-search-{args.what}-{Path(args.model).name}"
    Path(args.output).mkdir(parents=True, exist_ok=True)
    result = {"speed": speed, "memory": memory, "empty": empty, "conditional": conditional}[
        args.what
    ](args)
    (Path(args.output) / f"{args.what}.json").write_text(json.dumps(result, indent=2))
    big = ("sets", "rows", "examples", "history", "summary")
    print(json.dumps(_drop(result, big), indent=2))


def _drop(obj, keys):
    if isinstance(obj, dict):
        return {k: _drop(v, keys) for k, v in obj.items() if k not in keys}
    return obj


if __name__ == "__main__":
    main()
