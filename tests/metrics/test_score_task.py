"""The one task scorer: each task's convention (case, tokenisation, stemming) and the
pycocoevalcap ROUGE-L of the E2E scripts, checked by hand on small cases."""

from __future__ import annotations

import math
import shutil

import pytest
import sacrebleu

from gencraft.errors import ConfigError
from gencraft.metrics import rouge, score_task
from gencraft.metrics.data2text import coco_rouge_l


def _lcs(a: list[str], b: list[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = (
                table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
            )
    return table[-1][-1]


def test_coco_rouge_l_is_the_beta_1_2_lcs_f_with_best_precision_and_recall():
    pred = "the cat sat on a mat ."
    refs = ["the cat sat .", "a cat was on the mat today ."]
    c = pred.split()
    precs = [_lcs(c, r.split()) / len(c) for r in refs]
    recs = [_lcs(c, r.split()) / len(r.split()) for r in refs]
    p, r = max(precs), max(recs)  # best of each, over the references separately
    beta = 1.2
    want = 100 * (1 + beta**2) * p * r / (r + beta**2 * p)
    assert coco_rouge_l([pred], [refs]) == pytest.approx(want)
    # rouge-score's F1 of the best reference is another number (the convention matters)
    assert rouge([pred], [refs], ("rougeL",), use_stemmer=False)["rougeL"] != pytest.approx(want)


def test_e2e_is_cased_unless_the_caller_lowercases():
    refs = [["The Eagle is a pub near Burger King.", "Near Burger King is The Eagle pub."]]
    cased = score_task("e2e", ["The Eagle is a pub near Burger King."], refs)
    lowered = score_task("e2e", ["the eagle is a pub near burger king."], refs)
    asked = score_task("e2e", ["the eagle is a pub near burger king."], refs, lowercase=True)
    assert cased["BLEU"] == pytest.approx(100.0) and cased["ROUGE-L"] == pytest.approx(100.0)
    assert lowered["BLEU"] < 50 and lowered["ROUGE-L"] < 60
    assert asked["BLEU"] == pytest.approx(100.0) and asked["ROUGE-L"] == pytest.approx(100.0)
    assert "lower-cased" in asked["convention"] and "cased" in cased["convention"]
    assert "lower-cased" not in cased["convention"]


def test_data_to_text_metrics_on_known_cases():
    same = score_task("e2e", ["the cat sat ."], [["the cat sat ."]], metrics=("BLEU", "TER"))
    assert same["BLEU"] == pytest.approx(100.0) and same["TER"] == 0.0
    assert set(same) == {"BLEU", "TER", "convention"}
    preds = ["a dog ran away", "the cat sat ."]
    refs = [["the cat sat on the mat ."], ["the cat sat .", "a cat sat ."]]
    worse = score_task("dart", preds, refs, metrics=("BLEU", "NIST", "ROUGE-L", "CIDEr", "TER"))
    assert worse["BLEU"] < 100 and worse["TER"] > 0 and worse["CIDEr"] > 0 and worse["NIST"] > 0
    # BLEU is sacrebleu's corpus BLEU over every reference, on the text as written
    streams = [[r[0] for r in refs], [None, "a cat sat ."]]
    assert worse["BLEU"] == pytest.approx(sacrebleu.corpus_bleu(preds, streams).score)


def test_summarization_is_stemmed_rouge_score():
    preds, refs = ["Cats were running fast"], ["The cat runs fast"]
    got = score_task("xsum", preds, refs)
    assert got["rougeL"] == pytest.approx(rouge(preds, refs, use_stemmer=True)["rougeL"])
    assert got["rougeL"] > rouge(preds, refs, use_stemmer=False)["rougeL"]
    assert "stemming" in got["convention"]


@pytest.mark.parametrize(
    ("task", "outputs", "references", "message"),
    [
        ("e2f", ["a"], [["a"]], "no scoring convention for task 'e2f'"),
        ("e2e", ["a", "b"], [["a"]], "2 outputs but 1 references"),
        ("e2e", ["a"], [[]], "at least one reference"),
        ("e2e", [], [], "no outputs"),
    ],
)
def test_bad_input_names_the_problem(task, outputs, references, message):
    with pytest.raises(ConfigError, match=message):
        score_task(task, outputs, references)
    with pytest.raises(ConfigError, match="has no metric"):
        score_task("xsum", ["a"], ["a"], metrics=("BLEU",))


def test_meteor_is_nan_or_a_fraction():
    got = score_task("e2e", ["the cat sat ."], [["the cat sat ."]], metrics=("METEOR",))
    assert math.isnan(got["METEOR"]) or 0.9 < got["METEOR"] <= 1.0


@pytest.mark.skipif(shutil.which("java") is None, reason="METEOR 1.5 needs java")
def test_meteor_through_java_handles_newlines():
    from gencraft.metrics.data2text import meteor

    score = meteor(
        ["the cat\nsat ||| on the mat", "a dog"], [["the cat sat on the mat"], ["a dog"]]
    )
    assert 0.5 < score <= 1.0


def test_nist_keeps_order_5_when_only_some_outputs_are_shorter():
    """NIST's order is cut only to the longest output (nltk divides by each order's n-gram
    count): one short output among long ones leaves n = 5."""
    pytest.importorskip("nltk")
    from nltk.translate.nist_score import corpus_nist

    from gencraft.metrics.data2text import nist, tokens

    preds = ["the cat sat on the mat", "a dog"]
    # several references: higher-order n-grams carry information (nltk's weights)
    refs = [
        ["the cat sat on the mat", "the cat sat on the rug", "my cat sat on the mat"],
        ["a dog barked"],
    ]
    hyps = [tokens(p) for p in preds]
    ref_tokens = [[tokens(r) for r in rs] for rs in refs]
    assert nist(preds, refs) == pytest.approx(corpus_nist(ref_tokens, hyps, n=5))
    assert nist(preds, refs) != pytest.approx(corpus_nist(ref_tokens, hyps, n=2))
    short = ["a dog", "the cat"]  # every output shorter than 5: the order is the longest's
    short_refs = [["a dog barked"], ["the cat sat"]]
    want = corpus_nist(
        [[tokens(r) for r in rs] for rs in short_refs], [tokens(p) for p in short], n=2
    )
    assert nist(short, short_refs) == pytest.approx(want)


def test_own_data_reports_its_two_rouge_ls_side_by_side_and_names_unread_text():
    """Own data: pycocoevalcap's ROUGE-L next to rouge-score's rougeL, each named in the
    convention; outputs or references rouge-score cannot read (outside a-z0-9) are counted
    in a warning, as they score 0 there while ROUGE-L reads them."""
    outs = ["Привет мир", "the cat sat", "der Hund"]
    refs = ["Привет мир", "the cat sat down", "der Hund bellt"]
    r = score_task("my/task", outs, refs)
    assert list(r)[:3] == ["BLEU", "ROUGE-L", "rougeL"]
    conv = r["convention"]
    assert "ROUGE-L = pycocoevalcap's" in conv and "rougeL = rouge-score's" in conv
    assert "read no word in 1 of 3 outputs and in the references of 1" in conv
    assert "ROUGE-L (pycocoevalcap) reads every character" in conv
    assert r["ROUGE-L"] > r["rougeL"]  # the Cyrillic output's perfect match counts only there
    latin = score_task("my/task", outs[1:], refs[1:])
    assert "WARNING" not in latin["convention"]
    summ = score_task("xsum", outs, refs)
    assert "read no word in 1 of 3 outputs" in summ["convention"]
    assert "pycocoevalcap" not in summ["convention"]
