"""``gencraft reproduce throughput``: every batched decoder against the same decoder's loop over
single inputs and against its peer in ``transformers``, at several batch sizes, interleaved in
one process (:func:`gencraft.studies.timing.interleaved`: each case paired with an adjacent run
of the batched decoder, so the load of a shared machine cancels in the ratios).

Decoders (one row each per batch size b; the first b inputs):

* ``beam``: :func:`~gencraft.search.beam_search_batch` vs ``generate``'s beam search (same
  beams, ``length_penalty=0``, ``early_stopping=True``), outputs compared;
* ``conditional``: conditional beam search with a classifier that scores 0 for everything
  (its outputs must be plain beam search's) vs ``generate``'s beam search;
* ``exact``: :func:`~gencraft.search.exact_mode_batch` vs b single-prompt searches (no peer);
* ``sundae``, ``mask-predict``: the NAR decoders vs the autoregressive baseline's batched
  ``generate`` (beam), with decoder calls per output and tokens per call beside it;
* ``hso``: :func:`~gencraft.hso.hso_nll_batch` vs the plain model's forward over the batch.

The report names the machine, threads and load average. Peak memory is the allocator's peak
on CUDA, the process's peak resident set on the CPU (reset before each measurement).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from gencraft.studies.runner import ExperimentRun, machine, register, settings_field

DECODERS = ("beam", "conditional", "exact", "sundae", "mask-predict", "hso")
#: run only when named: b copies of the model's weights and their gradients in memory
OPT_IN = ("dynamic-eval",)


@dataclass
class ThroughputSettings:
    model: str = settings_field("smollm2-135m", "causal LM of the searches and HSO")
    nar_model: str = settings_field("minilm-l6", "masked LM converted for NAR decoding")
    decoders: tuple[str, ...] = settings_field(DECODERS, "which decoders")
    batch_sizes: tuple[int, ...] = settings_field((1, 8, 32), "batch sizes b")
    rounds: int = settings_field(3, "interleaved rounds")
    beams: int = settings_field(4, "beam size (beam, conditional, the AR baseline)")
    new_tokens: int = settings_field(16, "max_new_tokens of the beam searches")
    k: int = settings_field(16, "conditional: candidates per beam scored by the classifier")
    exact_tokens: int = settings_field(8, "exact: longest output")
    exact_nodes: int = settings_field(40, "exact: node budget per prompt")
    nar_length: int = settings_field(32, "NAR: every output's length (oracle lengths)")
    nar_steps: int = settings_field(15, "SUNDAE steps and Mask-Predict iterations")
    nar_samples: int = settings_field(16, "SUNDAE samples per source")
    hso_tokens: int = settings_field(100, "hso: tokens per sequence")
    dtype: str = settings_field("float32", "float32, bfloat16 or float16")
    device: str | None = settings_field(None, "cpu or cuda (default: cuda when present)")
    threads: int | None = settings_field(None, "torch CPU threads (default: torch's)")
    data_dir: str | None = settings_field(None, "datasets directory")


def peak_memory_bytes(fn: Any, device: torch.device) -> int | None:
    """Peak memory of one call of ``fn``: CUDA's allocator peak above the start, or on the CPU
    the process's peak resident set (Linux: reset through /proc/self/clear_refs first)."""
    from gencraft.studies.timing import cuda_peak_bytes

    if device.type == "cuda":
        return cuda_peak_bytes(fn)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
    except OSError:
        fn()
        return None
    fn()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


class ZeroScorer:
    """A classifier that scores 0 for every candidate: conditional beam search with it must
    choose exactly as plain beam search (the cost of the conditional machinery alone)."""

    def __init__(self, num_layers: int, hidden_size: int) -> None:
        self.num_layers, self.hidden_size = num_layers, hidden_size

    def init(self, n: int) -> torch.Tensor:
        return torch.zeros(n, 0)

    def score(self, state: Any, hidden: torch.Tensor, candidates: torch.Tensor):
        return torch.zeros(candidates.shape, device=candidates.device), state

    def reorder(self, state: Any, index: torch.Tensor) -> Any:
        return state


def _lm_cases(s: ThroughputSettings, name: str, b: int, ctx: dict) -> dict[str, Any]:
    """(cases {batched, loop, peer?}, check of identical outputs or None) for one causal-LM
    decoder at batch size b."""
    model = ctx["model"]
    if name == "dynamic-eval":
        return _dynamic_eval_cases(model, ctx["seqs"][:b])
    if name == "hso":  # sequences of hso_tokens tokens
        return _hso_cases(model, ctx["seqs"][:b])
    ids, mask, rows = ctx["ids"][:b], ctx["mask"][:b], ctx["rows"][:b]
    width = int(mask.sum(1).max())
    batch = _Prompts(ids[:, -width:], mask[:, -width:], rows)
    if name == "exact":
        return _exact_cases(s, model, batch)
    return _beam_cases(s, name, batch, ctx)


