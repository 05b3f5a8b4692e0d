"""``search-empty``: the exact mode (DFS, ``max_nodes`` per prompt) of "Summarize in one
sentence:" + an XSum document cut to each length, and of E2E MRs: how often the best output
found is empty, by prompt length (thesis §6.5 analogue). One unit per prompt: a stopped run
goes on where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from gencraft.models import load_model
from gencraft.progress import tqdm
from gencraft.search.exact import exact_mode_batch
from gencraft.search.prompts import encode_prompt, instruction_texts
from gencraft.studies.runner import ExperimentRun, register, settings_field
from gencraft.studies.search_inputs import TINY, batched
from gencraft.utils import default_device


@dataclass
class EmptySettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    prompts: int = settings_field(40, "XSum prompts per document length")
    words: tuple[int, ...] = settings_field((25, 50, 100, 200), "XSum document cut (words)")
    e2e_prompts: int = settings_field(80, "E2E prompts (0: none)")
    max_nodes: int = settings_field(200, "DFS node budget per prompt")
    max_new_tokens: int = settings_field(48, "longest output considered")
    batch_size: int = settings_field(8, "prompts searched together")
    data_dir: str | None = settings_field(None, "datasets directory")


@register(
    "search-empty",
    title="empty modes by prompt length (exact search, thesis §6.5 analogue)",
    settings=EmptySettings,
    scales={
        "tiny": {
            **TINY,
            "prompts": 2,
            "words": (10, 20),
            "e2e_prompts": 2,
            "max_nodes": 20,
            "max_new_tokens": 6,
        },
        "cpu": {},
        "gpu": {"max_nodes": 2000},
    },
    shardable=True,
    cpu_minutes=75,
)
def empty(s: EmptySettings, run: ExperimentRun) -> None:
    """How often the best output exact search finds is empty."""
    model, tok = load_model(s.model, device=default_device())
    sets = {
        f"xsum, {w} words": instruction_texts("xsum", s.prompts, s.data_dir, max_source_words=w)
        for w in s.words
    }
    if s.e2e_prompts:
        sets["e2e MR"] = instruction_texts("e2e", s.e2e_prompts, s.data_dir)
    parts: dict[str, list] = {}  # every unit asked for before any is read (sharding)
    for name, texts in sets.items():
        parts[name] = []
        for i in tqdm(range(0, len(texts), s.batch_size), desc=name):

            def some(i=i, texts=texts):
                prompts = [encode_prompt(tok, t) for t in texts[i : i + s.batch_size]]
                ((ids, mask),) = batched(model, tok, prompts, len(prompts))
                found = exact_mode_batch(
                    model, ids, mask, max_new_tokens=s.max_new_tokens, max_nodes=s.max_nodes
                )
                return [
                    {
                        "prompt_tokens": p.shape[1],
                        "empty": not r.tokens,
                        "exact": r.exact,
                        "log_prob": r.log_prob,
                        "nodes": r.nodes,
                        "mode": tok.decode(r.tokens),
                    }
                    for p, r in zip(prompts, found, strict=True)
                ]

            last = min(i + s.batch_size, len(texts)) - 1
            parts[name].append(run.unit(f"{name} #{i}-{last}", some))
    summary = []
    for name, got in parts.items():
        rows = [r for part in got for r in part]
        n = len(rows)
        summary.append(
            {
                "prompts": name,
                "n": n,
                "mean prompt tokens": sum(r["prompt_tokens"] for r in rows) / n,
                "empty mode %": 100 * sum(r["empty"] for r in rows) / n,
                "of which proven %": 100 * sum(r["empty"] and r["exact"] for r in rows) / n,
                "proven exact %": 100 * sum(r["exact"] for r in rows) / n,
                "mean nodes": sum(r["nodes"] for r in rows) / n,
            }
        )
    run.text(
        f"{s.model}: DFS with at most {s.max_nodes} nodes and outputs up to "
        f"{s.max_new_tokens} tokens, {s.batch_size} prompts searched together. 'empty mode' is "
        "an upper bound unless proven."
    )
    run.table(summary)
    _plot_empty(summary, run.plot_path("empty_by_length.png", "empty modes by prompt length"))


def _plot_empty(summary: list[dict], path) -> None:
    from gencraft.plotting import pyplot

    plt = pyplot()

    xsum = [r for r in summary if r["prompts"].startswith("xsum")]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(
        [r["mean prompt tokens"] for r in xsum],
        [r["empty mode %"] for r in xsum],
        marker="o",
        label="XSum prompts",
    )
    for r in summary:
        if r["prompts"] == "e2e MR":
            ax.scatter([r["mean prompt tokens"]], [r["empty mode %"]], color="C1", label="E2E")
    ax.set_xlabel("mean prompt length (tokens)")
    ax.set_ylabel("best output found is empty (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
