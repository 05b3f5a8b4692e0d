"""What a new user met in a trial, each fixed and tested: a closed stdout, a CSV with a
byte-order mark, an empty prompt file, a JSON file given as a corpus, an empty NAR source, the
pointer's unseen-word share, batch-size errors that name their split and flag, an HSO default
that fits the model, `generate --output`, text written as text, and names the docs promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_your_data_and_machines import FIELDS, _one_line, own  # noqa: F401

from gencraft.cli.main import main
from gencraft.errors import DataError, GencraftError

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_stdout_stops_quietly():
    """`gencraft models | head -c 1`: the reader is gone before the first line; no traceback,
    exit status 141 (128 + SIGPIPE), as a shell tool's."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    code = "import sys; from gencraft.cli.main import main; sys.exit(main(['models']))"
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    proc.stdout.close()  # before the child has printed anything (it is still importing)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_a_csv_with_a_byte_order_mark_reads_its_first_field(tmp_path):
    from gencraft.data.own import read_task_file

    path = tmp_path / "task.csv"
    path.write_bytes("\ufeffdocument,summary\nA long text.,Short.\n".encode())
    (ex,) = read_task_file(path, "document", "summary")
    assert (ex.source, ex.references) == ("A long text.", ["Short."])
    tsv = tmp_path / "corpus.txt"
    tsv.write_bytes("\ufeffthe cat\n".encode())
    from gencraft.data.io import read_text

    assert read_text(tsv) == "the cat\n"


def test_an_empty_prompt_file_is_named(tmp_path, capsys):
    empty = tmp_path / "prompts.txt"
    empty.write_text("\n  \n")
    line = _one_line(capsys, ["generate", "--model", "tiny-gpt2", "--prompt-file", empty], "holds")
    assert str(empty) in line and "--prompt-file" in line


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".tsv"])
def test_a_structured_file_given_as_a_corpus_is_refused(tmp_path, suffix):
    from gencraft.data.own import corpus_files

    path = tmp_path / f"data{suffix}"
    path.write_text('{"text": "the cat"}\n')
    with pytest.raises(DataError, match=f"a corpus is plain text.*not {suffix}"):
        corpus_files(path, ("valid",))
    txt = tmp_path / "data.txt"
    txt.write_text("the cat\n")
    assert corpus_files(txt, ("valid",)) == {"valid": txt}


def test_an_empty_nar_source_is_refused_before_loading(tmp_path, capsys):
    argv = ["nar", "generate", tmp_path / "no-run", "--sources", "a source", "  "]
    line = _one_line(capsys, argv, "--sources number 2 is empty")
    assert "no-run" not in line  # refused before the run is looked for


def test_the_unseen_word_share_is_the_share_of_unk():
    from gencraft.cli.pointer import unk_share
    from gencraft.data import UNK, Vocabulary

    vocab = Vocabulary.build(["the", "cat", UNK])
    unk = vocab.stoi[UNK]
    ids = torch.tensor([unk, unk, vocab.stoi["the"], unk])
    assert unk_share(ids, vocab) == 0.75
    assert unk_share(ids[2:3], vocab) == 0.0
    assert unk_share(ids[:0], vocab) == 0.0


