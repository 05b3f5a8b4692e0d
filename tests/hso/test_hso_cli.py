"""The HSO command and the few-shot experiment end to end on tiny models (the synthetic PTB
corpus; real SST-2-style data where present)."""

from __future__ import annotations

import json

from gencraft.cli.main import main
from gencraft.experiments import reproduce


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
