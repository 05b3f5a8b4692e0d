"""Search speed and memory studies, runnable with ``gencraft reproduce``:

* ``search-speed``: gencraft's ``beam_search`` against ``generate(num_beams=B,
  do_sample=False, length_penalty=0.0, early_stopping=True)`` on the same prompts, in
  interleaved rounds (machine load hits both alike); outputs are checked identical each round;
* ``search-cad-speed``: CAD's two engines (paired rows through ``generate``, two streams
  through the Stepper) timed on the same prompts;
* ``search-memory``: the key/value bytes exact search holds on its first (greedy) path of
  depth d, against a full cache at every node (the O(d²) scheme the thesis's §6.2 avoids).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

import torch

from gencraft.models import load_model
from gencraft.models.introspect import model_shape
from gencraft.progress import tqdm
from gencraft.search.beam import beam_search_batch
from gencraft.search.exact import exact_mode
from gencraft.search.prompts import encode_prompt, instruction_texts
from gencraft.studies.runner import ExperimentRun, register, settings_field
from gencraft.studies.search_inputs import TINY, batched, instruction_prompts
from gencraft.studies.timing import running_clock
from gencraft.utils import default_device


@dataclass
class SpeedSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    prompts: int = settings_field(8, "instruction prompts (half E2E, half XSum)")
    beams: int = settings_field(4, "beam size")
    new_tokens: int = settings_field(32, "max_new_tokens")
    rounds: int = settings_field(3, "interleaved timing rounds")
    batch_size: int = settings_field(8, "prompts per batch (both searches)")
    data_dir: str | None = settings_field(None, "datasets directory")


@register(
    "search-speed",
    title="beam search against generate (speed, identical outputs)",
    settings=SpeedSettings,
    scales={"tiny": {**TINY, "prompts": 2, "rounds": 1, "new_tokens": 8}, "cpu": {}, "gpu": {}},
    cpu_minutes=3,
)
def speed(s: SpeedSettings, run: ExperimentRun) -> None:
    """gencraft's beam_search_batch vs generate on the same left-padded batches."""
    model, tok = load_model(s.model, device=default_device())
    prompts = instruction_prompts(tok, s.prompts, s.data_dir)
    batches = batched(model, tok, prompts, s.batch_size)
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, int) else eos[0]
    _our_beams(model, batches, s), _generate_beams(model, batches, s, eos)  # warm-up
    rounds = []
    for i in tqdm(range(s.rounds), desc="rounds"):

        def one_round():
            t0 = running_clock()
            h = _our_beams(model, batches, s)
            t1 = running_clock()
            o = _generate_beams(model, batches, s, eos)
            t2 = running_clock()
            return {"gencraft": t1 - t0, "generate": t2 - t1, "identical": _same(h, o, eos)}

        rounds.append(run.unit(f"round {i}", one_round))
    g = median(r["gencraft"] for r in rounds)
    b = median(r["generate"] for r in rounds)
    run.text(
        f"{s.model}, {len(prompts)} prompts in left-padded batches of {s.batch_size} (both "
        f"searches), beam {s.beams}, up to {s.new_tokens} new tokens; median over interleaved "
        "rounds."
    )
    run.table(
        [
            {
                "gencraft s": g,
                "generate s": b,
                "ratio": g / b,
                "identical outputs": all(r["identical"] for r in rounds),
            }
        ]
    )


def _our_beams(model, batches: list, s: SpeedSettings) -> list:
    """Each prompt's hypotheses from :func:`beam_search_batch` over ``batches`` of
    (ids, mask) ``[B, T]``."""
    return [
        h
        for ids, mask in batches
        for h in beam_search_batch(model, ids, mask, num_beams=s.beams, max_new_tokens=s.new_tokens)
    ]


def _generate_beams(model, batches: list, s: SpeedSettings, eos: int) -> list:
    """Each prompt's ``generate`` output ``[T + new]`` with its batch's prompt width."""
    with torch.no_grad():
        return [
            (row, ids.shape[1])
            for ids, mask in batches
            for row in model.generate(
                ids,
                attention_mask=mask,
                num_beams=s.beams,
                do_sample=False,
                length_penalty=0.0,
                early_stopping=True,
                max_new_tokens=s.new_tokens,
                pad_token_id=eos,
            )
        ]


def _same(hyps: list, outs: list, eos: int) -> bool:
    """Whether every prompt's best hypothesis (its EOS if finished) starts ``generate``'s."""
    for h, (o, width) in zip(hyps, outs, strict=True):
        want = o[width:].tolist()
        got = h[0].tokens + ([eos] if h[0].finished else [])
        if want[: len(got)] != got:
            return False
    return True


@dataclass
class CadSpeedSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    prompts: int = settings_field(8, "instruction prompts (half E2E, half XSum)")
    beams: int = settings_field(4, "beam size")
    new_tokens: int = settings_field(32, "max_new_tokens")
    rounds: int = settings_field(3, "interleaved timing rounds")
    batch_size: int = settings_field(8, "prompts per batch (both searches)")
    cad_alpha: float = settings_field(0.5, "CAD's alpha")
    data_dir: str | None = settings_field(None, "datasets directory")


