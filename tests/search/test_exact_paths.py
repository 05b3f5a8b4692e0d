"""The paths of exact search that the other search tests do not reach (mutmut's survivors in
search/exact.py): a batch of a wrapper whose state follows rows in blocks (FAME)
searched row by row, the bytes of the caches that nodes keep for their later children, and a
search deeper than Python's recursion limit."""

from __future__ import annotations

import math
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from method_testing import small_fame, small_llama

from gencraft.search import exact_mode, exact_mode_batch


class _NoRepeat:
    """A row-dependent processor: bans the row's last token (its own, not row 0's)."""

    def __call__(self, input_ids, scores):
        out = scores.clone()
        out[torch.arange(len(scores)), input_ids[:, -1]] = -float("inf")
        return out


@pytest.fixture(scope="module")
def fame():
    return small_fame(3, vocab=7)


@settings(max_examples=6, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=2, max_size=3),
    seeds=st.lists(st.none() | st.lists(st.integers(1, 2), min_size=2, max_size=2), min_size=3),
    max_nodes=st.none() | st.integers(2, 12),
    eos=st.sampled_from([0, [0, 6]]),
)
def test_a_fame_batch_is_searched_row_by_row_as_each_row_alone(
    fame, prompts, seeds, max_nodes, eos
):
    """FAME's source state follows rows in blocks, so a batch falls back to one search per row:
    each row's result (tokens, score, exactness, nodes) is that row's own search, with its own
    prompt, mask, seed, EOS set, forced length, budget and processor."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(eos_token_id=eos, max_new_tokens=3, length=2, max_nodes=max_nodes)
    procs = [_NoRepeat()]
    got = exact_mode_batch(
        fame, ids, mask, initial=seeds[: len(prompts)], logits_processor=procs, **kw
    )
    assert len(got) == len(prompts)
    for p, seed, r in zip(prompts, seeds, got, strict=False):
        alone = exact_mode(fame, torch.tensor([p]), initial=seed, logits_processor=procs, **kw)
        assert (r.tokens, r.exact, r.nodes) == (alone.tokens, alone.exact, alone.nodes)
        assert r.log_prob == pytest.approx(alone.log_prob, rel=1e-6, abs=1e-5)  # padded or not
        if r.tokens:  # else the budget ran out before an output of length 2
            assert len(r.tokens) == 2 and r.tokens[0] != p[-1] and r.tokens[0] != r.tokens[1]


def _expected_peak(calls: list[int], prompt: int, per_position: int) -> int:
    """The most key/value bytes a DFS holds, from the order it stepped its nodes (the cache
    length each child was stepped from): at a node of depth d, its path's slices and its own
    full cache, (P + d) positions each, plus, for every ancestor whose second or later child
    leads to it, the full cache that ancestor rebuilt for those children."""
    path: list[list[int]] = [[0, 0]]  # per depth: [children stepped so far, kept bytes]
    peak = 2 * prompt * per_position
    for length in calls:
        depth = length - prompt  # the parent's
        parent = path[depth]
        parent[0] += 1
        kept = parent[1] + (length * per_position if parent[0] >= 2 else 0)
        path = [*path[: depth + 1], [0, kept]]
        peak = max(peak, 2 * (length + 1) * per_position + kept)
    return peak


@settings(max_examples=15, deadline=None)
@given(
    prompt=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    model_seed=st.integers(0, 3),
    new=st.integers(1, 4),
    forced=st.booleans(),
    max_nodes=st.none() | st.integers(1, 40),
)
def test_peak_kv_bytes_counts_the_caches_kept_for_later_children(
    prompt, model_seed, new, forced, max_nodes
):
    """``peak_kv_bytes`` equals the bytes a DFS of this shape holds, computed from the order the
    model was stepped (a forward hook), on searches wide enough that nodes expand a second
    child and deep ones hold several kept caches at once."""
    model = small_llama(model_seed, vocab=6)
    cfg = model.config
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 8 * 4
    calls: list[int] = []

    def hook(_module, _args, kwargs):
        cache = kwargs.get("past_key_values")
        if cache is not None and cache.get_seq_length() > 0:
            calls.append(cache.get_seq_length())

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        r = exact_mode(
            model,
            torch.tensor([prompt]),
            eos_token_id=0,
            max_new_tokens=new,
            length=new if forced else None,
            max_nodes=max_nodes,
        )
    finally:
        handle.remove()
    assert len(calls) == r.nodes - 1
    assert r.peak_kv_bytes == _expected_peak(calls, len(prompt), per_position)


def test_peak_kv_bytes_of_a_wide_search_is_above_one_path():
    """A search that expands second children holds their parents' rebuilt caches too."""
    model = small_llama(0, vocab=6)
    per_position = 2 * 2 * 1 * 8 * 4
    r = exact_mode(model, torch.tensor([[1, 3, 4]]), eos_token_id=0, max_new_tokens=4, length=4)
    assert r.nodes > 5  # not one path
    assert r.peak_kv_bytes > 2 * (3 + 4) * per_position


