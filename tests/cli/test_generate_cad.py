"""``gencraft generate --cad-alpha``: each prompt with its ``--context`` against the
prompt alone (a causal LM), or against an empty source (an encoder-decoder), equal to
``model.generate(custom_generate=context_aware, ...)`` on inputs built by hand; contexts one
per prompt or one for all; bad combinations refused in one line."""

from __future__ import annotations

import json

import pytest

from gencraft.cli.main import main
from gencraft.models import load_model
from gencraft.models.generate import build_inputs
from gencraft.search.custom_generate import context_aware

PROMPTS = ["where did it sit?", "what sat there on the mat today?", "who?"]
CONTEXTS = ["the cat sat on the mat", "a dog", "nobody came to the long meeting at noon"]


def _cli(args: list[str], capsys) -> list[list[int]]:
    assert main(["generate", *args, "--max-new-tokens", "6", "--json", "--batch-size", "2"]) == 0
    return [json.loads(line)["output"] for line in capsys.readouterr().out.splitlines()]


def _by_hand(name: str, inputs: list[str], negatives: list[str], beams: int) -> list[str]:
    model, tok = load_model(name)
    ed = model.config.is_encoder_decoder
    texts = []
    for i in range(0, len(inputs), 2):  # the CLI's batches of 2
        enc = build_inputs(tok, inputs[i : i + 2], left=not ed, pad_token_id=0)
        neg = build_inputs(tok, negatives[i : i + 2], left=not ed, pad_token_id=0, allow_empty=True)
        out = model.generate(
            **enc,
            custom_generate=context_aware,
            cad_alpha=0.7,
            num_beams=beams,
            negative_input_ids=neg["input_ids"],
            negative_attention_mask=neg["attention_mask"],
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
        )
        out = out if ed else out[:, enc["input_ids"].shape[1] :]
        texts += [t.strip() for t in tok.batch_decode(out, skip_special_tokens=True)]
    return texts


@pytest.mark.parametrize("beams", [1, 3])
def test_a_causal_lm_contrasts_each_prompt_with_its_context_against_the_prompt_alone(beams, capsys):
    args = ["--model", "tiny-llama", "--cad-alpha", "0.7", "--num-beams", str(beams)]
    for p, c in zip(PROMPTS, CONTEXTS, strict=True):
        args += ["--prompt", p, "--context", c]
    inputs = [f"{c}\n\n{p}" for p, c in zip(PROMPTS, CONTEXTS, strict=True)]
    assert _cli(args, capsys) == _by_hand("tiny-llama", inputs, PROMPTS, beams)
    assert main(["generate", *args, "--max-new-tokens", "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["prompt"], r["context"]) for r in rows] == list(zip(PROMPTS, CONTEXTS, strict=True))


def test_an_encoder_decoder_contrasts_with_an_empty_source_and_one_context_serves_all(capsys):
    got = _cli(
        [
            "--model",
            "tiny-t5",
            "--cad-alpha",
            "0.7",
            "--prompt",
            PROMPTS[0],
            "--prompt",
            PROMPTS[1],
        ],
        capsys,
    )
    assert got == _by_hand("tiny-t5", PROMPTS[:2], ["", ""], 1)
    args = ["--model", "tiny-t5", "--cad-alpha", "0.7", "--context", "ctx: {x}"]
    args += ["--context-template", "<{context}> {prompt}", "--prompt", "a", "--prompt", "b"]
    assert _cli(args, capsys) == _by_hand(
        "tiny-t5", ["<ctx: {x}> a", "<ctx: {x}> b"], ["a", "b"], 1
    )


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-bart"])
def test_empty_sources_encode_as_the_tokenizers_special_tokens_or_eos(name):
    _, tok = load_model(name)
    enc = build_inputs(tok, ["", "ab"], left=False, pad_token_id=0, allow_empty=True)
    want = list(tok("")["input_ids"]) or [tok.eos_token_id]
    assert enc["input_ids"][0, : len(want)].tolist() == want
    assert enc["attention_mask"].sum(1).tolist() == [len(want), len(tok("ab")["input_ids"])]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cad-alpha", "0.5"], "--cad-alpha needs --context for a decoder-only model"),
        (["--context", "a", "--context", "b", "--context", "c"], "one --context per prompt (2)"),
        (
            ["--cad-alpha", "0.5", "--do-sample", "--context", "a"],
            "it does not combine with --do-sample",
        ),
        (
            ["--cad-alpha", "0.5", "--mbr", "4", "--context", "a"],
            "it does not combine with --mbr",
        ),
        (["--cad-alpha", "-1", "--context", "a"], "A >= 0, got -1.0"),
        (["--cad-alpha", "inf", "--context", "a"], "finite weight A >= 0, got inf"),
        (["--cad-alpha", "nan", "--context", "a"], "finite weight A >= 0, got nan"),
        (["--mbr", "1"], "--mbr takes 0 (off) or N >= 2 candidates"),
        (["--context", "a", "--context-template", "{prompt}"], "must hold {context} and {prompt}"),
        (
            ["--context", "a", "--context-template", "{foo} {context} {prompt}"],
            "--context-template names {foo}; it takes only {context} and {prompt}",
        ),
    ],
)
def test_bad_combinations_are_refused_in_one_line(extra, message, capsys):
    assert (
        main(["generate", "--model", "tiny-llama", "--prompt", "x", "--prompt", "y", *extra]) == 2
    )
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
