"""The attribute classifier's training pipeline (``gencraft.search.train``) against references
computed row by row: the split, the padded batches, the loss and the validation loss, one
training step as Adam's, the result record; the sampler's defaults, seeds, labels, bars and
refusals."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, replace

import pytest
import torch
from recording_bar import RecordingBar

import gencraft.search.train as st
from gencraft.errors import GencraftError
from gencraft.models.introspect import fingerprint, model_name
from gencraft.search.classifier import NUM_LENGTH_BUCKETS, censored_nll
from gencraft.search.config import ClassifierTrainConfig
from tests.search.test_search import small_llama

SIZES = dict(d_clf=24, num_heads=4, d_out=8, mlp_hidden=16, dropout=0.0)


def _config(**fit) -> ClassifierTrainConfig:
    return ClassifierTrainConfig(fit=replace(ClassifierTrainConfig().fit, **fit))


def _alone(clf, rows) -> tuple[float, int]:
    """The summed censored NLL and the labelled positions of ``rows``, each row run alone."""
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            logits = clf(r["hidden"][None].float(), r["tokens"][None])
            cut = torch.full_like(r["labels"], bool(r["censored"]), dtype=torch.bool)
            t, n = censored_nll(logits, r["labels"][None], cut[None])
            total, count = total + float(t), count + int(n)
    return total, count


# ---------------------------------------------------------------------------- split and batches
@pytest.mark.parametrize("n", [2, 5, 24, 37])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.9])
def test_the_split_is_a_seeded_partition(n, fraction):
    rows = [{"labels": torch.tensor([i]), "i": i} for i in range(n)]
    cfg = replace(_config(), valid_fraction=fraction)
    train, valid = st._split_rows(rows, cfg)
    assert len(valid) == max(1, int(n * fraction)) and len(train) == n - len(valid)
    assert sorted(r["i"] for r in train + valid) == list(range(n))
    again = st._split_rows(rows, cfg)
    assert [r["i"] for r in again[1]] == [r["i"] for r in valid]
    if n >= 24:  # another seed, another split
        other = st._split_rows(rows, replace(cfg, fit=replace(cfg.fit, seed=1)))
        assert [r["i"] for r in other[1]] != [r["i"] for r in valid]


def test_the_split_refuses_too_few_or_unlabelled_rows():
    with pytest.raises(GencraftError) as err:
        st._split_rows([{"labels": torch.tensor([0])}], _config())
    assert str(err.value) == "need at least 2 training sequences, got 1"
    with pytest.raises(GencraftError) as err:
        st._split_rows([{"labels": torch.tensor([-100, -100])}] * 3, _config())
    assert str(err.value) == (
        "no labelled position: no sample ended within max_new_tokens, so no final length "
        "is known; sample with a larger max_new_tokens"
    )
    mixed = [{"labels": torch.tensor([-100])}, {"labels": torch.tensor([-100, 2])}]
    with pytest.raises(GencraftError) as err:  # a loss over 0 positions is no validation
        st._split_rows(mixed, _config())
    assert str(err.value).startswith("none of the 1 validation samples has a labelled position")
    both = [{"labels": torch.tensor([-100, 2])}, *mixed]
    train, valid = st._split_rows(both, _config())
    assert len(valid) == 1 and all(
        any((r["labels"] != -100).any() for r in p) for p in (train, valid)
    )


def test_a_padded_batch_holds_each_row():
    g = torch.Generator().manual_seed(0)
    rows = []
    for n, cut in ((3, True), (5, None), (1, False)):
        row = {
            "hidden": torch.randn(n, 3, 4, generator=g).half(),
            "tokens": torch.randint(1, 6, (n,), generator=g),
            "labels": torch.randint(0, 24, (n,), generator=g),
        }
        if cut is not None:  # a row without the flag is not censored
            row["censored"] = torch.tensor(cut)
        rows.append(row)
    hidden, tokens, labels, pad, censored = st.collate_rows(rows)
    assert hidden.dtype == torch.float16 and hidden.shape == (3, 5, 3, 4)
    assert (tokens.dtype, labels.dtype, pad.dtype, censored.dtype) == (
        torch.long,
        torch.long,
        torch.bool,
        torch.bool,
    )
    for j, (r, cut) in enumerate(zip(rows, (True, False, False), strict=True)):
        n = r["tokens"].shape[0]
        assert torch.equal(hidden[j, :n], r["hidden"]) and not hidden[j, n:].any()
        assert torch.equal(tokens[j, :n], r["tokens"]) and not tokens[j, n:].any()
        assert torch.equal(labels[j, :n], r["labels"]) and (labels[j, n:] == -100).all()
        assert pad[j].tolist() == [False] * n + [True] * (5 - n)
        assert censored[j].tolist() == [cut] * n + [False] * (5 - n)


# ---------------------------------------------------------------------------- losses and training
def test_the_loss_is_the_mean_over_labelled_positions(sampled):
    model, _, rows = sampled
    torch.manual_seed(0)
    clf = st.classifier_for(model, **SIZES).eval()
    total, count = _alone(clf, rows[:7])
    with torch.no_grad():
        got = st._loss(clf, st.collate_rows(rows[:7]))
        valid = st._valid_loss(clf, [st.collate_rows(rows[:3]), st.collate_rows(rows[3:7])])
    assert count > 0 and abs(float(got) - total / count) < 1e-5
    assert abs(valid["loss"] - total / count) < 1e-5  # pooled, not a mean of batch means


def test_the_result_record(sampled, tmp_path):
    """Sizes, the history (epoch 0: the untrained classifier on every validation row, in
    batches of 8), the best loss (the weights kept), the config, and result.json."""
    model, _, rows = sampled
    cfg = replace(_config(epochs=2, batch_size=3), valid_fraction=0.75, lr=3e-3)
    _, valid = st._split_rows(rows, cfg)
    torch.manual_seed(0)
    clf = st.classifier_for(model, **SIZES)
    total, count = _alone(clf.eval(), valid)
    result = st.train_classifier(clf, rows, cfg, tmp_path, progress=False)
    assert (result["train_sequences"], result["valid_sequences"]) == (6, 18)
    assert result["config"] == asdict(cfg)
    first, *later = result["history"]
    assert first == pytest.approx({"epoch": 0, "valid_loss": total / count}, rel=1e-5)
    assert [h["epoch"] for h in later] == [1, 2]
    assert all(set(h) == {"epoch", "train_loss", "valid_loss"} for h in later)
    assert all(h["train_loss"] > 0 for h in later)
    assert result["best_valid_loss"] == min(h["valid_loss"] for h in later)
    kept, n = _alone(clf, valid)
    assert abs(kept / n - result["best_valid_loss"]) < 1e-5 and not clf.training
    assert json.loads((tmp_path / "result.json").read_text()) == json.loads(json.dumps(result))


def test_without_an_output_directory_nothing_is_written(sampled, tmp_path, monkeypatch):
    model, _, rows = sampled
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    clf = st.classifier_for(model, **SIZES)
    result = st.train_classifier(clf, rows, _config(epochs=1), progress=False)
    assert result["valid_sequences"] == 2 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("lr", "weight_decay"), [(0.05, 0.0), (0.05, 0.5), (0.002, 0.5)])
def test_one_step_is_adams_with_the_configs_lr_and_weight_decay(sampled, lr, weight_decay):
    """One epoch of one batch: the weights are one Adam step on the batch's mean loss."""
    model, _, rows = sampled
    cfg = ClassifierTrainConfig(
        lr=lr,
        weight_decay=weight_decay,
        valid_fraction=0.5,
        fit=replace(ClassifierTrainConfig().fit, epochs=1, batch_size=16),
    )
    train, _ = st._split_rows(rows, cfg)
    torch.manual_seed(0)
    clf = st.classifier_for(model, **SIZES)
    ref = copy.deepcopy(clf).train()
    opt = torch.optim.Adam(ref.parameters(), lr=lr, weight_decay=weight_decay)
    total, count = censored_nll(ref(*st.collate_rows(train)[:2]), *_labels(train))
    (total / count).backward()
    opt.step()
    st.train_classifier(clf, rows, cfg, progress=False)
    # a tolerance of 1% of a step: Adam turns the rounding noise of a gradient that is zero
    # in exact arithmetic (the attention's key bias) into steps of up to 1e-4 of lr 0.05
    for (name, a), b in zip(clf.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=lr / 100, rtol=0, msg=name)


