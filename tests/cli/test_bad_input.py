"""Bad input to the newer commands (prefix, recurrence, hso, nar, reproduce): one line says
what is wrong, the exit status is 2, and no traceback appears. Cases: a zero,
negative or NaN number; a model of the wrong kind; a directory that is not a trained run; a
truncated weights file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gencraft.cli.main import main


def _save_prefix_recurrence_nar(root: Path) -> None:
    """Runs of three methods on tiny models under ``root``: prefix/, recurrence/, nar/."""
    from gencraft.models import load_model
    from gencraft.nar import load_mlm_seq2seq
    from gencraft.prefix import PrefixConfig, PrefixModel
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM
    from gencraft.training import save_run

    base, tok = load_model("tiny-llama", seed=0)
    cfg = PrefixConfig(num_virtual_tokens=2)
    settings = {"train": {"model": "tiny-llama", "task": "e2e", "max_source_tokens": 32}}
    settings["prefix"] = cfg.to_dict()
    save_run(root / "prefix", PrefixModel(base, cfg), tok, settings, base_name_or_path="tiny-llama")
    base, tok = load_model("tiny-llama", seed=0)
    rec = RecurrentLM(base, RecurrenceConfig(window=16))
    save_run(root / "recurrence", rec, tok, {"train": {"model": "tiny-llama"}})
    nar, tok = load_mlm_seq2seq("tiny-bert")
    save_run(root / "nar", nar, tok, {"train": {"model": "tiny-bert"}})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Saved runs of tiny models whose weight files are then cut in half, and a directory
    that holds no run."""
    root = tmp_path_factory.mktemp("runs")
    _save_prefix_recurrence_nar(root)
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


