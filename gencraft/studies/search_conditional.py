"""``search-conditional``: attribute classifiers trained on the model's own samples (§7.4.3),
then beam vs conditional beam search: (a) the rate of degenerate outputs, (b) length control:
both searches forced to n tokens, which finds the higher log-likelihood.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.models.stepping import sequence_log_prob
from gencraft.progress import tqdm
from gencraft.search.beam import beam_search_batch
from gencraft.search.prompts import encode_prompt, instruction_texts
from gencraft.studies.runner import ExperimentRun, machine, register, settings_field
from gencraft.studies.search_inputs import batched
from gencraft.utils import default_device


@dataclass
class ConditionalSettings:
    model: str = settings_field("smollm2-135m", "model name or path")
    train_prompts: int = settings_field(500, "classifier training prompts (half E2E, half XSum)")
    samples_per_prompt: int = settings_field(6, "samples of the model per training prompt")
    sample_batch: int = settings_field(8, "training prompts sampled together")
    sample_tokens: int = settings_field(64, "max_new_tokens of the samples")
    epochs: int = settings_field(8, "classifier epochs")
    censored: bool = settings_field(True, "length: lower-bound labels for cut samples")
    samples: str | None = settings_field(None, ".pt file: load the samples from it, or save")
    test_prompts: int = settings_field(200, "test prompts of the degenerate study")
    length_prompts: int | None = settings_field(60, "test prompts of the length study")
    beams: tuple[int, ...] = settings_field((5, 20), "beam sizes")
    k: int = settings_field(100, "candidates scored by the classifier per step")
    ratios: tuple[float, ...] = settings_field(
        (0.8, 0.9, 1.0, 1.1, 1.2), "length / reference length (thesis: 0.8-1.2 by 0.1)"
    )
    length_includes_eos: bool = settings_field(
        False, "length study: n counts the EOS (the thesis's convention)"
    )
    max_new_tokens: int = settings_field(64, "longest output")
    max_source_words: int = settings_field(100, "XSum document cut (words)")
    forced_eos: str = settings_field(
        "free", "forced EOS in the searches (length study, on-beam limit): 'model' or 'free'"
    )
    studies: tuple[str, ...] = settings_field(("degenerate", "length"), "which studies")
    classifiers: str | None = settings_field(None, "a previous run's folder: reuse its classifiers")
    kept_dtype: str = settings_field(
        "float16", "dtype the trained classifiers are kept and used in (float32 doubles 11 MB)"
    )
    batch_size: int = settings_field(8, "test prompts searched together")
    data_dir: str | None = settings_field(None, "datasets directory")
    work_dir: str | None = settings_field(None, "working folder (default: the run's)")

    def __post_init__(self) -> None:
        if self.kept_dtype not in ("float32", "float16", "bfloat16"):
            raise GencraftError(
                f"kept_dtype must be float32, float16 or bfloat16, not {self.kept_dtype!r}"
            )


@register(
    "search-conditional",
    title="beam vs conditional beam search: degenerate rate and length control",
    settings=ConditionalSettings,
    scales={
        "tiny": {
            "model": "tiny-llama",
            "train_prompts": 4,
            "samples_per_prompt": 2,
            "sample_tokens": 8,
            "epochs": 1,
            "test_prompts": 2,
            "length_prompts": 2,
            "beams": (2,),
            "k": 5,
            "max_new_tokens": 6,
            "max_source_words": 20,
            "ratios": (0.1, 0.2),  # lengths of a few tokens: the length study stays short
        },
        "cpu": {},
        "gpu": {"train_prompts": 2000, "samples_per_prompt": 16},
    },
    cpu_minutes=480,
)
def search_conditional(s: ConditionalSettings, run: ExperimentRun) -> None:
    """Conditional beam search with attribute classifiers trained on the model's samples."""
    work = Path(s.work_dir or run.directory)
    result = run.unit("conditional", lambda: conditional_study(s, work))
    md = (work / "conditional.md").read_text() if (work / "conditional.md").is_file() else ""
    run.text(md or json.dumps({k: v for k, v in result.items() if k in ("degenerate",)}))
    if (work / "length_control.png").is_file():
        run.plot_path("length_control.png", "length control")


