"""What a researcher brings: their own data through every method's commands, a
device and dtype checked before anything loads, runs that load from any folder, outputs
checked before work, and one line for each failure."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from gencraft.cli.main import build_parser, main


def _one_line(capsys, argv, message, code=2):
    got = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("gencraft: error:")]
    assert got == code, err
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def own(tmp_path_factory) -> Path:
    """A task folder (train.jsonl, valid.csv, test.tsv with src/tgt fields, several
    references) and a corpus folder and file."""
    root = tmp_path_factory.mktemp("own")
    task = root / "my task"  # a space in the name, as users have
    task.mkdir()
    rows = [
        {
            "src": f"name[Place {i}], food[{f}]",
            "tgt": [f"Place {i} serves {f} food.", f"{f} at {i}."],
        }
        for i, f in enumerate(["Thai", "Greek", "Basque", "Thai"] * 3)
    ]
    (task / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (task / "valid.csv").write_text(
        "src,tgt\n" + "".join(f'"{r["src"]}",{r["tgt"][0]}\n' for r in rows[:3])
    )
    (task / "test.tsv").write_text(
        "src\ttgt\n" + "".join(f"{r['src']}\t{t}\n" for r in rows[:3] for t in r["tgt"])
    )
    corpus = root / "corpus"
    corpus.mkdir()
    words = "the cat sat on the mat and the dog ran to the park".split()  # noqa: SIM905
    for k, name in enumerate(("train", "valid", "test")):
        lines = [" ".join(words[(i + k) % 7 :] + words[: (i + k) % 7]) for i in range(30)]
        (corpus / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (root / "corpus.txt").write_text((corpus / "train.txt").read_text())
    return root


FIELDS = ["--source-field", "src", "--target-field", "tgt"]


def test_prefix_and_nar_train_and_eval_on_a_task_folder(own, tmp_path, capsys, monkeypatch):
    task = own / "my task"
    run = tmp_path / "prefix"
    monkeypatch.chdir(own)  # trained on a relative path, evaluated from elsewhere
    argv = [
        "prefix",
        "train",
        "--model",
        "tiny-gpt2",
        "--task",
        "my task",
        *FIELDS,
        "--max-steps",
        "2",
    ]
    assert main([*map(str, argv), "--batch-size", "4", "--output", str(run), "--quiet"]) == 0
    settings = json.loads((run / "best" / "run_settings.json").read_text())
    assert settings["train"]["task"] == str(task.resolve())  # absolute: evaluates from anywhere
    assert settings["train"]["source_field"] == "src"
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    # the run's own task and fields by default; scored by the shared scorer's own-data rule
    assert main(["prefix", "eval", str(run), "--max-new-tokens", "4", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["examples"] == 3 and out["task"] == str(task.resolve())
    assert set(out["scores"]) >= {"BLEU", "ROUGE-L", "rouge1", "rouge2", "rougeL"}
    # another task keeps its own fields (source/target here), not the run's src/tgt
    other = tmp_path / "other.jsonl"
    other.write_text('{"source": "name[A], food[Thai]", "target": "A serves Thai food."}\n')
    argv = ["prefix", "eval", str(run), "--task", str(other), "--max-new-tokens", "2"]
    assert main([*argv, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 1
    nar = tmp_path / "nar"
    argv = ["nar", "train", "--model", "tiny-bert", "--task", str(task), *FIELDS]
    assert main([*argv, "--max-steps", "2", "--output", str(nar), "--quiet"]) == 0
    capsys.readouterr()
    # the run's task and fields by default, as for prefix runs
    argv = ["nar", "eval", str(nar / "best"), "--limit", "2"]
    assert main([*argv, "--json", "--steps", "2", "--samples", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == 2


def test_focus_trains_and_evaluates_on_a_task_file(own, tmp_path, capsys):
    task = own / "my task" / "train.jsonl"
    run = tmp_path / "fame"
    argv = ["focus", "train", "--model", "tiny-bart", "--task", str(task), *FIELDS]
    assert (
        main([*argv, "--max-steps", "1", "--frequent-size", "4", "--output", str(run), "--quiet"])
        == 0
    )
    capsys.readouterr()
    settings = json.loads((run / "best" / "run_settings.json").read_text())
    assert settings["data"] == {
        "task": str(task.resolve()),
        "source_field": "src",
        "target_field": "tgt",
    }
    # no --task: the run's own file and fields, not xsum
    argv = ["focus", "eval", str(run / "best"), "--limit", "2"]
    assert main([*argv, "--no-bertscore", "--max-new-tokens", "4", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["documents"] == 2 and {"R1", "R2", "RL"} <= set(out)
    assert out["data"] == str(task.resolve())
    # --task still overrides it
    folder = ["focus", "eval", str(run / "best"), "--task", str(own / "my task"), *FIELDS]
    assert main([*folder, "--no-bertscore", "--max-new-tokens", "2", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["data"] == str(own / "my task")


def test_lm_commands_read_a_corpus_file_or_folder(own, tmp_path, capsys):
    run = tmp_path / "ptr"
    argv = [
        "pointer",
        "train",
        "--corpus",
        str(own / "corpus"),
        "--preset",
        "tiny",
        "--max-steps",
        "2",
    ]
    assert main([*argv, "--batch-size", "2", "--bptt", "8", "--output", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert (
        main(["pointer", "eval", str(run), "--limit", "40", "--bptt", "8", "--json", "--quiet"])
        == 0
    )
    row = json.loads(capsys.readouterr().out)
    assert row["tokens"] == 39 and row["corpus"] == str((own / "corpus").resolve())
    argv = ["hso", "eval", "--model", "tiny-gpt2", "--corpus", str(own / "corpus.txt")]
    assert main([*argv, "--max-words", "60", "--reset-every", "32", "--json", "--quiet"]) == 0
    assert [r["method"] for r in json.loads(capsys.readouterr().out)] == ["baseline", "hso"]
    argv = ["recurrence", "eval", "tiny-llama", "--window", "16", "--corpus", str(own / "corpus")]
    assert main([*argv, "--max-words", "60", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["words"] == 60


def test_recurrence_eval_takes_a_model_folder_of_your_own(tmp_path, own, capsys):
    from gencraft.models import load_model

    model, tok = load_model("tiny-llama")
    folder = tmp_path / "my model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    argv = ["recurrence", "eval", str(folder), "--window", "16", "--corpus", str(own / "corpus")]
    assert main([*argv, "--max-words", "40", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["words"] == 40


def _commands(
    parser: argparse.ArgumentParser, prefix=()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix: parser}
    out = {}
    for name, p in subs[0].choices.items():
        out |= _commands(p, (*prefix, name))
    return out


LOADS_A_MODEL = {
    ("generate",): ["--model", "no-such-model", "--prompt", "x"],
    ("pointer", "train"): [],
    ("pointer", "eval"): ["no/such/run"],
    ("pointer", "analyze"): ["no/such/run"],
    ("focus", "train"): ["--model", "no-such-model"],
    ("focus", "generate"): ["no/such/run"],
    ("focus", "eval"): ["no/such/run"],
    ("search", "beam"): ["x", "--model", "no-such-model"],
    ("search", "mode"): ["x", "--model", "no-such-model"],
    ("search", "errors"): ["x", "--model", "no-such-model"],
    ("search", "train-classifier"): ["--model", "no-such-model"],
    ("prefix", "train"): ["--model", "no-such-model"],
    ("prefix", "generate"): ["no/such/run"],
    ("prefix", "eval"): ["no/such/run"],
    ("prefix", "analyze"): ["no/such/run"],
    ("recurrence", "train"): ["--model", "no-such-model"],
    ("recurrence", "eval"): ["no-such-model", "--window", "8"],
    ("hso", "eval"): ["--model", "no-such-model"],
    ("nar", "train"): ["--model", "no-such-model"],
    ("nar", "generate"): ["no-such-model", "--sources", "x"],
    ("nar", "eval"): ["no-such-model"],
}


def test_every_command_that_loads_a_model_takes_device_and_dtype():
    commands = _commands(build_parser())
    for name in LOADS_A_MODEL:
        dests = {a.dest for a in commands[name]._actions}
        assert {"device", "dtype"} <= dests, name
    for name in (("prefix", "generate"), ("prefix", "eval")):
        assert "base" in {a.dest for a in commands[name]._actions}


@pytest.mark.parametrize("name", sorted(LOADS_A_MODEL))
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "gpu0"], "--device gpu0: not a device"),
        (["--device", "cuda:99"], "--device cuda:99:"),
        (["--dtype", "float16", "--device", "cpu"], "--dtype float16 on the CPU"),
    ],
)
def test_a_bad_device_or_dtype_is_one_line_before_anything_loads(
    capsys, tmp_path, name, flags, message
):
    # the model named does not exist: had anything loaded first, the error would say so
    argv = [*name, *LOADS_A_MODEL[name], *flags]
    if "--output" not in argv and name[-1] == "train":
        argv += ["--output", str(tmp_path / "o")]
    _one_line(capsys, argv, message)


def test_cuda_on_a_torch_without_it_is_one_line(monkeypatch):
    import torch

    from gencraft.errors import ConfigError
    from gencraft.models.placement import check_placement

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with pytest.raises(ConfigError, match="built without CUDA"):
        check_placement("cuda")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        check_placement("cuda:0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="2 GPU"):
        check_placement("cuda:2")


def test_dtype_loads_the_weights_in_that_dtype(capsys):
    import torch

    from gencraft.models import load_model

    model, _ = load_model("tiny-gpt2", dtype="bfloat16", device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert load_model("tiny-gpt2", dtype="auto")[0].dtype == torch.float32
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-gpt2",
                "--prompt",
                "hi",
                "--dtype",
                "bfloat16",
                "--max-new-tokens",
                "2",
            ]
        )
        == 0
    )


def test_a_prefix_run_loads_from_any_folder_and_takes_base(tmp_path, monkeypatch, capsys, own):
    from gencraft.models import load_model

    work = tmp_path / "work"
    (work / "own").mkdir(parents=True)
    model, tok = load_model("tiny-llama")
    model.save_pretrained(work / "own" / "llama tiny")
    tok.save_pretrained(work / "own" / "llama tiny")
    monkeypatch.chdir(work)
    argv = ["prefix", "train", "--model", "own/llama tiny", "--task", str(own / "my task"), *FIELDS]
    assert main([*argv, "--max-steps", "1", "--output", "run", "--quiet"]) == 0
    saved = json.loads((work / "run" / "best" / "method_config.json").read_text())
    assert saved["base_name_or_path"] == str((work / "own" / "llama tiny").resolve())
    monkeypatch.chdir(tmp_path)  # elsewhere: the recorded absolute path loads
    gen = ["prefix", "generate", str(work / "run"), "--source", "name[X]", "--max-new-tokens", "2"]
    assert main([*gen, "--quiet"]) == 0
    (work / "own" / "llama tiny").rename(tmp_path / "moved")  # the base moved: --base names it
    capsys.readouterr()
    _one_line(capsys, [*gen, "--quiet"], "--base")
    assert main([*gen, "--base", str(tmp_path / "moved"), "--quiet"]) == 0


def test_the_classifier_check_compares_models_not_strings(tmp_path, monkeypatch):
    from gencraft.errors import GencraftError
    from gencraft.models import load_model
    from gencraft.search.train import classifier_for

    model, tok = load_model("tiny-llama", seed=0)
    folder = tmp_path / "own" / "llama tiny"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    monkeypatch.chdir(tmp_path)
    clf = classifier_for(load_model("own/llama tiny")[0], d_clf=24, num_heads=4)
    clf.bind(load_model(str(folder.resolve()))[0])  # the same folder, typed otherwise
    (tmp_path / "copy").mkdir()
    for f in folder.iterdir():
        (tmp_path / "copy" / f.name).write_bytes(f.read_bytes())
    clf.bind(load_model(str(tmp_path / "copy"))[0])  # the same weights elsewhere
    other = load_model("tiny-llama", seed=1)[0]  # same shape, other weights
    with pytest.raises(GencraftError, match=r"--model tiny-llama\)"):
        clf.bind(other)
    other.gencraft_name = str(tmp_path / "a b")
    with pytest.raises(GencraftError, match=r"--model '.*/a b'\)"):  # quoted for the shell
        clf.bind(other)


def test_outputs_are_checked_before_any_work(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    bad = afile / "sub"  # under a file: cannot be made
    cases = [
        (["focus", "train", "--model", "no-such-model", "--output", afile], "is a file"),
        (["prefix", "train", "--model", "no-such-model", "--output", bad], "cannot write there"),
        (["nar", "train", "--model", "no-such-model", "--output", afile], "is a file"),
        (["focus", "generate", "no/such/run", "--output", tmp_path], "is a folder"),
        (["prefix", "generate", "no/such/run", "--output", bad / "x.jsonl"], "cannot write there"),
        (["reproduce", "search-speed", "--scale", "tiny", "--output", afile], "is a file"),
    ]
    for argv, message in cases:
        _one_line(capsys, argv, message)


def test_a_source_budget_past_the_positions_is_refused_or_cut(tmp_path, capsys, own):
    from gencraft.models.introspect import check_token_budget
    from gencraft.models.tiny import build_tiny_model

    _one_line(
        capsys,
        [
            "prefix",
            "train",
            "--model",
            "tiny-gpt2",
            "--task",
            own / "my task",
            *FIELDS,
            "--max-source-tokens",
            "4000",
            "--output",
            tmp_path / "p",
        ],
        "--max-source-tokens 4000",
    )
    _one_line(
        capsys,
        [
            "focus",
            "train",
            "--model",
            "tiny-bart",
            "--task",
            own / "my task",
            *FIELDS,
            "--max-source",
            "2000",
            "--output",
            tmp_path / "f",
        ],
        "--max-source 2000 exceeds the",
    )
    gpt = build_tiny_model("tiny-gpt2", 0)
    ctx = gpt.config.n_positions
    assert check_token_budget(gpt, ctx - 10, 10) == ctx - 10  # fits exactly
    with pytest.warns(UserWarning, match=f"cut to {ctx - 20}"):
        assert check_token_budget(gpt, ctx - 10, 10, reserve=10) == ctx - 20
    bart = build_tiny_model("tiny-bart", 0)
    assert (
        check_token_budget(bart, bart.config.max_position_embeddings, 8)
        == bart.config.max_position_embeddings
    )


def test_an_interrupted_generate_keeps_its_finished_batches_and_resumes(
    tmp_path, monkeypatch, capsys
):
    from gencraft.models import load_model
    from gencraft.prefix import PrefixConfig, PrefixModel
    from gencraft.training import save_run

    base, tok = load_model("tiny-llama")
    save_run(
        tmp_path / "run",
        PrefixModel(base, PrefixConfig(num_virtual_tokens=2)),
        tok,
        {"train": {"model": "tiny-llama", "task": "e2e", "max_source_tokens": 32}},
        base_name_or_path="tiny-llama",
    )
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"source": f"s{i}", "target": "t"}) + "\n" for i in range(3))
    )
    calls = []
    real = PrefixModel.generate

    def generate(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(PrefixModel, "generate", generate)
    out = tmp_path / "gen.jsonl"
    argv = ["prefix", "generate", str(tmp_path / "run"), "--task", str(data), "--batch-size", "1"]
    argv += ["--max-new-tokens", "2", "--output", str(out), "--quiet"]
    assert main(argv) == 130
    # the finished batch is kept beside the output (docs/scale.md), the output not yet written
    kept = (tmp_path / "gen.jsonl.partial").glob("partial-*.jsonl")
    assert [
        len(json.loads(line)["results"]) for f in kept for line in f.read_text().splitlines()
    ] == [1]
    assert not out.exists()
    calls.clear()  # the rerun, not interrupted: the kept batch is not decoded again
    monkeypatch.setattr(
        PrefixModel, "generate", lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    )
    assert main(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in lines] == [0, 1, 2] and all("prediction" in r for r in lines)
    assert len(calls) == 2  # the two unfinished batches
    assert not (tmp_path / "gen.jsonl.partial").exists()


def test_a_changed_setting_names_that_setting_only(tmp_path, capsys):
    argv = [
        "prefix",
        "train",
        "--model",
        "tiny-gpt2",
        "--max-steps",
        "1",
        "--output",
        str(tmp_path / "r"),
    ]
    data = ["--data-dir", str(Path(__file__).parent), "--quiet"]  # never read: the run exists
    own_task = tmp_path / "t.jsonl"
    own_task.write_text(json.dumps({"source": "a", "target": "b"}) + "\n")
    assert main([*argv, "--task", str(own_task), "--quiet"]) == 0
    line = _one_line(
        capsys, [*argv, "--task", str(own_task), "--lr", "0.5", *data], "other settings"
    )
    assert "train.lr 0.005 -> 0.5" in line and len(line) < 250


def test_a_subcommand_flag_error_prints_that_subcommand_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["prefix", "train", "--no-such-flag"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "usage: gencraft prefix train" in err and "unrecognized arguments: --no-such-flag" in err


def test_models_lists_as_json(capsys):
    assert main(["models", "--json"]) == 0
    names = {m["name"] for m in json.loads(capsys.readouterr().out)}
    assert {"smollm2-135m", "tiny-gpt2"} <= names


@pytest.mark.parametrize(
    ("argv", "world", "want"),
    [
        (
            ["/x/bin/gencraft", "prefix", "train", "--output", "a b"],
            1,
            "gencraft prefix train --output 'a b'",
        ),
        (
            ["/x/gencraft/cli/main.py", "prefix", "train", "--restart"],
            2,
            "accelerate launch --multi_gpu --num_processes 2 -m gencraft prefix train",
        ),
        (
            ["/x/bin/gencraft", "focus", "train"],
            4,
            "accelerate launch --multi_gpu --num_processes 4 -m gencraft focus train",
        ),
        (["train.py", "--lr", "1"], 1, "train.py --lr 1"),
        (["-c"], 1, None),
    ],
)
def test_the_resume_command_runs_as_printed(argv, world, want):
    import gencraft
    from gencraft.training.checkpoint import resume_command

    if "cli/main.py" in argv[0]:
        argv = [str(Path(gencraft.__file__).parent / "cli" / "main.py"), *argv[1:]]
    assert resume_command(argv, world) == want


def test_two_processes_print_once_and_a_resume_on_one_says_so(tmp_path, own, capsys):
    """``accelerate launch`` with two CPU processes (gloo): one header, one summary with the
    global batch; the run resumed on one process warns once and its history records both."""
    import subprocess
    import sys

    launcher = Path(sys.executable).with_name("accelerate")
    run = tmp_path / "run"
    train = ["prefix", "train", "--model", "tiny-gpt2", "--task", str(own / "my task"), *FIELDS]
    train += ["--batch-size", "2", "--output", str(run), "--quiet"]
    cmd = [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "gencraft"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*cmd, *train, "--max-steps", "2"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("prefix on tiny-gpt2") == 1
    assert "batch 2 per process x 2 process(es) = 4 examples a step" in out
    assert out.count('"steps": 2') == 1
    summary = json.loads((run / "train_summary.json").read_text())
    assert (summary["processes"], summary["global_batch"]) == (2, 4)
    assert summary["trained_examples"] == 8  # 2 steps of 2 examples on each of 2 processes
    capsys.readouterr()
    assert main([*train, "--max-steps", "4"]) == 0
    err = capsys.readouterr().err
    warning = [x for x in err.splitlines() if "resumes on 1" in x]
    assert len(warning) == 1 and "trained on 2 process(es)" in warning[0]
    assert "global batch is now 2 (was 4)" in warning[0]
    history = json.loads((run / "history.json").read_text())
    assert [(r["processes"], r["global_batch"]) for r in history] == [(2, 4), (1, 2)]
    # 24 pairs: 2 steps of 4, then 2 steps of 2 = 12 examples, half an epoch
    assert history[-1]["epoch"] == pytest.approx(0.5)
    assert json.loads((run / "train_summary.json").read_text())["trained_examples"] == 12
