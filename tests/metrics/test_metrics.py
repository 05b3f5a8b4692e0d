import math

import pytest
import sacrebleu
import torch

from gencraft import metrics as M
from gencraft.models import load_model

# a GPU stack without the metrics extra still collects `pytest -m gpu`
rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer", reason="no metrics extra")


def test_distinct_n_by_hand():
    texts = ["the cat the cat", "a dog"]
    assert M.distinct_n(texts, 1) == pytest.approx(100 * 4 / 6)
    assert M.distinct_n(texts, 2) == pytest.approx(100 * 3 / 4)
    assert M.distinct_n(["one"], 2) == 0.0


def test_unique_counts():
    assert M.unique_count(["a b", "a b", "c"]) == 2
    assert M.mean_unique([["a", "a"], ["a", "b"]]) == 1.5


def test_repetition_rate_counts_content_words_only():
    texts = ["the cat saw the dog", "cat cat", "Dogs and dogs!"]
    assert M.repetition_rate(texts) == pytest.approx(100 * 2 / 3)


def test_novel_ngrams_by_hand():
    preds, srcs = ["a b c", "x y"], ["a b d", "x y z"]
    assert M.novel_ngram_rate(preds, srcs, 1) == pytest.approx(100 * (1 / 3 + 0) / 2)
    assert M.novel_ngram_rate(preds, srcs, 2) == pytest.approx(100 * (1 / 2 + 0) / 2)


def test_length_and_perplexity():
    assert M.mean_length(["a b c", "d"]) == 2.0
    assert M.perplexity(3 * math.log(8), 3) == pytest.approx(8.0)
    with pytest.raises(ValueError, match="n_tokens must be positive"):
        M.perplexity(1.0, 0)


def test_rouge_by_hand_and_against_library():
    assert M.rouge(["the cat sat"], ["the cat ran"])["rouge1"] == pytest.approx(100 * 2 / 3)
    preds = ["The cats were sitting on the mats.", "Police arrested two men on Friday."]
    refs = ["A cat sat on the mat.", "Two men were arrested by police."]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = {
        t: 100 * sum(scorer.score(r, p)[t].fmeasure for p, r in zip(preds, refs, strict=True)) / 2
        for t in ("rouge1", "rouge2", "rougeL")
    }
    assert M.rouge(preds, refs) == pytest.approx(expected)
    # stemming matters: "cats"/"cat" match only with the stemmer
    assert M.rouge(["cats"], ["cat"])["rouge1"] == 100.0
    assert M.rouge(["cats"], ["cat"], use_stemmer=False)["rouge1"] == 0.0


def test_rouge_multi_reference_takes_best():
    best = M.rouge(["the cat sat"], [["dogs run", "the cat sat"]])
    assert best["rouge1"] == 100.0


def test_rouge1_precision_against_source():
    assert M.rouge1_precision_vs_source(["cat sat"], ["the cat sat on the mat"]) == 100.0
    assert M.rouge1_precision_vs_source(["cat flew"], ["the cat sat"]) == 50.0


def test_bleu_matches_sacrebleu_and_handles_ragged_references():
    preds = ["the cat sat on the mat today", "a quick brown fox jumps over it"]
    refs = ["the cat sat on a mat today", "the quick brown fox jumped over it"]
    assert M.bleu(preds, refs) == pytest.approx(sacrebleu.corpus_bleu(preds, [refs]).score)
    assert M.bleu(["same words here ok"], ["same words here ok"]) == pytest.approx(100.0)
    ragged = [[refs[0]], [refs[1], "a fast brown fox jumps over it"]]
    padded = [[refs[0], refs[0]], ragged[1]]  # a duplicated reference changes nothing
    assert M.bleu(preds, ragged) == pytest.approx(M.bleu(preds, padded))
    assert M.bleu(preds, ragged) > M.bleu(preds, refs)


def test_metric_input_errors():
    with pytest.raises(ValueError, match="differ in length"):
        M.rouge(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="predictions is empty"):
        M.bleu([], [])


@torch.no_grad()
def test_causal_lm_nll_equals_brute_force():
    model, _ = load_model("tiny-llama", seed=3)
    ids = torch.randint(5, 200, (23,), generator=torch.Generator().manual_seed(0))
    logp = torch.log_softmax(model(input_ids=ids[None]).logits[0], -1)
    full = -sum(float(logp[t - 1, ids[t]]) for t in range(1, 23))
    nll, n = M.causal_lm_nll(model, ids, max_length=64, stride=32, progress=False)
    assert n == 22 and nll == pytest.approx(full, rel=1e-5)
    # bounded context: token t sees exactly ids[max(0, t+1-m) : t] when stride = 1
    m = 5
    brute = 0.0
    for t in range(1, 23):
        window = ids[max(0, t + 1 - m) : t + 1]
        brute -= float(torch.log_softmax(model(input_ids=window[None]).logits[0, -2], -1)[ids[t]])
    nll, n = M.causal_lm_nll(model, ids, max_length=m, stride=1, progress=False)
    assert n == 22 and nll == pytest.approx(brute, rel=1e-5)
    # every token scored once for any stride
    for stride in (2, 3, 4):
        assert M.causal_lm_nll(model, ids, max_length=m, stride=stride, progress=False)[1] == 22
    with pytest.raises(ValueError, match="stride < max_length"):
        M.causal_lm_nll(model, ids, max_length=4, stride=4)


@pytest.mark.slow
def test_bertscore_with_local_minilm():
    pytest.importorskip("bert_score")
    same = M.bertscore(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert same["bertscore_f"] == pytest.approx(100.0, abs=0.01)
    other = M.bertscore(["the cat sat on the mat"], ["stock markets fell sharply on monday"])
    near = M.bertscore(["the cat sat on the mat"], ["a cat was sitting on a mat"])
    assert other["bertscore_f"] < near["bertscore_f"] < 100.0
    with_empty = M.bertscore(["the cat sat on the mat", ""], ["the cat sat on the mat", "a dog"])
    assert with_empty["bertscore_f"] == pytest.approx(50.0, abs=0.01)


def test_rouge_per_example_averages_to_rouge_and_bootstrap_brackets_the_mean():
    from gencraft.metrics.text import bootstrap_mean, rouge_per_example

    preds = ["the cat sat", "a dog", "hello world there"]
    refs = ["the cat sat down", "a big dog", "hello world"]
    per = rouge_per_example(preds, refs)
    assert per[0] == pytest.approx(100 * 2 * 3 / 7)  # LCS 3 of 3 and 4 tokens: F1 = 6/7
    assert sum(per) / 3 == pytest.approx(M.rouge(preds, refs, ("rougeL",))["rougeL"])
    assert bootstrap_mean([2.0] * 5) == (2.0, 0.0)  # no spread, no interval
    mean, half = bootstrap_mean([float(i) for i in range(100)], resamples=2000)
    assert mean == 49.5 and 4.5 < half < 6.5  # ≈ 1.96 · 28.9 / √100


def test_stream_perplexities_by_hand():
    import math

    import pytest
    import torch

    from gencraft.metrics import stream_perplexities

    got = stream_perplexities(torch.tensor([1.0, 2.0, 3.0, 2.0]), words=2, seconds=0.4)
    assert got["tokens"] == 4 and got["words"] == 2
    assert got["token ppl"] == pytest.approx(math.exp(2.0))  # 8 nats / 4 tokens
    assert got["word ppl"] == pytest.approx(math.exp(4.0))  # 8 nats / 2 words
    assert got["ms/token"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="words > 0"):
        stream_perplexities(torch.tensor([1.0]), words=0)