def test_a_search_deeper_than_the_recursion_limit_runs_and_leaves_the_limit_as_it_was():
    """Each level of the DFS is a generator frame: a forced length of 300 under a recursion
    limit of 150 needs the limit raised for the search, and put back after it."""
    model = small_llama(0, vocab=5, context=400)
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(150)
    try:
        r = exact_mode(
            model,
            torch.tensor([[1, 3, 4]]),
            eos_token_id=0,
            max_new_tokens=300,
            length=300,
            max_nodes=301,
        )
        assert sys.getrecursionlimit() == 150
    finally:
        sys.setrecursionlimit(before)
    assert len(r.tokens) == 300 and not r.exact and r.nodes == 301


class _TwoRowStepper:
    """A hand-written Stepper holding two inputs and no ``step_ragged``."""

    vocab_size, batch_size = 3, 2

    def start(self):
        from gencraft.search import StepOutput

        return StepOutput(torch.full((2, 3), 1 / 3).log(), None)


def test_a_hand_written_stepper_of_several_inputs_without_step_ragged_is_refused():
    with pytest.raises(Exception) as e:
        exact_mode_batch(_TwoRowStepper(), eos_token_id=0, max_new_tokens=2)
    assert str(e.value) == (
        "exact_mode_batch needs step_ragged on a Stepper of 2 inputs (each row's hypotheses "
        "stepped with caches of their own); give it one input at a time"
    )


def _base_calls(model, base, prompts, **kw):
    """(results, forward calls of ``base``) of one batched exact search over ``prompts``."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    calls = [0]
    handle = base.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        got = exact_mode_batch(model, ids, mask, eos_token_id=0, **kw)
    finally:
        handle.remove()
    return got, calls[0]


@pytest.mark.parametrize("wrapper", ["none", "pointer", "fame"])
def test_a_batch_steps_every_unfinished_row_in_one_call_unless_rows_must_go_alone(wrapper, fame):
    """A plain model and the pointer head (a wrapper that steps itself) step the rows together:
    one call starts them all and each later call expands one node of every unfinished row,
    so the calls are the largest row's node count. FAME's wrapper goes row by row: the calls
    are the rows' node counts summed."""
    from gencraft.pointer import PointerSentinelHead

    prompts = [[1, 3, 4], [2], [5, 5, 2, 1]]
    if wrapper == "fame":
        model, base = fame, fame.base
    else:
        base = small_llama(1, vocab=6)
        model = base if wrapper == "none" else PointerSentinelHead(base, window=4).eval()
    got, calls = _base_calls(model, base, prompts, max_new_tokens=3, length=2)
    nodes = [r.nodes for r in got]
    assert len(set(nodes)) > 1  # rows that finish at different calls
    assert calls == (sum(nodes) if wrapper == "fame" else max(nodes))
    for p, r in zip(prompts, got, strict=True):  # and each row is its own search
        alone = exact_mode(model, torch.tensor([p]), eos_token_id=0, max_new_tokens=3, length=2)
        assert (r.tokens, r.nodes) == (alone.tokens, alone.nodes)
        assert r.log_prob == pytest.approx(alone.log_prob, rel=1e-6, abs=1e-5)


