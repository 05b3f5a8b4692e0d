"""``gencraft pointer train --model NAME``: the pointer sentinel head on a pretrained causal
LM, trained on a corpus in blocks of ``--bptt`` tokens with the base frozen, then scored
against its base; ``pointer eval`` of such a run. :func:`evaluate_head` against a loop that
scores each block alone with the model's own logits and the head's own forward."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gencraft.cli.main import main
from gencraft.errors import GencraftError
from gencraft.pointer.evaluate import evaluate_head, token_blocks

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "the",
    "mat",
    "and",
    "the",
    "dog",
    "ran",
    "to",
    "the",
    "park",
    "while",
    "a",
    "bird",
    "sang",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for split, n in (("train", 60), ("valid", 12), ("test", 12)):
        lines = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(12)) for i in range(n)]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def test_token_blocks_cut_the_text_and_refuse_too_little():
    from gencraft.models import load_model

    _, tok = load_model("tiny-llama")
    text = " ".join(WORDS * 4)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    blocks = token_blocks(tok, text, 7)
    assert blocks.shape == (len(ids) // 7, 7)
    assert blocks.flatten().tolist() == ids[: blocks.numel()]
    assert token_blocks(tok, text, 7, limit=20).shape == (2, 7)
    with pytest.raises(GencraftError, match="fewer than one block of 9999"):
        token_blocks(tok, text, 9999)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_evaluate_head_scores_each_block_alone_against_its_base(batch_size):
    from gencraft.models import load_model
    from gencraft.pointer import PointerSentinelHead

    base, _ = load_model("tiny-llama", seed=0)
    head = PointerSentinelHead(base, window=4)
    blocks = torch.randint(3, 200, (5, 9), generator=torch.Generator().manual_seed(0))
    r = evaluate_head(head, blocks, batch_size=batch_size)
    base_nll = head_nll = 0.0
    with torch.no_grad():
        for row in blocks:  # one block at a time, each alone
            logp = torch.log_softmax(base(row[None]).logits[0, :-1].float(), -1)
            base_nll -= float(logp.gather(1, row[1:, None]).sum())
            head_nll += float(head(row[None]).nll.sum())
    assert r["tokens"] == 5 * 8
    assert r["base_ppl"] == pytest.approx(math.exp(base_nll / 40), rel=1e-5)
    assert r["head_ppl"] == pytest.approx(math.exp(head_nll / 40), rel=1e-5)
    assert 0 < r["mean_gate"] < 1 and head.enabled


def test_pointer_train_model_trains_the_head_and_eval_scores_it(corpus, tmp_path, capsys):
    out = tmp_path / "head"
    argv = ["pointer", "train", "--model", "tiny-llama", "--corpus", str(corpus), "--bptt", "16"]
    argv += ["--batch-size", "4", "--max-steps", "3", "--window", "8", "--quiet"]
    assert main([*argv, "--output", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["steps"] == 3 and result["stopped"] == "max_steps"
    assert set(result["valid"]) == {"head_ppl", "base_ppl", "tokens", "mean_gate"}
    config = json.loads((out / "best" / "method_config.json").read_text())
    assert config["method"] == "pointer"
    capsys.readouterr()
    assert main(["pointer", "eval", str(out), "--split", "test", "--bptt", "16", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["head_ppl"] == pytest.approx(result["test"]["head_ppl"], rel=1e-5)
    assert row["base_ppl"] == pytest.approx(result["test"]["base_ppl"], rel=1e-5)
    assert main([*argv, "--output", str(out)]) == 0  # the same run: finished, not redone
    assert "finished" in capsys.readouterr().out.lower()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preset", "medium"], "--preset set the LSTM"),
        (["--no-pointer", "--k1", "5"], "--k1, --pointer set the LSTM"),
    ],
)
def test_lstm_flags_are_refused_with_model(extra, message, corpus, capsys):
    argv = ["pointer", "train", "--model", "tiny-llama", "--corpus", str(corpus), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert main(["pointer", "train", "--corpus", str(corpus), "--eval-tokens", "5"]) == 2
    assert "--eval-tokens applies with --model" in capsys.readouterr().err
