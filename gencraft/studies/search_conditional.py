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
from gencraft.search.beam import beam_search_batch
from gencraft.search.prompts import encode_prompt, instruction_texts
from gencraft.studies.runner import ExperimentRun, Kept, machine, register, settings_field
from gencraft.studies.search_inputs import batched
from gencraft.utils import default_device


@dataclass(frozen=True)
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
    kept=lambda s: conditional_kept(s),
)
def search_conditional(s: ConditionalSettings, run: ExperimentRun) -> None:
    """Conditional beam search with attribute classifiers trained on the model's samples."""
    loaded = _Loaded(s, run.directory)
    result: dict = {"model": s.model, **machine()}
    if s.classifiers:
        result["classifiers"] = s.classifiers
    else:
        result.update(_train_classifiers(s, run, loaded))
    tests = _prompts(s, s.test_prompts)
    if "degenerate" in s.studies:
        result["degenerate"] = _degenerate_study(s, run, loaded, tests)
    if "length" in s.studies:
        lengths = _prompts(s, s.length_prompts or s.test_prompts)
        result["length"] = _length_study(s, run, loaded, lengths)
        _plot_length(result["length"]["summary"], run.directory / "length_control.png", s.model)
        run.plot_path("length_control.png", "length control")
    run.text(_report(s, result, len(tests)))


def conditional_kept(s: ConditionalSettings) -> dict[str, Kept]:
    """What the run's units leave for later ones: the samples (read by the classifiers'
    training) and each trained classifier (read by its study)."""
    if s.classifiers:
        return {}
    kept = {"samples": Kept("samples", "samples", tuple(f"train {a}" for a in s.studies))}
    for a in s.studies:
        kept[f"train {a}"] = Kept(f"clf-{a}/kept", f"clf-{a}/checkpoint", (f"eval {a}",))
    return kept


class _Loaded:
    """The model, its tokenizer and the classifiers, loaded at the first unit that needs
    them (a rerun whose units are all saved loads nothing)."""

    def __init__(self, s: ConditionalSettings, folder: Path) -> None:
        self.s, self.folder = s, folder
        self._model: tuple | None = None
        self._classifiers: dict[str, Any] = {}
        self._samples: list | None = None  # the samples unit's rows, read once
        self.rows: list | None = None  # the samples with their hidden states, once computed

    def samples(self, texts: list[str]) -> list[dict]:
        """The samples unit's rows without states (:func:`_sample_rows`), read once."""
        if self._samples is None:
            self._samples = _sample_rows(self.s, self.folder, texts)
        return self._samples

    def model(self) -> tuple[Any, Any]:
        if self._model is None:
            self._model = load_model(self.s.model, device=default_device())
        return self._model

    def classifier(self, attr: str) -> Any:
        """The ``attr`` classifier as kept (another run's when ``classifiers`` names one)."""
        if attr not in self._classifiers:
            root = Path(self.s.classifiers) if self.s.classifiers else self.folder
            kept = root / f"clf-{attr}" / "kept"
            saved = kept if kept.is_dir() else root / f"clf-{attr}" / "best"
            self._classifiers[attr] = _load_classifier(saved, self.model()[0])
        return self._classifiers[attr]


def prompt_texts(data_dir: str | None, total: int, words: int) -> list[str]:
    """The study's ``total`` test prompts: half E2E, then XSum documents cut to ``words``."""
    half = total // 2
    return [
        t
        for kind, n in (("e2e", half), ("xsum", total - half))
        for t in instruction_texts(kind, n, data_dir, max_source_words=words)
    ]


def _prompts(s: ConditionalSettings, total: int) -> list[tuple[str, str]]:
    """``total`` test prompts (:func:`prompt_texts`) with their references."""
    from gencraft.search.prompts import instruction_references

    half = total // 2
    references = instruction_references("e2e", half, s.data_dir) + instruction_references(
        "xsum", total - half, s.data_dir
    )
    texts = prompt_texts(s.data_dir, total, s.max_source_words)
    return list(zip(texts, references, strict=True))


def _train_texts(s: ConditionalSettings) -> list[str]:
    """The classifiers' training prompts: half E2E, half XSum, from the training splits."""
    half = s.train_prompts // 2
    return instruction_texts("e2e", half, s.data_dir, split="train") + instruction_texts(
        "xsum",
        s.train_prompts - half,
        s.data_dir,
        split="train",
        max_source_words=s.max_source_words,
    )


def _train_classifiers(s: ConditionalSettings, run: ExperimentRun, loaded: _Loaded) -> dict:
    """Unit ``samples`` (the model's samples of every training prompt), then unit ``train A``
    per study: its classifier trained on them and kept; returns their records."""
    texts = _train_texts(s)
    counts = _sample_unit(s, run, loaded, texts)
    result: dict = {"train_prompts": len(texts), **counts}
    for attr in s.studies:
        result.update(run.unit(f"train {attr}", lambda attr=attr: _train(s, loaded, texts, attr)))
    return result