class _Prompts(NamedTuple):
    """Left-padded prompts ``ids``/``mask`` ``[B, T]`` (no column of padding only) and
    each row's own ids ``[T_r]``."""

    ids: torch.Tensor
    mask: torch.Tensor
    rows: list


def _beam_cases(s: ThroughputSettings, name: str, p: _Prompts, ctx: dict) -> dict[str, Any]:
    """Beam search (``conditional``: with a classifier that scores 0) batched, row by row,
    and ``generate``'s beam search; the check: each row's best equals ``generate``'s."""
    from gencraft.search import beam_search, beam_search_batch

    model = ctx["model"]
    beam_kw = dict(num_beams=s.beams, max_new_tokens=s.new_tokens)

    def generate():
        with torch.no_grad():
            return model.generate(
                input_ids=p.ids,
                attention_mask=p.mask,
                do_sample=False,
                length_penalty=0.0,
                early_stopping=True,
                pad_token_id=ctx["pad"],
                **beam_kw,
            )

    def same(found) -> bool:
        out = generate()[:, p.ids.shape[1] :].tolist()
        for hyps, want in zip(found, out, strict=True):
            h = hyps[0]
            got = h.tokens + ([h.eos_token] if h.finished else [])
            if want[: len(got)] != got:
                return False
        return True

    kw = beam_kw
    if name == "conditional":
        kw = dict(beam_kw, classifier=ZeroScorer(*ctx["hidden_shape"]), k=s.k)
    cases = {
        "batched": lambda: beam_search_batch(model, p.ids, p.mask, **kw),
        "loop": lambda: [beam_search(model, r, **kw) for r in p.rows],
        "peer": generate,
    }
    return {"cases": cases, "same": lambda: same(cases["batched"]())}


def _exact_cases(s: ThroughputSettings, model: Any, p: _Prompts) -> dict[str, Any]:
    """Exact search batched and row by row; the check: the same modes, flags and nodes."""
    from gencraft.search import exact_mode, exact_mode_batch

    kw = dict(max_new_tokens=s.exact_tokens, max_nodes=s.exact_nodes)

    def modes_agree() -> bool:
        got = exact_mode_batch(model, p.ids, p.mask, **kw)
        want = [exact_mode(model, r, **kw) for r in p.rows]
        return all(
            (g.tokens, g.exact, g.nodes) == (w.tokens, w.exact, w.nodes)
            for g, w in zip(got, want, strict=True)
        )

    cases = {
        "batched": lambda: exact_mode_batch(model, p.ids, p.mask, **kw),
        "loop": lambda: [exact_mode(model, r, **kw) for r in p.rows],
    }
    return {"cases": cases, "same": modes_agree}


def _hso_cases(model: Any, seqs: torch.Tensor) -> dict[str, Any]:
    """HSO's NLL of ``seqs`` ``[B, T]`` batched and row by row, against the plain model's
    forward; the check: each row's token NLL equals its own run's."""
    from gencraft.hso import HSOConfig, hso_nll, hso_nll_batch

    cfg = HSOConfig()

    def plain():
        with torch.no_grad():
            return model(input_ids=seqs).logits

    def hso_agree() -> bool:
        got = hso_nll_batch(model, seqs, None, cfg)
        return all(
            torch.allclose(g.token_nll, hso_nll(model, r[None], cfg).token_nll, atol=1e-4)
            for g, r in zip(got, seqs, strict=True)
        )

    cases = {
        "batched": lambda: hso_nll_batch(model, seqs, None, cfg),
        "loop": lambda: [hso_nll(model, r[None], cfg) for r in seqs],
        "peer": plain,
    }
    return {"cases": cases, "same": hso_agree}


def _dynamic_eval_cases(model: Any, seqs: torch.Tensor) -> dict[str, Any]:
    """Dynamic evaluation as the few-shot runs it (its default window and SGD rate) of each
    sequence [b, T], read at its last token: the rows' own weight copies against one row at a
    time; the peer is the plain model's forward."""
    from gencraft.hso.config import DynamicEvalConfig
    from gencraft.hso.dynamic import dynamic_eval_last_logits, dynamically_evaluated
    from gencraft.studies.hso import FewShotSettings

    few = FewShotSettings()
    cfg = DynamicEvalConfig(window=few.hso_window, lr=few.de_lr)

    def loop() -> list[torch.Tensor]:
        out = []
        for r in seqs:
            with dynamically_evaluated(model, r[None], cfg):
                out.append(model(input_ids=r[None]).logits[0, -1].float())
        return out

    def agree() -> bool:
        got = dynamic_eval_last_logits(model, seqs, None, cfg)
        # 0.05: float32 rounding grows over the steps; on SmolLM2 (100 random tokens) a 1e-7
        # relative change of the weights moved the loop's own logits by up to 1.6e-2
        return all(torch.allclose(g, w, atol=0.05) for g, w in zip(got, loop(), strict=True))

    cases = {
        "batched": lambda: dynamic_eval_last_logits(model, seqs, None, cfg),
        "loop": loop,
        "peer": lambda: model(input_ids=seqs).logits,
    }
    return {"cases": cases, "same": agree}


