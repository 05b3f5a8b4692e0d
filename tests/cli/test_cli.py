import json
import subprocess
import sys

import pytest

from gencraft.cli.main import build_parser, main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "argv", [[], ["data"], ["data", "stats"], ["generate"], ["eval"], ["demo"], ["models"]]
)
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: gencraft" in capsys.readouterr().out


def test_console_script_module_runs():
    res = subprocess.run(
        [sys.executable, "-m", "gencraft", "models"], capture_output=True, text=True, check=True
    )
    assert "smollm2-135m" in res.stdout and "tiny-bert2bert" in res.stdout


def test_eval_txt_and_jsonl(tmp_path, capsys):
    (tmp_path / "pred.txt").write_text("the cat sat on the mat\npolice arrested two men\n")
    (tmp_path / "ref.jsonl").write_text(
        json.dumps({"references": ["a cat sat on the mat", "the cat sat on the mat"]})
        + "\n"
        + json.dumps({"summary": "two men were arrested"})
        + "\n"
    )
    (tmp_path / "src.txt").write_text("the cat sat on the mat all day\ntwo men were arrested\n")
    code, out, _ = run(
        capsys,
        "eval",
        "--predictions",
        str(tmp_path / "pred.txt"),
        "--references",
        str(tmp_path / "ref.jsonl"),
        "--sources",
        str(tmp_path / "src.txt"),
        "--metrics",
        "rouge,bleu,distinct,repetition,length,novel,r1p_source",
        "--json",
    )
    assert code == 0
    res = json.loads(out)
    assert res["n"] == 2 and res["length"] == 5.0
    assert res["rouge1"] > 50 and res["novel1"] == pytest.approx(100 * (0 + 1 / 4) / 2)  # "police"
    code, out, _ = run(
        capsys,
        "eval",
        "--predictions",
        str(tmp_path / "pred.txt"),
        "--references",
        str(tmp_path / "ref.jsonl"),
    )
    assert code == 0 and "rougeL" in out and "bleu" in out


def test_eval_errors_are_clear(tmp_path, capsys):
    (tmp_path / "pred.jsonl").write_text('{"prediction": "ok"}\n{"prediction": \n')
    (tmp_path / "pred.txt").write_text("a\n")
    (tmp_path / "ref.txt").write_text("a\nb\n")
    cases = [
        ("pred.jsonl", "ref.txt", "rouge", "pred.jsonl, line 2: not JSON"),
        ("pred.txt", "ref.txt", "rouge", "1 predictions but 2 references"),
        ("pred.txt", "pred.txt", "novel", "metric 'novel' needs --sources"),
        ("pred.txt", "pred.txt", "meteor", "unknown metric(s) meteor"),
    ]
    for pred, ref, metric, message in cases:
        code, _, err = run(
            capsys,
            "eval",
            "--predictions",
            str(tmp_path / pred),
            "--references",
            str(tmp_path / ref),
            "--metrics",
            metric,
        )
        assert code == 2 and message in err, (pred, ref, metric, err)


