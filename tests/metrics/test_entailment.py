"""``EntailmentScorer`` (FAME's Ent.) on a tiny random NLI classifier: each pair's probability
against the classifier run on that pair alone, the batches and their calls, no graph, the
entailment class found by name or given, and the refusals word for word."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from gencraft.errors import GencraftError
from gencraft.metrics import EntailmentScorer
from gencraft.models import build_tiny_tokenizer

NAMES = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
# the first premise is cut; the last pair's hypothesis nearly fills the budget of 24 tokens
# alone, so cutting the premise only differs from cutting the longer side
DOCS = ["the cat sat on the mat " * 10, "a dog", "rain fell", "markets rose", "a dog ran " * 6]
SUMS = ["a cat sat", "dog", "it rained", "stocks fell", "the dog ran far away"]


def _classifier(names: dict[int, str] = NAMES):
    """Weights drawn wide (0.5), so that the probabilities vary with the pair."""
    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=len(names),
        id2label=names,
        initializer_range=0.5,
        label2id={v: k for k, v in names.items()},
        pad_token_id=tok.pad_token_id,
    )
    return BertForSequenceClassification(cfg).eval(), tok


def _alone(clf, tok, doc: str, summary: str, label: int, max_length: int) -> float:
    enc = tok(doc, summary, truncation="only_first", max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        return torch.softmax(clf(**enc).logits, -1)[0, label].item()


@pytest.mark.parametrize(("batch_size", "calls"), [(1, 5), (2, 3), (None, 1)])
@pytest.mark.parametrize("label", [None, 0])
def test_each_pair_is_scored_as_alone_in_batches(batch_size, calls, label):
    clf, tok = _classifier()
    kw = {} if batch_size is None else {"batch_size": batch_size}  # 8 by default
    scorer = EntailmentScorer((clf, tok), max_length=24, entailment_label=label, **kw)
    assert scorer.entailment_label == (2 if label is None else label)
    seen = []
    hook = clf.register_forward_hook(lambda *a: seen.append(torch.is_grad_enabled()))
    got = scorer.scores(DOCS, SUMS)
    hook.remove()
    assert seen == [False] * calls
    want = [
        _alone(clf, tok, d, s, scorer.entailment_label, 24) for d, s in zip(DOCS, SUMS, strict=True)
    ]
    assert got == pytest.approx(want, abs=1e-5)
    assert max(want) - min(want) > 0.05  # weights large enough for the pairs to matter
    assert scorer(DOCS, SUMS) == pytest.approx(100 * sum(want) / 5, abs=1e-3)


def test_defaults_and_an_empty_list():
    clf, tok = _classifier()
    scorer = EntailmentScorer((clf, tok))
    assert (scorer.max_length, scorer.batch_size) == (512, 8)
    assert scorer.scores([], []) == [] and scorer([], []) == 0.0


@pytest.mark.parametrize(
    ("names", "found"),
    [
        ({0: "entailment", 1: "not_entailment"}, 0),
        ({0: "NOT ENTAILED", 1: "neutral", 2: "Entails"}, 2),
        ({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, None),
        ({0: "entailment", 1: "entailed"}, None),
    ],
)
def test_the_entailment_class_is_the_one_label_naming_it(names, found):
    clf, tok = _classifier(names)
    if found is not None:
        assert EntailmentScorer((clf, tok)).entailment_label == found
        return
    lower = {k: v.lower() for k, v in names.items()}
    want = f"cannot tell the entailment class from id2label {lower}; pass entailment_label="
    with pytest.raises(GencraftError) as err:
        EntailmentScorer((clf, tok))
    assert str(err.value) == want


def test_refusals_word_for_word(tmp_path):
    clf, tok = _classifier()
    for label in (-1, 3):
        with pytest.raises(GencraftError) as err:
            EntailmentScorer((clf, tok), entailment_label=label)
        assert str(err.value) == f"entailment_label {label} outside [0, 3)"
    with pytest.raises(GencraftError) as err:
        EntailmentScorer((clf, tok)).scores(DOCS, SUMS[:2])
    assert str(err.value) == "5 premises but 2 hypotheses; they must pair up"
    with pytest.raises(GencraftError, match=r"^cannot load the NLI classifier '.*missing'"):
        EntailmentScorer(str(tmp_path / "missing"))
