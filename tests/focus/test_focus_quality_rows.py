"""`focus-quality` on tiny models: which rows Tables 1 and 2 and the focus_top,k curve get,
under the settings that add or drop them (masked-only rows, no Table 2)."""

from __future__ import annotations

import json

import pytest

from gencraft.studies.runner import reproduce

SAMPLED = ["top_k", "nucleus"]
FOCUS_SAMPLED = ["focus_sample", "focus_sample+top_k", "focus_sample+nucleus"]


def _quality(shared_data, tmp_path, **overrides) -> dict:
    reproduce(
        "focus-quality",
        scale="tiny",
        output=tmp_path,
        overrides={"data_dir": str(shared_data), **overrides},
    )
    return json.loads((tmp_path / "results.json").read_text())["units"]["quality"]


@pytest.mark.parametrize("masked_rows", [False, True])
def test_rows_of_tables_1_and_2_and_the_focus_top_curve(shared_data, tmp_path, masked_rows):
    r = _quality(shared_data, tmp_path, masked_rows=masked_rows, focus_top=(5, 50))
    assert sorted(r["table1"]) == ["baseline", "fame"]
    # FAME alone adds the focus samplings; "masked only" is added to focus_sample alone
    want = [f"baseline ({d})" for d in SAMPLED] + [f"fame ({d})" for d in SAMPLED + FOCUS_SAMPLED]
    if masked_rows:
        want.append("fame (focus_sample, masked only)")
    assert sorted(r["table2"]) == sorted(want)
    assert sorted(r["focus_top"]) == ["5", "50"]
    assert sorted(r["focus_top_masked"]) == (["5", "50"] if masked_rows else [])
    metrics = set(r["table1"]["fame"])
    assert all(set(v) == metrics for v in r["focus_top"].values())
    assert r["test_docs"] == 2  # the tiny scale's test documents, each scored


def test_no_sampled_documents_gives_no_table_2(shared_data, tmp_path):
    r = _quality(shared_data, tmp_path, sample_docs=0, focus_top=(7,))
    assert r["table2"] == {} and sorted(r["table1"]) == ["baseline", "fame"]
    assert sorted(r["focus_top"]) == ["7"] and r["focus_top_masked"] == {}
