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
    assert (trained / "ptr" / "best" / "method_model.safetensors").is_file()
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
            "--json",
        ]
    )
    assert rc == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["ppl"] == pytest.approx(res["test_ppl"], rel=1e-9)
    lstm = json.loads((trained / "lstm" / "results.json").read_text())
    assert res["parameters"] - lstm["parameters"] == 32 * 32 + 2 * 32


def _bucket_gains_by_hand(counts, res) -> tuple[list[float], list[int]]:
    """Per frequency bucket: the sum of nll_lstm - nll_pointer, and the token count."""
    ranked = sorted(range(len(counts)), key=lambda w: (-counts[w], w))
    bucket = {w: r * 10 // len(counts) for r, w in enumerate(ranked)}
    sums, tokens = [0.0] * 10, [0] * 10
    targets = res["lstm"]["targets"].flatten().tolist()
    gain = (res["lstm"]["token_nll"] - res["ptr"]["token_nll"]).flatten().tolist()
    for w, g in zip(targets, gain, strict=True):
        sums[bucket[w]] += g
        tokens[bucket[w]] += 1
    return sums, tokens


def test_analyze_writes_pngs_and_the_bucket_gains_and_gates_computed_by_hand(
    trained, synthetic_lm_dir, tmp_path
):
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
    # the gains by hand: word types ranked by training count (ties: smaller id first), ten
    # equal buckets by rank, mean of nll_lstm - nll_pointer over the test tokens of each
    from gencraft.data import load_lm_corpus
    from gencraft.pointer import PointerSentinelLSTM
    from gencraft.pointer.evaluate import evaluate

    corpus = load_lm_corpus("ptb", synthetic_lm_dir)
    models = {k: PointerSentinelLSTM.from_pretrained(trained / k / "best") for k in ("lstm", "ptr")}
    res = {
        k: evaluate(m, corpus["test"], batch_size=2, return_details=True, progress=False)
        for k, m in models.items()
    }
    sums, tokens = _bucket_gains_by_hand(corpus.vocab.counts, res)
    for i, row in enumerate(summary["buckets"]):
        assert row["tokens"] == tokens[i]
        if tokens[i]:
            assert row["gain"] == pytest.approx(sums[i] / tokens[i], abs=1e-5)
    assert sum(tokens) == res["lstm"]["targets"].numel() and sum(t > 0 for t in tokens) >= 5
    # the passage's gates: those of one evaluation pass from the start of the split
    ids = corpus["test"]
    m = models["ptr"].eval()
    with torch.no_grad():
        out = m(ids[None, :32], ids[None, 1:33])
    assert len(summary["passage"]) == 12
    words = corpus.vocab.decode(ids[20:32])
    for j, row in enumerate(summary["passage"]):
        assert row["input"] == words[j]
        assert row["gate"] == pytest.approx(float(out.gate[0, 20 + j]), abs=2e-4)
        assert 0 <= row["distance"] < 20


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


def _train(data, out, *extra):
    args = ["pointer", "train", *TRAIN, "--lr", "1", "--data-dir", str(data), "--output", str(out)]
    return main([*args, *extra])


def test_max_steps_below_an_epoch_still_saves_best_and_reruns_say_so(
    synthetic_lm_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    assert _train(synthetic_lm_dir, out, "--max-steps", "2") == 0  # no evaluation was due
    assert (out / "best" / "method_model.safetensors").is_file()
    capsys.readouterr()
    assert _train(synthetic_lm_dir, out, "--max-steps", "2") == 0
    said = capsys.readouterr().out
    assert "already finished (max_steps: step 2" in said and "--max-epochs to continue" in said
    assert _train(synthetic_lm_dir, out, "--max-steps", "4") == 0  # a larger budget continues
    assert json.loads((out / "results.json").read_text())["steps"] == 4
    assert _train(synthetic_lm_dir, out, "--max-steps", "4", "--bptt", "5") == 2
    assert "other settings (bptt 10 -> 5" in capsys.readouterr().err
    assert _train(synthetic_lm_dir, out, "--max-time", "0") == 2
    assert "max_time must be > 0" in capsys.readouterr().err


def test_ctrl_c_saves_and_the_resumed_run_ends_with_the_uninterrupted_weights(
    synthetic_lm_dir, tmp_path, capsys, monkeypatch
):
    import os
    import signal

    from gencraft.pointer import PointerSentinelLSTM, PointerTrainer

    assert _train(synthetic_lm_dir, tmp_path / "ref", "--max-steps", "8", "--eval-every", "3") == 0
    step = PointerTrainer.step_loss
    calls = []

    def interrupted_step(self, model, st):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of step 5
        return step(self, model, st)

    monkeypatch.setattr(PointerTrainer, "step_loss", interrupted_step)
    run = tmp_path / "run"
    assert _train(synthetic_lm_dir, run, "--max-steps", "8", "--eval-every", "3") == 130
    err = capsys.readouterr().err
    assert f"gencraft: interrupted: saved {run / 'checkpoint'}" in err
    assert "Traceback" not in err
    monkeypatch.setattr(PointerTrainer, "step_loss", step)
    assert _train(synthetic_lm_dir, run, "--max-steps", "8", "--eval-every", "3") == 0
    a = PointerSentinelLSTM.from_pretrained(tmp_path / "ref" / "best").state_dict()
    b = PointerSentinelLSTM.from_pretrained(run / "best").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ref_hist = json.loads((tmp_path / "ref" / "history.json").read_text())
    run_hist = json.loads((run / "history.json").read_text())
    assert [h["valid_ppl"] for h in ref_hist] == [h["valid_ppl"] for h in run_hist]


def test_medium_preset_trains_with_the_papers_schedule_by_default(
    synthetic_lm_dir, tmp_path, capsys
):
    """--preset medium without --k1 uses k1 = 1 (the paper's schedule); --k1 still wins."""
    common = [
        "pointer",
        "train",
        "--corpus",
        "ptb",
        "--preset",
        "medium",
        "--hidden-size",
        "8",
        "--window",
        "4",
        "--batch-size",
        "2",
        "--bptt",
        "5",
        "--max-steps",
        "2",
        "--eval-batch-size",
        "2",
        "--final-eval-batch-size",
        "2",
        "--quiet",
        "--data-dir",
        str(synthetic_lm_dir),
    ]
    for extra, k1 in (([], 1), (["--k1", "5"], 5)):
        out = tmp_path / str(k1)
        assert main([*common, *extra, "--output", str(out)]) == 0
        state = torch.load(out / "checkpoint" / "state.pt", weights_only=False)
        assert state["settings"]["k1"] == k1
    assert "--preset medium: k1 = 1" in capsys.readouterr().out