def _labels(rows):
    _, _, labels, _, censored = st.collate_rows(rows)
    return labels, censored


# ---------------------------------------------------------------------------- sampling
class Words:
    """A tokenizer stand-in: token i is the word w<i>; records ``skip_special_tokens``."""

    def __init__(self):
        self.skips = []

    def decode(self, ids, skip_special_tokens=False):
        self.skips.append(skip_special_tokens)
        return " ".join(f"w{int(i)}" for i in ids)


def _tokens(rows):
    return [r["tokens"].tolist() for r in rows]


def test_the_samplers_defaults(monkeypatch):
    """4 samples a prompt, 64 tokens at most, seed 0, batches of 8 prompts, no censoring, a
    bar of batches."""
    model = small_llama(0, vocab=6)
    prompts = [torch.tensor([[1, 2 + i % 4, 3]]) for i in range(9)]
    seen = []
    ancestral = st._Sampler.ancestral

    def recording(self, chunk, indices, n, steps, seed):
        seen.append((len(chunk), n, steps, seed))
        return ancestral(self, chunk, indices, n, min(steps, 3), seed)  # short, so some are cut

    monkeypatch.setattr(st._Sampler, "ancestral", recording)
    monkeypatch.setattr(st, "tqdm", RecordingBar.reset())
    rows = st.sample_training_data(model, None, prompts, hidden=False)
    assert seen == [(8, 4, 64, 0), (1, 4, 64, 0)] and len(rows) == 36
    (bar,) = RecordingBar.made
    assert bar.kw == dict(desc="sampling", unit="batch", disable=False) and bar.updates == 2
    cut = [r for r in rows if not r["finished"]]
    assert cut and all((r["labels"] == -100).all() and not r["censored"] for r in cut)
    quiet = st.sample_training_data(model, None, prompts, hidden=False, progress=False)
    assert RecordingBar.made[-1].kw["disable"] is True and _tokens(quiet) == _tokens(rows)


