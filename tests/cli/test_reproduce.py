"""`gencraft reproduce`: the registry, a CPU experiment end to end on tiny models, resumption,
and config-generated flags."""

from __future__ import annotations

import json

import pytest

from gencraft.cli.main import main
from gencraft.errors import GencraftError
from gencraft.studies.runner import experiments, reproduce


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
        "prefix-tasks",
    ):
        assert name in out
    for e in experiments().values():  # every experiment has the three scales and an estimate
        want = {"tiny", "cpu", "slot"} if e.name == "campaign" else {"tiny", "cpu", "gpu"}
        assert set(e.scales) == want and e.cpu_minutes > 0
        # the processes column: N for the experiments whose units shard, 1 for the rest
        line = next(row for row in out.splitlines() if row.split() and row.split()[0] == e.name)
        assert line.split()[3] == ("N" if e.shardable else "1"), line
    shards = {e.name for e in experiments().values() if e.shardable}
    assert shards == {"search-empty", "search-errors", "search-mbr"}


def test_search_empty_runs_end_to_end_and_resumes(shared_data, tmp_path, capsys):
    out = tmp_path / "empty"
    args = ["reproduce", "search-empty", "--scale", "tiny", "--output", str(out)]
    assert main([*args, "--data-dir", str(shared_data)]) == 0
    report = (out / "report.md").read_text()
    assert "| xsum, 10 words | 2 |" in report and "e2e MR" in report
    assert (out / "empty_by_length.png").stat().st_size > 1000
    results = json.loads((out / "results.json").read_text())
    # 3 sets, each one batch of its 2 prompts (searched together)
    assert sorted(results["units"]) == ["e2e MR #0-1", "xsum, 10 words #0-1", "xsum, 20 words #0-1"]
    assert all(len(v) == 2 for v in results["units"].values())
    assert "2 prompts searched together" not in report and "searched together" in report
    # a stopped run resumes: drop one unit, mark the others, and only the missing one reruns
    units = results["units"]
    dropped = sorted(units)[0]
    del units[dropped]
    for v in units.values():
        for row in v:
            row["mode"] = "KEPT"
    (out / "results.json").write_text(json.dumps(results))
    assert main([*args, "--data-dir", str(shared_data)]) == 0
    again = json.loads((out / "results.json").read_text())["units"]
    assert all(row["mode"] != "KEPT" for row in again[dropped])
    assert all(row["mode"] == "KEPT" for k in units for row in again[k])
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


def test_prefix_tasks_mean_interval_is_students_t():
    from gencraft.studies.prefix import mean_interval

    assert mean_interval([1.0, 3.0]) == (2.0, pytest.approx(12.706))  # t(0.975, 1 dof)
    assert mean_interval([4.0]) == (4.0, None)


def test_prefix_tasks_seeds_share_runs_and_rescore_on_new_decoding(shared_data, tmp_path):
    runs = tmp_path / "runs"
    common = {"data_dir": str(shared_data), "runs_dir": str(runs)}
    report = reproduce(
        "prefix-tasks",
        scale="tiny",
        output=tmp_path / "a",
        overrides={**common, "variants": "dense,hierblock"},
    )
    text = report.read_text()
    assert "| dense | 2 |" in text and "| hierblock | 2 |" in text and " ± " in text
    assert (tmp_path / "a" / "bleu_by_variant.png").stat().st_size > 1000
    units = json.loads((tmp_path / "a" / "results.json").read_text())["units"]
    assert set(units) == {"dense/seed0", "dense/seed1", "hierblock/seed0", "hierblock/seed1"}
    assert (runs / "dense" / "best").is_dir() and (runs / "dense-seed1" / "best").is_dir()
    # another seed starts from other prefixes and another data order
    assert units["dense/seed0"]["best_valid_loss"] != units["dense/seed1"]["best_valid_loss"]
    mean, half = units["dense/seed0"]["BLEU_bootstrap"]
    assert 0 <= mean <= 100 and half >= 0
    # each test input's output is kept: rows can be paired input by input later
    saved_outputs = json.loads((runs / "dense" / "test-3.json").read_text())["outputs"]
    assert units["dense/seed0"]["outputs"] == saved_outputs and len(saved_outputs) == 3
    # a second experiment folder reuses the trained run and its saved test scores...
    saved = runs / "dense" / "test-3.json"
    result = json.loads(saved.read_text())
    result["scores"]["BLEU"] = 12.5
    saved.write_text(json.dumps(result))
    one = {**common, "variants": "dense", "seeds": "0"}
    reproduce("prefix-tasks", scale="tiny", output=tmp_path / "b", overrides=one)
    again = json.loads((tmp_path / "b" / "results.json").read_text())["units"]["dense/seed0"]
    assert again["scores"]["BLEU"] == 12.5 and again["steps"] == 2
    # the training time is the run's, not the (instant) resumed call's
    assert again["train_seconds"] == units["dense/seed0"]["train_seconds"] > 0
    # ...but other decoding settings score it again
    reproduce(
        "prefix-tasks", scale="tiny", output=tmp_path / "c", overrides={**one, "num_beams": 1}
    )
    rescored = json.loads((tmp_path / "c" / "results.json").read_text())["units"]["dense/seed0"]
    assert rescored["scores"]["BLEU"] != 12.5


