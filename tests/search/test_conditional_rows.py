"""`search-conditional` on a tiny model, with batches whose last one is short: every row of
both studies equals that prompt searched alone, and the rates are the rows' own counts."""

from __future__ import annotations

import json
import math

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
    s = ex.ConditionalSettings(**{**tiny, **over, "work_dir": str(out)})
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
    result = json.loads((out / "conditional.json").read_text())
    return s, out, model, tok, prompts, result


def test_each_length_row_is_its_prompt_searched_alone(study):
    s, out, model, tok, prompts, result = study
    clf = ex._load_classifier(out / "clf-length" / "kept", model)
    rows = result["length"]["rows"]
    per = len(s.ratios) * len(s.beams)
    assert len(rows) == 3 * per
    lengths = set()
    for j, prompt in enumerate(prompts):
        alone = ex._length_batch(s, model, tok, clf, [prompt])
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


def test_the_study_reads_its_settings_without_changing_them(tmp_path, monkeypatch):
    """The run's folder is the default work folder, passed on beside the settings; the
    settings object stays as given (its work_dir None), and a given work_dir is used."""
    seen = []
    monkeypatch.setattr(ex, "conditional_study", lambda s, work: seen.append((s, work)) or {})

    class Run:
        directory = tmp_path / "run"

        def unit(self, key, compute):
            return compute()

        def text(self, text):
            pass

    s = ex.ConditionalSettings()
    ex.search_conditional(s, Run())
    assert seen == [(s, tmp_path / "run")] and s.work_dir is None
    given = ex.ConditionalSettings(work_dir=str(tmp_path / "w"))
    ex.search_conditional(given, Run())
    assert seen[-1] == (given, tmp_path / "w")
