"""`gencraft reproduce`: the registry, a CPU experiment end to end on tiny models, resumption,
and config-generated flags."""

from __future__ import annotations

import json

import pytest

from gencraft.cli.main import main
from gencraft.errors import GencraftError
from gencraft.experiments import experiments, reproduce


def test_list_names_every_documented_experiment(capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "search-speed",
        "search-memory",
        "search-empty",
        "pointer-vs-lstm",
        "focus-speed",
        "focus-quality",
    ):
        assert name in out
    for e in experiments().values():  # every experiment has the three scales and an estimate
        assert set(e.scales) == {"tiny", "cpu", "gpu"} and e.cpu_minutes > 0


def test_search_empty_runs_end_to_end_and_resumes(shared_data, tmp_path, capsys):
    out = tmp_path / "empty"
    args = ["reproduce", "search-empty", "--scale", "tiny", "--output", str(out)]
    assert main([*args, "--data-dir", str(shared_data)]) == 0
    report = (out / "report.md").read_text()
    assert "| xsum, 10 words | 2 |" in report and "e2e MR" in report
    assert (out / "empty_by_length.png").stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    assert len(results["units"]) == 6  # 3 sets x 2 prompts
    # a stopped run resumes: drop one unit, mark the others, and only the missing one reruns
    units = results["units"]
    dropped = sorted(units)[0]
    del units[dropped]
    for v in units.values():
        v["mode"] = "KEPT"
    (out / "results.json").write_text(json.dumps(results))
    assert main([*args, "--data-dir", str(shared_data)]) == 0
    again = json.loads((out / "results.json").read_text())["units"]
    assert again[dropped]["mode"] != "KEPT"
    assert all(again[k]["mode"] == "KEPT" for k in units)
    # other settings in the same folder are refused, not mixed
    assert main([*args, "--data-dir", str(shared_data), "--max-nodes", "5"]) == 2
    assert "other settings (max_nodes)" in capsys.readouterr().err


def test_memory_experiment_is_linear_and_settings_are_validated(shared_data, tmp_path, capsys):
    report = reproduce(
        "search-memory", scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)}
    )
    rows = json.loads((tmp_path / "results.json").read_text())["units"]
    per_pos = {r["bytes per position"] for r in rows.values()}
    assert len(per_pos) == 1  # the same bytes per position at every depth: O(d)
    assert "| 16 |" in report.read_text()
    with pytest.raises(GencraftError, match="unknown experiment"):
        reproduce("no-such-thing")
    assert main(["reproduce", "search-memory", "--bogus", "1"]) == 2
    assert "search-memory has no setting --bogus" in capsys.readouterr().err