def _train(s: ConditionalSettings, loaded: _Loaded, texts: list[str], attr: str) -> dict:
    """The ``attr`` classifier trained on the samples and kept in ``clf-ATTR/kept``: its
    training record (and, for ``degenerate``, the share of degenerate samples). The samples'
    hidden states are computed only to train, once for both classifiers."""
    from gencraft.models.introspect import eos_ids
    from gencraft.search.train import ClassifierTrainConfig, relabel_degenerate, train_classifier

    model, tok = loaded.model()
    eos = eos_ids(model, None)
    cfg = ClassifierTrainConfig()
    cfg = replace(cfg, fit=replace(cfg.fit, epochs=s.epochs))
    out = loaded.folder / f"clf-{attr}"
    samples = loaded.samples(texts)

    def train(clf) -> dict:
        if loaded.rows is None:
            loaded.rows = _with_states(s, model, tok, texts, samples)
        rows = loaded.rows
        if attr == "degenerate":
            rows = relabel_degenerate(rows, tok, texts, eos)
        record = train_classifier(clf, rows, cfg, out)
        return {k: v for k, v in record.items() if k != "config"}

    _, record = kept_classifier(model, attr, train, out / "kept", s.kept_dtype)
    done = {f"{attr}_classifier": record}
    if attr == "degenerate":
        labelled = relabel_degenerate(samples, tok, texts, eos)
        done["degenerate_training_rate"] = sum(int(r["labels"][0]) for r in labelled) / len(
            labelled
        )
    return done


def _with_states(s: ConditionalSettings, model, tok, texts: list[str], rows: list) -> list:
    """The samples with their hidden states; without length labels where a sample was cut,
    unless ``censored`` (lower-bound labels)."""
    from gencraft.search.train import attach_hidden

    if not s.censored:  # cut samples carry no length labels then
        rows = [
            {**r, "labels": torch.full_like(r["labels"], -100), "censored": torch.tensor(False)}
            if bool(r["censored"])
            else r
            for r in rows
        ]
    prompts = [encode_prompt(tok, t) for t in texts]
    return attach_hidden(model, rows, prompts, progress=True)


def kept_classifier(model, attr: str, train, kept: Path, dtype: str) -> tuple[Any, dict]:
    """The ``attr`` classifier of ``model``, trained once by ``train(clf) -> record`` and kept
    in ``kept`` in ``dtype`` with its training record; a rerun loads it from there. Its first
    weights are drawn from seed 0, whatever ran before it. It is
    always used as kept (float16 weights read back into float32), so a study resumed in a later
    invocation reads the same weights as the batches before. Returns (classifier, record)."""
    from gencraft.search.classifier import AttributeClassifier
    from gencraft.search.train import classifier_for

    record_path = kept / "record.json"
    if not record_path.is_file():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # its first weights: the same in a stopped and resumed run
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


#: training prompts sampled between saves of the samples
SAMPLE_CHUNK = 32


def _sample_unit(s: ConditionalSettings, run: ExperimentRun, loaded: _Loaded, texts) -> dict:
    """Unit ``samples``: the model's samples of every training prompt, drawn ``SAMPLE_CHUNK``
    prompts at a time, each part kept in ``samples/START.pt`` without the hidden states
    (about 1 KB a sample, not 2 MB), so a stopped run resumes at its first unsampled prompt
    (a part's items: each prompt's number of samples). A ``samples`` file that exists is read
    instead; one that does not is written at the end. Returns the counts of the samples,
    of those finished, and whether any length label is censored."""
    given = Path(s.samples) if s.samples else None

    def part(start: int, stop: int) -> list[int]:
        if given is not None and given.is_file():
            rows = [r for r in loaded.samples(texts) if start <= int(r["prompt_index"]) < stop]
        else:
            rows = _draw(s, loaded, texts, start, stop)
            (run.directory / "samples").mkdir(exist_ok=True)
            torch.save({"stop": stop, "rows": rows}, run.directory / "samples" / f"{start}.pt")
        return [sum(int(r["prompt_index"]) == i for r in rows) for i in range(start, stop)]

    def combine(items: list[int], seconds: float) -> dict:
        rows = loaded.samples(texts)
        return {
            "samples": len(rows),
            "finished_samples": sum(bool(r["finished"]) for r in rows),
            "censored_length_labels": any(bool(r["censored"]) for r in rows),
        }

    counts = run.unit_over("samples", len(texts), SAMPLE_CHUNK, part, combine, "sampling")
    if given is not None and not given.is_file():
        torch.save(loaded.samples(texts), given)
    return counts


