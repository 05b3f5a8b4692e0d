"""`gencraft pointer train|eval|analyze` end to end on a tiny synthetic corpus, and the
frequency-bucket analysis."""

from __future__ import annotations

import json

import pytest
import torch

from gencraft.cli.main import main
from gencraft.pointer.analysis import bucket_gains, frequency_buckets

TRAIN = [
    "--corpus",
    "ptb",
    "--preset",
    "tiny",
    "--batch-size",
    "4",
    "--bptt",
    "10",
    "--eval-batch-size",
    "2",
    "--final-eval-batch-size",
    "2",
    "--quiet",
]


@pytest.fixture(scope="module")
def trained(synthetic_lm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    for name, extra in (("ptr", []), ("lstm", ["--no-pointer"])):
        rc = main(
            [
                "pointer",
                "train",
                *TRAIN,
                "--max-steps",
                "6",
                "--eval-every",
                "3",
                "--lr",
                "1",
                "--data-dir",
                str(synthetic_lm_dir),
                "--output",
                str(out / name),
                *extra,
            ]
        )
        assert rc == 0
    return out


def test_train_writes_results_and_eval_reproduces_them(trained, synthetic_lm_dir, capsys):
    res = json.loads((trained / "ptr" / "results.json").read_text())
    assert res["steps"] == 6 and res["test_ppl"] > 1
    assert (trained / "ptr" / "best" / "model.safetensors").is_file()
    capsys.readouterr()
    rc = main(
        [
            "pointer",
            "eval",
            str(trained / "ptr"),
            "--split",
            "test",
            "--batch-size",
            "2",
            "--bptt",
            "10",
            "--data-dir",
            str(synthetic_lm_dir),
        ]
    )
    assert rc == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["ppl"] == pytest.approx(res["test_ppl"], rel=1e-9)
    lstm = json.loads((trained / "lstm" / "results.json").read_text())
    assert res["parameters"] - lstm["parameters"] == 32 * 32 + 2 * 32


def test_analyze_writes_pngs_and_ten_buckets(trained, synthetic_lm_dir, tmp_path):
    rc = main(
        [
            "pointer",
            "analyze",
            str(trained / "ptr"),
            "--baseline",
            str(trained / "lstm"),
            "--start",
            "20",
            "--length",
            "12",
            "--batch-size",
            "2",
            "--output",
            str(tmp_path),
            "--data-dir",
            str(synthetic_lm_dir),
        ]
    )
    assert rc == 0
    for name in ("frequency_gain.png", "passage.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "analysis.json").read_text())
    assert [r["bucket"] for r in summary["buckets"]] == list(range(1, 11))
    assert len(summary["passage"]) == 12
    assert all(0 <= r["gate"] <= 1 and 0 <= r["distance"] < 20 for r in summary["passage"])


def test_clear_errors(trained, synthetic_lm_dir, tmp_path, capsys):
    assert main(["pointer", "train", *TRAIN, "--data-dir", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert (
        main(["pointer", "train", *TRAIN, "--window", "0", "--data-dir", str(synthetic_lm_dir)])
        == 2
    )
    assert "window must be at least 1" in capsys.readouterr().err
    wiki = tmp_path / "wikitext-2"
    wiki.mkdir()
    for split in ("train", "valid", "test"):
        (wiki / f"wiki.{split}.tokens").write_text(" = A = \n the cat sat \n")
    rc = main(
        [
            "pointer",
            "eval",
            str(trained / "ptr"),
            "--corpus",
            "wikitext-2",
            "--data-dir",
            str(tmp_path),
        ]
    )
    assert rc == 2 and "vocabulary mismatch" in capsys.readouterr().err
    assert main(["pointer", "eval", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_frequency_buckets_and_gains_by_hand():
    counts = [50, 40, 30, 20, 10, 9, 8, 7, 6, 5]
    b = frequency_buckets(counts, 5)
    assert b.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    targets = torch.tensor([0, 1, 9, 9])
    rows = bucket_gains(
        torch.tensor([2.0, 4.0, 5.0, 7.0]), torch.tensor([1.0, 1.0, 5.0, 3.0]), targets, b, 5
    )
    assert rows[0]["tokens"] == 2 and rows[0]["gain"] == pytest.approx(2.0)
    assert rows[4]["gain"] == pytest.approx(2.0) and rows[1]["tokens"] == 0
