"""`pointer-vs-lstm` end to end on the tiny preset: its units, each model's row against its
best checkpoint scored again, the frequency buckets against the test stream, the plots, and
a rerun that trains nothing."""

from __future__ import annotations

import json
import math

import pytest

from gencraft.data import load_lm_corpus
from gencraft.pointer.evaluate import evaluate
from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.studies.runner import reproduce


def _run(out, data_dir):
    overrides = {"corpus": "ptb", "data_dir": str(data_dir), "eval_batch_size": 2}
    reproduce("pointer-vs-lstm", scale="tiny", output=out, overrides=overrides)
    return json.loads((out / "results.json").read_text())["units"]


@pytest.fixture(scope="module")
def pointer_run(tmp_path_factory, synthetic_lm_dir):
    out = tmp_path_factory.mktemp("pointer-vs-lstm")
    return out, _run(out, synthetic_lm_dir)


def test_each_row_is_its_best_checkpoint_scored_again(pointer_run, synthetic_lm_dir):
    out, units = pointer_run
    assert list(units) == ["throughput", "train lstm", "train pointer"]
    corpus = load_lm_corpus("ptb", synthetic_lm_dir)
    params = {}
    for name in ("lstm", "pointer"):
        row = units[f"train {name}"]
        best = PointerSentinelLSTM.from_pretrained(out / name / "best")
        assert best.config.pointer == (name == "pointer")
        params[name] = sum(p.numel() for p in best.parameters())
        assert row["parameters"] == params[name]
        for split in ("valid", "test"):  # the run's --eval-batch-size streams
            want = evaluate(best, corpus[split], batch_size=2)["ppl"]
            assert math.isclose(row[f"{split} ppl"], want, rel_tol=1e-6), (name, split)
        assert row["train tokens"] > 0
        assert row["train tokens/s"] > 0
    assert params["pointer"] > params["lstm"]  # the same LSTM plus the pointer's query and gate


def test_frequency_buckets_cover_the_test_stream(pointer_run, synthetic_lm_dir):
    out, _ = pointer_run
    corpus = load_lm_corpus("ptb", synthetic_lm_dir)
    lines = (out / "report.md").read_text().split("by word-frequency bucket")[1].splitlines()
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines if x[:2] == "| "]
    buckets = {int(r[0]): r for r in rows if r[0].isdigit()}
    assert sorted(buckets) == list(range(1, 11))
    tokens = [int(buckets[b][1]) for b in range(1, 11)]
    assert sum(tokens) == corpus["test"].numel() - 1  # every target of the one stream
    # the buckets' token-weighted NLL is the LSTM's test NLL on one stream
    nll = sum(int(r[1]) * float(r[2]) for r in buckets.values()) / sum(tokens)
    lstm = PointerSentinelLSTM.from_pretrained(out / "lstm" / "best")
    want = math.log(evaluate(lstm, corpus["test"], batch_size=1)["ppl"])
    assert math.isclose(nll, want, abs_tol=6e-4)  # the table shows 4 significant digits
    for png in ("frequency_gain.png", "passage.png"):
        assert (out / png).stat().st_size > 1000


def test_a_rerun_trains_nothing(pointer_run, synthetic_lm_dir):
    out, units = pointer_run
    history = {n: (out / n / "history.json").stat().st_mtime_ns for n in ("lstm", "pointer")}
    assert _run(out, synthetic_lm_dir) == units
    assert {n: (out / n / "history.json").stat().st_mtime_ns for n in history} == history