def _draw(s: ConditionalSettings, loaded: _Loaded, texts: list[str], start: int, stop: int):
    """The samples of training prompts ``[start, stop)``, each seeded by its own index."""
    from gencraft.search.train import sample_training_data

    model, tok = loaded.model()
    return sample_training_data(
        model,
        tok,
        [encode_prompt(tok, t) for t in texts[start:stop]],
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


def _sample_rows(s: ConditionalSettings, folder: Path, texts: list[str]) -> list[dict]:
    """The samples unit's rows (without states), read back from its parts in prompt order,
    or from the ``samples`` file it was read from."""
    if s.samples and Path(s.samples).is_file():
        return torch.load(s.samples)
    rows: list[dict] = []
    start = 0
    while start < len(texts):
        path = folder / "samples" / f"{start}.pt"
        if not path.is_file():
            raise GencraftError(
                f"{path} is gone (the samples of training prompt {start} on); rerun with --restart"
            )
        part = torch.load(path)
        rows += part["rows"]
        start = part["stop"]
    return rows


def _report(s: ConditionalSettings, result: dict, n_tests: int) -> str:
    """The run's report: its size against the thesis's, then each study's tables."""
    md = [_conditional_size(s, result, n_tests), ""]
    if "degenerate" in result:
        d = result["degenerate"]
        md += [
            f"Degenerate outputs (beam {s.beams[0]}, {n_tests} test prompts): "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in d["rates"].items())
            + f"; only conditional fine on {d['only_conditional_fine']}, only beam (on_beam) "
            f"fine on {d['only_beam_fine']}",
            "",
            *_degenerate_lines(d),
        ]
    if "length" in result:
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
    return "\n".join(md)


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
    s: ConditionalSettings, run: ExperimentRun, loaded: _Loaded, tests: list[tuple[str, str]]
) -> dict:
    """Unit ``eval degenerate``, (a) the degenerate rate: conditional beam towards "not
    degenerate" (class 0), against plain beam search with the same policy for completed
    hypotheses (on the beam, Alg. 1), and against transformers' policy (set aside) as a second
    row; ``batch_size`` prompts searched together, each batch saved as it finishes."""
    texts = [text for text, _ in tests]

    def part(start: int, stop: int) -> list[dict]:
        model, tok = loaded.model()
        systems = _degenerate_systems(s, loaded.classifier("degenerate"))
        return _degenerate_batch(s, model, tok, systems, texts[start:stop])

    def combine(examples: list[dict], seconds: float) -> dict:
        return _degenerate_summary(s, examples, list(SYSTEMS), s.batch_size)

    return run.unit_over("eval degenerate", len(texts), s.batch_size, part, combine, "degenerate")


#: the searches of the degenerate study
SYSTEMS = ("beam (on_beam)", "conditional (on_beam)", "beam (aside)")


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
    s: ConditionalSettings, run: ExperimentRun, loaded: _Loaded, tests: list[tuple[str, str]]
) -> dict:
    """Unit ``eval length``, (b) length control: both searches forced to n tokens; who finds
    the output with the higher log P(y | x) under the model itself (the thesis's comparison,
    Figs 7.1-7.2)? The search's own objective (EOS removed and steps renormalised) is kept
    beside it. Each batch of prompts is saved as it finishes; a prompt's item is its rows."""

    def part(start: int, stop: int) -> list[list[dict]]:
        model, tok = loaded.model()
        return _length_batch(s, model, tok, loaded.classifier("length"), tests[start:stop])

    def combine(items: list[list[dict]], seconds: float) -> dict:
        rows = [row for prompt in items for row in prompt]
        return {
            "k": s.k,
            "forced_eos": s.forced_eos,
            "length_includes_eos": s.length_includes_eos,
            "prompts": len(items),
            "summary": [
                {"beams": b, "ratio": ratio, **length_wins(rows, b, ratio)}
                for b in s.beams
                for ratio in s.ratios
            ],
            "rows": rows,
        }

    return run.unit_over("eval length", len(tests), s.batch_size, part, combine, "length")


def _length_batch(s: ConditionalSettings, model, tok, clf, chunk: list) -> list[list[dict]]:
    """One batch of (text, reference) prompts searched together at every ratio and beam
    size, each row forced to its own length: per prompt, its rows in ratio, beam order."""
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
    done: list[list[dict]] = []
    for j, p in enumerate(prompts):
        done.append([])
        for ratio in s.ratios:
            for b in s.beams:
                n, pl, co = found[j, ratio, b]
                done[j].append(
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


def study_items(folder: Path, study: str) -> tuple[list, Path] | None:
    """A run's per-prompt items of ``study``, in prompt order, and the file they come from:
    for ``degenerate`` each prompt's searches, for ``length`` each prompt's rows. Read from the
    run's finished unit ``eval STUDY`` in results.json, else from the batch log
    ``STUDY_rows.jsonl`` (one line per finished batch: ``first`` prompt and its ``rows``) of
    runs made before the study ran as units; None when neither holds them."""
    results = folder / "results.json"
    unit = json.loads(results.read_text()).get("units", {}) if results.is_file() else {}
    if f"eval {study}" in unit:
        value = unit[f"eval {study}"]
        rows, path = value["examples" if study == "degenerate" else "rows"], results
    elif (folder / f"{study}_rows.jsonl").is_file():
        path = folder / f"{study}_rows.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        batches = {b["first"]: b["rows"] for b in lines}  # a batch written twice: the last
        rows = [row for first in sorted(batches) for row in batches[first]]
    else:
        return None
    if study == "degenerate":
        return rows, path
    per = len({(r["ratio"], r["beams"]) for r in rows})  # rows in prompt, ratio, beam order
    return [rows[i : i + per] for i in range(0, len(rows), per)], path