def conditional_study(s: ConditionalSettings, out_dir: Path) -> dict:
    """Beam vs conditional beam search: degenerate rate, and length-controlled generation;
    its files (samples, classifiers, rows, report) in ``out_dir``."""
    model, tok = load_model(s.model, device=default_device())
    if s.classifiers:  # reuse trained classifiers: skip sampling and training

        def saved(a: str) -> Path:  # the kept weights where the run kept them, else best/
            kept = Path(s.classifiers, f"clf-{a}", "kept")
            return kept if kept.is_dir() else Path(s.classifiers, f"clf-{a}", "best")

        clfs = {a: _load_classifier(saved(a), model) for a in s.studies}
        result: dict = {"model": s.model, **machine(), "classifiers": s.classifiers}
        return _conditional_eval(s, model, tok, clfs, result, out_dir)
    clfs, result = _train_classifiers(s, model, tok, out_dir)
    return _conditional_eval(s, model, tok, clfs, result, out_dir)


def _train_classifiers(s: ConditionalSettings, model, tok, out_dir: Path) -> tuple[dict, dict]:
    """Samples from the model on training prompts (resumable), then one classifier per
    study trained on them and kept; returns (study -> classifier, the result so far)."""
    from gencraft.models.introspect import eos_ids
    from gencraft.search.train import ClassifierTrainConfig, relabel_degenerate, train_classifier

    eos = eos_ids(model, None)
    half = s.train_prompts // 2
    train_texts = instruction_texts("e2e", half, s.data_dir, split="train") + instruction_texts(
        "xsum",
        s.train_prompts - half,
        s.data_dir,
        split="train",
        max_source_words=s.max_source_words,
    )
    # kept in the work folder by default, so a stopped run resumes without resampling
    samples = Path(s.samples) if s.samples else out_dir / "samples.pt"
    # the hidden states (2 MB a sample) only where a classifier is still to train
    untrained = [a for a in s.studies if not (out_dir / f"clf-{a}/kept/record.json").is_file()]
    rows = _sample_resumable(model, tok, train_texts, s, samples, hidden=bool(untrained))
    if not s.censored:  # cut samples carry no length labels then
        rows = [
            {**r, "labels": torch.full_like(r["labels"], -100), "censored": torch.tensor(False)}
            if bool(r["censored"])
            else r
            for r in rows
        ]
    result: dict = {
        "model": s.model,
        **machine(),
        "train_prompts": len(train_texts),
        "censored_length_labels": any(bool(r["censored"]) for r in rows),
        "samples": len(rows),
        "finished_samples": sum(bool(r["finished"]) for r in rows),
    }
    cfg = ClassifierTrainConfig()
    cfg = replace(cfg, fit=replace(cfg.fit, epochs=s.epochs))
    clfs = {}
    for attr in s.studies:
        data = rows if attr == "length" else relabel_degenerate(rows, tok, train_texts, eos)

        def train(clf, data=data, attr=attr) -> dict:
            record = train_classifier(clf, data, cfg, out_dir / f"clf-{attr}")
            return {k: v for k, v in record.items() if k != "config"}

        clfs[attr], result[f"{attr}_classifier"] = kept_classifier(
            model, attr, train, out_dir / f"clf-{attr}" / "kept", s.kept_dtype
        )
        if attr == "degenerate":
            result["degenerate_training_rate"] = sum(int(r["labels"][0]) for r in data) / len(data)
        (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    return clfs, result


def kept_classifier(model, attr: str, train, kept: Path, dtype: str) -> tuple[Any, dict]:
    """The ``attr`` classifier of ``model``, trained once by ``train(clf) -> record`` and kept
    in ``kept`` in ``dtype`` with its training record; a rerun loads it from there. It is
    always used as kept (float16 weights read back into float32), so a study resumed in a later
    invocation reads the same weights as the batches before. Returns (classifier, record)."""
    from gencraft.search.classifier import AttributeClassifier
    from gencraft.search.train import classifier_for

    record_path = kept / "record.json"
    if not record_path.is_file():
        clf = classifier_for(model, attr)
        record = train(clf)
        copy = AttributeClassifier(clf.config)
        copy.load_state_dict(clf.state_dict())
        copy.to(getattr(torch, dtype)).save_pretrained(kept)
        record_path.write_text(json.dumps(record, indent=2))
    clf = _load_classifier(kept, model)
    return clf, json.loads(record_path.read_text())


def _load_classifier(path: Path, model) -> Any:
    """A saved classifier in float32, bound to ``model`` and on its device (it loads on the
    CPU; the search runs where the model is)."""
    from gencraft.search.classifier import AttributeClassifier

    device = next(model.parameters()).device
    return AttributeClassifier.from_pretrained(path, model).float().to(device).eval()


#: training prompts sampled between saves of the partial samples
SAMPLE_CHUNK = 32


def _sample_resumable(
    model, tok, texts: list[str], s: ConditionalSettings, path: Path, hidden: bool = True
) -> list[dict]:
    """The model's samples of every training prompt, with their hidden states. Drawn
    ``SAMPLE_CHUNK`` prompts at a time and saved after each chunk (``path`` + ``.partial``),
    so a stopped run resumes at its first unsampled prompt; written to ``path`` when complete
    (a file there already is loaded instead). Both files hold the rows without their states
    (about 1 KB a sample, not 2 MB), and the states are computed once every row is drawn
    (unless ``hidden`` is False: no classifier will train on them)."""
    from gencraft.search.train import attach_hidden, sample_training_data

    prompts = [encode_prompt(tok, t) for t in texts]
    partial = path.with_name(path.name + ".partial")
    if path.is_file():
        rows = torch.load(path)
        return attach_hidden(model, rows, prompts, progress=True) if hidden else rows
    done, rows = 0, []
    if partial.is_file():
        saved = torch.load(partial)
        done, rows = saved["done"], saved["rows"]
    path.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(texts), initial=done, desc="sampling")
    for start in range(done, len(texts), SAMPLE_CHUNK):
        rows += sample_training_data(
            model,
            tok,
            prompts[start : start + SAMPLE_CHUNK],
            attribute="length",
            samples_per_prompt=s.samples_per_prompt,
            max_new_tokens=s.sample_tokens,
            prompt_texts=texts,
            censored=s.censored,
            seed=0,
            first=start,
            progress=False,
            batch_size=s.sample_batch,
            hidden=False,
        )
        torch.save({"done": min(start + SAMPLE_CHUNK, len(texts)), "rows": rows}, partial)
        bar.update(min(SAMPLE_CHUNK, len(texts) - start))
    bar.close()
    torch.save(rows, path)
    partial.unlink(missing_ok=True)
    return attach_hidden(model, rows, prompts, progress=True) if hidden else rows