def test_prefix_tasks_on_xsum_pair_documents_and_refuse_an_unknown_variant(shared_data, tmp_path):
    """XSum: per-document ROUGE-L, its interval, and the paired difference against dense."""
    common = {"data_dir": str(shared_data)}
    xsum = {
        **common,
        "runs_dir": str(tmp_path / "xruns"),
        "task": "xsum",
        "variants": "dense,hierblock",
        "seeds": "0",
    }
    report = reproduce("prefix-tasks", scale="tiny", output=tmp_path / "x", overrides=xsum)
    assert "rougeL − dense, seed 0 (paired)" in report.read_text()
    units = json.loads((tmp_path / "x" / "results.json").read_text())["units"]
    per_doc = units["hierblock/seed0"]["rougeL_per_doc"]
    assert len(per_doc) == 3
    assert sum(per_doc) / 3 == pytest.approx(units["hierblock/seed0"]["scores"]["rougeL"])
    with pytest.raises(GencraftError, match="unknown variant"):
        reproduce(
            "prefix-tasks",
            scale="tiny",
            output=tmp_path / "d",
            overrides={**common, "runs_dir": str(tmp_path / "runs"), "variants": "densest"},
        )


def test_settings_given_as_none_are_kept_not_dropped():
    from gencraft.studies.cli import _overrides
    from gencraft.studies.prefix import PrefixTaskSettings

    given = _overrides(PrefixTaskSettings, ["--test-limit", "none", "--test-spread"], "x")
    assert given == {"test_limit": None, "test_spread": True}  # None overrides the default 80
    assert _overrides(PrefixTaskSettings, [], "x") == {}


@pytest.mark.parametrize(
    "name, baseline, rows",
    [
        ("prefix-speed", "peft", ("dense", "uniblock", "hierblock", "htruncsa", "hsoftsa")),
        ("recurrence-speed", "plain windows", ("recurrent", "recurrent, checkpointed")),
        ("nar-speed", "autoregressive, beam 4", ("SUNDAE, 3 steps × 2 samples",)),
    ],
)
def test_speed_experiments_interleave_against_their_baseline(
    name, baseline, rows, shared_data, tmp_path
):
    """Each speed experiment runs end to end on tiny models: one table with every variant's
    median-of-ratios and its quartiles, the baseline at exactly 1."""
    overrides = {"data_dir": str(shared_data)} if name == "nar-speed" else {}
    report = reproduce(name, scale="tiny", output=tmp_path, overrides=overrides).read_text()
    assert "| ratio | ratio q25 | ratio q75 | ± spread |" in report
    assert f"| {baseline} | " in report
    line = next(row for row in report.splitlines() if row.startswith(f"| {baseline} | "))
    assert "| 1 | 1 | 1 | 0.0% |" in line
    for r in rows:
        assert f"| {r} | " in report
    units = json.loads((tmp_path / "results.json").read_text())["units"]
    assert units["speed"]["threads"] >= 1
    if name == "prefix-speed":  # dense prefixes' generate against the base model's
        assert list(units["speed"]["generate"]) == ["base", "dense prefixes"]
        assert "| dense prefixes | " in report


def test_the_python_api_refuses_a_file_where_the_report_folder_goes(tmp_path):
    """The CLI checks --output before anything runs; reproduce() called from Python does too."""
    path = tmp_path / "taken"
    path.write_text("mine\n")
    with pytest.raises(GencraftError, match="is a file; an experiment writes a directory"):
        reproduce("search-memory", scale="tiny", output=path)
    assert path.read_text() == "mine\n"
