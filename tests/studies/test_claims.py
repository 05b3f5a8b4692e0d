"""The claims registry (gencraft.studies.claims): its records, the verdict each row gets
(the one rule on the Holm-adjusted primary), the readers of the committed runs on their
independent unit, and `gencraft reproduce claims`, whose output is docs/results/claims.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.cli.main import main
from gencraft.metrics.stats import VERDICTS, compare_paired, holm, verdict
from gencraft.studies import claims as registry
from gencraft.studies import rereads
from gencraft.studies.claims import CLAIMS, claim_row
from gencraft.studies.records import Claim, Reported, Scale
from gencraft.studies.rereads import Comparison, Measured

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "results" / "runs"
FIELDS = (
    "id",
    "paper",
    "claim",
    "unit",
    "test",
    "scale",
    "effect",
    "low",
    "high",
    "p",
    "units",
    "verdict",
    "decide",
)


def test_the_registry_covers_every_claim_once_with_a_unit_a_test_and_a_reason():
    ids = [c.id for c in CLAIMS]
    assert len(ids) >= 25 and len(set(ids)) == len(ids)
    assert set(rereads.READERS) <= set(ids)
    for c in CLAIMS:
        assert c.paper and c.claim and c.reported.table and c.direction in (1, -1)
        if c.not_attempted:
            continue
        assert c.unit != "-" and c.test != "-" and c.decide, c.id
        assert c.scale is None or c.scale.why, c.id
    papers = {c.paper for c in CLAIMS}
    assert len(papers) == 4  # the thesis, FAME, pointer sentinel, DASP


def test_each_confirmatory_plan_states_endpoint_unit_test_alpha_size_and_stopping():
    plans = {c.id: c.plan for c in CLAIMS if c.plan}
    assert set(plans) == {"hso-ppl", "hso-fewshot", "pointer-ptb"}
    for p in plans.values():
        assert all((p.endpoint, p.unit, p.test, p.size, p.stopping, p.command, p.registered))
        assert 0 < p.alpha < 1 and p.cost


def _claim(**kw) -> Claim:
    base = dict(
        id="x",
        paper="P",
        claim="c",
        reported=Reported("T1", "e", 1.0, "m", "d", "t"),
        endpoint="a − b",
        unit="example",
        test="t",
        scale=Scale(0.1, 0.1, False, "small"),
        decide="more",
    )
    return Claim(**{**base, **kw})


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.floats(0.0, 1.0, allow_subnormal=False), min_size=1, max_size=4),
    st.floats(-3, 3, allow_subnormal=False),
    st.booleans(),
    st.sampled_from([1, -1]),
)
def test_a_rows_verdict_is_the_one_rule_on_the_holm_adjusted_primary(ps, mean, deciding, way):
    def res(p):
        return {"mean": mean, "low": mean - 1, "high": mean + 1, "p": p, "units": 40}

    measured = Measured(
        Comparison("a − b", res(ps[0]), "example"),
        tuple(Comparison(f"s{i}", res(p), "example") for i, p in enumerate(ps[1:])),
    )
    claim = _claim(direction=way, scale=Scale(0.1, 0.1, deciding, "why"))
    rereads.READERS["x"] = lambda runs, data: measured
    try:
        row = claim_row(claim, RUNS, None)
    finally:
        del rereads.READERS["x"]
    adj = holm(ps)
    assert row["p"] == pytest.approx(adj[0]) and row["p_raw"] == ps[0]
    want = verdict({**res(adj[0])}, direction=way, deciding=deciding, paper_effect=1.0)
    assert row["verdict"] == want and [s["p"] for s in row["secondary"]] == pytest.approx(adj[1:])
    assert set(FIELDS) <= set(row) and row["units"] == 40


def test_holm_can_undo_a_primary_that_is_significant_alone():
    def res(p):
        return {"mean": 2.0, "low": 1.0, "high": 3.0, "p": p, "units": 40}

    measured = Measured(
        Comparison("a − b", res(0.03), "example"), (Comparison("other", res(0.04), "example"),)
    )
    rereads.READERS["x"] = lambda runs, data: measured
    try:
        row = claim_row(_claim(), RUNS, None)
    finally:
        del rereads.READERS["x"]
    assert verdict(res(0.03)) == "reproduced"  # alone
    assert row["p"] == pytest.approx(0.06) and row["verdict"] == "undecided"


def _two_level(rows: list[tuple[int, int, float]]):
    """compare_paired over (seed, unit, difference) rows, two levels."""
    return compare_paired(
        [x for *_, x in rows],
        [0.0] * len(rows),
        clusters=[u for _, u, _ in rows],
        seeds=[s for s, _, _ in rows],
        resamples=200,
    )


def test_a_two_level_result_counts_its_seeds_as_the_independent_units():
    """Three seeds × 50 sentences: the row, its secondary, claims.md and the page block count
    3 independent units (50 within each), and the power estimate is in seeds; a one-level
    result counts its units."""
    from gencraft.studies.claims_report import claims_markdown, page_block

    rows = [(s, u, 0.2 + 0.05 * s + 0.01 * (u % 7)) for s in range(3) for u in range(50)]
    two = _two_level(rows)
    one = compare_paired([x for *_, x in rows], [0.0] * len(rows), resamples=200)
    measured = Measured(Comparison("a − b", two, "seed"), (Comparison("one", one, "row"),))
    claim = _claim(id="pointer-x", unit="seed")
    rereads.READERS["pointer-x"] = lambda runs, data: measured
    try:
        row = claim_row(claim, RUNS, None)
    finally:
        del rereads.READERS["pointer-x"]
    assert (row["units"], row["within"]) == (3, 50)
    assert (row["secondary"][0]["units"], row["secondary"][0]["within"]) == (150, None)
    md = claims_markdown([row])
    assert "| 3 (50 within each) |" in md and "3 seeds (50 within each)." in md
    assert "150 rows." in md
    assert "3 independent units (seed; 50 within each)" in page_block([row], "pointer.md")


def test_the_pointer_readers_add_each_seed_and_a_t_test_over_the_seeds_alone():
    from scipy import stats

    r = _two_level([(s, u, 0.1 * s + 0.01 * (u % 5) - 0.2) for s in range(4) for u in range(30)])
    label, text = rereads._over_seeds(r)
    t = stats.ttest_1samp(r.run_means, 0.0)
    assert "t test over the seeds" in label and len(r.run_means) == 4
    assert text == "-0.180, -0.080, +0.020, +0.120; " + f"p = {t.pvalue:.2g} (3 degrees of freedom)"


def test_rows_without_a_run_are_undecided_and_unattempted_claims_say_why():
    row = claim_row(_claim(), RUNS, None)
    assert row["verdict"] == "undecided" and row["effect"] is None and row["units"] == 0
    row = claim_row(_claim(not_attempted="no data"), RUNS, None)
    assert row["verdict"] == "not attempted" and row["why"] == "no data"


def test_the_hso_fewshot_reread_takes_the_example_as_its_unit(shared_data, tmp_path):
    """The first run's re-read (the campaign's 200 examples, read where the pre-registered run
    is absent) clusters by example; once that run has finished, the claim reads it instead."""
    (tmp_path / "campaign-cpu").symlink_to(RUNS / "campaign-cpu")
    got = rereads.hso_fewshot(tmp_path, str(shared_data))
    run = json.loads((RUNS / rereads.HSO_FEWSHOT).read_text())["units"]
    cells = sorted({k.rsplit(" ", 1)[0] for k in run if k.endswith(" hso")})
    per_example = [
        math.fsum(run[f"{c} hso"]["correct"][i] - run[f"{c} baseline"]["correct"][i] for c in cells)
        * 100
        / len(cells)
        for i in range(200)
    ]
    want = compare_paired(per_example, [0.0] * 200)
    r = got.primary.result
    assert len(cells) == 9 and r.units == 200 and r.rows == 1800
    assert (r.mean, r.low, r.high, r.p) == pytest.approx((want.mean, want.low, want.high, want.p))
    assert r.p > 0.05  # the pseudo-replicated 1,800 pairs gave p = 0.010
    labels = dict(got.details)
    assert "no " in labels["baseline: accuracy per class"]
    confirmed = rereads.hso_fewshot(RUNS, str(shared_data)).primary
    assert confirmed.result.units == 450 and confirmed.name == "hso2 − plain, n = 2"


def test_degenerate_kinds_are_counted_apart():
    prompt = "Write a summary of this: the cat sat on the mat and then it went out to play."
    kinds = rereads.degenerate_kinds
    assert kinds("", prompt, True) == {
        "empty": True,
        "loop": False,
        "copy": False,
        "truncated": False,
    }
    loop = "go go go go " * 3
    assert kinds(loop, prompt, True)["loop"] and not kinds(loop, prompt, True)["copy"]
    copy = "the cat sat on the mat and then it went out to play"
    assert kinds(copy, prompt, False) == {
        "empty": False,
        "loop": False,
        "copy": True,
        "truncated": True,
    }
    fine = "A cat rested on a rug before going outside."
    assert not any(kinds(fine, prompt, True).values())


def test_the_length_reread_clusters_pairs_by_prompt():
    got = rereads.conditional_length(RUNS, None).primary.result
    assert (got.units, got.rows) == (60, 600)


def test_the_recurrence_reread_clusters_by_article_once_the_run_saves_them(tmp_path):
    base = {"block_nll": [3.0, 3.1, 2.9, 3.3, 3.2, 3.0], "words": 100, "tokens": 130}
    rec = {"block_nll": [2.9, 3.2, 2.7, 3.3, 3.0, 2.95]}
    units = {"eval baseline verdict": [base], "eval recurrent verdict": [rec]}
    path = tmp_path / rereads.RECURRENCE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"units": units}))
    old = rereads.recurrence(tmp_path, None)
    assert old.primary.unit == f"run of {rereads.RECURRENCE_BLOCK} consecutive blocks"
    articles = tmp_path / "articles"
    path = articles / rereads.RECURRENCE
    path.parent.mkdir(parents=True)
    base["block_article"] = [0, 0, 1, 1, 1, 2]
    path.write_text(json.dumps({"units": units}))
    got = rereads.recurrence(articles, None)
    want = compare_paired(rec["block_nll"], base["block_nll"], clusters=base["block_article"])
    assert got.primary.unit == "article" and got.primary.result == want
    assert got.primary.result.units == 3


def test_a_started_preregistered_run_is_undecided_until_it_finishes(tmp_path):
    claim = next(c for c in CLAIMS if c.id == "pointer-ptb")
    assert "no committed per-unit results" in claim_row(claim, tmp_path, None)["why"]
    folder = tmp_path / Path(claim.run).name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"settings": {"seeds": [0]}, "units": {}}))
    row = claim_row(claim, tmp_path, None)
    assert row["verdict"] == "undecided" and row["effect"] is None
    assert row["why"] == "its run has not finished; an interim look decides nothing"


def test_reproduce_claims_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "out"
    empty = tmp_path / "runs"
    empty.mkdir()
    assert main(["reproduce", "claims", "--output", str(out), "--runs", str(empty)]) == 0
    rows = json.loads((out / "claims.json").read_text())
    assert [r["id"] for r in rows] == [c.id for c in CLAIMS]
    assert all(set(FIELDS) <= set(r) and r["verdict"] in VERDICTS for r in rows)
    said = capsys.readouterr().out
    assert f"{len(rows)} claims: " in said and (out / "claims.md").read_text().startswith(
        "# Claims and verdicts"
    )
    assert main(["reproduce", "claims", "--output", str(out), "--runs", str(tmp_path / "no")]) == 2
    assert "no runs folder" in capsys.readouterr().err


def test_docs_claims_md_is_the_commands_output(tmp_path, shared_data):
    """docs/results/claims.md is written by the command, never by hand."""
    from gencraft.studies.claims_report import PAGES

    for page in PAGES:  # the pages' claims blocks too
        (tmp_path / page).write_text((ROOT / "docs/results" / page).read_text())
    rows = registry.claim_rows(RUNS, str(shared_data))
    registry.write_claims(rows, tmp_path)
    for name in ("claims.md", "claims.json", *PAGES):
        assert (tmp_path / name).read_text() == (ROOT / "docs/results" / name).read_text(), name