def _conditional_eval(
    s: ConditionalSettings, model, tok, clfs: dict, result: dict, out_dir: Path
) -> dict:
    from gencraft.search.prompts import instruction_references

    def prompts(total: int) -> list[tuple[str, str]]:
        half = total // 2
        return [
            (t, r)
            for kind, n in (("e2e", half), ("xsum", total - half))
            for t, r in zip(
                instruction_texts(kind, n, s.data_dir, max_source_words=s.max_source_words),
                instruction_references(kind, n, s.data_dir),
                strict=True,
            )
        ]

    tests = prompts(s.test_prompts)
    if "degenerate" in s.studies:
        _degenerate_study(s, model, tok, clfs["degenerate"], tests, result, out_dir)
    if "length" in s.studies:
        _length_study(s, model, tok, clfs["length"], prompts, result, out_dir)
    (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    md = [_conditional_size(s, result, len(tests)), ""]
    if "degenerate" in result:
        d = result["degenerate"]
        md += [
            f"Degenerate outputs (beam {s.beams[0]}, {len(tests)} test prompts): "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in d["rates"].items())
            + f"; only conditional fine on {d['only_conditional_fine']}, only beam (on_beam) "
            f"fine on {d['only_beam_fine']}",
            "",
            *_degenerate_lines(d),
        ]
    if "summary" in result.get("length", {}):
        md += [
            f"Length control ({result['length']['prompts']} test prompts; wins on the model's "
            f"log P(y | x); forced EOS {s.forced_eos}):",
            "",
            "| beams | length / reference | conditional higher | beam higher | tie | sign test p "
            "| mean log P conditional / beam |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        md += [
            f"| {r['beams']} | {r['ratio']:.1f} | {100 * r['conditional_higher']:.0f}% | "
            f"{100 * r['beam_higher']:.0f}% | {100 * r['tie']:.0f}% | {r['p']:.3g} | "
            f"{r['cond_mean_log_prob']:.2f} / {r['beam_mean_log_prob']:.2f} |"
            for r in result["length"]["summary"]
        ]
        md += ["", *_pooled_length_lines(result["length"]["summary"])]
    (out_dir / "conditional.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


#: the thesis's sizes (ch. 6-7), beside which every search report states its own
THESIS_SIZES = (
    "the thesis: classifiers on 300K GPT-2-345M samples (8 epochs) and 1.1M MarianMT zh-en "
    "sources (3 epochs); searches on the 2,002 WMT17 zh-en dev sources and the 1,571 ROC "
    "validation stories, beams 5 and 20"
)


def _conditional_size(s: ConditionalSettings, result: dict, n_tests: int) -> str:
    """The run's size against the thesis's, one line."""
    trained = (
        f"classifiers trained on {result['samples']} samples of the model (epochs: {s.epochs})"
        if "samples" in result
        else f"classifiers from {result.get('classifiers')}"
    )
    studies = []
    if "degenerate" in s.studies:
        studies.append(f"degenerate study on {n_tests} test prompts (beam {s.beams[0]})")
    if "length" in s.studies:
        n = s.length_prompts or s.test_prompts
        studies.append(
            f"length study on {n} prompts x {len(s.ratios)} ratios x beams "
            f"{', '.join(map(str, s.beams))}"
        )
    return f"Size: {trained}; {'; '.join(studies)}. Against {THESIS_SIZES}."


class _BatchLog:
    """Finished batches of a study, one JSON line each (``first`` row index, ``size``, its
    ``rows``), so a stopped study resumes at its first missing batch. Lines of another batch
    size are ignored (their batches do not line up)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size = path, size
        self.done: dict[int, list] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if entry["size"] == size:
                    self.done[entry["first"]] = entry["rows"]

    def add(self, first: int, rows: list) -> None:
        self.done[first] = rows
        with self.path.open("a") as f:
            f.write(json.dumps({"first": first, "size": self.size, "rows": rows}) + "\n")


def _degenerate_lines(d: dict) -> list[str]:
    """The degenerate study's tests as report lines (runs before these statistics: none)."""
    if "paired" not in d:
        return []
    pc, nc = d["paired"], d["no_conflict"]
    rates = ", ".join(
        f"{k} [{100 * lo:.0f}%, {100 * hi:.0f}%]" for k, (lo, hi) in d["rate_intervals"].items()
    )
    worse = "-" if nc["rate"] is None else f"{100 * nc['rate']:.0f}%"
    return [
        f"95% intervals: {rates}. Paired sign test, conditional against beam (on_beam): "
        f"{pc['wins']} better, {pc['losses']} worse, {pc['ties']} tied, p = {pc['p']:.3g}.",
        f"No-conflict control: of the {nc['beam_fine']} prompts whose beam output is fine, "
        f"conditional search made {nc['made_worse']} degenerate ({worse}, 95% interval "
        f"{100 * nc['interval'][0]:.0f}% to {100 * nc['interval'][1]:.0f}%).",
        "",
    ]


def _pooled_length_lines(summary: list[dict]) -> list[str]:
    """Each beam width's wins pooled over the length ratios, with the sign test."""
    from gencraft.metrics.stats import paired_comparison

    lines = []
    for b in sorted({r["beams"] for r in summary}):
        sel = [r for r in summary if r["beams"] == b and r.get("n")]
        pc = paired_comparison(
            sum(r["wins"] for r in sel), sum(r["losses"] for r in sel), sum(r["n"] for r in sel)
        )
        lines.append(
            f"Beam {b}, pooled over the ratios: conditional higher on {pc['wins']}, beam on "
            f"{pc['losses']}, tied {pc['ties']} (prompt, length) pairs; conditional's share of "
            f"the decided {100 * pc['share']:.0f}% [{100 * pc['share_low']:.0f}%, "
            f"{100 * pc['share_high']:.0f}%], sign test p = {pc['p']:.3g}."
        )
    return lines


def _degenerate_study(
    s: ConditionalSettings, model, tok, clf, tests, result: dict, out_dir: Path
) -> None:
    """(a) degenerate rate: conditional beam towards "not degenerate" (class 0), against plain
    beam search with the same policy for completed hypotheses (on the beam, Alg. 1), and
    against transformers' policy (set aside) as a second row."""
    systems = _degenerate_systems(s, clf)
    examples = []
    size = s.batch_size
    log = _BatchLog(out_dir / "degenerate_rows.jsonl", size)
    bar = tqdm(total=len(tests), desc="degenerate")
    for i in range(0, len(tests), size):
        if i in log.done:  # a stopped run's finished batch
            examples += log.done[i]
            bar.update(len(log.done[i]))
            continue
        chunk = [text for text, _ in tests[i : i + size]]
        rows = _degenerate_batch(s, model, tok, systems, chunk)
        examples += rows
        log.add(i, rows)
        bar.update(len(chunk))
    bar.close()
    result["degenerate"] = _degenerate_summary(s, examples, list(systems), size)
    (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))


