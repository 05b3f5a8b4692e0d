"""``search-mbr``: minimum-Bayes-risk selection over sampled candidates against beam
search, per task, with the per-prompt ROUGE-L difference as the unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from gencraft.models import load_model
from gencraft.search.prompts import instruction_texts
from gencraft.studies.runner import ExperimentRun, register, settings_field
from gencraft.studies.search_inputs import TINY
from gencraft.studies.timing import running_clock
from gencraft.utils import default_device


def mbr_differences(asked: list[tuple]) -> list[dict]:
    """Per task and MBR N: the per-prompt ROUGE-L difference from beam search (``asked``:
    (task, decoder, references, prompts, unit) in order, beam first per task)."""
    from gencraft.metrics.stats import paired_t
    from gencraft.metrics.text import rouge_per_example

    rows, beam = [], {}
    for task, name, refs, _, got in asked:
        scores = rouge_per_example(got["outputs"], refs, "rougeL")
        if name == "beam":
            beam[task] = scores
            continue
        t = paired_t([m - b for m, b in zip(scores, beam[task], strict=True)])
        rows.append(
            {
                "task": task,
                "decoder": name,
                "prompts": t["n"],
                "RL diff": t["mean"],
                "95% interval": f"[{t['low']:.2f}, {t['high']:.2f}]",
                "p": t["p"],
                "worse": sum(m < b for m, b in zip(scores, beam[task], strict=True)),
            }
        )
    return rows


@dataclass
class MbrSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    tasks: tuple[str, ...] = settings_field(("e2e", "xsum"), "instruction prompts' tasks")
    prompts: int = settings_field(40, "test prompts per task")
    beams: int = settings_field(4, "the beam search baseline's beams")
    candidates: tuple[int, ...] = settings_field((8, 16, 32), "MBR's N")
    utility: str = settings_field("chrf", "MBR's utility (the scores are other metrics)")
    epsilon: float = settings_field(0.02, "epsilon sampling of the candidates")
    max_new_tokens: int = settings_field(64, "longest output")
    max_source_words: int = settings_field(100, "XSum document cut (words)")
    batch_size: int = settings_field(8, "prompts decoded together")
    seed: int = settings_field(0, "candidate seed (prompt i: seed + i)")
    data_dir: str | None = settings_field(None, "datasets directory")


@register(
    "search-mbr",
    title="MBR decoding against beam search (E2E and XSum instruction prompts)",
    settings=MbrSettings,
    scales={
        "tiny": {
            **TINY,
            "prompts": 1,
            "candidates": (2,),
            "max_new_tokens": 4,
            "max_source_words": 20,
        },
        "cpu": {},
        "gpu": {"prompts": 500, "batch_size": 32},
    },
    shardable=True,
    cpu_minutes=150,
)
def mbr_study(s: MbrSettings, run: ExperimentRun) -> None:
    """Beam search and MBR at each N on the same prompts, scored by score_task with metrics
    other than the utility, with the wall time per output."""
    from functools import partial

    from gencraft.metrics.tasks import score_task
    from gencraft.models.generate import generate_text
    from gencraft.search.mbr import mbr_generate_text
    from gencraft.search.prompts import instruction_references

    model, tok = load_model(s.model, device=default_device())
    rows, asked = [], []
    for task in s.tasks:
        texts = instruction_texts(task, s.prompts, s.data_dir, max_source_words=s.max_source_words)
        refs = instruction_references(task, s.prompts, s.data_dir, every=True)
        methods = [("beam", 0)] + [(f"MBR N={n}", n) for n in s.candidates]
        for name, n in methods:

            def unit(n=n, texts=texts):
                if n:
                    decode = partial(mbr_generate_text, n=n, utility=s.utility, do_sample=True)
                    kw = dict(epsilon=s.epsilon)
                else:
                    decode, kw = generate_text, dict(num_beams=s.beams)
                outs, t0 = [], running_clock()
                for i in range(0, len(texts), s.batch_size):
                    batch = texts[i : i + s.batch_size]
                    kw.update(seed=s.seed + i, max_new_tokens=s.max_new_tokens)
                    outs += decode(model, tok, batch, **kw)
                return {"outputs": outs, "seconds": running_clock() - t0}

            asked.append((task, name, refs, len(texts), run.unit(f"{task} {name}", unit)))
    for task, name, refs, n, got in asked:  # read once every unit is asked for (sharding)
        # metrics other than the utility: BLEU and ROUGE-L (E2E), ROUGE-1/2/L (XSum)
        scores = score_task(task, got["outputs"], refs)
        keep = {k: v for k, v in scores.items() if isinstance(v, float)}
        per = got["seconds"] / n
        rows.append({"task": task, "decoder": name, **keep, "s/output": per})
    run.text(
        f"{s.model}: beam {s.beams} against MBR over N epsilon-{s.epsilon} samples with the "
        f"{s.utility} utility, {s.prompts} test prompts per task, up to {s.max_new_tokens} new "
        "tokens; scored by score_task (its metrics for each task, none of them the utility)."
    )
    for task in s.tasks:
        run.table([r for r in rows if r["task"] == task])
    run.text(
        "Each MBR N minus beam search, paired by prompt: per-prompt ROUGE-L F1 (x100, against "
        "every reference; not the utility), mean difference with its 95% paired-t interval."
    )
    run.table(mbr_differences(asked))
