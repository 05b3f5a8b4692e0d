"""Search errors against model errors: ``search_errors`` against brute force on tiny
vocabularies, where every mode is provable; its verdicts, bounds and tables; the count tests
it reports with."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from method_testing import small_llama

from gencraft.errors import GencraftError
from gencraft.metrics.stats import sign_test, wilson_interval
from gencraft.search import beam_search, exact_mode, search_errors
from gencraft.search.errors import (
    SearchErrorRow,
    SearchOutcome,
    budget_table,
    classify,
    empty_bounds,
    error_table,
    length_table,
    score_differences,
)

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_MODELS: dict = {}


def _model(seed: int):
    if seed not in _MODELS:
        _MODELS[seed] = small_llama(seed, vocab=4)
    return _MODELS[seed]


def _batch(prompts: list[list[int]]):
    width = max(map(len, prompts))
    ids = [[0] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def _brute_mode(model, prompt: list[int], n: int) -> tuple[list[int], float]:
    """The best output (EOS 0 excluded) of at most n tokens, by scoring every one."""
    best, arg = -math.inf, None
    for size in range(n + 1):
        for seq in itertools.product([1, 2, 3], repeat=size):
            ids = torch.tensor([prompt + list(seq) + [0]])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].double(), -1)
            p = len(prompt)
            s = sum(lp[p - 1 + i, t].item() for i, t in enumerate([*seq, 0]))
            if s > best:
                best, arg = s, list(seq)
    return arg, best


def _expected(hyp, proven: bool, mode_lp: float) -> str:
    if not hyp.finished:
        return "cut"
    if not proven:
        return "unknown"
    return "equal" if abs(hyp.score - mode_lp) <= 1e-4 else "below"


prompts_st = st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=20, **SETTINGS)
@given(
    seed=st.integers(0, 5),
    prompts=prompts_st,
    max_new=st.integers(0, 3),
    beams=st.sampled_from([(1,), (1, 2), (3, 1), (2, 4)]),
)
def test_search_errors_equal_brute_force_when_every_mode_is_provable(seed, prompts, max_new, beams):
    model = _model(seed)
    ids, mask = _batch(prompts)
    rows = search_errors(
        model, ids, mask, beams=beams, max_nodes=None, max_new_tokens=max_new, eos_token_id=0
    )
    assert len(rows) == len(prompts)
    for row, p in zip(rows, prompts, strict=True):
        tokens, lp = _brute_mode(model, p, max_new)
        assert row.proven and row["proven"] is True
        assert row.mode_tokens == tokens
        assert row.mode_logprob == pytest.approx(lp, abs=1e-4)
        assert row.mode_empty == (tokens == []) and row.best_empty == (tokens == [])
        assert sorted(row.searches) == sorted(beams)
        for k in beams:
            top = beam_search(
                model, torch.tensor([p]), num_beams=k, max_new_tokens=max_new + 1, eos_token_id=0
            )[0]
            got = row.searches[k]
            assert got.tokens == top.tokens and got.finished == top.finished
            assert got.logprob == pytest.approx(top.score, abs=1e-5)
            assert got.error == _expected(top, True, lp)
            assert got["error"] == got.error


def _best_finished(tops) -> list[int] | None:
    done = [t for t in tops if t.finished]
    return max(done, key=lambda t: t.score).tokens if done else None


@settings(max_examples=15, **SETTINGS)
@given(
    seed=st.integers(0, 5),
    prompts=prompts_st,
    max_nodes=st.integers(1, 12),
    seeded=st.booleans(),
)
def test_a_node_budget_leaves_rows_unproven_as_exact_mode_does_alone(
    seed, prompts, max_nodes, seeded
):
    """Each row's exact search is exact_mode's alone, seeded (by default) with the best
    finished beam output of the row."""
    model = _model(seed)
    ids, mask = _batch(prompts)
    rows = search_errors(
        model,
        ids,
        mask,
        beams=(1, 2),
        max_nodes=max_nodes,
        max_new_tokens=3,
        eos_token_id=0,
        seed=seeded,
    )
    for row, p in zip(rows, prompts, strict=True):
        tops = [
            beam_search(model, torch.tensor([p]), num_beams=k, max_new_tokens=4, eos_token_id=0)[0]
            for k in (1, 2)
        ]
        alone = exact_mode(
            model,
            torch.tensor([p]),
            eos_token_id=0,
            max_new_tokens=3,
            max_nodes=max_nodes,
            initial=_best_finished(tops) if seeded else None,
        )
        assert row.proven == alone.exact and row.nodes == alone.nodes
        assert row.mode_tokens == alone.tokens
        assert row.mode_empty == (alone.exact and not alone.tokens)
        for k, top in zip((1, 2), tops, strict=True):
            assert row.searches[k].error == _expected(top, alone.exact, alone.log_prob)
    # the empty modes, by brute force, lie inside the bounds the rows give
    truth = sum(_brute_mode(model, p, 3)[0] == [] for p in prompts)
    low, high = empty_bounds(rows)
    assert low <= truth <= high


@settings(max_examples=15, **SETTINGS)
@given(seed=st.integers(0, 5), prompts=prompts_st)
def test_the_seed_bound_makes_a_cut_search_no_worse_than_the_best_beam(seed, prompts):
    """Cut at its first node, a seeded search still holds the best finished beam output (the
    bound it started from); unseeded, it holds only the empty output."""
    model = _model(seed)
    ids, mask = _batch(prompts)
    kw = dict(beams=(1, 3), max_nodes=1, max_new_tokens=3, eos_token_id=0)
    for row, bare in zip(
        search_errors(model, ids, mask, **kw),
        search_errors(model, ids, mask, seed=False, **kw),
        strict=True,
    ):
        assert bare.mode_tokens == [] and bare.nodes == 1
        done = [o for o in row.searches.values() if o.finished]
        if not done:  # nothing to seed with
            assert row.to_json() == {**bare.to_json(), "seconds": row.seconds}
            continue
        best = max(done, key=lambda o: o.logprob)
        assert row.mode_logprob == pytest.approx(best.logprob, abs=1e-4)
        assert row.mode_tokens == best.tokens and row.nodes == 1 + len(best.tokens)


def test_the_drawn_models_make_search_errors_and_ties():
    """The brute-force check above means something only if both verdicts occur."""
    kinds = set()
    for seed in range(6):
        ids, mask = _batch([[1], [2, 3], [3, 1, 2]])
        for row in search_errors(
            _model(seed), ids, mask, beams=(1, 2), max_nodes=None, max_new_tokens=3, eos_token_id=0
        ):
            kinds |= {o.error for o in row.searches.values()}
    assert {"below", "equal"} <= kinds


def test_the_seed_is_the_best_finished_beam_where_widths_disagree():
    """Rows where greedy and beam 3 both finish with different scores: the seed (what a
    search cut at once holds) is the higher of the two, never the lower."""
    disagree = 0
    every = [list(p) for n in (1, 2, 3) for p in itertools.product([1, 2, 3], repeat=n)]
    for seed in range(6):
        ids, mask = _batch(every)
        kw = dict(beams=(1, 3), max_new_tokens=5, eos_token_id=0)
        for row in search_errors(_model(seed), ids, mask, max_nodes=1, **kw):
            g, b = row.searches[1], row.searches[3]
            if g.finished and b.finished and abs(g.logprob - b.logprob) > 1e-3 and g.tokens:
                disagree += 1
                assert row.mode_logprob == pytest.approx(max(g.logprob, b.logprob), abs=1e-4)
    assert disagree >= 4


def test_classify_names_each_verdict_and_refuses_an_output_above_a_proven_mode():
    assert classify(-3.0, False, True, -1.0) == "cut"
    assert classify(-3.0, True, False, -1.0) == "unknown"
    assert classify(-1.00005, True, True, -1.0) == "equal"
    assert classify(-1.0002, True, True, -1.0) == "below"
    assert classify(-1.0002, True, True, -1.0, tol=1e-3) == "equal"
    with pytest.raises(GencraftError, match="above the proven mode"):
        classify(-0.9, True, True, -1.0)


def test_search_errors_refuses_bad_widths_and_limits():
    model = _model(0)
    ids = torch.tensor([[1, 2]])
    for beams in [(), (0,), (2, 2)]:
        with pytest.raises(GencraftError, match="beams must be distinct widths >= 1"):
            search_errors(model, ids, beams=beams, max_nodes=5, max_new_tokens=2)
    with pytest.raises(GencraftError, match="max_new_tokens must be >= 0"):
        search_errors(model, ids, max_nodes=5, max_new_tokens=-1)


def _row(proven, mode_lp, mode_tokens, outs):
    searches = {
        k: SearchOutcome(toks, lp, fin, classify(lp, fin, proven, mode_lp))
        for k, (toks, lp, fin) in outs.items()
    }
    return SearchErrorRow(
        proven, proven and not mode_tokens, mode_lp, mode_tokens, not mode_tokens, 5, 0.1, searches
    )


def test_error_table_counts_errors_over_proven_rows_and_bounds_over_all():
    rows = [
        _row(True, -1.0, [], {1: ([2], -2.0, True), 4: ([], -1.0, True)}),  # greedy below
        _row(True, -1.5, [3], {1: ([3], -1.5, True), 4: ([3], -1.5, True)}),  # both equal
        _row(False, -1.0, [], {1: ([2], -3.0, True), 4: ([2, 2], -9.0, False)}),  # known/cut
        _row(False, -4.0, [1], {1: ([2], -3.0, True), 4: ([], -2.0, True)}),  # unjudged
    ]
    table = {r["search"]: r for r in error_table(rows, {"greedy": 20.0, "exact": 1.0})}
    lo, hi = wilson_interval(1, 2)
    assert table["greedy"]["search errors %"] == f"50.0 [{100 * lo:.1f}, {100 * hi:.1f}]"
    # greedy: 1 below a proven mode + 1 below the best found, 1 not judged: 2 to 3 of 4
    assert table["greedy"]["search errors % (bounds, all)"] == "50.0 to 75.0"
    assert table["beam 4"]["search errors % (bounds, all)"] == "0.0 to 50.0"
    assert table["beam 4"]["empty %"] == "50.0" and table["beam 4"]["cut %"] == "25.0"
    assert table["greedy"]["task score"] == 20.0 and table["exact"]["task score"] == 1.0
    assert table["exact"]["proven %"] == "50.0" and table["exact"]["n"] == 4
    # the unproven row whose best found is [1] has a non-empty mode; the other may be empty
    assert table["exact"]["empty % (bounds, all)"] == "25.0 to 50.0"
    assert table["exact"]["empty %"].startswith("50.0 [")
    bins = length_table(rows, [3, 8, 11, 30], [0, 8, 16, 64])  # 8 opens the second bin
    assert [b["n"] for b in bins] == [1, 2, 1]
    assert bins[1]["proven %"] == "50.0" and bins[1]["empty mode %"].startswith("0.0 [")
    assert bins[0]["greedy errors %"].startswith("100.0 [")
    assert bins[2]["empty mode %"] == "-"


def test_rows_survive_json():
    row = _row(True, -1.0, [2], {1: ([2], -1.0, True), 3: ([1, 2], -2.5, False)})
    back = SearchErrorRow.from_json(row.to_json())
    assert back == row and set(back.keys()) >= {"proven", "mode_empty", "searches"}
    with pytest.raises(KeyError):
        row["nope"]


@given(st.integers(0, 12).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
@settings(max_examples=40, **SETTINGS)
def test_sign_test_equals_counting_every_sequence(counts):
    wins, n = counts
    losses = n - wins
    low = min(wins, losses)
    extreme = sum(min(sum(s), n - sum(s)) <= low for s in itertools.product([0, 1], repeat=n))
    assert sign_test(wins, losses) == pytest.approx(min(1.0, extreme / 2**n) if n else 1.0)


def test_wilson_interval_matches_published_values_and_stays_inside():
    # Newcombe (1998), Table I: 0/10 -> 0 to 0.2775, 1/29 -> 0.0061 to 0.1718
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=1e-4)
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for n in range(1, 30):
        for k in range(n + 1):
            lo, hi = wilson_interval(k, n)
            assert 0 <= lo <= k / n <= hi <= 1
    with pytest.raises(GencraftError, match="0 <= k <= n"):
        wilson_interval(5, 3)
    with pytest.raises(GencraftError, match="counts >= 0"):
        sign_test(-1, 3)


def test_cli_prints_a_line_per_prompt_then_the_table(capsys):
    from gencraft.cli.main import main

    args = ["search", "errors", "hi", "a restaurant", "--model", "tiny-llama", "--beams", "1", "3"]
    assert main([*args, "--max-new-tokens", "3", "--max-nodes", "40"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["input"] for x in lines[:2]] == [0, 1]
    assert all(set(x["searches"]) == {"1", "3"} for x in lines[:2])
    assert [x["search"] for x in lines[2:]] == ["greedy", "beam 3", "exact"]
    assert lines[-1]["n"] == 2
    assert main(["search", "errors", "hi", "--model", "no-such-model", "--beams", "2", "2"]) == 2
    assert "beams must be distinct widths" in capsys.readouterr().err


def _spy_seed(monkeypatch) -> list:
    """Record the ``seed`` each call of the real ``search_errors`` gets."""
    import gencraft.search.errors as errors

    seen, real = [], errors.search_errors

    def spy(*a, **kw):
        seen.append(kw["seed"])
        return real(*a, **kw)

    monkeypatch.setattr(errors, "search_errors", spy)
    return seen


def test_cli_passes_the_seed_flag_through(capsys, monkeypatch):
    from gencraft.cli.main import main

    seen = _spy_seed(monkeypatch)
    args = ["search", "errors", "hi", "--model", "tiny-llama", "--beams", "1", "3"]
    assert main([*args, "--max-new-tokens", "3", "--max-nodes", "1", "--no-seed-bound"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (line["nodes"], line["mode"]) == (1, "")  # unseeded, cut at once: the root's output
    assert main([*args, "--max-new-tokens", "3", "--max-nodes", "1"]) == 0
    assert seen == [False, True]


def test_reproduce_search_errors_reports_both_tasks_and_resumes(shared_data, tmp_path):
    from gencraft.studies.runner import reproduce

    kw = dict(scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)})
    report = reproduce("search-errors", **kw).read_text()
    assert "**xsum** (4 prompts, 1.0 references each; task score: rougeL)" in report
    # E2E's BLEU against every reference of an MR, not the first alone
    e2e = next(x for x in report.splitlines() if x.startswith("**e2e** (2 prompts, "))
    assert float(e2e.split(", ")[1].split()[0]) > 1 and e2e.endswith("task score: BLEU)")
    assert "| greedy |" in report and "| beam 2 |" in report and "| exact |" in report
    assert "| node budget |" in report and "| 5 |" in report and "| 20 |" in report
    assert ", seeded with the best finished beam output," in report
    assert "Size: 6 prompts, exact search cut at 20 nodes. Against Stahlberg & Byrne's" in report
    header = next(x for x in report.splitlines() if x.startswith("| search |"))
    assert "| empty % (bounds, all) |" in header  # the exact line's column, in every table
    # the paired table: per task, each search against exact over all prompts (4 XSum, 2 E2E)
    paired = [x for x in report.splitlines() if "| exact | all |" in x]
    assert len(paired) == 4 and sum("| exact | all | 4 |" in x for x in paired) == 2
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results["units"]) == ["e2e MR #0-1", "xsum, 10 words #0-1", "xsum, 20 words #0-1"]
    units = results["units"]
    units["e2e MR #0-1"][0]["outputs"]["exact"] = "KEPT"
    del units["xsum, 10 words #0-1"]
    (tmp_path / "results.json").write_text(json.dumps(results))
    reproduce("search-errors", **kw)
    again = json.loads((tmp_path / "results.json").read_text())["units"]
    assert again["e2e MR #0-1"][0]["outputs"]["exact"] == "KEPT"
    assert len(again["xsum, 10 words #0-1"]) == 2
    with pytest.raises(GencraftError, match=r"budgets \[5, 30\] must be given and <= max_nodes"):
        reproduce(
            "search-errors", scale="tiny", output=tmp_path / "b", overrides={"budgets": (5, 30)}
        )


def test_reproduce_search_errors_can_leave_exact_search_unseeded(
    shared_data, tmp_path, monkeypatch
):
    from gencraft.studies.runner import reproduce

    seen = _spy_seed(monkeypatch)
    overrides = {"data_dir": str(shared_data), "seed_bound": False, "max_nodes": 1, "budgets": (1,)}
    report = reproduce("search-errors", scale="tiny", output=tmp_path, overrides=overrides)
    assert "exact search with at most 1 nodes per prompt, unseeded," in report.read_text()
    units = json.loads((tmp_path / "results.json").read_text())["units"]
    rows = [e["row"] for unit in units.values() for e in unit]
    assert len(rows) == 6 and {(r["nodes"], tuple(r["mode_tokens"])) for r in rows} == {(1, ())}
    assert seen == [False] * 3  # one call per batch


@settings(max_examples=6, **SETTINGS)
@given(seed=st.integers(0, 5), prompts=prompts_st)
def test_one_run_gives_the_proven_share_at_every_smaller_budget(seed, prompts):
    """What budget_table reads off one run is what a run at each smaller budget proves."""
    model = _model(seed)
    ids, mask = _batch(prompts)
    kw = dict(beams=(1,), max_new_tokens=3, eos_token_id=0)
    big = search_errors(model, ids, mask, max_nodes=60, **kw)
    budgets = [1, 3, 6, 12, 30]
    table = budget_table(big, budgets)
    truth = sum(_brute_mode(model, p, 3)[0] == [] for p in prompts)
    for budget, line in zip(budgets, table, strict=True):
        small = search_errors(model, ids, mask, max_nodes=budget, **kw)
        assert [r.proven and r.nodes <= budget for r in big] == [r.proven for r in small]
        proven = [r for r in small if r.proven]
        assert line["proven %"].startswith(f"{100 * len(proven) / len(prompts):.1f} [")
        assert line["empty mode % (of proven)"] == error_table(small)[-1]["empty %"]
        assert line["n"] == len(prompts)
        # every unproven prompt may have an empty mode: the truth lies within the bounds
        parts = line["empty mode % (bounds, all)"].split(" to ")  # one number when equal
        low, high = float(parts[0]), float(parts[-1])
        empty = sum(r.mode_empty for r in proven)
        assert (low, high) == (
            round(100 * empty / len(prompts), 1),
            round(100 * (empty + len(prompts) - len(proven)) / len(prompts), 1),
        )
        assert low - 0.05 <= 100 * truth / len(prompts) <= high + 0.05  # printed to 0.1
        # read at a run's own budget, the bounds are that run's (its best outputs found)
        (own,) = budget_table(small, [budget], max_nodes=budget)
        assert own["empty mode % (bounds, all)"] == error_table(small)[-1]["empty % (bounds, all)"]


def test_a_time_budget_stops_exact_search_like_a_node_budget():
    """max_seconds=0 stops every row before its first expansion (unproven, the root only);
    a generous one changes nothing; a negative one is refused."""
    model = _model(1)
    ids, mask = _batch([[1, 2], [3]])
    kw = dict(beams=(1,), max_nodes=None, max_new_tokens=3, eos_token_id=0, seed=False)
    stopped = search_errors(model, ids, mask, max_seconds=0.0, **kw)
    assert [(r.proven, r.nodes) for r in stopped] == [(False, 1), (False, 1)]
    assert all(r.searches[1].error in ("unknown", "cut") for r in stopped)
    free = search_errors(model, ids, mask, **kw)
    timed = search_errors(model, ids, mask, max_seconds=600.0, **kw)

    def strip(rows):
        return [{**r.to_json(), "seconds": 0} for r in rows]

    assert strip(timed) == strip(free) and all(r.proven for r in timed)
    with pytest.raises(GencraftError, match="max_seconds must be >= 0, got -1"):
        exact_mode(model, torch.tensor([[1]]), eos_token_id=0, max_new_tokens=2, max_seconds=-1)


WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.lists(st.sampled_from(WORDS), max_size=5), min_size=3, max_size=3),
            st.lists(
                st.lists(st.sampled_from(WORDS), min_size=1, max_size=5), min_size=1, max_size=2
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_score_differences_pair_each_search_with_exact_prompt_by_prompt(drawn):
    """Each line's mean, interval and counts are those of the per-prompt ROUGE-L differences
    computed one prompt at a time with rouge_score, over all prompts and the proven ones."""
    from rouge_score import rouge_scorer

    from gencraft.metrics.stats import paired_t

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    names = ["greedy", "beam 4", "exact"]
    outputs = [{n: " ".join(o) for n, o in zip(names, outs, strict=True)} for outs, _, _ in drawn]
    refs = [[" ".join(r) for r in rs] for _, rs, _ in drawn]
    proven = [p for _, _, p in drawn]
    table = score_differences(outputs, refs, proven)
    assert [(r["search"], r["prompts"]) for r in table] == [
        (n, w) for n in names[:2] for w in ("all", "proven")
    ]
    for line in table:
        idx = [i for i in range(len(drawn)) if line["prompts"] == "all" or proven[i]]

        def rl(i, n):
            return 100 * scorer.score_multi(refs[i], outputs[i][n])["rougeL"].fmeasure

        diffs = [rl(i, line["search"]) - rl(i, "exact") for i in idx]
        assert line["n"] == len(idx) and line["minus"] == "exact"
        assert line["higher"] == sum(d > 0 for d in diffs)
        assert line["lower"] == sum(d < 0 for d in diffs)
        if not idx:
            assert line["RL diff"] == line["95% interval"] == line["p"] == "-"
            continue
        t = paired_t(diffs)
        assert line["RL diff"] == round(t["mean"], 2) and line["p"] == float(f"{t['p']:.3g}")
        if len(idx) > 1:
            assert line["95% interval"] == f"[{t['low']:.2f}, {t['high']:.2f}]"


def test_score_differences_refuse_unparallel_inputs():
    with pytest.raises(GencraftError, match="one of each per prompt"):
        score_differences([{"exact": "a"}], [["a"], ["b"]], [True])
