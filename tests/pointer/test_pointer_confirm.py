"""`pointer-confirm`, the confirmatory pointer run: its units on a tiny corpus, each test word's
NLL against the evaluator at batch 1, and the registered two-level analysis (and the claims'
readers) against a hand computation over seeds and sentences."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.data import EOS, load_lm_corpus
from gencraft.metrics.stats import compare_paired, holm
from gencraft.pointer.analysis import frequency_buckets
from gencraft.pointer.evaluate import evaluate
from gencraft.pointer.lstm import PointerSentinelLSTM
from gencraft.studies.pointer import pointer_confirm_analysis, sentence_of_words
from gencraft.studies.rereads import POINTER_CONFIRM, pointer_ptb, pointer_rare
from gencraft.studies.runner import reproduce


@pytest.fixture(scope="module")
def corpus(synthetic_lm_dir):
    return load_lm_corpus("ptb", str(synthetic_lm_dir))


@pytest.fixture(scope="module")
def confirm_run(tmp_path_factory, synthetic_lm_dir):
    runs = tmp_path_factory.mktemp("runs")
    out = runs / "pointer-confirm-cpu"
    # one whole epoch of the small corpus (validated at its end), not the scale's 3 steps
    over = {"data_dir": str(synthetic_lm_dir), "max_steps": None}
    reproduce("pointer-confirm", scale="tiny", output=out, overrides=over)
    return runs, json.loads((out / "results.json").read_text())


def test_a_sentence_ends_with_its_eos_target(corpus):
    ids = corpus["test"]
    sent = sentence_of_words(ids, corpus.vocab.stoi[EOS])
    assert len(sent) == ids.numel() - 1 and sent[0] == 0
    eos = corpus.vocab.stoi[EOS]
    for i in range(1, len(sent)):  # a new sentence begins after each <eos> target
        assert sent[i] - sent[i - 1] == int(ids[i] == eos)


def test_each_seed_trains_both_models_and_scores_every_test_word(confirm_run, corpus):
    runs, res = confirm_run
    u = res["units"]
    names = [f"{m}-s{sd}" for sd in (0, 1) for m in ("lstm", "pointer")]
    assert list(u) == [f"{k} {n}" for n in names for k in ("train", "test")]
    steps = (corpus["train"].numel() // 4 - 1 + 99) // 100  # batch 4, BPTT 100: one epoch
    for n in names:
        assert u[f"train {n}"]["steps"] == steps and u[f"train {n}"]["stopped by"] == "epochs"
        history = json.loads((runs / "pointer-confirm-cpu" / n / "history.json").read_text())
        assert u[f"train {n}"]["best valid ppl"] == min(h["valid_ppl"] for h in history)
        assert len(u[f"test {n}"]["token_nll"]) == corpus["test"].numel() - 1
    best = PointerSentinelLSTM.from_pretrained(runs / "pointer-confirm-cpu" / "pointer-s1" / "best")
    direct = evaluate(best, corpus["test"], batch_size=1, return_details=True)["token_nll"][0]
    assert u["test pointer-s1"]["token_nll"] == pytest.approx(direct.tolist(), abs=1e-5)
    assert u["test pointer-s1"]["ppl"] == pytest.approx(math.exp(direct.double().mean()))
    # the seeds train different models: the two-level analysis has two levels
    assert u["test lstm-s0"]["token_nll"] != u["test lstm-s1"]["token_nll"]


def _hand(units, corpus, seeds, pick_bucket=None):
    """(a, b, sentence, seed) rows, pointer and LSTM, of the words in ``pick_bucket`` (None:
    every word)."""
    ids = corpus["test"]
    sent = sentence_of_words(ids, corpus.vocab.stoi[EOS])
    bucket = frequency_buckets(corpus.vocab.counts)[ids[1:]].tolist()
    rows = []
    for sd in seeds:
        p, q = units[f"test pointer-s{sd}"]["token_nll"], units[f"test lstm-s{sd}"]["token_nll"]
        rows += [
            (p[i], q[i], sent[i], sd)
            for i in range(len(p))
            if pick_bucket is None or bucket[i] == pick_bucket
        ]
    return rows


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 3), st.integers(0, 999))
def test_the_registered_analysis_is_two_level_with_holm_over_the_buckets(corpus, n_seeds, seed):
    rng = random.Random(seed)
    n = corpus["test"].numel() - 1
    seeds = list(range(n_seeds))
    units = {
        f"test {m}-s{sd}": {"token_nll": [rng.uniform(0, 5) for _ in range(n)]}
        for sd in seeds
        for m in ("lstm", "pointer")
    }
    got = pointer_confirm_analysis(units, corpus, seeds, resamples=300)
    a, b, c, s = zip(*_hand(units, corpus, seeds), strict=True)
    want = compare_paired(a, b, clusters=c, seeds=s, resamples=300)
    assert (got["primary"].mean, got["primary"].p) == pytest.approx((want.mean, want.p))
    assert (got["primary"].units, got["primary"].seeds) == (want.units, n_seeds)
    ps = [want.p]
    for row in got["buckets"]:
        rows = _hand(units, corpus, seeds, row["bucket"] - 1)
        if not rows:
            continue
        a, b, c, s = zip(*rows, strict=True)
        ref = compare_paired(b, a, clusters=c, seeds=s, resamples=300)  # the gain: LSTM − pointer
        assert row["result"].mean == pytest.approx(ref.mean)
        assert row["words"] == len(rows) // n_seeds
        ps.append(ref.p)
    if len(ps) == 11:
        assert [got["p_holm"], *(r["p_holm"] for r in got["buckets"])] == pytest.approx(holm(ps))
    del units[f"test lstm-s{seeds[-1]}"]
    assert pointer_confirm_analysis(units, corpus, seeds) is None


def test_the_claims_are_read_from_the_run(confirm_run, synthetic_lm_dir, corpus):
    runs, res = confirm_run
    got = pointer_ptb(runs, str(synthetic_lm_dir))
    assert got.files == (POINTER_CONFIRM,) and got.primary.result.seeds == 2
    assert len(got.secondary) == 10
    rare = pointer_rare(runs, str(synthetic_lm_dir))
    # by hand: per (seed, sentence) holding both deciles, the rare gain minus the frequent
    ids = corpus["test"]
    sent = sentence_of_words(ids, corpus.vocab.stoi[EOS])
    bucket = frequency_buckets(corpus.vocab.counts)[ids[1:]].tolist()
    a, b, c, s = [], [], [], []
    for sd in (0, 1):
        lstm = res["units"][f"test lstm-s{sd}"]["token_nll"]
        ptr = res["units"][f"test pointer-s{sd}"]["token_nll"]
        for k in sorted(set(sent)):
            g = {
                d: [lstm[i] - ptr[i] for i in range(len(sent)) if sent[i] == k and bucket[i] == d]
                for d in (0, 9)
            }
            if g[0] and g[9]:
                a.append(math.fsum(g[9]) / len(g[9]))
                b.append(math.fsum(g[0]) / len(g[0]))
                c.append(k)
                s.append(sd)
    want = compare_paired(a, b, clusters=c, seeds=s)
    assert rare.primary.result.mean == pytest.approx(want.mean)
    assert rare.primary.result.units == want.units > 0
