"""`hso-ppl`, the confirmatory perplexity run, on a tiny model and a synthetic WikiText: each
token's article, each context's summed NLL against the windowed NLL computed directly, HSO at
η = 0 against the plain model per context, and the planned analysis against a hand
computation on the article means."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_data import write_wikitext

from gencraft.data import stream_articles, subword_stream
from gencraft.errors import DataError
from gencraft.hso.config import HSOConfig
from gencraft.hso.functional import contexts, hso_nll
from gencraft.metrics import windowed_nll
from gencraft.metrics.stats import compare_paired, sign_test
from gencraft.models import load_model
from gencraft.studies.hso import _Contexts, context_sums, ppl_analysis
from gencraft.studies.runner import reproduce


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_model("tiny-llama", seed=0)
    return model.eval(), tok


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_each_token_belongs_to_the_article_whose_title_it_follows(tiny, sizes):
    _, tok = tiny
    with tempfile.TemporaryDirectory() as d:
        write_wikitext(Path(d), sizes)
        ids, _ = subword_stream("wikitext-2", "test", tok, data_dir=d)
        arts = stream_articles("wikitext-2", "test", tok, data_dir=d)
    assert arts.shape == ids.shape and int(arts[0]) == 0
    assert bool((arts[1:] >= arts[:-1]).all()) and int(arts.max()) == len(sizes) - 1
    for a in range(len(sizes)):  # the article's text is its own: it names its index
        text = tok.decode(ids[arts == a])
        assert f"Title {a} =" in text and f"article {a} says thing {sizes[a] - 1}" in text
        assert a == 0 or text.startswith(f"= Title {a} =")  # the title's first token opens it
        assert all(f"article {b} " not in text for b in range(len(sizes)) if b != a)


def test_a_slow_tokenizer_is_refused_in_one_line(tiny, tmp_path):
    write_wikitext(tmp_path, [1])

    class Slow:
        is_fast = False

    msg = r"^stream_articles needs a fast tokenizer \(character offsets\); Slow is not one$"
    with pytest.raises(DataError, match=msg):
        stream_articles("wikitext-2", "test", Slow(), data_dir=str(tmp_path))


def _stream(model, tok, d: str, size: int) -> _Contexts:
    ids, _ = subword_stream("wikitext-2", "test", tok, data_dir=d)
    return _Contexts(ids, contexts(ids.numel() - 1, size, model), [])


@settings(max_examples=5, deadline=None, derandomize=True, database=None)
@given(st.integers(12, 40), st.integers(0, 6), st.integers(1, 4))
def test_context_sums_are_the_windowed_nll_of_each_context(tiny, size, a, span):
    model, tok = tiny
    with tempfile.TemporaryDirectory() as d:
        write_wikitext(Path(d), [3, 2])
        stream = _stream(model, tok, d, size)
    a = min(a, len(stream.ranges) - 1)
    b = min(a + span, len(stream.ranges))
    whole = windowed_nll(model, stream.ids, window=size, overlap=0)
    plain = lambda x: windowed_nll(model, x, window=size, overlap=0, batch_size=3)  # noqa: E731
    got = context_sums(plain, stream, a, b)
    assert len(got) == b - a
    for (total, n), (c0, c1) in zip(got, stream.ranges[a:b], strict=True):
        assert n == c1 - c0
        assert total == pytest.approx(float(whole[c0:c1].double().sum()), rel=1e-5)
    # HSO with η = 0 changes no state: the plain model's NLL, context by context
    still = HSOConfig(reset_every=size, lr=0.0)
    frozen = context_sums(lambda x: hso_nll(model, x, still, batch_size=2).token_nll, stream, a, b)
    assert [n for _, n in frozen] == [n for _, n in got]
    assert [x for x, _ in frozen] == pytest.approx([x for x, _ in got], rel=1e-4)


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(-64, 64).map(lambda k: k / 64), st.integers(1, 9)),
        min_size=2,
        max_size=25,
    )
)
def test_the_planned_analysis_is_by_article_with_the_sign_test_under_holm(rows):
    rows = sorted(rows, key=lambda r: r[0])  # contexts run through the articles in order
    units = {
        "articles": {"article": [a for a, _, _ in rows]},
        "plain": {"contexts": [[2.0 * n, n] for _, _, n in rows]},
        "hso": {"contexts": [[(2.0 + d) * n, n] for _, d, n in rows]},
    }
    got = ppl_analysis(units, resamples=500)
    by: dict[int, list[float]] = {}
    for a, d, _ in rows:
        by.setdefault(a, []).append(d)
    means = [math.fsum(v) / len(v) for v in by.values()]
    want = compare_paired(means, [0.0] * len(means), resamples=500)
    assert got["primary"].units == len(by) and got["primary"].rows == len(rows)
    assert got["primary"].mean == pytest.approx(math.fsum(means) / len(means), abs=1e-9)
    assert got["primary"].p == pytest.approx(want.p)
    lower, higher = sum(m < 0 for m in means), sum(m > 0 for m in means)
    assert (got["sign"]["lower"], got["sign"]["higher"]) == (lower, higher)
    p = sorted([want.p, sign_test(lower, higher)])
    assert sorted([got["p_holm"], got["sign"]["p_holm"]]) == pytest.approx(
        [min(1.0, 2 * p[0]), min(1.0, max(2 * p[0], p[1]))]
    )


def test_the_run_saves_every_context_with_its_article_and_resumes(tmp_path):
    write_wikitext(tmp_path, [4, 2, 3])
    out = tmp_path / "run"
    over = {"data_dir": str(tmp_path), "max_words": None, "batch_size": 4}
    reproduce("hso-ppl", scale="tiny", output=out, overrides=over)
    res = json.loads((out / "results.json").read_text())
    _, tok = load_model("tiny-llama")
    ids, _ = subword_stream("wikitext-2", "test", tok, data_dir=str(tmp_path))
    n_ctx = math.ceil((ids.numel() - 1) / 32)
    u = res["units"]
    assert list(u) == ["articles", "plain", "hso"]
    assert len(u["articles"]["article"]) == len(u["plain"]["contexts"]) == n_ctx
    assert sorted(set(u["articles"]["article"])) == [0, 1, 2]
    of_token = stream_articles("wikitext-2", "test", tok, data_dir=str(tmp_path)).tolist()
    for j, art in enumerate(u["articles"]["article"]):  # most of its targets lie there
        targets = of_token[32 * j + 1 : 32 * (j + 1) + 1]
        assert targets.count(art) * 2 >= len(targets)
    assert any(of_token[32 * j] != a for j, a in enumerate(u["articles"]["article"]))
    assert sum(n for _, n in u["hso"]["contexts"]) == ids.numel() - 1
    plain = [x for x, _ in u["plain"]["contexts"]]
    assert [x for x, _ in u["hso"]["contexts"]] != pytest.approx(plain, rel=1e-6)
    report = (out / "report.md").read_text()
    assert report.index("**Planned analysis**") < report.index("**Exploratory**")
    assert "HSO − plain, nats/token (primary)" in report and "| 3 | " in report
    # a rerun finds every unit finished: the same numbers, nothing recomputed
    before = (out / "results.json").read_text()
    reproduce("hso-ppl", scale="tiny", output=out, overrides=over)
    assert json.loads((out / "results.json").read_text())["units"] == json.loads(before)["units"]
    assert torch.tensor(plain).isfinite().all()