def test_each_prompt_draws_from_its_own_seed():
    """Prompt i of a set sampled with seed s draws what it draws alone with seed s + i."""
    model = small_llama(0, vocab=6)
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[1, 4, 3]]), torch.tensor([[1, 5, 2]])]
    kw = dict(samples_per_prompt=3, max_new_tokens=6, hidden=False, progress=False)
    rows = st.sample_training_data(model, None, prompts, seed=4, **kw)
    for i, p in enumerate(prompts):
        alone = st.sample_training_data(model, None, [p], seed=4 + i, **kw)
        assert _tokens(alone) == _tokens(rows[3 * i : 3 * i + 3])
        assert [int(r["prompt_index"]) for r in rows[3 * i : 3 * i + 3]] == [i] * 3
    assert _tokens(rows[:3]) != _tokens(rows[3:6])


@pytest.mark.parametrize("texts", [None, ["first", "second"]])
def test_degenerate_labels_read_the_text_and_the_prompt(texts):
    """One label a sample: the labeler on its tokens without EOS, decoded without special
    tokens, and its prompt's text (given, or the prompt decoded); never censored."""
    model = small_llama(0, vocab=6)
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[1, 4, 3]])]
    calls = []

    def rule(text, prompt_text, finished):
        return prompt_text.endswith(("w3", "second")) == finished

    def labeler(text, prompt_text, finished):
        calls.append((text, prompt_text, finished))
        return rule(text, prompt_text, finished)

    tok = Words()
    rows = st.sample_training_data(
        model,
        tok,
        prompts,
        attribute="degenerate",
        labeler=labeler,
        prompt_texts=texts,
        samples_per_prompt=4,
        max_new_tokens=4,
        censored=True,
        hidden=False,
        progress=False,
    )
    assert len(calls) == len(rows) == 8 and tok.skips.count(True) == 8  # the samples' texts
    for r, (text, prompt_text, finished) in zip(rows, calls, strict=True):
        i = int(r["prompt_index"])
        want = texts[i] if texts else " ".join(f"w{t}" for t in prompts[i][0].tolist())
        assert prompt_text == want and finished is bool(r["finished"])
        assert text == " ".join(f"w{t}" for t in r["tokens"].tolist() if t != 0)
        label = int(rule(text, want, finished))
        assert r["labels"].tolist() == [label] * len(r["tokens"]) and not r["censored"]
    assert {int(r["labels"][0]) for r in rows} == {0, 1}


