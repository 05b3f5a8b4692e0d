"""`hso-lm` on a tiny model: its units and rows (ablations and dynamic evaluation on the
first split only), the baseline row against the windowed NLL computed directly, and the
time and thesis columns."""

from __future__ import annotations

import json
import math

import pytest

from gencraft.data import subword_stream
from gencraft.metrics import windowed_nll
from gencraft.models import load_model
from gencraft.studies.hso import PAPER_33
from gencraft.studies.runner import reproduce


@pytest.fixture(scope="module")
def hso_lm_run(tmp_path_factory, synthetic_lm_dir):
    out = tmp_path_factory.mktemp("hso-lm")
    overrides = {
        "corpus": "ptb",
        "data_dir": str(synthetic_lm_dir),
        "ablations": ("k10", "sgd"),
        "splits": ("test", "valid"),
        "de_words": 60,
    }
    reproduce("hso-lm", scale="tiny", output=out, overrides=overrides)
    return json.loads((out / "results.json").read_text()), (out / "report.md").read_text()


def test_units_are_the_ablations_and_dynamic_evaluation_on_the_first_split(hso_lm_run):
    results, _ = hso_lm_run
    assert list(results["units"]) == [
        "test baseline",
        "test hso",
        "test k10",
        "test sgd",
        "test de-subset baseline",
        "test de-subset hso",
        "test de-subset dynamic eval",
        "valid baseline",
        "valid hso",
    ]
    u = results["units"]
    last = ["baseline", "hso", "dynamic eval", "baseline", "hso"]
    assert [u[k]["variant"] for k in u][-5:] == last
    assert u["test de-subset baseline"]["words"] == 60 < u["test baseline"]["words"]
    # the methods change the numbers; the ablations change HSO's
    nll = {k: v["token ppl"] for k, v in u.items()}
    assert nll["test hso"] != nll["test baseline"] and nll["test k10"] != nll["test hso"]
    assert nll["test de-subset dynamic eval"] != nll["test de-subset baseline"]


def test_the_baseline_row_is_the_windowed_nll_computed_directly(hso_lm_run, synthetic_lm_dir):
    results, _ = hso_lm_run
    model, tok = load_model("tiny-llama")
    model.eval()
    ids, n = subword_stream("ptb", "test", tok, data_dir=str(synthetic_lm_dir), max_words=300)
    nll = windowed_nll(model, ids, window=64, overlap=0)  # the tiny scale's context
    row = results["units"]["test baseline"]
    assert row["tokens"] == nll.numel() and row["words"] == n
    assert math.isclose(row["token ppl"], math.exp(float(nll.mean())), rel_tol=1e-5)
    assert math.isclose(row["word ppl"], math.exp(float(nll.sum()) / n), rel_tol=1e-5)


def test_time_and_thesis_columns(hso_lm_run):
    _, report = hso_lm_run
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in report.splitlines()
        if line.startswith("| test") or line.startswith("| valid")
    ]
    assert len(rows) == 9
    for split, variant, *_rest, time_vs, thesis in rows:
        if variant == "baseline":
            assert float(time_vs) == 1.0
        first = split == "test"  # the first split, its de-subset rows excluded
        want = PAPER_33.get(variant, "") if first else ""
        assert thesis == (str(want) if want != "" else ""), (split, variant)
