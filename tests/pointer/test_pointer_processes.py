"""The pointer trainer on ``fit``: a run interrupted on one process count and resumed on
another ends with the weights and validation history of an uninterrupted one-process run
(dropout masks and the carried LSTM state belong to streams, not to processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_pointer_cli import TRAIN as CLI_TRAIN

from gencraft.cli.main import main

# the CLI tests' tiny run, with zoneout off: zoneout draws per row inside the LSTM, so its draws
# depend on the rows a process holds
TRAIN = ["pointer", "train", *CLI_TRAIN, "--zoneout", "0", "--eval-every", "3", "--lr", "1"]


def _launch(args: list[str]) -> subprocess.CompletedProcess:
    launcher = Path(sys.executable).with_name("accelerate")
    cmd = [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "gencraft", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from gencraft.pointer import PointerSentinelLSTM

    return PointerSentinelLSTM.from_pretrained(run / "last").state_dict()


@pytest.mark.parametrize("first", [2, 1], ids=["2-then-1", "1-then-2"])
def test_a_pointer_run_resumed_on_another_process_count_ends_as_one_uninterrupted(
    synthetic_lm_dir, tmp_path, capsys, first
):
    data = ["--data-dir", str(synthetic_lm_dir)]
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main([*TRAIN, *data, "--max-steps", "6", "--output", str(ref)]) == 0
    halves = [[*TRAIN, *data, "--max-steps", str(n), "--output", str(run)] for n in (3, 6)]
    for args, processes in zip(halves, (first, 3 - first), strict=True):
        if processes == 2:
            proc = _launch(args)
            assert proc.returncode == 0, proc.stderr[-3000:]
        else:
            assert main(args) == 0
    capsys.readouterr()
    a, b = _weights(ref), _weights(run)
    for k in a:  # two processes average their gradients: equal up to the sum's rounding
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    ref_hist = json.loads((ref / "history.json").read_text())
    run_hist = json.loads((run / "history.json").read_text())
    assert [r["step"] for r in run_hist] == [r["step"] for r in ref_hist] == [3, 6]
    assert [r["valid_ppl"] for r in run_hist] == pytest.approx([r["valid_ppl"] for r in ref_hist])
    assert [(r["processes"], r["global_batch"]) for r in run_hist] == [(first, 4), (3 - first, 4)]
    summary = json.loads((run / "train_summary.json").read_text())
    assert (summary["steps"], summary["processes"], summary["global_batch"]) == (6, 3 - first, 4)
    assert json.loads((run / "results.json").read_text())["steps"] == 6