def test_data_stats_and_missing_dir(tmp_path, capsys):
    d = tmp_path / "ptb"
    d.mkdir()
    for split in ("train", "valid", "test"):
        (d / f"ptb.{split}.txt").write_text(" a b c \n a <unk> \n")
    code, out, _ = run(capsys, "data", "stats", "ptb", "--data-dir", str(tmp_path), "--json")
    rows = json.loads(out)
    assert code == 0 and [r["tokens"] for r in rows] == [7, 7, 7] and rows[0]["vocab"] == 5
    code, _, err = run(capsys, "data", "stats", "ptb", "--data-dir", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err and "--data-dir" in err
    code, _, err = run(capsys, "data", "stats", "imagenet", "--data-dir", str(tmp_path))
    assert code == 2 and "unknown dataset 'imagenet'" in err


def test_data_stats_real_wikitext(shared_data, capsys):
    code, out, _ = run(
        capsys, "data", "stats", "wikitext-2", "--split", "valid", "--data-dir", str(shared_data)
    )
    assert code == 0 and "217646" in out and "33278" in out


def test_generate_with_tiny_model(capsys):
    code, out, _ = run(
        capsys,
        "generate",
        "--model",
        "tiny-gpt2",
        "--prompt",
        "hi",
        "--prompt",
        "yo",
        "--do-sample",
        "--top-k",
        "5",
        "--max-new-tokens",
        "3",
        "--json",
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["prompt"] for r in lines] == ["hi", "yo"]
    code, _, err = run(
        capsys, "generate", "--model", "tiny-gpt2", "--prompt", "hi", "--top-p", "0.9"
    )
    assert code == 2 and "--top-k/--top-p only apply with --do-sample" in err
    code, _, err = run(capsys, "generate", "--model", "no-such-model", "--prompt", "hi")
    assert code == 2 and "cannot load model 'no-such-model'" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", ""], "--prompt number 1 is empty"),
        (["--prompt", "hi", "--prompt", " "], "--prompt number 2 is empty"),
        (["--prompt", "hi", "--num-beams", "0"], "num_beams must be >= 1, got 0"),
        (["--prompt", "hi", "--num-beams", "-1"], "num_beams must be >= 1, got -1"),
        (["--prompt", "hi", "--do-sample", "--top-p", "1.5"], "top_p must lie in (0, 1]"),
        (["--prompt", "hi", "--top-k", "5"], "only apply with --do-sample"),
        (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
        (["--prompt", "word " * 600], "exceeds the model's context of 512"),
    ],
)
def test_generate_rejects_bad_input_with_one_line(args, message, capsys):
    from gencraft.cli.main import main

    assert main(["generate", "--model", "tiny-gpt2", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-bart"])
def test_a_prompt_beyond_the_context_is_refused_for_every_architecture(model, capsys):
    from gencraft.cli.main import main

    assert main(["generate", "--model", model, "--prompt", "word " * 300]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err


@pytest.mark.slow
def test_an_encoder_cannot_generate(capsys):
    from gencraft.cli.main import main

    assert main(["generate", "--model", "minilm-l6", "--prompt", "hi"]) == 2
    assert "encoder without a language-model head" in capsys.readouterr().err


def test_a_mistyped_name_fails_at_once_without_the_network(capsys, monkeypatch):
    from gencraft.cli.main import main
    from gencraft.models import registry

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def no_network(*a, **k):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(registry.AutoConfig, "from_pretrained", no_network)
    for name in ("smollm2-135", "outputs/missing/run", "tiny_llama"):
        assert main(["generate", "--model", name, "--prompt", "hi"]) == 2
        err = capsys.readouterr().err
        assert "not a Hugging Face Hub id" in err


TRAINERS = [
    (["focus", "train", "--model", "tiny-bart"], "gencraft.focus.config:FocusTrainConfig"),
    (["search", "train-classifier"], "gencraft.search.config:ClassifierTrainConfig"),
    (["prefix", "train"], "gencraft.prefix.config:PrefixTrainConfig"),
    (["recurrence", "train"], "gencraft.recurrence.config:RecurrenceTrainConfig"),
    (["nar", "train"], "gencraft.nar.config:NARTrainConfig"),
]


def _config_class(path: str) -> type:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _flag_names(cls: type) -> set[str]:
    """Every field of ``cls`` that is a flag; a nested ``fit`` contributes its own fields but
    those its metadata hides."""
    import dataclasses

    names = set()
    for f in dataclasses.fields(cls):
        if f.type in ("dict[str, Any]",):
            continue
        if f.type == "FitConfig":
            inner = {g.name for g in dataclasses.fields(f.default_factory())}
            names |= inner - set(f.metadata["hide"])
        else:
            names.add(f.name)
    return names


@pytest.mark.parametrize(
    "argv, config",
    [
        *TRAINERS,
        (["pointer", "train"], "gencraft.pointer.config:TrainConfig"),
        (["generate", "--model", "x"], "gencraft.models.settings:GenerationSettings"),
    ],
)
def test_flags_come_from_the_config_dataclasses(argv, config):
    """Defaults live in one place: a command's parsed defaults build the dataclass's defaults,
    and every field of the dataclass (but free-form dicts) is a flag, the nested training-loop
    settings included."""
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.main import build_parser

    cls = _config_class(config)
    args = build_parser().parse_args(argv)
    assert dataclass_from_args(cls, args) == cls()
    assert _flag_names(cls) <= set(vars(args))


@pytest.mark.parametrize("argv, config", TRAINERS)
def test_every_trainer_takes_the_training_loop_flags(argv, config):
    """The README's promise: --max-steps, --max-time, --epochs, --batch-size and --seed reach
    the one training loop's settings (cfg.fit) of every trainer."""
    from gencraft.cli.flags import dataclass_from_args
    from gencraft.cli.main import build_parser

    cls = _config_class(config)
    flags = ["--max-steps", "3", "--max-time", "5", "--epochs", "4", "--batch-size", "2"]
    args = build_parser().parse_args([*argv, *flags, "--seed", "7"])
    fit = dataclass_from_args(cls, args).fit
    assert (fit.max_steps, fit.max_time, fit.epochs, fit.batch_size, fit.seed) == (3, 5, 4, 2, 7)
    assert cls().fit.max_steps is None  # and the defaults were the method's


def test_config_validation_is_one_line_for_every_trainer(capsys):
    from gencraft.cli.main import main

    for argv, message in (
        (["focus", "train", "--model", "tiny-bart", "--batch-size", "0"], "batch_size must be"),
        (["pointer", "train", "--k1", "500"], "k1 must lie in [1, bptt = 100]"),
        (["search", "train-classifier", "--valid-fraction", "2"], "valid_fraction must lie"),
        (["search", "train-classifier", "--max-steps", "0"], "max_steps must be >= 1"),
        (["prefix", "train", "--max-time", "-1"], "max_time must be > 0"),
        (["focus", "eval", "no/such/run", "--samples", "0"], "samples must be >= 1"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_every_flag_is_generated_from_a_dataclass_field():
    """At least 90% of the CLI's arguments come from dataclasses (all of them now);
    each has its field's help text."""
    import argparse

    from gencraft.cli.flags import census
    from gencraft.cli.main import build_parser

    total, generated = census(build_parser())
    assert total > 300 and generated / total >= 0.9, (total, generated)

    def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return sub.choices[name]

    nar_eval = subcommand(subcommand(build_parser(), "nar"), "eval")
    helps = {a.dest: a.help for a in nar_eval._actions if a.help != argparse.SUPPRESS}
    assert helps["num_beams"].startswith("beam size (1: greedy)")
    assert helps["output"].startswith("the predictions: a .txt file")
    train = subcommand(subcommand(build_parser(), "nar"), "train")
    helps = {a.dest: a.help for a in train._actions if a.help != argparse.SUPPRESS}
    assert helps["output"].startswith("where the results go")


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (["search", "beam", "hi", "--beams", "3"], "num_beams", 3),
        (["nar", "eval", "m", "--beams", "2"], "num_beams", 2),
        (["focus", "eval", "run", "--data", "cnndm"], "task", "cnndm"),
        (["focus", "train", "--model", "m", "--max-train", "5"], "train_examples", 5),
        (["focus", "train", "--model", "m", "--max-valid", "2"], "valid_examples", 2),
        (["nar", "eval", "m", "--predictions", "p.txt"], "output", "p.txt"),
        (["prefix", "analyze", "run", "--output-dir", "d"], "output", "d"),
        (["pointer", "train", "--no-pointer"], "pointer", False),
    ],
)
def test_old_spellings_stay_as_hidden_aliases(argv, dest, value):
    from gencraft.cli.main import build_parser

    assert getattr(build_parser().parse_args(argv), dest) == value


@pytest.mark.parametrize("command", [["search", "beam"], ["nar", "eval"], ["focus", "train"]])
def test_help_shows_one_name_per_concept(command, capsys):
    from gencraft.cli.main import main

    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    for old in ("--beams", "--max-train", "--max-valid", "--predictions", "--output-dir"):
        assert old not in text
    assert "--data " not in text and "--data\n" not in text