_WITH_EOS = "length_includes_eos: the EOS alone is 1"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(length=0, length_includes_eos=True), f"length=0 with {_WITH_EOS}"),
        (dict(max_new_tokens=-1), "max_new_tokens must be >= 0, got -1"),
        (dict(length=4), "length must be in [0, max_new_tokens=3], got 4"),
        (dict(length=-1), "length must be in [0, max_new_tokens=3], got -1"),
        (dict(max_nodes=0), "max_nodes must be >= 1, got 0"),
    ],
)
def test_lengths_and_budgets_outside_their_range_are_named_word_for_word(kw, message):
    model = small_llama(0, vocab=6)
    kw = {"max_new_tokens": 3, **kw}
    with pytest.raises(Exception) as e:
        exact_mode(model, torch.tensor([[1, 3]]), eos_token_id=0, **kw)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("kw", "tokens"),
    [
        (dict(max_new_tokens=0), 0),
        (dict(max_new_tokens=3, length=0), 0),
        (dict(max_new_tokens=3, length=1, length_includes_eos=True), 0),
        (dict(max_new_tokens=3, length=2, length_includes_eos=True), 1),
        (dict(max_new_tokens=3, length=3), 3),
        (dict(max_new_tokens=3, length=3, max_nodes=1), None),
    ],
)
def test_lengths_and_budgets_at_their_bounds_are_accepted(kw, tokens):
    """The smallest and largest legal values: an output of exactly ``tokens`` tokens (a budget
    of one node expands only the root: no output of length 3 is found)."""
    model = small_llama(0, vocab=6)
    t0 = time.perf_counter()
    r = exact_mode(model, torch.tensor([[1, 3]]), eos_token_id=0, **kw)
    assert 0 < r.seconds <= time.perf_counter() - t0
    if tokens is None:
        assert r.exact is False and r.nodes == 1 and r.tokens == []
        assert r.log_prob == -float("inf")
    else:
        assert r.exact is True and len(r.tokens) == tokens


def test_a_search_that_fills_the_models_context_exactly_is_accepted():
    """The deepest node's forward covers prompt + max_new_tokens positions: a search that fills
    a 16-position model exactly runs, and one token more is refused before any work."""
    model = small_llama(0, vocab=6, context=16)
    ids = torch.tensor([[1, 3, 4]])
    r = exact_mode(model, ids, eos_token_id=0, max_new_tokens=13, length=13, max_nodes=14)
    assert len(r.tokens) == 13
    r = exact_mode(model, torch.arange(1, 16)[None] % 6, eos_token_id=0, max_new_tokens=1, length=1)
    assert len(r.tokens) == 1  # one token after 15: the smallest search fills 16 too
    with pytest.raises(Exception, match="exceeds the model's context of 16"):
        exact_mode(model, ids, eos_token_id=0, max_new_tokens=14, length=14, max_nodes=15)


def test_a_fame_batch_without_a_mask_is_searched_row_by_row(fame):
    prompts = torch.tensor([[1, 3, 4], [2, 5, 5]])
    got = exact_mode_batch(fame, prompts, eos_token_id=0, max_new_tokens=2, length=2)
    alone = [exact_mode(fame, p[None], eos_token_id=0, max_new_tokens=2, length=2) for p in prompts]
    assert [r.tokens for r in got] == [r.tokens for r in alone]
    assert [r.nodes for r in got] == [r.nodes for r in alone]


class _FlatRows:
    """A hand-written Stepper of several inputs with ``step_ragged``: a real model's caches, and
    each row its own flat distribution, P(EOS) = ``p_eos[r]`` and the rest shared by 3 tokens."""

    vocab_size = 4

    def __init__(self, p_eos: list[float]) -> None:
        from gencraft.models.stepping import HFStepper

        self.batch_size = len(p_eos)
        ids = torch.tensor([[1, 3]] * self.batch_size)
        self.inner = HFStepper(small_llama(0, vocab=4), ids, max_new_tokens=8)
        self.flat = torch.tensor([[p, (1 - p) / 3, (1 - p) / 3, (1 - p) / 3] for p in p_eos]).log()

    def start(self):
        from gencraft.search import StepOutput

        return StepOutput(self.flat, self.inner.start().cache)

    def split(self, cache):
        return self.inner.split(cache)

    def step(self, tokens, cache):
        from gencraft.search import StepOutput

        return StepOutput(self.flat[:1], self.inner.step(tokens, cache).cache)

    def step_ragged(self, tokens, caches, rows):
        from gencraft.search import StepOutput

        outs = self.inner.step_ragged(tokens, caches, rows)
        pairs = zip(rows.tolist(), outs, strict=True)
        return [StepOutput(self.flat[r : r + 1], o.cache) for r, o in pairs]


def test_a_hand_written_stepper_with_step_ragged_searches_its_rows_together():
    """P(EOS) = 0.4: the empty output beats every child at once (1 node); 0.1: the three
    children are expanded and their children pruned (4 nodes), as each row alone."""
    got = exact_mode_batch(_FlatRows([0.4, 0.1]), eos_token_id=0, max_new_tokens=6)
    assert [(r.tokens, r.nodes, r.exact) for r in got] == [([], 1, True), ([], 4, True)]
    assert [r.log_prob for r in got] == pytest.approx([math.log(0.4), math.log(0.1)])
