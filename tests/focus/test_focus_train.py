"""FAME training: encoding of examples, frozen-base features against the full forward,
the trainer (full, baseline, head-only), summarize/metrics and the CLI on tiny models."""

from __future__ import annotations

import json

import pytest
import torch

from gencraft.cli.main import main
from gencraft.data.summarization import SummarizationExample
from gencraft.errors import GencraftError
from gencraft.focus import FocusConfig, FocusForConditionalGeneration
from gencraft.focus.data import SummaryEncoder, collate
from gencraft.focus.evaluate import diversity_metrics, summarize, summary_metrics
from gencraft.focus.features import collect_features, head_losses
from gencraft.focus.train import FocusTrainConfig, FocusTrainer, load_summarizer
from gencraft.models import load_model
from gencraft.training import FitConfig

ALL = ["tiny-bart", "tiny-t5", "tiny-bert2bert", "tiny-llama", "tiny-gpt2"]


def _examples(n: int) -> list[SummarizationExample]:
    return [
        SummarizationExample(
            f"d{i}", f"the council said bridge {i} will open next year.", f"bridge {i} opens"
        )
        for i in range(n)
    ]


def test_encoder_layouts():
    _, tok = load_model("tiny-llama")
    enc = SummaryEncoder(tok, False, max_source=5, max_target=4)
    row = enc.encode("abcdefghij", "xyzuvw")
    n_src = sum(row["source_mask"])
    assert row["labels"][:n_src] == [-100] * n_src
    assert row["labels"][n_src:] == row["input_ids"][n_src:]
    assert row["labels"][-1] == tok.eos_token_id and len(row["labels"]) - n_src == 4
    assert tok.decode(row["input_ids"][:n_src]).count("abcde") == 1
    assert "f" not in tok.decode(row["input_ids"][:n_src]).split("abcde")[1][:1]
    _, tok = load_model("tiny-bart")
    s2s = SummaryEncoder(tok, True, max_source=6, max_target=3).encode("abcdefghij", "xyz")
    xy = tok("xy", add_special_tokens=False)["input_ids"]
    assert len(s2s["input_ids"]) == 6 and s2s["labels"] == [*xy, tok.eos_token_id]
    batch = collate(
        [{"input_ids": [1, 2, 3], "labels": [4]}, {"input_ids": [5], "labels": [6, 7]}],
        0,
        left=True,
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3], [0, 0, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 4], [6, 7]]
    with pytest.raises(GencraftError, match="max_target"):
        SummaryEncoder(tok, True, max_target=1)


