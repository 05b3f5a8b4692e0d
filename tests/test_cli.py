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
        ("pred.jsonl", "ref.txt", "rouge", "pred.jsonl:2: malformed JSON line"),
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