def _degenerate_systems(s: ConditionalSettings, clf) -> dict[str, dict]:
    """The searches compared, name -> beam_search_batch's arguments; the classifier is aimed
    at class 0 ("not degenerate")."""
    clf.target_class = 0
    return {
        "beam (on_beam)": dict(finished="on_beam", forced_eos=s.forced_eos),
        "conditional (on_beam)": dict(
            classifier=clf, k=s.k, finished="on_beam", forced_eos=s.forced_eos
        ),
        "beam (aside)": {},
    }


def _degenerate_batch(
    s: ConditionalSettings, model, tok, systems: dict, chunk: list[str]
) -> list[dict]:
    """One batch of prompt texts searched together by every system: per prompt, each
    system's best output, whether it is degenerate, finished, and its log-probability."""
    from gencraft.search.classifier import degenerate

    prompts = [encode_prompt(tok, text) for text in chunk]
    ((ids, mask),) = batched(model, tok, prompts, len(prompts))
    rows: list[dict] = [{} for _ in chunk]
    for name, kw in systems.items():
        found = beam_search_batch(
            model, ids, mask, num_beams=s.beams[0], max_new_tokens=s.max_new_tokens, **kw
        )
        for row, text, p, hyps in zip(rows, chunk, prompts, found, strict=True):
            h = hyps[0]
            out_text = tok.decode(h.tokens, skip_special_tokens=True)
            row[name] = {
                "text": out_text,
                "degenerate": degenerate(out_text, text, h.finished),
                "finished": h.finished,
                "log_prob": sequence_log_prob(model, p, h.tokens, end=h.finished),
            }
    return rows