@register(
    "search-cad-speed",
    title="context-aware beam search against plain beam search (time on the same batches)",
    settings=CadSpeedSettings,
    scales={"tiny": {**TINY, "prompts": 2, "rounds": 1, "new_tokens": 8}, "cpu": {}, "gpu": {}},
    cpu_minutes=4,
)
def cad_speed(s: CadSpeedSettings, run: ExperimentRun) -> None:
    """CAD beam search (two streams: the prompt with its source, and the instruction alone)
    against plain beam search on the prompts with their sources, the same batches."""
    from gencraft.search.prompts import INSTRUCTIONS

    model, tok = load_model(s.model, device=default_device())
    half = s.prompts // 2
    kinds = ["e2e"] * half + ["xsum"] * (s.prompts - half)
    prompts = instruction_prompts(tok, s.prompts, s.data_dir)
    plain = [encode_prompt(tok, INSTRUCTIONS[k] + "\n") for k in kinds]
    batches = list(
        zip(
            batched(model, tok, prompts, s.batch_size),
            batched(model, tok, plain, s.batch_size),
            strict=True,
        )
    )
    routes = _cad_routes(model, tok, batches, s)
    for go in routes.values():  # warm-up
        go()
    rounds = []
    for i in tqdm(range(s.rounds), desc="rounds"):

        def one_round():
            times = {}
            for name, go in routes.items():
                t0 = running_clock()
                go()
                times[name] = running_clock() - t0
            return times

        rounds.append(run.unit(f"round {i}", one_round))
    _cad_speed_report(s, run, rounds, len(prompts))


def _cad_routes(model, tok, batches: list, s: CadSpeedSettings) -> dict[str, Any]:
    """The four searches timed, each over every batch ((ids, mask), (context-free ids, mask)):
    gencraft's beam search, plain and CAD (two steppers); transformers' beam search, plain and
    CAD by paired rows."""
    from gencraft.models.cad import CADSettings, ContrastStepper, paired_contrast_generate
    from gencraft.models.introspect import pad_id
    from gencraft.models.stepping import HFStepper

    kw = dict(num_beams=s.beams, max_new_tokens=s.new_tokens)
    cad = CADSettings(s.cad_alpha)
    eos, pad = model.generation_config.eos_token_id, pad_id(model, tok)

    def plain_beam():
        return [beam_search_batch(model, ids, mask, **kw) for (ids, mask), _ in batches]

    def cad_beam():
        for (ids, mask), (nids, nmask) in batches:
            streams = [
                HFStepper(model, i, attention_mask=m, max_new_tokens=s.new_tokens)
                for i, m in ((ids, mask), (nids, nmask))
            ]
            beam_search_batch(ContrastStepper(*streams, cad), eos_token_id=eos, **kw)

    def generate_beam(paired: bool):
        for (ids, mask), (nids, nmask) in batches:
            if paired:
                paired_contrast_generate(
                    model.generate,
                    ids,
                    mask,
                    nids,
                    nmask,
                    cad=cad,
                    left_padding=True,
                    pad_token_id=pad,
                    **kw,
                )
            else:
                model.generate(input_ids=ids, attention_mask=mask, pad_token_id=pad, **kw)

    return {
        "beam": plain_beam,
        "cad": cad_beam,
        "generate": lambda: generate_beam(False),
        "paired": lambda: generate_beam(True),
    }


def _cad_speed_report(s: CadSpeedSettings, run: ExperimentRun, rounds: list, n: int) -> None:
    b, c = median(r["beam"] for r in rounds), median(r["cad"] for r in rounds)
    run.text(
        f"{s.model}, {n} prompts in left-padded batches of {s.batch_size}, beam "
        f"{s.beams}, up to {s.new_tokens} new tokens, CAD alpha {s.cad_alpha} (context-free "
        "stream: the instruction alone); median over interleaved rounds. Outputs differ (CAD "
        "changes the distribution), so the searches may stop at different steps."
    )
    run.table([{"beam s": b, "CAD beam s": c, "ratio": c / b, "target": "<= 2.1"}])
    if all("paired" in r for r in rounds):  # rounds timed since the paired route
        g, p = median(r["generate"] for r in rounds), median(r["paired"] for r in rounds)
        run.text(
            "CAD by paired rows (one call over 2B rows a step, the context-free prompts padded "
            "to the batch's width; the route of prefix models) against transformers' own beam "
            "search, the same batches and rounds:"
        )
        run.table([{"generate beam s": g, "paired CAD s": p, "ratio": p / g, "target": "<= 2.1"}])


@dataclass
class MemorySettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    depths: tuple[int, ...] = settings_field((16, 64, 256), "path depths d")
    data_dir: str | None = settings_field(None, "datasets directory")


@register(
    "search-memory",
    title="exact-search key/value memory on a greedy path (linear, not quadratic)",
    settings=MemorySettings,
    scales={"tiny": {**TINY, "depths": (4, 8, 16)}, "cpu": {}, "gpu": {}},
    cpu_minutes=2,
)
def memory(s: MemorySettings, run: ExperimentRun) -> None:
    """Peak key/value bytes of exact search against a full cache per node."""
    model, tok = load_model(s.model, device=default_device())
    prompt = encode_prompt(tok, instruction_texts("e2e", 1, s.data_dir)[0])
    shape = model_shape(model)
    per_pos = 2 * shape.layers * shape.kv_heads * shape.head_dim
    per_pos *= next(model.parameters()).element_size()
    rows = []
    for d in tqdm(s.depths, desc="depths"):

        def one(d=d):
            r = exact_mode(model, prompt, max_new_tokens=d, length=d, max_nodes=d + 1)
            p = prompt.shape[1]
            naive = sum((p + i) * per_pos for i in range(d + 1))
            return {
                "depth": d,
                "prompt tokens": p,
                "peak KV bytes": r.peak_kv_bytes,
                "full cache per node": naive,
                "ratio to naive": r.peak_kv_bytes / naive,
                "bytes per position": r.peak_kv_bytes / (p + d),
            }

        rows.append(run.unit(f"depth {d}", one))
    run.text(f"{s.model}: length-conditional search stopped after d + 1 nodes (its greedy path).")
    run.table(rows)