# ---------------------------------------------------------------- first contact
@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> dict[str, Path]:
    """Intact saved runs of five methods, a classifier trained for tiny-llama, and a NAR run
    whose config.json is cut in half."""
    import shutil

    import torch

    from gencraft.focus import FocusConfig, FocusForConditionalGeneration
    from gencraft.models import load_model
    from gencraft.search.train import classifier_for
    from gencraft.training import save_run

    root = tmp_path_factory.mktemp("intact")
    _save_prefix_recurrence_nar(root)
    shutil.copytree(root / "nar", root / "nar-cut")
    config = root / "nar-cut" / "config.json"
    config.write_text(config.read_text()[: len(config.read_text()) // 2])
    base, tok = load_model("tiny-bart")
    focus = FocusForConditionalGeneration(base, FocusConfig(), frequent_ids=torch.tensor([5, 6]))
    save_run(root / "focus", focus, tok, {"train": {"model": "tiny-bart"}}, save_base=True)
    base, tok = load_model("tiny-llama")
    clf = classifier_for(base, "length", d_clf=8, num_heads=2, d_out=4, mlp_hidden=8)
    save_run(root / "classifier", clf, None, {"train": {"model": "tiny-llama"}})
    (root / "a-file").write_text("not a directory")
    return {p.name: p for p in root.iterdir()}


GPT2_HSO = ["hso", "eval", "--model", "tiny-gpt2", "--max-words", "400"]
BEAM_GPT2 = ["search", "beam", "hi", "--model", "tiny-gpt2"]
NAR_HI = ["nar", "generate", "{nar}", "--sources", "hi"]
FIRST_CONTACT = [
    # a run of another method: the message names the method and the command for it
    (["nar", "generate", "{prefix}", "--sources", "hi"], "is a prefix run, not a nar one"),
    (["nar", "eval", "{recurrence}", *DATA], "try `gencraft recurrence eval`"),
    (["prefix", "eval", "{focus}", *DATA], "is a focus run, not a prefix one"),
    (["recurrence", "eval", "{nar}", *DATA], "try `gencraft nar eval`"),
    (["prefix", "generate", "{nar}", "--source", "hi"], "try `gencraft nar generate`"),
    # damaged JSON beside intact weights
    (["nar", "eval", "{nar-cut}", *DATA], "config.json is damaged or truncated"),
    # numbers a command used to take as something else
    (["prefix", "eval", "{prefix}", "--limit", "2", "--num-beams", "0", *DATA], "num_beams"),
    (["prefix", "eval", "{prefix}", "--limit", "-1", *DATA], "limit must be >= 1, got -1"),
    (["nar", "eval", "{nar}", "--limit", "0", *DATA], "limit must be >= 1, got 0"),
    (["prefix", "generate", "{prefix}", "--source", "ok", " "], "--source number 2"),
    # contexts past GPT-2's learned positions (the default fits them)
    (
        [*GPT2_HSO, "--reset-every", "100000", *DATA],
        "exceeds the model's 512 positions",
    ),
    # an encoder cannot sample a classifier's training data
    (
        ["search", "train-classifier", "--model", "tiny-bert", "--num-prompts", "2", *OUT],
        "needs a model that generates",
    ),
    # a classifier steers only the model it was trained on
    (
        [*BEAM_GPT2, "--classifier", "{classifier}", "--attribute", "3"],
        "trained on the hidden states of 'tiny-llama', not of 'tiny-gpt2'",
    ),
    # flags of another decoding method
    (
        [*NAR_HI, "--method", "mask-predict", "--argmax-unrolled", "--temperature", "0.5"],
        "--temperature, --argmax-unrolled do not apply to mask-predict decoding",
    ),
    (
        [*NAR_HI, "--method", "sundae", "--num-beams", "2"],
        "--num-beams does not apply to sundae decoding",
    ),
    # an experiment's output that is a file
    (["reproduce", "search-memory", "--scale", "tiny", "--output", "{a-file}"], "is a file"),
]


@pytest.mark.parametrize(
    "argv, message", FIRST_CONTACT, ids=lambda a: " ".join(a[:3]) if isinstance(a, list) else ""
)
def test_first_contact_bad_inputs(argv, message, intact, capsys, tmp_path, shared_data):
    """Each ends in one line, exit 2, no traceback."""
    values = {k: str(v) for k, v in intact.items()}
    _one_line_error(capsys, _fill(argv, out=tmp_path / "o", data=shared_data, **values), message)


def test_truncated_config_from_python(intact):
    from gencraft.errors import GencraftError
    from gencraft.models import load_method

    with pytest.raises(GencraftError, match=r"config\.json is damaged or truncated"):
        load_method(intact["nar-cut"])


def test_windowed_nll_refuses_a_window_past_the_positions():
    import torch

    from gencraft.errors import ConfigError
    from gencraft.metrics import windowed_nll
    from gencraft.models import load_model

    model, _ = load_model("tiny-gpt2")
    ids = torch.randint(0, 100, (2000,))
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel has 512 positions"):
        windowed_nll(model, ids, window=1024)
    assert windowed_nll(model, ids[:600], window=512).shape == (599,)  # within: scored


def test_run_commands_table_matches_the_cli():
    """RUN_COMMANDS (where a wrong-method message sends the user) names real subcommands."""
    import argparse

    from gencraft.cli.main import build_parser
    from gencraft.training.run import RUN_COMMANDS

    groups = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for method, commands in RUN_COMMANDS.items():
        sub = next(a for a in groups.choices[method]._actions if a.dest.endswith("command"))
        for command in commands:
            assert command.split()[0] in sub.choices, (method, command)


def test_reproduce_list_with_a_name_shows_its_settings(capsys):
    assert main(["reproduce", "--list", "search-memory"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("search-memory:") and "--depths" in out and "tiny" in out
    assert "prefix-tasks" not in out  # that experiment only, not the whole list


def test_help_texts_say_what_the_flag_does(capsys):
    """hso eval's corpus is the corpus scored (it takes no run); optional choices show the
    word the flag reads ("none"), not Python's None."""
    with pytest.raises(SystemExit):
        main(["hso", "eval", "--help"])
    assert "trained on" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["search", "beam", "--help"])
    out = capsys.readouterr().out
    assert "{aside,on_beam,none}" in out and "None" not in out
    said = " ".join(out.split())  # the scoring the search uses, as argparse wraps it
    assert "the EOS step included (no length normalisation: length_penalty 0)" in said
    assert "a row stops once --num-beams hypotheses have finished (early_stopping True)" in said
