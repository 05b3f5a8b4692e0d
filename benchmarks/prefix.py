"""DASP cost: a PrefixModel training step against peft's prefix-tuning on the same model and
batch (time and peak memory, as ratios to peft measured in the same run), the blocked and
sparse variants beside it, and generation with prefixes against the base model's generate.

    python benchmarks/prefix.py --model smollm2-135m --threads 1 --steps 6
    python benchmarks/prefix.py --model tiny-llama --steps 3          # seconds, any machine

Each variant runs in its own process, so peak memory (CUDA: max_memory_allocated; CPU: the
peak resident set above the loaded model) is its own. Time is the median step after one
warm-up step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "peft": {},
    "dense": {},
    "uniblock": {"encoder_segments": 2, "blocked_layers": "all"},
    "hierblock": {"encoder_segments": 2, "blocked_layers": "lower"},
    "htruncsa": {"normalizer": "truncsa", "sparse_layers": "lower"},
    "hsoftsa": {"normalizer": "softsa", "sparse_layers": "lower"},
    "hierblock+softsa": {
        "encoder_segments": 2,
        "blocked_layers": "lower",
        "normalizer": "softsa",
        "sparse_layers": "lower",
    },
}


def _rss_kib() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(args: argparse.Namespace) -> dict:
    import torch

    from gencraft.models import load_model
    from gencraft.prefix import PrefixConfig, PrefixModel

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base, _ = load_model(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base.to(device).train()
    p = args.prefix
    if args.variant == "peft":
        from peft import PrefixTuningConfig, TaskType, get_peft_model

        model = get_peft_model(
            base, PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=p)
        )
    else:
        model = PrefixModel(base, PrefixConfig(num_virtual_tokens=p, **VARIANTS[args.variant]))
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    g = torch.Generator().manual_seed(0)
    vocab = base.get_output_embeddings().weight.shape[0]
    ids = torch.randint(10, min(1000, vocab), (args.batch, args.length), generator=g).to(device)
    mask = torch.ones_like(ids)
    labels = ids.clone()
    labels[:, : args.length // 2] = -100
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start_mem = torch.cuda.memory_allocated()
    else:
        start_mem = _rss_kib() * 1024
    times = []
    for _ in range(args.steps + 1):
        t = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = (
        torch.cuda.max_memory_allocated() - start_mem
        if device == "cuda"
        else _rss_kib() * 1024 - start_mem
    )
    out = {"variant": args.variant, "step_s": statistics.median(times[1:]), "peak_bytes": peak}
    if args.variant in ("dense", "peft"):
        model.eval()
        prompt = ids[:1, :16]
        with torch.no_grad():
            gen = []
            kw = {"max_new_tokens": args.new, "min_new_tokens": args.new, "do_sample": False}
            for m in (model, base):
                m.generate(input_ids=prompt, attention_mask=mask[:1, :16], **kw)  # warm-up
                t = time.perf_counter()
                for _ in range(3):
                    m.generate(input_ids=prompt, attention_mask=mask[:1, :16], **kw)
                gen.append((time.perf_counter() - t) / 3)
        out["generate_s"], out["base_generate_s"] = gen
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prefix", type=int, default=10, help="P")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--new", type=int, default=32, help="generated tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(worker(args)))
        return
    rows = []
    for v in VARIANTS:
        cmd = [sys.executable, __file__, "--variant", v] + [
            f"--{k}={getattr(args, k)}"
            for k in ("model", "prefix", "batch", "length", "steps", "new", "threads")
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            sys.exit(f"{v} failed:\n{res.stderr[-2000:]}")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    ref = rows[0]
    print(
        f"model {args.model}, P={args.prefix}, batch {args.batch}x{args.length}, "
        f"{args.threads} thread(s); ratios to peft prefix-tuning in this run"
    )
    print(f"{'variant':18} {'step s':>8} {'time ratio':>10} {'peak MiB':>9} {'mem ratio':>9}")
    for r in rows:
        print(
            f"{r['variant']:18} {r['step_s']:8.3f} {r['step_s'] / ref['step_s']:10.3f} "
            f"{r['peak_bytes'] / 2**20:9.1f} "
            f"{r['peak_bytes'] / max(ref['peak_bytes'], 1):9.3f}"
        )
    for r in rows:
        if "generate_s" in r:
            print(
                f"generate {args.new} tokens ({r['variant']}): {r['generate_s']:.3f} s vs base "
                f"{r['base_generate_s']:.3f} s, ratio {r['generate_s'] / r['base_generate_s']:.3f}"
            )


if __name__ == "__main__":
    main()