def test_pointer_eval_reports_the_unseen_word_share(own, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "ptr"
    argv = ["pointer", "train", "--corpus", own / "corpus", "--preset", "tiny", "--max-steps", "1"]
    argv += ["--batch-size", "2", "--bptt", "8", "--output", run, "--quiet"]
    assert main([str(a) for a in argv]) == 0
    capsys.readouterr()
    assert main(["pointer", "eval", str(run), "--bptt", "8", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["unk_share"] == 0.0  # every valid word seen


def test_too_few_tokens_names_the_split_and_the_flag():
    from gencraft.training.schedules import batchify

    with pytest.raises(
        GencraftError,
        match=r"^the valid split: 18 tokens .* 10 streams .* lower --eval-batch-size$",
    ):
        batchify(torch.arange(18), 10, "the valid split", "--eval-batch-size")
    assert batchify(torch.arange(18), 9).shape == (9, 2)


def test_hso_eval_default_contexts_fit_the_model(own, capsys):  # noqa: F811
    """tiny-llama has 512 positions: the default --reset-every (1024) becomes 512; a value
    given past the positions is still refused."""
    argv = ["hso", "eval", "--model", "tiny-llama", "--corpus", str(own / "corpus.txt")]
    assert main([*argv, "--steps", "1", "--json", "--quiet"]) == 0  # 360 words: > 512 tokens
    assert [r["method"] for r in json.loads(capsys.readouterr().out)] == ["baseline", "hso"]
    _one_line(capsys, [*argv, "--reset-every", "1024"], "512")


def test_generate_output_writes_id_prompt_and_output_as_text(tmp_path, capsys):
    out = tmp_path / "gen.jsonl"
    prompts = ["Größe of", "the cat", "a dog"]
    argv = ["generate", "--model", "tiny-gpt2", "--max-new-tokens", "2", "--batch-size", "2"]
    for p in prompts:
        argv += ["--prompt", p]
    assert main([*argv, "--output", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(x) for x in lines]
    assert [(r["id"], r["prompt"]) for r in rows] == list(enumerate(prompts))
    assert "Größe" in lines[0]  # not \u escapes
    assert f"3 outputs -> {out}" in capsys.readouterr().out


def test_prefix_generate_output_writes_ids_and_references(own, tmp_path, capsys):  # noqa: F811
    task = own / "my task"
    argv = ["prefix", "train", "--model", "tiny-llama", "--task", str(task), *FIELDS]
    assert main([*argv, "--max-steps", "1", "--output", str(tmp_path / "run"), "--quiet"]) == 0
    out = tmp_path / "gen.jsonl"
    gen = ["prefix", "generate", str(tmp_path / "run"), "--split", "test", "--limit", "2"]
    assert main([*gen, "--max-new-tokens", "2", "--output", str(out), "--quiet"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [0, 1]
    assert rows[0]["references"] == ["Place 0 serves Thai food.", "Thai at 0."]
    assert all(isinstance(r["prediction"], str) for r in rows)


def test_the_data_names_the_docs_promise_import():
    from gencraft.data import references_of, source_of, task_examples  # noqa: F401


def test_focus_train_writes_its_summary_with_processes_and_global_batch(own, tmp_path, capsys):  # noqa: F811
    """As every trainer on fit: train_summary.json with the steps, the processes and the
    global batch (per-process batch x accumulation x processes)."""
    task = own / "my task" / "train.jsonl"
    run = tmp_path / "fame"
    argv = ["focus", "train", "--model", "tiny-bart", "--task", str(task), *FIELDS]
    argv += ["--max-steps", "2", "--batch-size", "2", "--grad-accum", "2", "--frequent-size", "4"]
    assert main([*argv, "--output", str(run), "--quiet"]) == 0
    header = "batch 2 per process x 2 accumulated x 1 process(es) = 4 examples a step"
    assert header in capsys.readouterr().out
    summary = json.loads((run / "train_summary.json").read_text())
    assert (summary["steps"], summary["processes"], summary["global_batch"]) == (2, 1, 4)
    assert summary["trained_examples"] == 8 and summary["history"]


def test_nar_generate_decodes_a_task_split_with_limit_and_quiet(own, tmp_path, capsys):  # noqa: F811
    """Without --sources: the run's own task (its fields), --split's first --limit inputs."""
    task = own / "my task"
    nar = tmp_path / "nar"
    argv = ["nar", "train", "--model", "tiny-bert", "--task", str(task), *FIELDS]
    assert main([*argv, "--max-steps", "1", "--output", str(nar), "--quiet"]) == 0
    capsys.readouterr()
    argv = ["nar", "generate", str(nar / "best"), "--split", "test", "--limit", "2", "--quiet"]
    assert main([*argv, "--json", "--steps", "2", "--samples", "2"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [r["source"] for r in rows] == [
        "name[Place 0], food[Thai]",
        "name[Place 1], food[Greek]",
    ]
    bars = [b for b in out.err.replace("\r", "\n").splitlines() if "%|" in b]
    assert all(b.startswith("Loading weights") for b in bars)  # --quiet: no bar of its own
    argv = ["nar", "generate", str(nar / "best"), "--split", "valid", "--limit", "1", "--json"]
    assert main([*argv, "--steps", "1", "--samples", "1"]) == 0
    assert [r["source"] for r in json.loads(capsys.readouterr().out)] == [
        "name[Place 0], food[Thai]"
    ]


@pytest.mark.parametrize(
    ("accum", "world", "words"),
    [
        (1, 1, "batch 4 per process x 1 process(es) = 4 examples a step"),
        (3, 1, "batch 4 per process x 3 accumulated x 1 process(es) = 12 examples a step"),
        (2, 3, "batch 4 per process x 2 accumulated x 3 process(es) = 24 examples a step"),
    ],
)
def test_the_training_header_counts_accumulation_and_processes(accum, world, words, monkeypatch):
    from gencraft.cli.options import batch_note

    monkeypatch.setenv("WORLD_SIZE", str(world))
    assert batch_note(4, accum) == words