def test_the_sampler_refuses_bad_settings_word_for_word():
    model = small_llama(0, vocab=6)
    p = [torch.tensor([[1, 2, 3]])]
    cases = [
        (dict(attribute="size"), "attribute must be 'length' or 'degenerate', got 'size'"),
        (dict(samples_per_prompt=0), "samples_per_prompt must be >= 1, got 0"),
        (dict(max_new_tokens=0), "max_new_tokens must be >= 1, got 0"),
        (dict(batch_size=0), "batch_size must be >= 1, got 0"),
    ]
    for kw, message in cases:
        with pytest.raises(GencraftError) as err:
            st.sample_training_data(model, None, p, progress=False, **kw)
        assert str(err.value) == message
    with pytest.raises(GencraftError) as err:
        st.sample_training_data(model, None, [], progress=False)
    assert str(err.value) == "no prompts to sample from"
    rows = st.sample_training_data(model, None, p, max_new_tokens=1, hidden=False, progress=False)
    assert all(len(r["tokens"]) == 1 for r in rows)
    from transformers import BertConfig, BertModel

    encoder = BertModel(
        BertConfig(
            vocab_size=6,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
        )
    )
    with pytest.raises(GencraftError, match=r"^a classifier's training data needs a model"):
        st.sample_training_data(encoder, None, p, progress=False)


def test_attach_hidden_names_a_prompt_outside_the_set(sampled, monkeypatch):
    model, prompts, rows = sampled
    bare = [{k: v for k, v in r.items() if k != "hidden"} for r in rows]
    shifted = [{**r, "prompt_index": r["prompt_index"] + 5} for r in bare]
    monkeypatch.setattr(st, "tqdm", RecordingBar.reset())
    out = st.attach_hidden(model, shifted, prompts, first=5)
    assert all(torch.equal(a["hidden"], r["hidden"]) for a, r in zip(out, rows, strict=True))
    assert RecordingBar.made[0].kw == dict(desc="hidden states", disable=True)
    st.attach_hidden(model, shifted, prompts, first=5, progress=True)
    assert RecordingBar.made[1].kw["disable"] is False
    for first, index in ((4, 6), (6, 5)):  # 6 is past the two given from 4; 5 is before 6
        with pytest.raises(GencraftError) as err:
            st.attach_hidden(model, shifted, prompts, first=first)
        assert str(err.value) == f"a row names prompt {index}, outside the 2 given"


def test_relabelling_keeps_no_censoring_and_skips_special_tokens(sampled):
    _, _, rows = sampled
    rows = [{**r, "censored": torch.tensor(True)} for r in rows]
    tok = Words()
    out = st.relabel_degenerate(rows, tok, ["a", "b"], [0])
    assert not any(o["censored"] for o in out)
    assert set(tok.skips) == {True}


@pytest.mark.parametrize(
    ("attribute", "classes"), [("length", NUM_LENGTH_BUCKETS), ("degenerate", 2)]
)
def test_a_classifier_for_a_model(sampled, attribute, classes):
    model, _, _ = sampled
    clf = st.classifier_for(model, attribute, **SIZES)
    cfg = clf.config
    assert (cfg.num_classes, cfg.attribute, cfg.d_clf, cfg.mlp_hidden) == (
        classes,
        attribute,
        24,
        16,
    )
    assert (cfg.model_name, cfg.model_fingerprint) == (model_name(model), fingerprint(model))
    assert cfg.model_fingerprint
    from gencraft.models import load_model

    named, _ = load_model("tiny-llama")
    assert st.classifier_for(named, attribute, **SIZES).config.model_name == "tiny-llama"


