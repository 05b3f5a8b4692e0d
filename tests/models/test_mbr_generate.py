"""MBR decoding from ``mbr_generate_text`` and ``gencraft generate --mbr``: the output
is the brute-force MBR choice among the candidates; sampled candidates are each prompt's own
(the same in any batch); beam candidates are generate's N best."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import TopKLogitsWarper

from gencraft.cli.main import main
from gencraft.errors import GencraftError
from gencraft.metrics.mbr import utility_matrices
from gencraft.models import load_model
from gencraft.models.generate import prepared_inputs
from gencraft.models.introspect import eos_ids
from gencraft.models.sampling import sample_batch
from gencraft.search.mbr import mbr_batch_text, mbr_candidates, mbr_generate_text

PROMPTS = ["the cat sat", "a dog", "once upon a time there was"]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


def _brute_force(tok, ids: list[list[int]], n: int, utility: str) -> list[str]:
    texts = [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True)]
    out = []
    for b in range(0, len(texts), n):
        row = texts[b : b + n]
        u = utility_matrices([row], utility)[0]
        means = [sum(float(u[i, j]) for j in range(n) if j != i) / max(n - 1, 1) for i in range(n)]
        out.append(row[means.index(max(means))])
    return out


@pytest.mark.parametrize("utility", ["chrf", "bleu", "rouge"])
@pytest.mark.parametrize("sample", [True, False])
def test_mbr_output_is_the_brute_force_choice(tiny, utility, sample):
    model, tok = tiny
    kw = dict(max_new_tokens=6, do_sample=sample, top_k=20 if sample else None)
    kw = {k: v for k, v in kw.items() if v is not None}
    got = mbr_generate_text(model, tok, PROMPTS, seed=3, n=4, utility=utility, **dict(kw))
    enc = prepared_inputs(model, tok, PROMPTS, None, None, kw)
    if sample:  # the batched sampler, each prompt seeded 3 + its index, top-k 20
        cands = sample_batch(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            n=4,
            max_new_tokens=6,
            seeds=[3, 4, 5],
            eos_token_id=eos_ids(model, None),
            processors=[TopKLogitsWarper(20)],
        )
    else:
        cands = mbr_candidates(model, enc, n=4, **kw)
    assert len(cands) == 12
    assert got == _brute_force(tok, cands, 4, utility)
    if not sample:  # generate's own 4 best beams
        ref = model.generate(**enc, num_beams=4, num_return_sequences=4, **kw)
        assert cands == ref[:, enc["input_ids"].shape[1] :].tolist()


def test_sampled_candidates_are_each_prompt_s_own(tiny):
    model, tok = tiny
    kw = dict(max_new_tokens=5, do_sample=True, temperature=0.8)
    together = mbr_generate_text(model, tok, PROMPTS, seed=10, n=3, epsilon=0.01, **kw)
    alone = [
        mbr_generate_text(model, tok, [p], seed=10 + i, n=3, epsilon=0.01, **kw)[0]
        for i, p in enumerate(PROMPTS)
    ]
    assert together == alone
    enc = prepared_inputs(model, tok, PROMPTS[:1], None, None, dict(kw))
    a = mbr_candidates(model, enc, n=3, seed=1, **kw)
    assert a != mbr_candidates(model, enc, n=3, seed=2, **kw)  # the seed matters


def test_cli_mbr_and_its_errors(capsys):
    args = ["generate", "--model", "tiny-llama", "--prompt", "the cat", "--prompt", "a dog"]
    assert main([*args, "--mbr", "3", "--do-sample", "--max-new-tokens", "4", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [0, 1]
    for bad, msg in (
        (["--mbr", "-1"], "--mbr takes 0 (off) or N >= 2 candidates"),
        (["--epsilon", "0.1"], "--epsilon applies to --mbr's samples"),
        (["--mbr", "2", "--do-sample", "--epsilon", "1.5"], "epsilon must lie in \\(0, 1\\)"),
    ):
        assert main([*args, *bad]) == 2
        assert msg.replace("\\", "") in capsys.readouterr().err


def test_mbr_refuses_zero_candidates(tiny):
    model, tok = tiny
    enc = prepared_inputs(model, tok, PROMPTS[:1], None, None, {"max_new_tokens": 3})

    with pytest.raises(GencraftError, match="mbr \\(candidates per input\\) must be >= 1"):
        mbr_batch_text(model, tok, enc, n=0, max_new_tokens=3)
    assert torch.is_tensor(enc["input_ids"])


def test_the_mbr_study_runs_at_tiny_scale(shared_data, tmp_path):
    from gencraft.studies.runner import reproduce

    report = reproduce(
        "search-mbr", scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)}
    ).read_text()
    units = json.loads((tmp_path / "results.json").read_text())["units"]
    assert sorted(units) == sorted(f"{t} {d}" for t in ("e2e", "xsum") for d in ("beam", "MBR N=2"))
    assert all(len(u["outputs"]) == 1 for u in units.values())  # 1 prompt per task
    assert "| xsum | MBR N=2 |" in report and "| e2e | beam |" in report


def test_the_mbr_table_pairs_each_n_with_beam_search_by_prompt_and_task():
    from gencraft.metrics.text import rouge_per_example
    from gencraft.studies.search_mbr import mbr_differences

    refs = {
        "e2e": [["the cat sat"], ["a dog ran", "dog runs"], ["birds fly high"]],
        "xsum": [["one two three"], ["four five"]],
    }
    outs = {
        ("e2e", "beam"): ["the cat", "a cat ran", "fly"],
        ("e2e", "MBR N=8"): ["the cat sat", "a dog", "birds"],
        ("xsum", "beam"): ["one two three", "four"],
        ("xsum", "MBR N=8"): ["one", "four five"],
    }
    asked = [(t, d, refs[t], len(refs[t]), {"outputs": o}) for (t, d), o in outs.items()]
    rows = mbr_differences(asked)
    assert [(r["task"], r["decoder"], r["prompts"]) for r in rows] == [
        ("e2e", "MBR N=8", 3),
        ("xsum", "MBR N=8", 2),
    ]
    for r in rows:
        beam = rouge_per_example(outs[(r["task"], "beam")], refs[r["task"]])
        mbr = rouge_per_example(outs[(r["task"], "MBR N=8")], refs[r["task"]])
        diffs = [m - b for m, b in zip(mbr, beam, strict=True)]
        assert r["RL diff"] == pytest.approx(sum(diffs) / len(diffs))
        assert r["worse"] == sum(d < 0 for d in diffs)
    assert rows[1]["worse"] == 1  # "one" is worse than "one two three"