def _degenerate_summary(
    s: ConditionalSettings, examples: list[dict], systems: list[str], size: int
) -> dict:
    """The degenerate study's record: its tests, each system's rate, the headline pair."""
    n = len(examples)
    rates = {name: sum(bool(e[name]["degenerate"]) for e in examples) for name in systems}
    only = {
        a: sum(r[a]["degenerate"] < r[b]["degenerate"] for r in examples)
        for a, b in (
            ("conditional (on_beam)", "beam (on_beam)"),
            ("beam (on_beam)", "conditional (on_beam)"),
        )
    }
    return {
        **degenerate_tests(examples),
        "beam_size": s.beams[0],
        "k": s.k,
        "prompts": n,
        "batch_size": size,
        "rates": {k: v / n for k, v in rates.items()},
        # the headline pair: the same policy for completed hypotheses
        "beam_rate": rates["beam (on_beam)"] / n,
        "conditional_rate": rates["conditional (on_beam)"] / n,
        "only_conditional_fine": only["conditional (on_beam)"],
        "only_beam_fine": only["beam (on_beam)"],
        "examples": examples,
    }


def degenerate_tests(examples: list[dict]) -> dict:
    """The degenerate study's statistics over its per-prompt ``examples`` (each holding the
    systems' outputs with a ``degenerate`` flag): each system's rate with its 95% Wilson
    interval; the paired sign test of conditional (on_beam) against beam (on_beam); and the
    no-conflict control: of the prompts where plain beam search's output is fine, how often
    the conditional search's is degenerate (steering that makes a good output worse)."""
    from gencraft.metrics.stats import paired_comparison, wilson_interval

    n = len(examples)
    cond, beam = "conditional (on_beam)", "beam (on_beam)"
    intervals = {
        name: wilson_interval(sum(bool(e[name]["degenerate"]) for e in examples), n)
        for name in (examples[0] if examples else {})
    }
    fine = [e for e in examples if not e[beam]["degenerate"]]
    worse = sum(bool(e[cond]["degenerate"]) for e in fine)
    return {
        "rate_intervals": intervals,
        "paired": paired_comparison(
            sum(e[cond]["degenerate"] < e[beam]["degenerate"] for e in examples),
            sum(e[beam]["degenerate"] < e[cond]["degenerate"] for e in examples),
            n,
        ),
        "no_conflict": {
            "beam_fine": len(fine),
            "made_worse": worse,
            "rate": worse / len(fine) if fine else None,
            "interval": wilson_interval(worse, len(fine)),
        },
    }