def test_the_training_loop_is_given_the_runs_settings(sampled, tmp_path, monkeypatch):
    """``fit`` gets the settings a resume is checked against (the train config without its
    loop, the number of sequences, the classifier's config) and the bar, resume and restart
    flags: by default a bar, resuming, no restart."""
    import gencraft.training as training
    from gencraft.training import settings_of

    model, _, rows = sampled
    seen = []
    fit = training.fit

    def recording(*args, **kw):
        seen.append(kw)
        return fit(*args, **kw)

    monkeypatch.setattr(training, "fit", recording)
    cfg = _config(epochs=1)
    clf = st.classifier_for(model, **SIZES)
    st.train_classifier(clf, rows, cfg, tmp_path / "a")
    st.train_classifier(clf, rows, cfg, tmp_path / "b", progress=False, resume=False, restart=True)
    want = {"train_config": settings_of(cfg), "sequences": 24, "classifier": asdict(clf.config)}
    assert [k["settings"] for k in seen] == [want, want]
    flags = [(k["progress"], k["resume"], k["restart"]) for k in seen]
    assert flags == [(True, True, False), (False, False, True)]


def test_one_labelled_position_is_its_own_loss(sampled):
    """The mean over a single labelled position is that position's NLL; none gives 0."""
    model, _, rows = sampled
    clf = st.classifier_for(model, **SIZES).eval()
    long = next(r for r in rows if len(r["tokens"]) >= 3)
    row = {**long, "labels": torch.full_like(long["labels"], -100)}
    row["labels"][1] = 3
    total, count = _alone(clf, [row])
    with torch.no_grad():
        none = st._valid_loss(clf, [st.collate_rows([{**row, "labels": row["labels"] * 0 - 100}])])
        got = st._loss(clf, st.collate_rows([row]))
        valid = st._valid_loss(clf, [st.collate_rows([row])])
    assert count == 1 and total > 0.1 and none == {"loss": 0.0}
    assert abs(float(got) - total) < 1e-5 and abs(valid["loss"] - total) < 1e-5


def test_cut_length_samples_carry_lower_bounds():
    """With ``censored``, a length sample cut at ``max_new_tokens`` is flagged and labelled
    with lower bounds; an ended one counts down to its EOS."""
    from gencraft.search.classifier import length_labels

    model = small_llama(0, vocab=6)
    rows = st.sample_training_data(
        model,
        None,
        [torch.tensor([[1, 2, 3]])],
        samples_per_prompt=8,
        max_new_tokens=3,
        censored=True,
        hidden=False,
        progress=False,
    )
    cut = [r for r in rows if not r["finished"]]
    assert cut and len(cut) < len(rows)
    for r in rows:
        n, ended = len(r["tokens"]), bool(r["finished"])
        assert bool(r["censored"]) is not ended
        assert r["labels"].tolist() == length_labels(n, ended, censored=True)


def test_a_model_without_a_pad_pads_with_its_eos():
    """Padding is masked or after the sample: a model whose generation config names no pad
    samples and reads states exactly as one that does."""
    prompts = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 5]])]
    kw = dict(samples_per_prompt=3, max_new_tokens=5, progress=False)
    model = small_llama(0, vocab=6)
    model.generation_config.pad_token_id = 4  # a token, not the EOS (0)
    with_pad = st.sample_training_data(model, None, prompts, **kw)
    model.generation_config.pad_token_id = None
    without = st.sample_training_data(model, None, prompts, **kw)
    assert _tokens(without) == _tokens(with_pad)
    for a, b in zip(without, with_pad, strict=True):
        assert torch.equal(a["hidden"], b["hidden"])