def _nar_cases(s: ThroughputSettings, name: str, b: int, ctx: dict) -> dict[str, Any]:
    from dataclasses import replace

    from gencraft.nar import SamplingConfig
    from gencraft.nar.decoding import (
        autoregressive_generate,
        mask_predict_generate,
        sundae_generate,
    )

    nar, ar = ctx["nar"], ctx["ar"]
    ids, mask = ctx["src"][:b], ctx["src_mask"][:b]
    lengths = torch.full((b,), s.nar_length)
    n = s.nar_length
    if name == "sundae":
        cfg = SamplingConfig(steps=s.nar_steps, samples=s.nar_samples, length_candidates=1)
        cfg = replace(cfg, seed=0)

        def run(rows=None):
            return sundae_generate(
                nar, ids, mask, cfg, noise=ctx["noise"], lengths=lengths, batch_size=rows
            )
    else:
        cfg = SamplingConfig(steps=s.nar_steps, length_candidates=1)

        def run(rows=None):
            return mask_predict_generate(
                nar, ids, mask, cfg, mask_id=ctx["mask_id"], lengths=lengths, batch_size=rows
            )

    def peer():
        return autoregressive_generate(
            ar, ids, mask, num_beams=s.beams, max_new_tokens=n + 1, min_new_tokens=n + 1
        )

    def agree() -> bool:
        a, o = run(), run(1)
        return a.sequences == o.sequences and a.model_calls == o.model_calls

    return {
        "cases": {"batched": run, "loop": lambda: run(1), "peer": peer},
        "same": agree,
        "calls": lambda: (run(), peer()),
    }


@register(
    "throughput",
    title="batched decoders: outputs per second against their per-input loop and their peer",
    settings=ThroughputSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "nar_model": "tiny-bert",
            "batch_sizes": (1, 4),
            "rounds": 1,
            "new_tokens": 4,
            "exact_tokens": 3,
            "exact_nodes": 6,
            "nar_length": 6,
            "nar_steps": 3,
            "nar_samples": 2,
            "hso_tokens": 30,
        },
        "cpu": {},
        "gpu": {"dtype": "bfloat16", "rounds": 5},
    },
    cpu_minutes=120,  # the loops at b = 32 dominate; docs/results/throughput.md ran b <= 16
)
def throughput(s: ThroughputSettings, run: ExperimentRun) -> None:
    """Outputs per second of each decoder at each batch size, as ratios in one run."""
    from gencraft.errors import GencraftError

    bad = [d for d in s.decoders if d not in DECODERS + OPT_IN]
    if bad:
        raise GencraftError(f"unknown decoders {bad}; choose from {', '.join(DECODERS + OPT_IN)}")
    if s.threads:
        torch.set_num_threads(s.threads)
    ctx = _context(s)
    rows = []
    for name in s.decoders:
        for b in s.batch_sizes:
            rows.append(run.unit(f"{name} b={b}", lambda name=name, b=b: _measure(s, name, b, ctx)))
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    info = machine()
    run.text(
        f"{s.model} ({s.dtype}) for the searches and HSO, {s.nar_model} converted (untrained) "
        f"for NAR, on {info['device']} with {info['threads']} threads (load average "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} over 1 / 5 / 15 min at the end), "
        f"torch {info['torch']}; {s.rounds} interleaved rounds. Each row: the first b inputs; "
        "'out/s' the batched decoder's outputs per second; 'vs loop' its speed-up over the same "
        "decoder run on one input at a time (a ratio > 1: batching pays); 'time / peer' its "
        "time over the peer's on the same batch (generate's beam search; the AR baseline for "
        "NAR; the plain model's forward for HSO): ≤ 1 means no slower. Ratios are medians of "
        "per-round pairs. 'same' checks the outputs: the batched search against generate "
        "(beam, conditional), against the loop (exact: the same modes and node counts; NAR: "
        "the same outputs; HSO: NLL within 1e-4). Beam searches: beam "
        f"{s.beams}, {s.new_tokens} new tokens; conditional: a classifier scoring 0, k = {s.k}; "
        f"exact: {s.exact_tokens} tokens at most, {s.exact_nodes} nodes per prompt; NAR: "
        f"outputs of {s.nar_length} tokens, {s.nar_steps} steps, SUNDAE {s.nar_samples} "
        f"samples, AR beam {s.beams}; HSO: {s.hso_tokens}-token sequences, k = 25; dynamic "
        "evaluation (when named): the same sequences, a step per 10 tokens, each row its own "
        "weights (logits within 0.05 of the loop's: rounding grows over the steps)."
    )
    run.table(rows)


