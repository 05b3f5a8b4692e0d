"""The CLI of recurrence and HSO end to end on tiny models and the synthetic PTB corpus:
train (then a re-run resumes it and says it finished), eval by overlap, hso eval, the
experiments at their tiny scale, and one-line errors."""

from __future__ import annotations

import json

from gencraft.cli.main import main
from gencraft.studies.runner import reproduce

TRAIN = [
    "recurrence",
    "train",
    "--model",
    "tiny-llama",
    "--corpus",
    "ptb",
    "--window",
    "12",
    "--overlap",
    "2",
    "--insert-layer",
    "1",
    "--ffn-hidden",
    "8",
    "--bptt-windows",
    "3",
    "--max-steps",
    "3",
    "--warmup",
    "1",
    "--eval-every-tokens",
    "60",
    "--valid-words",
    "100",
    "--quiet",
]


def test_recurrence_train_eval_and_resume(tmp_path, synthetic_lm_dir, capsys):
    out = tmp_path / "run"
    args = [*TRAIN, "--output", str(out), "--data-dir", str(synthetic_lm_dir)]
    assert main(args) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 3 and summary["stopped"] == "max_steps"
    assert main(args) == 0  # a finished run is not trained again
    assert "already finished" in capsys.readouterr().out
    capsys.readouterr()
    assert (
        main(
            [
                "recurrence",
                "eval",
                str(out / "best"),
                "--overlaps",
                "0",
                "2",
                "--split",
                "valid",
                "--json",
                "--quiet",
                "--data-dir",
                str(synthetic_lm_dir),
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["overlap"] for r in rows] == [0, 2]
    assert rows[1]["flops/token"] > rows[0]["flops/token"]


def test_recurrence_eval_refuses_an_overlap_of_a_whole_window_and_train_a_missing_layer(
    tmp_path, synthetic_lm_dir, capsys
):
    data = ["--corpus", "ptb", "--data-dir", str(synthetic_lm_dir)]
    evaluate = ["recurrence", "eval", "tiny-llama", "--window", "12", *data]
    assert main([*evaluate, "--overlaps", "11", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*evaluate, "--overlaps", "12"]) == 2
    assert "overlap must be in [0, window=12)" in capsys.readouterr().err
    train = [*TRAIN[:-1], "--insert-layer", "5", "--output", str(tmp_path / "x")]
    assert main([*train, "--data-dir", str(synthetic_lm_dir)]) == 2
    assert "insert_layer must be in [0, 2)" in capsys.readouterr().err


def test_experiments_run_at_tiny_scale(tmp_path, synthetic_lm_dir):
    for name in ("hso-lm", "recurrence-lm"):
        report = reproduce(
            name,
            scale="tiny",
            output=tmp_path / name,
            overrides={"corpus": "ptb", "data_dir": str(synthetic_lm_dir)},
        )
        text = report.read_text()
        assert "| baseline" in text or "| valid | baseline" in text
    assert (tmp_path / "recurrence-lm" / "ppl_vs_flops.png").stat().st_size > 1000
