"""What a new user met, each ending in one line before work starts (or working as the docs
say): CAD's weight ``inf``, ``--mbr 1``, a conflicting flag named, an unknown ``{field}`` in
``--context-template`` and a typed ``\\n``, a misspelt split of a single-file task, ``nar
generate --sources`` with ``--task``, ``pointer eval --bptt 0``, a hub id offline, a run folder
given as ``--model``, ``eval --field``, training into another method's run folder, a
classifier's validation with no labelled position."""

from __future__ import annotations

import json

import pytest
import torch
from test_rerun_outputs import _one_line_error

from gencraft.cli.main import main
from gencraft.errors import GencraftError


@pytest.mark.parametrize(
    "argv",
    [
        ["prefix", "eval", "no-run", "--cad-alpha", "inf"],
        ["prefix", "generate", "no-run", "--cad-alpha", "inf"],
        ["focus", "eval", "no-run", "--cad-alpha", "inf"],
        ["focus", "generate", "no-run", "--cad-alpha", "nan"],
        [
            "generate",
            "--model",
            "tiny-llama",
            "--prompt",
            "x",
            "--context",
            "c",
            "--cad-alpha",
            "inf",
        ],
    ],
)
def test_cad_alpha_inf_is_refused_in_one_line_everywhere(argv, capsys):
    _one_line_error(capsys, argv, "--cad-alpha takes a finite weight A >= 0")


def test_the_library_refuses_an_infinite_cad_weight():
    from gencraft.models.cad import CADSettings

    with pytest.raises(GencraftError, match="finite"):
        CADSettings(float("inf"))
    CADSettings(float("inf"), adaptive=True)  # the weight is each row's own: not read


def test_a_typed_newline_in_the_template_is_a_newline(monkeypatch, capsys):
    import gencraft.models.generate as generate_module

    seen: list[list[str]] = []

    def recording(model, tok, texts, **kw):
        seen.append(list(texts))
        return ["out"] * len(texts)

    monkeypatch.setattr(generate_module, "generate_text", recording)
    args = ["generate", "--model", "tiny-llama", "--prompt", "p", "--context", "c"]
    for template in (None, "{context}\\n\\n{prompt}", "{prompt}\\t{context}"):
        assert main(args + (["--context-template", template] if template else [])) == 0
    assert seen == [["c\n\np"], ["c\n\np"], ["p\tc"]]


def test_the_template_default_is_shown_as_written():
    from gencraft.cli.main import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    assert "'{context}\\n\\n{prompt}'" in " ".join(help_text.split())


def test_a_misspelt_split_of_a_single_file_task_is_refused(tmp_path):
    from gencraft.data.own import corpus_files, load_task_path

    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps({"source": "s", "target": "t"}) + "\n")
    assert len(load_task_path(task, "dev")) == 1
    with pytest.raises(GencraftError, match="unknown split 'nosuch'"):
        load_task_path(task, "nosuch")
    text = tmp_path / "c.txt"
    text.write_text("a b c\n")
    with pytest.raises(GencraftError, match="unknown split 'nosuch'"):
        corpus_files(text, ("train", "nosuch"))


def test_nar_generate_refuses_sources_with_a_task(capsys):
    argv = ["nar", "generate", "tiny-bert", "--sources", "a b", "--task", "e2e"]
    _one_line_error(capsys, argv, "--sources gives the inputs; --task picks")
    _one_line_error(capsys, [*argv[:5], "--limit", "2"], "--limit picks")


def test_pointer_eval_names_bptt(capsys):
    _one_line_error(capsys, ["pointer", "eval", "no-run", "--bptt", "0"], "bptt must be >= 1")