def _length_study(
    s: ConditionalSettings, model, tok, clf, prompts, result: dict, out_dir: Path
) -> None:
    """(b) length control: both searches forced to n tokens; who finds the output with the
    higher log P(y | x) under the model itself (the thesis's comparison, Figs 7.1-7.2)? The
    search's own objective (EOS removed and steps renormalised) is kept beside it."""
    length_rows: list[dict] = []
    length_tests = prompts(s.length_prompts or s.test_prompts)
    size = s.batch_size
    log = _BatchLog(out_dir / "length_rows.jsonl", size)
    for i in tqdm(range(0, len(length_tests), size), desc="length"):
        if i in log.done:  # a stopped run's finished batch
            length_rows += log.done[i]
            continue
        done = _length_batch(s, model, tok, clf, length_tests[i : i + size])
        length_rows += done
        log.add(i, done)
    summary = [
        {"beams": b, "ratio": ratio, **length_wins(length_rows, b, ratio)}
        for b in s.beams
        for ratio in s.ratios
    ]
    result["length"] = {
        "k": s.k,
        "forced_eos": s.forced_eos,
        "length_includes_eos": s.length_includes_eos,
        "prompts": len(length_tests),
        "summary": summary,
        "rows": length_rows,
    }
    (out_dir / "conditional.json").write_text(json.dumps(result, indent=2))
    _plot_length(summary, out_dir / "length_control.png", s.model)


