"""Attribute classifiers for conditional beam search: labels, data from samples, training."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.search import beam_search
from gencraft.search.classifier import (
    AttributeClassifier,
    censored_nll,
    degenerate,
    length_bucket,
    length_labels,
)
from gencraft.search.train import (
    ClassifierTrainConfig,
    classifier_for,
    sample_training_data,
    train_classifier,
)
from tests.search.test_search import PROMPT, small_llama


def _fit(**changes):
    """The classifier's own training-loop defaults with ``changes``."""
    return replace(ClassifierTrainConfig().fit, **changes)


def test_length_buckets_match_the_thesis():
    assert [length_bucket(r) for r in range(17)] == list(range(17))
    edges = {
        17: 17,
        20: 17,
        21: 18,
        24: 18,
        25: 19,
        29: 20,
        32: 20,
        33: 21,
        48: 21,
        49: 22,
        64: 22,
        65: 23,
        1000: 23,
    }
    for r, c in edges.items():
        assert length_bucket(r) == c, r
    assert len({length_bucket(r) for r in range(200)}) == 24
    with pytest.raises(GencraftError):
        length_bucket(-1)


def test_length_labels_count_down_to_eos():
    assert length_labels(5, finished=True) == [4, 3, 2, 1, 0]
    assert length_labels(3, finished=False) == [-100, -100, -100]
    # cut after 3 tokens: after token t + 1 at least 3 - t remain (EOS included)
    assert length_labels(3, finished=False, censored=True) == [3, 2, 1]
    assert length_labels(70, finished=False, censored=True)[:3] == [23, 23, 23]
    assert length_labels(70, finished=False, censored=True)[-1] == 1


def test_for_length_targets_are_the_labels_of_an_n_token_output():
    """for_length(n) asks at step t for the class that an output of exactly n tokens + EOS
    carries at position t in training (length_labels of n + 1 finished tokens)."""
    model = small_llama(0)
    clf = classifier_for(model, "length", d_clf=24, num_heads=4)
    for n in (0, 1, 5, 16, 17, 20, 33, 40, 70):
        clf.for_length(n)
        assert [clf.target_class(t) for t in range(n + 1)] == length_labels(n + 1, True)
        clf.for_length(n + 1, includes_eos=True)  # the thesis's convention counts the EOS
        assert [clf.target_class(t) for t in range(n + 1)] == length_labels(n + 1, True)


def test_censored_nll_matches_a_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    labels = torch.tensor([[0, 3, 5, -100], [2, 2, -100, 1]])
    censored = torch.tensor([[False] * 4, [True] * 4])
    total, n = censored_nll(logits, labels, censored)
    p = logits.softmax(-1)
    want = 0.0
    for b in range(2):
        for t in range(4):
            y = int(labels[b, t])
            if y == -100:
                continue
            want -= float(torch.log(p[b, t, y:].sum() if censored[b, t] else p[b, t, y]))
    assert int(n) == 6
    assert torch.allclose(total, torch.tensor(want), atol=1e-5)
    # a lower bound of 0 says nothing: no loss; a plain label is ordinary cross-entropy
    zero, _ = censored_nll(logits[:1, :1], torch.tensor([[0]]), torch.tensor([[True]]))
    assert abs(float(zero)) < 1e-6
    ce = torch.nn.functional.cross_entropy(logits[0, :3], labels[0, :3], reduction="sum")
    plain, _ = censored_nll(logits[:1, :3], labels[:1, :3], censored[:1, :3])
    assert torch.allclose(plain, ce, atol=1e-5)


def test_degenerate_rules():
    prompt = "Describe this restaurant: name[Blue Spice], eatType[pub], area[riverside]"
    assert degenerate("", prompt, True)
    assert degenerate("Blue Spice is a pub", prompt, False)  # unfinished
    assert degenerate("the pub is nice the pub is nice the pub is nice the pub", prompt, True)
    assert degenerate("name[Blue Spice], eatType[pub]", prompt, True)  # copies the prompt
    assert not degenerate("Blue Spice is a pub by the river.", prompt, True)


