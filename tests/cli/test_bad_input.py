"""Bad input to the newer commands (prefix, recurrence, hso, nar, reproduce): one line says
what is wrong, the exit status is 2, and no traceback appears (issue 26 §6). Cases: a zero,
negative or NaN number; a model of the wrong kind; a directory that is not a trained run; a
truncated weights file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gencraft.cli.main import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Saved runs of tiny models whose weight files are then cut in half, and a directory
    that holds no run."""
    from gencraft.models import load_model
    from gencraft.nar import load_mlm_seq2seq
    from gencraft.prefix import PrefixConfig, PrefixModel
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM
    from gencraft.training import save_run

    root = tmp_path_factory.mktemp("runs")
    base, tok = load_model("tiny-llama", seed=0)
    cfg = PrefixConfig(num_virtual_tokens=2)
    settings = {"train": {"model": "tiny-llama"}, "prefix": cfg.to_dict()}
    save_run(root / "prefix", PrefixModel(base, cfg), tok, settings, base_name_or_path="tiny-llama")
    base, tok = load_model("tiny-llama", seed=0)
    rec = RecurrentLM(base, RecurrenceConfig(window=16))
    save_run(root / "recurrence", rec, tok, {"train": {"model": "tiny-llama"}})
    nar, tok = load_mlm_seq2seq("tiny-bert")
    save_run(root / "nar", nar, tok, {"train": {"model": "tiny-bert"}})
    for f in root.rglob("*.safetensors"):
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("not a run")
    return {p.name: p for p in root.iterdir()}


def _one_line_error(capsys, argv: list[str], message: str) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("gencraft: error:")]
    assert code == 2, err
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


OUT = ["--output", "{out}", "--data-dir", "{data}"]
DATA = ["--data-dir", "{data}"]

NUMBERS = [
    (
        ["prefix", "train", "--model", "tiny-llama", "--num-virtual-tokens", "0", *OUT],
        "num_virtual_tokens must be >= 1",
    ),
    (["prefix", "train", "--model", "tiny-llama", "--lr", "nan", *OUT], "lr must be > 0, got nan"),
    (
        ["prefix", "train", "--model", "tiny-llama", "--top-p", "-1", *OUT],
        "top_p must lie in (0, 1]",
    ),
    (
        ["recurrence", "train", "--model", "tiny-llama", "--window", "0", *OUT],
        "window must be >= 1, got 0",
    ),
    (
        ["recurrence", "train", "--model", "tiny-llama", "--lr", "-1", *OUT],
        "lr must be > 0, got -1",
    ),
    (["hso", "eval", "--model", "tiny-llama", "--lr", "nan", *DATA], "lr must be >= 0, got nan"),
    (
        ["hso", "eval", "--model", "tiny-llama", "--window", "-3", *DATA],
        "window must be >= 1, got -3",
    ),
    (["nar", "train", "--model", "tiny-bert", "--max-steps", "0", *OUT], "max_steps must be >= 1"),
    (
        ["reproduce", "recurrence-lm", "--scale", "tiny", "--window", "0", *OUT],
        "window must be >= 1",
    ),
]


KINDS = [
    (
        ["prefix", "train", "--model", "tiny-bert", *OUT],
        "PrefixModel needs a causal LM or an encoder-decoder",
    ),
    (["recurrence", "train", "--model", "tiny-bart", *OUT], "RecurrentLM needs a causal LM"),
    (["hso", "eval", "--model", "tiny-bart", *DATA], "HSO needs a causal LM with a KV cache"),
    (["hso", "eval", "--model", "tiny-bert", *DATA], "HSO needs a causal LM with a KV cache"),
    (["nar", "train", "--model", "tiny-llama", *OUT], "cannot use 'tiny-llama' as a masked LM"),
    (
        ["reproduce", "prefix-tasks", "--scale", "tiny", "--model", "tiny-bert", *OUT],
        "PrefixModel needs",
    ),
    (
        ["reproduce", "hso-lm", "--scale", "tiny", "--model", "tiny-bart", *OUT],
        "HSO needs a causal LM",
    ),
    (
        ["reproduce", "nar-tasks", "--scale", "tiny", "--model", "tiny-llama", *OUT],
        "as a masked LM",
    ),
]


def _fill(argv: list[str], **values: object) -> list[str]:
    return [a.format(**values) for a in argv]


@pytest.mark.parametrize(
    "argv, message",
    NUMBERS + KINDS,
    ids=lambda a: " ".join(a[:4]) if isinstance(a, list) else "",
)
def test_bad_numbers_and_wrong_model_kinds(argv, message, capsys, tmp_path, shared_data):
    _one_line_error(capsys, _fill(argv, out=tmp_path / "o", data=shared_data), message)


RUN_COMMANDS = [
    ("prefix", ["prefix", "generate", "{run}", "--task", "e2e", "--limit", "1", *DATA]),
    ("prefix", ["prefix", "eval", "{run}", "--task", "e2e", "--data-dir", "{data}"]),
    ("prefix", ["prefix", "analyze", "{run}", "--data-dir", "{data}"]),
    ("recurrence", ["recurrence", "eval", "{run}", "--data-dir", "{data}"]),
    ("nar", ["nar", "generate", "{run}", "--sources", "hi"]),
    ("nar", ["nar", "eval", "{run}", "--data-dir", "{data}"]),
]


@pytest.mark.parametrize(
    "kind, argv", RUN_COMMANDS, ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a
)
def test_not_a_run_and_truncated_weights(kind, argv, runs, capsys, shared_data):
    _one_line_error(capsys, _fill(argv, run=runs["empty"], data=shared_data), "not a trained run")
    _one_line_error(capsys, _fill(argv, run=runs[kind], data=shared_data), "damaged or truncated")


def test_unknown_experiment_and_setting(capsys):
    _one_line_error(capsys, ["reproduce", "no-such"], "unknown experiment 'no-such'")
    _one_line_error(
        capsys, ["reproduce", "search-empty", "--beams", "0"], "search-empty has no setting --beams"
    )
