"""A rerun never returns another run's outputs: an interrupted ``gencraft generate --output F``
keeps its finished batches in ``F.partial/`` with a fingerprint of what made them, and a later
run into ``F`` resumes them only when the model, its weights, the prompts, every setting and
the seed are the same; anything else is refused in one line before any batch runs. One output
rule for every file command: an existing file is refused unless ``--restart``, and a suffix the
command cannot write is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gencraft.models.generate as generate_module
from gencraft.cli.main import main

PROMPTS = ["What is 2+2?", "the cat sat on", "a dog ran", "one two three", "blue"]


def _one_line_error(capsys, argv: list[str], *messages: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("gencraft: error:")]
    assert code == 2, err
    assert len(lines) == 1 and all(m in lines[0] for m in messages), err
    assert "Traceback" not in err
    return lines[0]


def _argv(model: str, prompts: list[str], out: Path, *extra: str) -> list[str]:
    argv = ["generate", "--model", model, "--batch-size", "2", "--max-new-tokens", "3"]
    for p in prompts:
        argv += ["--prompt", p]
    return [*argv, *extra, "--output", str(out)]


def _interrupted(monkeypatch, argv: list[str], after: int = 1) -> None:
    """Run ``argv``, stopped (Ctrl-C) in its batch number ``after + 1``."""
    real, calls = generate_module.generate_text, []

    def stopping(*a, **k):
        calls.append(1)
        if len(calls) > after:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(generate_module, "generate_text", stopping)
    assert main(argv) == 130
    monkeypatch.setattr(generate_module, "generate_text", real)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


CHANGED = {
    "model": (["--model", "tiny-gpt2"], "model"),
    "prompts": (["--prompt", "another prompt"], "inputs"),
    "settings": (["--max-new-tokens", "4"], "settings"),
    "seed": (["--seed", "7"], "seed"),
    "batch size": (["--batch-size", "3"], "batch size"),
}


@pytest.mark.parametrize("what", sorted(CHANGED))
def test_a_rerun_of_another_run_into_the_same_output_is_refused(
    what, tmp_path, monkeypatch, capsys
):
    """tiny-llama on five prompts, stopped after its first batch; a rerun into the same file
    with another model, prompts, setting, seed or batch size is refused in one line naming
    what differs, and the kept batch stays; the same command then resumes and equals a fresh
    run; ``--restart`` starts afresh."""
    out = tmp_path / "gen.jsonl"
    first = _argv("tiny-llama", PROMPTS, out)
    _interrupted(monkeypatch, first)
    capsys.readouterr()
    flags, part = CHANGED[what]
    other = [*first[:-2], *flags, "--output", str(out)]
    if what == "prompts":
        other = _argv("tiny-llama", [*PROMPTS[:4], "another prompt"], out)
    _one_line_error(capsys, other, f"{out}.partial", f"({part} differ)", "--restart")
    assert not out.exists() and list((tmp_path / "gen.jsonl.partial").glob("partial-*"))
    assert main(first) == 0  # the same run resumes
    fresh = tmp_path / "fresh.jsonl"
    assert main(_argv("tiny-llama", PROMPTS, fresh)) == 0
    assert _rows(out) == _rows(fresh)
    assert not (tmp_path / "gen.jsonl.partial").exists()


def test_restart_replaces_another_runs_partial_results(tmp_path, monkeypatch, capsys):
    out = tmp_path / "gen.jsonl"
    _interrupted(monkeypatch, _argv("tiny-llama", PROMPTS, out))
    other = _argv("tiny-gpt2", ["What is 2+2?", "x y"], out)
    _one_line_error(capsys, other, "(input count, inputs, model differ)")
    assert main([*other, "--restart"]) == 0
    fresh = tmp_path / "fresh.jsonl"
    assert main(_argv("tiny-gpt2", ["What is 2+2?", "x y"], fresh)) == 0
    assert _rows(out) == _rows(fresh)


def test_the_same_run_resumes_without_redoing_its_finished_batches(tmp_path, monkeypatch):
    out = tmp_path / "gen.jsonl"
    argv = _argv("tiny-llama", PROMPTS, out)
    _interrupted(monkeypatch, argv, after=2)  # two of three batches kept
    real, calls = generate_module.generate_text, []
    monkeypatch.setattr(
        generate_module, "generate_text", lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    )
    assert main(argv) == 0
    assert len(calls) == 1 and [r["id"] for r in _rows(out)] == list(range(5))


def test_an_existing_output_is_refused_unless_restart(tmp_path, capsys):
    out = tmp_path / "gen.jsonl"
    out.write_text("precious\n")
    argv = _argv("tiny-llama", PROMPTS[:2], out)
    _one_line_error(capsys, argv, f"--output {out} exists", "--restart")
    assert out.read_text() == "precious\n"
    assert main([*argv, "--restart"]) == 0
    assert [r["prompt"] for r in _rows(out)] == PROMPTS[:2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["generate", "--model", "tiny-llama", "--prompt", "a", "--output", "{d}/x.txt"],
            "writes .jsonl files, not .txt",
        ),
        (["data", "export", "e2e", "--output", "{d}/e2e.xml"], "writes .jsonl or .csv"),
        (["data", "export", "e2e", "--output", "{d}/e2e.txt"], "e2e is written as .jsonl"),
        (["data", "export", "ptb", "--output", "{d}/ptb.jsonl"], "ptb is written as .txt"),
        (["focus", "eval", "run", "--output", "{d}/scores.jsonl"], "writes .json files"),
        (["nar", "eval", "run", "--output", "{d}/p.csv"], "writes .txt or .jsonl files"),
    ],
)
def test_a_suffix_the_command_cannot_write_is_refused(argv, message, tmp_path, capsys):
    _one_line_error(capsys, [a.replace("{d}", str(tmp_path)) for a in argv], message)
    assert not list(tmp_path.iterdir())


def test_data_export_refuses_an_existing_file_and_writes_what_task_reads(
    shared_data, tmp_path, capsys
):
    out = tmp_path / "e2e.jsonl"
    argv = ["data", "export", "e2e", "--split", "test", "--output", str(out)]
    assert main([*argv, "--data-dir", str(shared_data)]) == 0
    before = out.read_text()
    _one_line_error(capsys, [*argv, "--data-dir", str(shared_data)], "exists")
    assert out.read_text() == before
    assert main([*argv, "--data-dir", str(shared_data), "--restart"]) == 0
    assert out.read_text() == before


def test_nar_eval_writes_json_lines_or_text_by_the_suffix(shared_data, tmp_path, capsys):
    argv = ["nar", "eval", "tiny-bert", "--task", "e2e", "--limit", "3", "--steps", "2"]
    argv += ["--data-dir", str(shared_data), "--quiet", "--json"]
    assert main([*argv, "--output", str(tmp_path / "p.jsonl")]) == 0
    rows = _rows(tmp_path / "p.jsonl")
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert main([*argv, "--output", str(tmp_path / "p.txt")]) == 0
    lines = (tmp_path / "p.txt").read_text().splitlines()
    assert lines == [r["prediction"] for r in rows]