def test_sampled_data_shapes_and_labels(sampled):
    model, _prompts, rows = sampled
    assert len(rows) == 24
    finished = [r for r in rows if r["tokens"][-1] == 0]
    assert finished, "the small model should end some samples"
    for r in rows:
        t = r["tokens"].shape[0]
        assert r["hidden"].shape == (t, 3, 16) and r["labels"].shape == (t,)
        if r["tokens"][-1] == 0:
            assert r["labels"].tolist() == [length_bucket(t - 1 - i) for i in range(t)]
            assert not r["censored"]
        else:  # cut at 12 tokens: lower bounds, trained with the censored likelihood
            assert t == 12 and r["censored"]
            assert r["labels"].tolist() == [length_bucket(t - i) for i in range(t)]
        assert (r["tokens"][:-1] != 0).all()  # nothing after the first EOS
    # position 0 reads the last prompt position: its layer-0 state is that token's embedding
    first = rows[0]
    emb = model.get_input_embeddings().weight[PROMPT[-1]].half()
    assert torch.allclose(first["hidden"][0, 0], emb, atol=1e-3)


def test_training_reduces_loss_and_round_trips(sampled, tmp_path):
    model, _, rows = sampled
    clf = classifier_for(model, d_clf=24, num_heads=4, d_out=8, mlp_hidden=16, dropout=0.0)
    result = train_classifier(
        clf, rows, ClassifierTrainConfig(lr=3e-3, fit=_fit(epochs=15)), tmp_path, progress=False
    )
    assert result["best_valid_loss"] < result["history"][0]["valid_loss"]
    train_losses = [h["train_loss"] for h in result["history"][1:]]
    assert train_losses[-1] < train_losses[0]
    assert (tmp_path / "last" / "method_model.safetensors").is_file()  # per-epoch checkpoint
    back = AttributeClassifier.from_pretrained(tmp_path / "best", model)
    r = rows[0]
    with torch.no_grad():
        a = clf.eval()(r["hidden"][None].float(), r["tokens"][None])
        b = back(r["hidden"][None].float(), r["tokens"][None])
    assert a.shape == (1, r["tokens"].shape[0], 24)
    assert torch.allclose(a, b)
    # it plugs into conditional beam search; forced lengths hold
    hyps = beam_search(
        model,
        torch.tensor([PROMPT]),
        num_beams=3,
        max_new_tokens=8,
        eos_token_id=0,
        classifier=back.for_length(5),
        k=4,
        force_length=5,
    )
    assert hyps and all(len(h.tokens) == 5 for h in hyps)
    assert all(h.conditional_score is not None for h in hyps)
    scores = [h.score for h in hyps]  # a forced length is certain: ranked by S alone
    assert scores == sorted(scores, reverse=True)
    hyps = beam_search(
        model,
        torch.tensor([PROMPT]),
        num_beams=3,
        max_new_tokens=8,
        eos_token_id=0,
        classifier=back.for_length(5),
        k=4,
        force_length=5,
        finished="on_beam",
    )
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_classifier_for_another_model_is_refused(sampled, tmp_path):
    model, _, _ = sampled
    other = small_llama(0, vocab=6)
    other.config.num_hidden_layers = 3  # pretend: a deeper model
    clf = classifier_for(model, d_clf=24, num_heads=4)
    with pytest.raises(GencraftError, match="another model"):
        clf.bind(other)
    with pytest.raises(GencraftError, match="length"):
        classifier_for(model, attribute="degenerate", d_clf=24, num_heads=4).for_length(3)