def _context(s: ThroughputSettings) -> dict[str, Any]:
    """The models and inputs every case reads, loaded once."""
    from gencraft.data.tasks import pick_examples, source_of, task_examples
    from gencraft.models import load_model
    from gencraft.models.introspect import eos_ids, model_shape, pad_id
    from gencraft.models.placement import check_placement
    from gencraft.models.prompts import left_padded_batches
    from gencraft.search.prompts import encode_prompt, instruction_texts

    device, dtype = check_placement(s.device, s.dtype)  # one line for a bad device or dtype
    dtype = dtype or torch.float32
    top = max(s.batch_sizes)
    ctx: dict[str, Any] = {"device": device}
    lm_used = any(d in s.decoders for d in ("beam", "conditional", "exact", "hso", *OPT_IN))
    if lm_used:
        model, tok = load_model(s.model, device=device, dtype=dtype)
        texts = instruction_texts("e2e", (top + 1) // 2, s.data_dir) + instruction_texts(
            "xsum", top // 2, s.data_dir, max_source_words=40
        )
        prompts = [encode_prompt(tok, t)[0].tolist() for t in texts[:top]]
        pad = pad_id(model, tok)
        ((_, ids, mask),) = left_padded_batches(model, tok, prompts, len(prompts))
        shape = model_shape(model)
        g = torch.Generator().manual_seed(0)
        ctx.update(
            model=model,
            pad=pad,
            eos=eos_ids(model, None),
            ids=ids.to(device),
            mask=mask.to(device),
            rows=[torch.tensor([p], device=device) for p in prompts],
            hidden_shape=(shape.layers + 1, shape.hidden),
            seqs=torch.randint(10, shape.vocab - 10, (top, s.hso_tokens), generator=g).to(device),
        )
    if any(d in s.decoders for d in ("sundae", "mask-predict")):
        from gencraft.nar.functional import noise_ids
        from gencraft.nar.model import load_mlm_seq2seq, target_token_ids

        limit = max(s.nar_length + 2, 64)
        nar, ntok = load_mlm_seq2seq(s.nar_model, max_target_length=limit)
        ar, _ = load_mlm_seq2seq(s.nar_model, max_target_length=limit, bidirectional=False)
        examples = pick_examples(task_examples("e2e", "test", s.data_dir), top, spread=True)
        enc = ntok([source_of(e) for e in examples], truncation=True, max_length=128, padding=True)
        ctx.update(
            nar=nar.to(device=device, dtype=dtype).eval(),
            ar=ar.to(device=device, dtype=dtype).eval(),
            src=torch.tensor(enc["input_ids"], device=device),
            src_mask=torch.tensor(enc["attention_mask"], device=device),
            noise=noise_ids(ntok).to(device),
            mask_id=target_token_ids(ntok)["mask"],
        )
    return ctx


def _measure(s: ThroughputSettings, name: str, b: int, ctx: dict) -> dict[str, Any]:
    from gencraft.studies.timing import interleaved

    nar = name in ("sundae", "mask-predict")
    spec = _nar_cases(s, name, b, ctx) if nar else _lm_cases(s, name, b, ctx)
    cases = spec["cases"]
    with torch.no_grad():  # HSO turns its own gradients on
        same = spec["same"]()
        t = interleaved(cases, "batched", rounds=s.rounds, warmup=1)
        peak = peak_memory_bytes(cases["batched"], ctx["device"])
        extra: dict[str, Any] = {}
        if nar:
            out, ar = spec["calls"]()
            extra = {
                "calls/output": sum(out.model_calls) / b,
                "tokens/call": sum(out.tokens_per_call) / b,
                "AR calls/output": sum(ar.model_calls) / b,
                "AR tokens/call": sum(ar.tokens_per_call) / b,
            }
    row = {
        "decoder": name,
        "b": b,
        "out/s": b / t["batched"].seconds,
        "batched s": t["batched"].seconds,
        "vs loop": t["loop"].ratio,  # the loop's time over the batched decoder's
        "loop ratio q25-q75": f"{t['loop'].low:.2f}-{t['loop'].high:.2f}",
    }
    if "peer" in t:
        row["time / peer"] = 1 / t["peer"].ratio
        row["peer ratio q25-q75"] = f"{1 / t['peer'].high:.2f}-{1 / t['peer'].low:.2f}"
    row["peak MiB"] = round(peak / 2**20, 1) if peak is not None else "n/a"
    row["same"] = same
    row.update(extra)
    row["measured at"] = time.strftime("%H:%M:%S")
    return row