@pytest.mark.parametrize("name", ALL)
def test_head_losses_from_stored_features_equal_the_full_forward(name):
    base, tok = load_model(name)
    torch.manual_seed(0)
    model = FocusForConditionalGeneration(
        base, FocusConfig(freeze_base=True), frequent_ids=torch.tensor([5, 6])
    )
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0, 0.3)
    enc = SummaryEncoder(tok, base.config.is_encoder_decoder, max_source=30, max_target=10)
    rows = [
        enc.encode("the cat sat on the mat today", "cat sits"),
        enc.encode("a dog ran far away", "dog ran off fast now"),
    ]
    batch = collate(rows, tok.pad_token_id)
    feats, residual = collect_features(model, batch)
    loss, mle, topic = head_losses(model, feats, residual)
    out = model(**batch)
    torch.testing.assert_close(mle, out.mle_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(topic, out.topic_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, out.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_features_of_a_trainable_base_keep_no_graph_and_its_mode(training):
    """Collected in eval mode without gradients, the base left in its mode: the features and
    the residual equal those of a frozen copy in eval mode."""
    base, tok = load_model("tiny-bart")
    model = FocusForConditionalGeneration(base, FocusConfig(freeze_base=False))
    enc = SummaryEncoder(tok, True, max_source=30, max_target=10)
    batch = collate([enc.encode("a dog ran far away", "dog ran off")], tok.pad_token_id)
    model.eval()
    want, want_r = collect_features(model, batch)
    model.train(training)
    feats, residual = collect_features(model, batch)
    assert model.base.training is training and not residual.requires_grad
    for f, w in zip(feats, want, strict=True):
        for k in ("x", "y", "a", "targets"):
            assert not getattr(f, k).requires_grad
            torch.testing.assert_close(getattr(f, k), getattr(w, k))
    torch.testing.assert_close(residual, want_r)
    with pytest.raises(GencraftError, match=r"^collecting head features needs labels"):
        collect_features(model, {k: v for k, v in batch.items() if k != "labels"})


@pytest.mark.parametrize("name", ["tiny-bart", "tiny-gpt2"])
def test_features_keep_a_target_of_id_0_and_a_zero_residual_without_targets(name):
    base, tok = load_model(name)
    if hasattr(base, "final_logits_bias"):  # BART's residual, zero at initialisation
        with torch.no_grad():
            base.final_logits_bias.normal_()
    model = FocusForConditionalGeneration(base, FocusConfig(freeze_base=True))
    ed = bool(base.config.is_encoder_decoder)
    enc = SummaryEncoder(tok, ed, max_source=30, max_target=10)
    batch = collate([enc.encode("a dog ran far away", "dog ran off")], tok.pad_token_id)
    batch["labels"][0, -1] = 0  # a real target whose token id is 0
    (feat,), residual = collect_features(model, batch)
    bias = getattr(base, "final_logits_bias", torch.zeros(1, residual.shape[0]))[0]
    torch.testing.assert_close(residual, bias, atol=1e-5, rtol=1e-5)
    labels = batch["labels"][0] if ed else batch["labels"][0, 1:]
    assert feat.targets.tolist() == labels[labels >= 0].tolist() and feat.targets[-1] == 0
    assert feat.y.shape[0] == feat.a.shape[0] == len(feat.targets)
    unscored = dict(batch, labels=torch.full_like(batch["labels"], -100))
    (feat,), residual = collect_features(model, unscored)
    assert feat.targets.numel() == 0
    assert torch.equal(residual, torch.zeros(model.output_embedding.weight.shape[0]))


@pytest.mark.parametrize(
    "cfg",
    [dict(focus=False), dict(focus=True), dict(focus=True, freeze_base=True, lr=3e-2)],
    ids=["baseline", "fame", "fame-frozen"],
)
def test_training_lowers_validation_loss_and_saves_loadable_models(cfg, tmp_path):
    base, tok = load_model("tiny-bart")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    data = _examples(12)
    fit = FitConfig(epochs=3, batch_size=4, warmup=0.1)
    config = FocusTrainConfig(fit=fit, frequent_size=3, lr=cfg.pop("lr", 3e-3), **cfg)
    trainer = FocusTrainer(
        base, tok, data, data[:4], config, tmp_path, progress=False, base_name_or_path="tiny-bart"
    )
    trainer.train()
    losses = [h["valid_mle"] for h in trainer.history]
    assert losses[-1] < losses[0]
    frozen = all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    assert frozen == bool(config.freeze_base)
    model, _ = load_summarizer(str(tmp_path / "best"))
    assert isinstance(model, FocusForConditionalGeneration) == config.focus
    if config.focus:  # a frozen base is reloaded by name, a trained one is saved
        assert (tmp_path / "best" / "base").exists() != bool(config.freeze_base)
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history) == 3


def test_best_checkpoint_by_validation_rouge_l(tmp_path):
    """select_by="rougeL" (the paper's Appendix A): best/ is the epoch with the highest ROUGE-L
    of beam-searched validation summaries, and reloading it gives that ROUGE-L again."""
    from gencraft.metrics import rouge

    base, tok = load_model("tiny-bart")
    data = _examples(12)
    config = FocusTrainConfig(
        fit=FitConfig(epochs=6, batch_size=4),
        frequent_size=3,
        lr=1e-2,
        select_by="rougeL",
        select_docs=4,
        select_beams=2,
        max_target=12,
    )
    trainer = FocusTrainer(base, tok, data, data[:4], config, tmp_path, progress=False)
    trainer.train()
    scores = [h["valid_rougeL"] for h in trainer.history]
    assert all("valid_loss" in h for h in trainer.history)
    chosen = max(i for i, h in enumerate(trainer.history) if h["best"])
    assert scores[chosen] == max(scores) and scores.index(max(scores)) == chosen
    losses = [h["valid_loss"] for h in trainer.history]
    assert chosen != losses.index(min(losses))  # this run's two rules disagree
    model, tok2 = load_summarizer(str(tmp_path / "best"))
    again = summarize(
        model, tok2, [d.document for d in data[:4]], num_beams=2, max_new_tokens=12, progress=False
    )
    assert rouge([s[0] for s in again], [d.summary for d in data[:4]])["rougeL"] == pytest.approx(
        max(scores)
    )
    with pytest.raises(GencraftError, match="select_by"):
        FocusTrainConfig(select_by="bleu")


def test_train_config_and_summarize_errors():
    with pytest.raises(GencraftError, match="needs focus"):
        FocusTrainConfig(focus=False, freeze_base=True)
    with pytest.raises(GencraftError, match="frozen base"):
        FocusTrainConfig(precompute=True)
    base, tok = load_model("tiny-bart")
    with pytest.raises(GencraftError, match="needs a FAME model"):
        summarize(base, tok, ["a"], decoding="focus_sample")
    with pytest.raises(GencraftError, match="unknown decoding"):
        summarize(base, tok, ["a"], decoding="greedy")


def test_summarize_samples_and_metrics():
    base, tok = load_model("tiny-llama")
    model = FocusForConditionalGeneration(base, frequent_ids=torch.tensor([5]))
    docs = ["the cat sat on the mat", "a dog ran"]
    groups = summarize(
        model,
        tok,
        docs,
        decoding="focus_sample+nucleus",
        samples=3,
        focus_k=40,
        max_new_tokens=6,
        progress=False,
    )
    assert [len(g) for g in groups] == [3, 3]
    again = summarize(
        model,
        tok,
        docs,
        decoding="focus_sample+nucleus",
        samples=3,
        focus_k=40,
        max_new_tokens=6,
        progress=False,
    )
    assert groups == again  # seeded
    row = summary_metrics(
        ["the cat sat"], ["the cat sat"], ["the cat sat on the mat"], with_bertscore=False
    )
    assert row["R1"] == pytest.approx(100.0) and row["R1_precision_doc"] == pytest.approx(100.0)
    div = diversity_metrics(
        [["a b", "a b"], ["c d", "e f"]], ["a b", "c d"], ["a b", "c d"], with_bertscore=False
    )
    assert div["unique"] == pytest.approx(1.5)


def test_cli_train_then_eval(tmp_path, capsys):
    root = tmp_path / "data" / "xsum"
    root.mkdir(parents=True)
    rows = [{"id": e.id, "document": e.document, "summary": e.summary} for e in _examples(30)]
    (root / "xsum-30.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "fame"
    data = ["--data", "xsum", "--data-dir", str(tmp_path / "data"), "--quiet"]
    train = [
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--freeze-base",
        "--lr",
        "1e-2",
        "--frequent-size",
        "4",
        "--output",
        str(out),
    ]
    assert main(["focus", "train", "--model", "tiny-gpt2", *data, *train]) == 0
    capsys.readouterr()
    ev = [
        "--decoding",
        "focus_top",
        "--focus-k",
        "30",
        "--max-new-tokens",
        "5",
        "--no-bertscore",
        "--output",
        str(tmp_path / "r.json"),
    ]
    assert main(["focus", "eval", str(out / "best"), *data, *ev]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["documents"] == 3 and "RL" in result and "R1_precision_doc" in result


def test_entailment_scorer_with_a_tiny_random_nli_classifier(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    from gencraft.metrics import EntailmentScorer
    from gencraft.models import build_tiny_tokenizer

    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        id2label={0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"},
        label2id={"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2},
        pad_token_id=tok.pad_token_id,
    )
    clf = BertForSequenceClassification(cfg).eval()
    clf.save_pretrained(tmp_path / "nli")
    tok.save_pretrained(tmp_path / "nli")
    scorer = EntailmentScorer(str(tmp_path / "nli"), max_length=24, batch_size=2)
    assert scorer.entailment_label == 2
    docs = ["the cat sat on the mat " * 10, "a dog", "rain fell"]
    sums = ["a cat sat", "dog", "it rained"]
    got = scorer.scores(docs, sums)
    for d, s, p in zip(docs, sums, got, strict=True):
        enc = tok(d, s, truncation="only_first", max_length=24, return_tensors="pt")
        with torch.no_grad():
            ref = torch.softmax(clf(**enc).logits, -1)[0, 2].item()
        assert p == pytest.approx(ref, abs=1e-5)
    assert scorer(docs, sums) == pytest.approx(100 * sum(got) / 3)
    with pytest.raises(GencraftError, match="pair up"):
        scorer.scores(docs, sums[:2])
    clf.config.id2label = {0: "A", 1: "B", 2: "C"}
    with pytest.raises(GencraftError, match="entailment class"):
        EntailmentScorer((clf, tok))
    with pytest.raises(GencraftError, match="cannot load the NLI classifier"):
        EntailmentScorer(str(tmp_path / "missing"))


def test_cli_generate_feeds_eval_rerun_says_finished_and_bad_k_is_refused(tmp_path, capsys):
    root = tmp_path / "data" / "xsum"
    root.mkdir(parents=True)
    rows = [{"id": e.id, "document": e.document, "summary": e.summary} for e in _examples(30)]
    (root / "xsum-30.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "fame"
    data = ["--data", "xsum", "--data-dir", str(tmp_path / "data"), "--quiet"]
    train = ["--model", "tiny-gpt2", "--epochs", "1", "--freeze-base", "--frequent-size", "4"]
    assert main(["focus", "train", *train, *data, "--output", str(out)]) == 0
    capsys.readouterr()
    # the same command again: nothing to do, and it says so (best/ is not overwritten)
    before = (out / "best" / "method_model.safetensors").read_bytes()
    assert main(["focus", "train", *train, *data, "--output", str(out)]) == 0
    assert "already finished" in capsys.readouterr().out
    assert (out / "best" / "method_model.safetensors").read_bytes() == before
    # another configuration into the same output is refused
    assert main(["focus", "train", *train, "--lr", "1", *data, "--output", str(out)]) == 2
    assert "other settings" in capsys.readouterr().err
    gen = tmp_path / "gen.jsonl"
    common = [str(out / "best"), *data, "--max-new-tokens", "4", "--limit", "2"]
    assert main(["focus", "generate", *common, "--output", str(gen)]) == 0
    capsys.readouterr()
    assert main(["eval", "--predictions", str(gen), "--references", str(gen), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2.0
    assert main(["focus", "generate", *common, "--decoding", "focus_top", "--focus-k", "9999"]) == 2
    assert "focus_k must lie in [1, |V| = 261]" in capsys.readouterr().err


def test_non_utf8_files_are_named(tmp_path, capsys):
    bad = tmp_path / "preds.txt"
    bad.write_bytes(b"caf\xe9\n")
    assert main(["eval", "--predictions", str(bad), "--references", str(bad)]) == 2
    assert f"{bad}: not UTF-8 text" in capsys.readouterr().err


def test_eval_warns_when_summaries_are_empty(tmp_path, capsys, monkeypatch):
    from gencraft.focus import evaluate

    root = tmp_path / "data" / "xsum"
    root.mkdir(parents=True)
    rows = [{"id": e.id, "document": e.document, "summary": e.summary} for e in _examples(30)]
    (root / "xsum-30.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    monkeypatch.setattr(evaluate, "summarize", lambda model, tok, docs, **kw: [[""] for _ in docs])
    args = ["focus", "eval", "tiny-bart", "--data-dir", str(tmp_path / "data"), "--limit", "2"]
    assert main([*args, "--no-bertscore", "--quiet"]) == 0
    assert "2 of 2 summaries are empty" in capsys.readouterr().err
