"""`search-conditional` on a tiny model, with batches whose last one is short: every row of
both studies equals that prompt searched alone, and the rates are the rows' own counts. The
study runs as units of one run (the samples, each classifier, each study): a stopped run resumes
at its first unsaved part, a finished one loads nothing, and the claims read a run's rows from
its results or from the batch logs of runs made before."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

import gencraft.studies.search_conditional as ex
from gencraft.models import load_model
from gencraft.search.prompts import instruction_references, instruction_texts
from gencraft.studies.runner import experiments, reproduce


@pytest.fixture(scope="module")
def study(tmp_path_factory, shared_data):
    out = tmp_path_factory.mktemp("conditional")
    over = {"data_dir": str(shared_data), "test_prompts": 3, "length_prompts": 3, "batch_size": 2}
    reproduce("search-conditional", scale="tiny", output=out, overrides=over)
    tiny = experiments()["search-conditional"].scales["tiny"]
    s = ex.ConditionalSettings(**{**tiny, **over})
    model, tok = load_model(s.model)
    # the run's prompts: E2E then XSum, as _conditional_eval draws them
    prompts = [
        (t, r)
        for kind, n in (("e2e", 1), ("xsum", 2))
        for t, r in zip(
            instruction_texts(kind, n, s.data_dir, max_source_words=s.max_source_words),
            instruction_references(kind, n, s.data_dir),
            strict=True,
        )
    ]
    units = json.loads((out / "results.json").read_text())["units"]
    result = {"length": units["eval length"], "degenerate": units["eval degenerate"]}
    return s, out, model, tok, prompts, result


def test_each_length_row_is_its_prompt_searched_alone(study):
    s, out, model, tok, prompts, result = study
    clf = ex._load_classifier(out / "clf-length" / "kept", model)
    rows = result["length"]["rows"]
    per = len(s.ratios) * len(s.beams)
    assert len(rows) == 3 * per
    lengths = set()
    for j, prompt in enumerate(prompts):
        (alone,) = ex._length_batch(s, model, tok, clf, [prompt])
        for got, want in zip(rows[j * per : (j + 1) * per], alone, strict=True):
            keys = ("ratio", "beams", "length", "beam_text", "cond_text")
            assert {k: got[k] for k in keys} == {k: want[k] for k in keys}, j
            for k in ("beam_log_prob", "cond_log_prob", "beam_search_score"):
                assert math.isclose(got[k], want[k], rel_tol=1e-4, abs_tol=1e-4), (j, k)
        lengths |= {r["length"] for r in alone}
    assert len(lengths) > 1  # the rows' forced lengths differ


def test_each_degenerate_row_is_its_prompt_searched_alone(study):
    s, out, model, tok, prompts, result = study
    clf = ex._load_classifier(out / "clf-degenerate" / "kept", model)
    systems = ex._degenerate_systems(s, clf)
    d = result["degenerate"]
    examples = d["examples"]
    assert d["prompts"] == len(examples) == 3 and d["batch_size"] == 2
    for (text, _), got in zip(prompts, examples, strict=True):
        (want,) = ex._degenerate_batch(s, model, tok, systems, [text])
        for name in systems:
            assert got[name]["text"] == want[name]["text"], name
            assert got[name]["degenerate"] == want[name]["degenerate"], name
    assert len({e["beam (on_beam)"]["text"] for e in examples}) > 1  # the rows differ
    for name in systems:
        flags = [bool(e[name]["degenerate"]) for e in examples]
        assert d["rates"][name] == sum(flags) / 3
    assert d["beam_rate"] == d["rates"]["beam (on_beam)"]
    assert d["conditional_rate"] == d["rates"]["conditional (on_beam)"]


def _over(shared_data) -> dict:
    return {"data_dir": str(shared_data), "test_prompts": 3, "length_prompts": 3, "batch_size": 2}


class _Stop(Exception):
    """Stands for a run stopped in the middle of a unit."""


def _stopping(monkeypatch, name: str, calls: list, at: int | None) -> None:
    """``ex.NAME`` recording each call's first argument after the settings, the call ``at``
    (1-based) raising :class:`_Stop` before any work."""
    real = getattr(ex, name)

    def wrapped(*a, **kw):
        calls.append(a)
        if len(calls) == at:
            raise _Stop
        return real(*a, **kw)

    monkeypatch.setattr(ex, name, wrapped)


def test_a_stopped_run_resumes_at_its_first_unsaved_part(study, shared_data, tmp_path, monkeypatch):
    """Stopped in its second sampling part, then in each study's second batch: every rerun
    computes only what was not saved (one sampling part, one batch of each study), trains each
    classifier once on states computed once, and ends with the units and report of the run
    never stopped."""
    _, whole, *_ = study
    monkeypatch.setattr(ex, "SAMPLE_CHUNK", 2)  # 4 training prompts: two parts
    run = dict(scale="tiny", output=tmp_path, overrides=_over(shared_data))
    draws, degenerate, length, trained, states = [], [], [], [], []
    _stopping(monkeypatch, "_draw", draws, 2)
    _stopping(monkeypatch, "_degenerate_batch", degenerate, 2)
    _stopping(monkeypatch, "_length_batch", length, 2)
    _stopping(monkeypatch, "kept_classifier", trained, None)
    _stopping(monkeypatch, "_with_states", states, None)
    for _ in range(3):
        with pytest.raises(_Stop):
            reproduce("search-conditional", **run)
    report = reproduce("search-conditional", **run).read_text()
    assert [a[3] for a in draws] == [0, 2, 2]  # (s, loaded, texts, start)
    # batches of prompts [0, 2) and [2, 3): the second stopped once, then run once
    assert [len(a[4]) for a in degenerate] == [2, 1, 1]
    assert [len(a[4]) for a in length] == [2, 1, 1]
    assert [a[1] for a in trained] == ["degenerate", "length"]
    assert len(states) == 1  # the samples' states: once, for both classifiers
    got = json.loads((tmp_path / "results.json").read_text())["units"]
    want = json.loads((whole / "results.json").read_text())["units"]
    assert got == want
    assert report.split("Machine:")[0] == (whole / "report.md").read_text().split("Machine:")[0]


def test_a_finished_run_loads_nothing_and_keeps_what_its_units_read(study, shared_data):
    """The report states the run's size; its counts are the samples' own. A rerun of the
    finished run loads no model and gives the same report; every file a unit leaves for a
    later one is in the run's folder, where the run says it keeps it."""
    s, out, *_ = study
    report = (out / "report.md").read_text()
    assert (
        "Size: classifiers trained on 8 samples of the model (epochs: 1); degenerate study on 3 "
        "test prompts (beam 2); length study on 3 prompts x 2 ratios x beams 2." in report
    )
    assert "Degenerate outputs (beam 2, 3 test prompts): beam (on_beam) " in report
    assert "| beams | length / reference |" in report
    rows = ex._sample_rows(s, out, ex._train_texts(s))
    assert json.loads((out / "results.json").read_text())["units"]["samples"] == {
        "samples": len(rows),
        "finished_samples": sum(bool(r["finished"]) for r in rows),
        "censored_length_labels": any(bool(r["censored"]) for r in rows),
    }
    assert sorted(int(r["prompt_index"]) for r in rows) == [0, 0, 1, 1, 2, 2, 3, 3]
    for key, kept in ex.conditional_kept(s).items():
        assert (out / kept.made).exists(), key
        assert set(kept.readers) <= set(json.loads((out / "results.json").read_text())["units"])
    assert set(ex.conditional_kept(s)) == {"samples", "train degenerate", "train length"}
    assert ex.conditional_kept(ex.ConditionalSettings(classifiers="x")) == {}
    before = (out / "report.md").read_text()

    def no_model(*a, **k):
        raise AssertionError("the model loaded")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ex, "load_model", no_model)
        again = reproduce(
            "search-conditional", scale="tiny", output=out, overrides=_over(shared_data)
        )
    assert again.read_text().split("Machine:")[0] == before.split("Machine:")[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 3  # the study takes settings it cannot change


def test_the_claims_read_a_runs_rows_from_its_results_or_its_batch_logs(study, tmp_path):
    """study_items gives each prompt's items in prompt order from a run's results, and the
    same from the batch logs of the earlier layout (batches in any order, a batch written
    twice read at its last); the committed run holds 200 and 60 prompts."""
    s, out, *_ = study
    units = json.loads((out / "results.json").read_text())["units"]
    examples, path = ex.study_items(out, "degenerate")
    assert examples == units["eval degenerate"]["examples"] and path == out / "results.json"
    per_prompt, _ = ex.study_items(out, "length")
    per = len(s.ratios) * len(s.beams)
    assert [len(p) for p in per_prompt] == [per] * 3
    assert [r for p in per_prompt for r in p] == units["eval length"]["rows"]
    rows = {"degenerate": examples, "length": units["eval length"]["rows"]}
    for study_name, items in rows.items():
        size = 2 if study_name == "degenerate" else 2 * per
        batches = [
            {"first": f, "size": 2, "rows": items[f * size // 2 : f * size // 2 + size]}
            for f in (0, 2)
        ]
        wrong = {**batches[1], "rows": items[:1]}
        lines = [wrong, batches[1], batches[0]]
        (tmp_path / f"{study_name}_rows.jsonl").write_text(
            "".join(json.dumps(b) + "\n" for b in lines)
        )
    assert ex.study_items(tmp_path, "degenerate") == (examples, tmp_path / "degenerate_rows.jsonl")
    assert ex.study_items(tmp_path, "length") == (per_prompt, tmp_path / "length_rows.jsonl")
    assert ex.study_items(tmp_path / "none", "length") is None
    committed = Path(__file__).parents[2] / "docs/results/runs/search-conditional-cpu"
    assert len(ex.study_items(committed, "degenerate")[0]) == 200
    lengths = ex.study_items(committed, "length")[0]
    assert len(lengths) == 60 and {len(p) for p in lengths} == {10}
