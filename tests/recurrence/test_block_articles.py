"""Each 1,024-token block of the recurrence evaluation names its WikiText article (the one
most of its targets lie in), so that two models' blocks pair by article; other corpora have
no articles and the rows say none."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_data import write_wikitext

from gencraft.data import stream_articles
from gencraft.models import load_model
from gencraft.recurrence.evaluate import BLOCK, block_articles, evaluate


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=6), st.integers(1, 40))
def test_a_block_is_the_article_most_of_its_targets_lie_in(runs, block):
    arts = torch.tensor([0] + [a for a, n in enumerate(runs) for _ in range(n)])
    got = block_articles(arts, block)
    targets = arts[1:].tolist()
    assert len(got) == -(-len(targets) // block)
    for i, art in enumerate(got):
        chunk = targets[i * block : (i + 1) * block]
        best = max(chunk.count(a) for a in set(chunk))
        assert chunk.count(art) == best and art == min(
            a for a in set(chunk) if chunk.count(a) == best
        )


def test_the_rows_name_each_blocks_article_on_wikitext_only(tmp_path, synthetic_lm_dir):
    write_wikitext(tmp_path, [9] * 8)
    model, tok = load_model("tiny-llama", seed=0)
    kw = {"window": 64, "overlaps": (0, 8)}
    rows = evaluate(
        model.eval(), tok, corpus="wikitext-2", split="test", data_dir=str(tmp_path), **kw
    )
    arts = stream_articles("wikitext-2", "test", tok, data_dir=str(tmp_path))
    assert arts.numel() > 2 * BLOCK  # several blocks
    for r in rows:
        assert r["block_article"] == block_articles(arts, BLOCK)
        assert len(r["block_article"]) == len(r["block_nll"])
    assert len(set(rows[0]["block_article"])) > 1
    ptb = evaluate(model, tok, corpus="ptb", split="test", data_dir=str(synthetic_lm_dir), **kw)
    assert all("block_article" not in r for r in ptb)