def _length_batch(s: ConditionalSettings, model, tok, clf, chunk: list) -> list[dict]:
    """One batch of (text, reference) prompts searched together at every ratio and beam
    size, each row forced to its own length: rows in prompt, ratio, beam order."""
    common = dict(forced_eos=s.forced_eos, length_includes_eos=s.length_includes_eos)
    prompts = [encode_prompt(tok, text) for text, _ in chunk]
    ((ids, mask),) = batched(model, tok, prompts, len(prompts))
    eos_in = int(s.length_includes_eos)
    ref_lens = [len(tok(ref, add_special_tokens=False)["input_ids"]) + eos_in for _, ref in chunk]
    found: dict = {}
    for ratio in s.ratios:
        # each row its own forced length n and limit (n tokens, then EOS)
        ns = [max(1 + eos_in, round(ratio * r)) for r in ref_lens]
        limits = [n - eos_in + 1 for n in ns]  # the tokens before EOS, then EOS
        for b in s.beams:
            plain = beam_search_batch(
                model, ids, mask, num_beams=b, max_new_tokens=limits, force_length=ns, **common
            )
            cond = _conditional_rows(model, ids, mask, clf, s, b, ns, limits, common)
            for j in range(len(chunk)):
                found[j, ratio, b] = (ns[j], plain[j][0], cond[j][0])
    done = []
    for j, p in enumerate(prompts):
        for ratio in s.ratios:
            for b in s.beams:
                n, pl, co = found[j, ratio, b]
                done.append(
                    {
                        "ratio": ratio,
                        "beams": b,
                        "length": n,
                        "beam_log_prob": sequence_log_prob(model, p, pl.tokens),
                        "cond_log_prob": sequence_log_prob(model, p, co.tokens),
                        "beam_search_score": pl.score,
                        "cond_search_score": co.score,
                        "beam_text": tok.decode(pl.tokens),
                        "cond_text": tok.decode(co.tokens),
                    }
                )
    return done


def _conditional_rows(model, ids, mask, clf, s, beams, ns, limits, common) -> list:
    """Conditional beam search of each row at its own length n: the length classifier is
    aimed at one n at a time, so the rows that share an n search together."""
    out: list = [None] * len(ns)
    for n in sorted(set(ns)):
        rows = [i for i, m in enumerate(ns) if m == n]
        found = beam_search_batch(
            model,
            ids[rows],
            mask[rows],
            num_beams=beams,
            max_new_tokens=[limits[i] for i in rows],
            force_length=n,
            classifier=clf.for_length(n, includes_eos=s.length_includes_eos),
            k=s.k,
            finished="on_beam",
            **common,
        )
        for i, hyps in zip(rows, found, strict=True):
            out[i] = hyps
    return out


def length_wins(rows: list[dict], beams: int, ratio: float, tol: float = 1e-4) -> dict:
    """Shares of prompts where conditional / plain beam search found the output with the higher
    log P(y | x) (``*_log_prob``), and ties within ``tol``; also the mean log P of each."""
    sel = [r for r in rows if r["beams"] == beams and r["ratio"] == ratio]
    if not sel:
        return {"n": 0}
    from gencraft.metrics.stats import sign_test

    wins = sum(r["cond_log_prob"] > r["beam_log_prob"] + tol for r in sel)
    losses = sum(r["cond_log_prob"] < r["beam_log_prob"] - tol for r in sel)
    return {
        "n": len(sel),
        "wins": wins,
        "losses": losses,
        "p": sign_test(wins, losses),
        "conditional_higher": wins / len(sel),
        "beam_higher": losses / len(sel),
        "tie": (len(sel) - wins - losses) / len(sel),
        "cond_mean_log_prob": sum(r["cond_log_prob"] for r in sel) / len(sel),
        "beam_mean_log_prob": sum(r["beam_log_prob"] for r in sel) / len(sel),
    }


def _plot_length(summary: list[dict], path: Path, model: str) -> None:
    from gencraft.plotting import pyplot

    plt = pyplot()

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
