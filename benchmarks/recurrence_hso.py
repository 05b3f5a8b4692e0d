"""Recurrence and HSO cost, as ratios to a baseline measured in the same run:

* a recurrent training step against plain fine-tuning on the same windows (the baseline mode
  of RecurrentLM: the same windows and loss, no state), with and without bottleneck
  checkpointing (the issue's target: <= 1.10x time without it);
* activation memory against sequence length: the bytes autograd saves for backward (exact,
  any device; CUDA adds max_memory_allocated), checkpointed or not, plotted as PNG;
* HSO and dynamic evaluation time per token against the plain model on the same text.

    python benchmarks/recurrence_hso.py --model smollm2-135m --window 128 --threads 2
    python benchmarks/recurrence_hso.py --model tiny-llama --window 16      # seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _saved_bytes(model, ids) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, return_logits=False).loss.backward()
    model.zero_grad(set_to_none=True)
    return total


def main() -> None:
    from gencraft.hso import DynamicEvalConfig, HSOConfig, dynamic_eval_nll, hso_nll
    from gencraft.metrics import windowed_nll
    from gencraft.models import load_model
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--bptt-windows", type=int, default=4)
    ap.add_argument("--memory-windows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--hso-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--plot", default="outputs/bench-recurrence-memory.png")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base, _ = load_model(args.model)
    vocab = base.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    report: dict = {"model": args.model, "window": args.window, "threads": torch.get_num_threads()}

    # ---- training step: recurrent vs the same windows without recurrence
    n = args.window * args.bptt_windows + 1
    ids = torch.randint(3, vocab, (1, n), generator=g)
    model = RecurrentLM(
        base,
        RecurrenceConfig(
            window=args.window, insert_layer=min(2, base.config.num_hidden_layers - 1)
        ),
    )
    model.train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def step():
        opt.zero_grad(set_to_none=True)
        model(ids, return_logits=False).loss.backward()
        opt.step()

    times = {}
    for name, recurrent, ckpt in (
        ("plain windows", False, False),
        ("recurrent", True, False),
        ("recurrent, checkpointed", True, True),
    ):
        model.config.recurrent, model.config.checkpoint = recurrent, ckpt
        times[name] = _median_time(step, args.repeats)
    report["train step seconds"] = times
    report["train step ratio to plain"] = {k: v / times["plain windows"] for k, v in times.items()}

    # ---- activation memory vs length
    mem = []
    for w in args.memory_windows:
        x = torch.randint(3, vocab, (1, args.window * w + 1), generator=g)
        row = {"windows": w, "tokens": x.shape[1]}
        model.config.recurrent = True
        for ckpt in (False, True):
            model.config.checkpoint = ckpt
            row["checkpointed bytes" if ckpt else "full bytes"] = _saved_bytes(model, x)
        mem.append(row)
    report["saved activation bytes"] = mem
    if len(mem) > 1:
        d = mem[-1]["windows"] - mem[0]["windows"]
        report["bytes per extra window"] = {
            "full": (mem[-1]["full bytes"] - mem[0]["full bytes"]) / d,
            "checkpointed": (mem[-1]["checkpointed bytes"] - mem[0]["checkpointed bytes"]) / d,
        }
    _plot(mem, args.plot, args.model, args.window)
    report["plot"] = args.plot

    # ---- HSO / dynamic evaluation per token vs the plain model
    plain_model = model.base.eval()
    text = torch.randint(3, vocab, (1, args.hso_tokens + 1), generator=g)
    t_plain = _median_time(
        lambda: windowed_nll(plain_model, text, window=args.hso_tokens), args.repeats
    )
    t_hso = _median_time(lambda: hso_nll(plain_model, text, HSOConfig()), args.repeats)
    t_de = _median_time(lambda: dynamic_eval_nll(plain_model, text, DynamicEvalConfig()), 1)
    report["per-token seconds"] = {
        "plain": t_plain / args.hso_tokens,
        "hso (k=25)": t_hso / args.hso_tokens,
        "dynamic eval (k=25)": t_de / args.hso_tokens,
    }
    report["per-token ratio to plain"] = {"hso": t_hso / t_plain, "dynamic eval": t_de / t_plain}
    print(json.dumps(report, indent=2))


def _plot(rows, path, model, window) -> None:
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = [r["tokens"] for r in rows]
    ax.plot(x, [r["full bytes"] / 2**20 for r in rows], marker="o", label="no checkpointing")
    ax.plot(
        x,
        [r["checkpointed bytes"] / 2**20 for r in rows],
        marker="s",
        label="bottleneck checkpointing",
    )
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("bytes saved for backward (MiB)")
    ax.set_title(f"{model}, windows of {window}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