def test_cli_train_classifier(tmp_path, capsys):
    import json

    from gencraft.cli.main import main

    root = tmp_path / "data" / "xsum"
    root.mkdir(parents=True)
    rows = [
        {
            "id": f"d{i}",
            "document": f"Document {i} says the river rose by {i} metres.",
            "summary": f"The river rose {i} metres.",
        }
        for i in range(30)
    ]
    (root / "xsum-30.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "clf"
    args = [
        "search",
        "train-classifier",
        "--model",
        "tiny-llama",
        "--attribute",
        "degenerate",
        "--prompts",
        "xsum",
        "--num-prompts",
        "4",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "4",
        "--epochs",
        "1",
        "--output",
        str(out),
        "--data-dir",
        str(tmp_path / "data"),
    ]
    assert main(args) == 0
    assert (out / "best" / "method_config.json").is_file()
    length = [a if a != "degenerate" else "length" for a in args]
    assert main(length) == 2  # tiny-llama never ends within 4 tokens: no length is known
    assert "no sample ended" in capsys.readouterr().err
    # the output holds the degenerate classifier: another run there is refused, not mixed in
    assert main([*length, "--censored"]) == 2
    assert "other settings" in capsys.readouterr().err
    assert main([*length, "--censored", "--restart"]) == 0  # lower bounds only
    history = json.loads((out / "history.json").read_text())
    assert all(h["valid_loss"] == h["valid_loss"] for h in history)  # no NaN


def test_relabel_degenerate_gives_one_label_per_sample(sampled):
    from gencraft.search.train import relabel_degenerate

    class Words:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(f"w{i}" for i in ids)

    _, _, rows = sampled
    texts = ["prompt a", "prompt b"]
    out = relabel_degenerate(rows, Words(), texts, [0])
    for r, o in zip(rows, out, strict=True):
        text = " ".join(f"w{i}" for i in r["tokens"].tolist() if i != 0)
        want = degenerate(text, texts[int(r["prompt_index"])], bool(r["finished"]))
        assert o["labels"].tolist() == [int(want)] * r["tokens"].shape[0]
        assert o["hidden"] is r["hidden"]  # the states are shared, not copied
    assert {int(o["labels"][0]) for o in out} == {0, 1}  # both classes occur here


@pytest.mark.parametrize("kind", ["causal", "encoder-decoder"])
def test_sampled_states_are_the_ones_search_reads(kind):
    """Training states equal the states the search's stepper hands the classifier."""
    from gencraft.models.stepping import HFStepper
    from tests.search.test_search import small_bart

    model = small_llama(1, vocab=6) if kind == "causal" else small_bart(1, vocab=6)
    eos = 0 if kind == "causal" else 2
    src = torch.tensor([[3, 4, 5, 3]])
    rows = sample_training_data(
        model, None, [src], samples_per_prompt=6, max_new_tokens=8, progress=False
    )
    assert len(rows) == 6
    m = model.config.num_hidden_layers + 1 if kind == "causal" else model.config.decoder_layers + 1
    for r in rows:
        toks = r["tokens"].tolist()
        assert eos not in toks[:-1] and r["hidden"].shape == (len(toks), m, 16)
        stepper = HFStepper(model, src, max_new_tokens=8, hidden=True)
        out = stepper.start()
        for t, tok in enumerate(toks):
            assert torch.allclose(r["hidden"][t].float(), out.hidden[0], atol=2e-2), (kind, t)
            if t + 1 < len(toks):
                out = stepper.step(torch.tensor([tok]), out.cache)
    clf = classifier_for(model, d_clf=24, num_heads=4, d_out=8, mlp_hidden=16, dropout=0.0)
    train_classifier(clf, rows, ClassifierTrainConfig(fit=_fit(epochs=2)), progress=False)
    hyps = beam_search(
        model, src, num_beams=2, max_new_tokens=6, classifier=clf.for_length(3), k=3, force_length=3
    )
    assert all(len(h.tokens) == 3 for h in hyps)


def test_cli_beam_uses_a_trained_classifier_and_bad_counts_are_named(tmp_path, capsys):
    import json

    from gencraft.cli.main import main

    root = tmp_path / "data" / "xsum"
    root.mkdir(parents=True)
    rows = [
        {"id": f"d{i}", "document": f"Document {i} about rain.", "summary": f"Rain {i}."}
        for i in range(30)
    ]
    (root / "xsum-30.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "clf"
    common = ["search", "train-classifier", "--model", "tiny-llama", "--prompts", "xsum"]
    common += ["--num-prompts", "4", "--max-new-tokens", "4", "--epochs", "1"]
    common += ["--data-dir", str(tmp_path / "data"), "--attribute", "degenerate"]
    assert main([*common, "--samples-per-prompt", "0", "--output", str(out)]) == 2
    assert "samples_per_prompt must be >= 1, got 0" in capsys.readouterr().err
    assert main([*common, "--samples-per-prompt", "2", "--output", str(out)]) == 0
    assert main([*common, "--epochs", "0", "--samples-per-prompt", "2"]) == 2
    assert "epochs must be >= 1" in capsys.readouterr().err
    capsys.readouterr()
    beam = ["search", "beam", "Describe: name[X]", "--model", "tiny-llama", "--beams", "2"]
    beam += ["--max-new-tokens", "4", "--classifier", str(out), "--k", "3"]
    assert main(beam) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and all("log_prob" in x for x in lines)
    assert main([*beam, "--attribute", "7"]) == 2
    assert "not-degenerate|degenerate" in capsys.readouterr().err


def test_length_study_compares_log_p_under_the_model_not_the_search_objective():
    """The length study's wins are counted on log P(y | x) of the model itself (tokens + EOS, no
    renormalisation), computed here by one forward pass; the search's objective differs."""
    from gencraft.models import load_model
    from gencraft.studies.search_conditional import ConditionalSettings, _length_batch, length_wins

    model, tok = load_model("tiny-llama")
    clf = classifier_for(model, "length", d_clf=24, num_heads=4).eval()
    args = ConditionalSettings(
        ratios=(0.8, 1.2), beams=(2,), k=5, forced_eos="free", length_includes_eos=False
    )
    per_prompt = _length_batch(args, model, tok, clf, [("the cat", "a dog"), ("sun", "moon")])
    assert [len(rows) for rows in per_prompt] == [2, 2]  # each prompt's ratios
    eos = tok.eos_token_id
    rows = [row for prompt in per_prompt for row in prompt]
    from gencraft.search.prompts import encode_prompt

    for r, text in zip(rows, ["the cat"] * 2 + ["sun"] * 2, strict=True):
        ids = encode_prompt(tok, text)
        for side in ("beam", "cond"):
            out = tok(r[f"{side}_text"], add_special_tokens=False)["input_ids"]
            assert len(out) == r["length"]
            full = torch.tensor([ids[0].tolist() + out + [eos]])
            with torch.no_grad():
                lp = model(full).logits[0, ids.shape[1] - 1 : -1].double().log_softmax(-1)
            want = lp.gather(1, full[0, ids.shape[1] :, None]).sum().item()
            assert r[f"{side}_log_prob"] == pytest.approx(want, abs=1e-3)
    assert any(abs(r["beam_log_prob"] - r["beam_search_score"]) > 1e-3 for r in rows)
    w = length_wins(rows, 2, 0.8)
    assert w["n"] == 2 and w["conditional_higher"] + w["beam_higher"] + w["tie"] == 1


def _same_rows(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_sampling_in_chunks_draws_what_one_pass_draws():
    """Each prompt is seeded by its index in the whole set, so chunks (``first``) give the
    rows of one pass: the same samples, prompt indices and labels."""
    model = small_llama(0, vocab=6)
    prompts = [torch.tensor([PROMPT]), torch.tensor([[1, 2, 5, 3]]), torch.tensor([[4, 4]])]
    kw = dict(samples_per_prompt=5, max_new_tokens=6, censored=True, progress=False)
    whole = sample_training_data(model, None, prompts, **kw)
    parts = sample_training_data(model, None, prompts[:1], **kw) + sample_training_data(
        model, None, prompts[1:], first=1, **kw
    )
    assert _same_rows(whole, parts)
    assert sorted({int(r["prompt_index"]) for r in parts}) == [0, 1, 2]
    # each prompt its own seed: the same prompt twice draws different samples
    twice = sample_training_data(model, None, [prompts[1], prompts[1]], **kw)
    firsts = [r["tokens"].tolist() for r in twice if int(r["prompt_index"]) == 0]
    assert firsts != [r["tokens"].tolist() for r in twice if int(r["prompt_index"]) == 1]
    # a prompt's samples do not depend on what was sampled before it
    alone = sample_training_data(model, None, prompts[2:], first=2, **kw)
    assert _same_rows(alone, [r for r in whole if int(r["prompt_index"]) == 2])


def _drawn(rows: list[dict]) -> list[tuple]:
    return [
        (int(r["prompt_index"]), r["tokens"].tolist(), r["labels"].tolist(), bool(r["censored"]))
        for r in rows
    ]


@settings(max_examples=6, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    n=st.integers(1, 4),
    batch=st.integers(1, 5),
    seed=st.integers(0, 50),
    kind=st.sampled_from(["causal", "encoder-decoder"]),
)
def test_batched_sampling_draws_each_prompt_s_samples_alone(lengths, n, batch, seed, kind):
    """Prompts of different lengths sampled ``batch`` at a time (left-padded, or padded encoder
    inputs) give each prompt the samples it draws alone, with the same states and labels."""
    from tests.search.test_search import small_bart

    model = small_llama(2, vocab=6) if kind == "causal" else small_bart(2, vocab=6)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 6, (1, m), generator=g) for m in lengths]
    kw = dict(samples_per_prompt=n, max_new_tokens=7, censored=True, progress=False, seed=seed)
    batched = sample_training_data(model, None, prompts, batch_size=batch, **kw)
    alone = [
        r
        for i, p in enumerate(prompts)
        for r in sample_training_data(model, None, [p], first=i, batch_size=1, **kw)
    ]
    assert _drawn(batched) == _drawn(alone)
    for a, b in zip(batched, alone, strict=True):
        assert torch.equal(a["hidden"], b["hidden"])
    assert len(batched) == len(prompts) * n  # no sample is empty: each draws >= 1 token


def test_samples_follow_the_model_s_next_token_distribution():
    """The first sampled token's frequencies over many samples match softmax of the logits,
    and each sample ends at its first EOS (id 0) or at max_new_tokens."""
    model = small_llama(3, vocab=6)
    prompt = torch.tensor([[1, 4, 2]])
    rows = sample_training_data(
        model, None, [prompt], samples_per_prompt=3000, max_new_tokens=3, progress=False
    )
    with torch.no_grad():
        p = model(prompt).logits[0, -1].float().softmax(-1)
    freq = torch.bincount(torch.tensor([int(r["tokens"][0]) for r in rows]), minlength=6) / 3000
    assert (freq - p).abs().max() < 0.03, (freq, p)
    for r in rows:
        toks = r["tokens"].tolist()
        assert 0 not in toks[:-1] and (toks[-1] == 0 or len(toks) == 3)
        assert bool(r["finished"]) == (toks[-1] == 0)


def test_a_trained_classifier_is_kept_in_its_dtype_and_not_trained_again(tmp_path):
    """The conditional study trains each classifier once and keeps it (float16 by default):
    the first call already uses the kept (rounded) weights, a rerun loads them without
    training, and the file holds float16 tensors (half the float32 size)."""
    from safetensors import safe_open

    from gencraft.models import load_model
    from gencraft.studies.search_conditional import kept_classifier

    model, _ = load_model("tiny-llama")
    calls = []

    def train(clf):
        calls.append(1)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in clf.parameters():
                p.add_(torch.randn_like(p) * 1e-2)
        trained.append({k: v.clone() for k, v in clf.state_dict().items()})
        return {"best_valid_loss": 0.5}

    trained: list = []
    kept = tmp_path / "clf-length" / "kept"
    first, record = kept_classifier(model, "length", train, kept, "float16")
    again, record2 = kept_classifier(model, "length", train, kept, "float16")
    assert calls == [1] and record == record2 == {"best_valid_loss": 0.5}
    for k, v in trained[0].items():
        want = v.to(torch.float16).float()
        assert torch.equal(first.state_dict()[k], want), k
        assert torch.equal(again.state_dict()[k], want), k
    assert first.in_proj.weight.dtype == torch.float32 and not first.training
    assert first._embedding and first._embedding[0] is model.get_input_embeddings()
    (weights,) = kept.glob("*.safetensors")
    with safe_open(str(weights), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}  # noqa: SIM118


@pytest.mark.gpu
def test_a_kept_classifier_runs_where_the_model_runs(tmp_path):
    """Loaded from its files on the CPU, the kept classifier moves to the model's device."""
    from gencraft.models import load_model
    from gencraft.studies.search_conditional import kept_classifier

    model, _ = load_model("tiny-llama")
    model = model.to("cuda")
    clf, _ = kept_classifier(model, "length", lambda c: {}, tmp_path / "kept", "float16")
    assert clf.in_proj.weight.device.type == "cuda"


def test_a_bad_kept_dtype_stops_before_the_model_loads(tmp_path, monkeypatch):

    import gencraft.studies.search_conditional as ex
    from gencraft.studies.runner import reproduce

    monkeypatch.setattr(ex, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(GencraftError, match="kept_dtype must be float32, float16 or bfloat16"):
        ex.ConditionalSettings(kept_dtype="float8")  # refused when the settings are built
    with pytest.raises(GencraftError, match="kept_dtype must be float32, float16 or bfloat16"):
        reproduce(
            "search-conditional", scale="tiny", output=tmp_path, overrides={"kept_dtype": "x"}
        )