def test_a_hub_id_offline_names_offline_mode(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _one_line_error(capsys, ["generate", "--model", "gpt2", "--prompt", "x"], "'gpt2'")
    assert "HF_HUB_OFFLINE=1 is set and the Hugging Face cache holds no copy" in line
    line = _one_line_error(capsys, ["generate", "--model", "tiny_llama", "--prompt", "x"])
    assert "not a Hugging Face Hub id" in line and "Did you mean 'tiny-llama'" in line


def test_a_run_folder_given_as_model_names_the_command(tmp_path, capsys):
    from gencraft.models import load_model
    from gencraft.prefix import PrefixConfig, PrefixModel
    from gencraft.training import save_run

    base, tok = load_model("tiny-llama")
    run = tmp_path / "prefix-tiny"
    settings = {"train": {"model": "tiny-llama", "task": "e2e", "max_source_tokens": 32}}
    model = PrefixModel(base, PrefixConfig(num_virtual_tokens=2))
    save_run(run / "best", model, tok, settings, base_name_or_path="tiny-llama")
    for given in (run, run / "best"):
        _one_line_error(
            capsys,
            ["generate", "--model", str(given), "--prompt", "x"],
            "is a gencraft prefix run",
            f"`gencraft prefix generate {given}`",
        )


def test_eval_field_names_which_file_it_picks(tmp_path, capsys):
    preds, refs = tmp_path / "p.jsonl", tmp_path / "r.jsonl"
    preds.write_text(json.dumps({"prediction": "a b"}) + "\n")
    refs.write_text(json.dumps({"gold": "a b"}) + "\n")
    line = _one_line_error(
        capsys,
        ["eval", "--predictions", str(preds), "--references", str(refs)],
        "references fields",
    )
    assert "--field" not in line and "rename it" in line
    refs.write_text(json.dumps({"references": ["a b"]}) + "\n")
    preds.write_text(json.dumps({"hyp": "a b"}) + "\n")
    _one_line_error(
        capsys,
        ["eval", "--predictions", str(preds), "--references", str(refs)],
        "choose it with --field",
    )
    assert (
        main(
            [
                "eval",
                "--predictions",
                str(preds),
                "--references",
                str(refs),
                "--field",
                "hyp",
                "--json",
            ]
        )
        == 0
    )


def test_training_into_another_methods_run_names_it(tmp_path):
    from gencraft.training.checkpoint import RunCheckpoint

    focus = {"train_config": {f"s{i}": i for i in range(45)}, "base": "b", "lr": 1}
    RunCheckpoint(tmp_path, focus, own_keys=("train_config", "base")).save({"step": 1})
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "method_config.json").write_text(json.dumps({"method": "focus"}))
    prefix = {"train": {"a": 1}, "prefix": {}, "lr": 1}
    with pytest.raises(GencraftError) as err:
        RunCheckpoint(tmp_path, prefix, own_keys=("train", "prefix")).load()
    assert "holds a focus run, not one of this command" in str(err.value)
    assert len(str(err.value)) < 200
    changed = {**focus, "train_config": {f"s{i}": i + 1 for i in range(45)}}
    with pytest.raises(GencraftError) as err:  # the same kind: its settings, five of them
        RunCheckpoint(tmp_path, changed, own_keys=("train_config", "base")).load()
    assert "and 40 more" in str(err.value) and str(err.value).count("->") == 5


def test_a_classifier_validation_with_no_labelled_position_is_refused():
    from gencraft.search.config import ClassifierTrainConfig
    from gencraft.search.train import _split_rows

    def row(labelled: bool) -> dict:
        labels = torch.tensor([1, 1]) if labelled else torch.tensor([-100, -100])
        return {"tokens": torch.tensor([3, 4]), "labels": labels}

    config = ClassifierTrainConfig(valid_fraction=0.5)
    rows = [row(True), row(True), row(False), row(False)]
    for seed in range(20):  # every split whose half for validation is unlabelled is refused
        config.fit.seed = seed
        try:
            train, valid = _split_rows(rows, config)
        except GencraftError as err:
            assert "has a labelled position" in str(err)
            continue
        assert any((r["labels"] != -100).any() for r in valid)
        assert any((r["labels"] != -100).any() for r in train)


def test_the_gguf_conversion_bar_is_drawn_by_gencraft():
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from gencraft.models.pretrained import gguf_bar
    from gencraft.progress import tqdm

    with gguf_bar():
        assert gguf_utils.tqdm is tqdm  # whole lines in a redirected log
    assert gguf_utils.tqdm is not tqdm


@pytest.mark.parametrize("source", ["prompt_file", "task"])
def test_a_classifier_trains_on_the_users_own_prompts(source, tmp_path, monkeypatch, capsys):
    """``search train-classifier --prompt-file F`` or ``--task PATH``: the samples come from
    those prompts (the first --num-prompts), each sampled --samples-per-prompt times."""
    import gencraft.search.train as train

    texts = [f"Tell me about item {i} please." for i in range(5)]
    if source == "prompt_file":
        given = tmp_path / "prompts.txt"
        given.write_text("\n".join([texts[0], "", *texts[1:]]) + "\n")  # a blank line skipped
    else:
        given = tmp_path / "own.jsonl"
        given.write_text("".join(json.dumps({"source": t, "target": "x"}) + "\n" for t in texts))
    seen = []
    real = train.sample_training_data

    def recording(model, tok, prompts, **kw):
        seen.append(list(kw["prompt_texts"]))
        return real(model, tok, prompts, **kw)

    monkeypatch.setattr(train, "sample_training_data", recording)
    argv = ["search", "train-classifier", "--model", "tiny-llama", "--attribute", "degenerate"]
    argv += [f"--{source.replace('_', '-')}", str(given), "--num-prompts", "4"]
    argv += ["--samples-per-prompt", "2", "--max-new-tokens", "3", "--epochs", "1"]
    assert main([*argv, "--output", str(tmp_path / "clf")]) == 0
    assert seen == [texts[:4]]
    result = json.loads((tmp_path / "clf" / "result.json").read_text())
    assert result["train_sequences"] + result["valid_sequences"] == 8
    _one_line_error(capsys, [*argv, "--prompts", "e2e"], "each give the prompts: give one")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    argv = ["search", "train-classifier", "--model", "tiny-llama", "--prompt-file", str(empty)]
    _one_line_error(capsys, argv, f"--prompt-file {empty} holds no prompt (it is empty or blank)")
