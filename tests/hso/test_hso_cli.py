"""The HSO command and the few-shot experiment end to end on tiny models (the synthetic PTB
corpus; real SST-2-style data where present)."""

from __future__ import annotations

import json

from gencraft.cli.main import main
from gencraft.studies.runner import reproduce


def test_hso_eval_cli(synthetic_lm_dir, capsys):
    base = [
        "hso",
        "eval",
        "--model",
        "tiny-llama",
        "--corpus",
        "ptb",
        "--max-words",
        "120",
        "--reset-every",
        "40",
        "--window",
        "10",
        "--data-dir",
        str(synthetic_lm_dir),
    ]
    assert main([*base, "--dynamic-eval", "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["baseline", "hso", "dynamic eval"]
    assert len({r["tokens"] for r in rows}) == 1
    assert main([*base, "--lr", "-0.1"]) == 2
    assert "lr must be >= 0" in capsys.readouterr().err
    assert main([*base, "--model", "tiny-bart"]) == 2
    assert "BartForConditionalGeneration is not one" in capsys.readouterr().err


def test_few_shot_experiment_at_tiny_scale(tmp_path, shared_data):
    report = reproduce(
        "hso-fewshot", scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)}
    )
    text = report.read_text()
    assert "| 2 |" in text and "Chance: 50 %" in text


def test_few_shot_units_per_method_resume_and_pair(tmp_path, shared_data):
    """Each (n, seed) is kept as one unit per method with its per-example results; a run
    stopped inside (n, seed) recomputes only the missing method, to the same results; a whole
    (n, seed) unit saved by an earlier release is read as it is, reported unpaired."""
    kw = {"scale": "tiny", "output": tmp_path, "overrides": {"data_dir": str(shared_data)}}
    reproduce("hso-fewshot", **kw)
    path = tmp_path / "results.json"
    saved = json.loads(path.read_text())
    units = saved["units"]
    assert sorted(units) == sorted(
        f"n=2 seed={s} {m}" for s in (0, 1) for m in ("baseline", "dynamic eval", "hso", "hso2")
    )
    assert [len(units[f"n=2 seed=0 {m}"]["correct"]) for m in ("baseline", "hso")] == [4, 4]
    assert len(units["n=2 seed=0 dynamic eval"]["correct"]) == 2
    kept = units.pop("n=2 seed=1 hso2")
    # the old format: one whole unit for seed 0
    old = {
        "accuracy": {"baseline": 50.0, "dynamic eval": 50.0, "hso": 75.0, "hso2": 25.0},
        "examples": {"baseline": 4, "dynamic eval": 2, "hso": 4, "hso2": 4},
        "seconds per example": {m: 0.5 for m in ("baseline", "dynamic eval", "hso", "hso2")},
        "mean prompt tokens": 30.0,
    }
    for m in ("baseline", "dynamic eval", "hso", "hso2"):
        units.pop(f"n=2 seed=0 {m}")
    units["n=2 seed=0"] = old
    path.write_text(json.dumps(saved))
    text = reproduce("hso-fewshot", **kw).read_text()
    again = json.loads(path.read_text())["units"]
    assert again["n=2 seed=1 hso2"]["correct"] == kept["correct"]
    assert "n=2 seed=0 hso" not in again and again["n=2 seed=0"] == old
    assert "| 2 | 0 | 4 | +25.00 (unpaired) | -25.00 (unpaired) |" in text
    s1 = {m: again[f"n=2 seed=1 {m}"]["correct"] for m in ("baseline", "hso", "hso2")}
    diff = 100 * (sum(s1["hso"]) - sum(s1["baseline"])) / 4
    assert f"| 2 | 1 | 4 | {diff:+.2f} ± " in text


def test_few_shot_paired_rows_against_the_per_example_differences():
    """The paired table's difference is the mean of the per-example differences against the
    plain model, with bootstrap_mean's interval over them."""
    from gencraft.metrics.text import bootstrap_mean
    from gencraft.studies.hso import _combine, _paired_rows

    base, hso, hso2 = [1, 0, 0, 1, 0, 0], [1, 1, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0]
    parts = {
        m: {"correct": c, "seconds": 1.2, "mean prompt tokens": 7.0}
        for m, c in (("baseline", base), ("dynamic eval", base[:2]), ("hso", hso), ("hso2", hso2))
    }
    unit = _combine(parts)
    assert unit["accuracy"]["hso2"] == 50.0 and unit["examples"]["dynamic eval"] == 2
    assert unit["seconds per example"]["dynamic eval"] == 0.6
    [row] = _paired_rows({(4, 3): unit})
    for m, c in (("hso", hso), ("hso2", hso2)):
        mean, half = bootstrap_mean([100.0 * (a - b) for a, b in zip(c, base, strict=True)])
        assert row[f"{m} - baseline"] == f"{mean:+.2f} ± {half:.2f}"
    assert (row["n"], row["seed"], row["examples"]) == (4, 3, 6)
    assert row["hso - baseline"].startswith("+33.33") and row["hso2 - baseline"].startswith(
        "+16.67"
    )
