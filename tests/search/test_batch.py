"""Batched search: every row of ``beam_search_batch`` / ``exact_mode_batch`` equals the
single-input search on that row alone, over drawn models, batch sizes, padding, beams, EOS sets
and length settings; batched exact search equals brute force; ``generate(custom_generate=...)``
equals ``generate``'s own beam search on padded batches, logits processors included."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from method_testing import small_llama
from transformers import LogitsProcessor

from gencraft.errors import GencraftError
from gencraft.models.architectures import tiny_architecture
from gencraft.search import (
    beam_search,
    beam_search_batch,
    beam_search_tensors,
    exact_mode,
    exact_mode_batch,
)
from gencraft.search import custom_generate as cg

V = 12
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_MODELS: dict = {}


def _model(kind: str, seed: int):
    """Tiny random models with peaked distributions (search differs from greedy, ties are
    rare), cached per (kind, seed)."""
    key = (kind, 0 if kind.startswith("copy-") else seed)  # one copy model of each kind
    if key not in _MODELS and kind == "peaked-llama":
        # large weights everywhere: attention (and so positions and masks) matters
        _MODELS[key] = small_llama(seed, vocab=V)
        _MODELS[key].generation_config.eos_token_id = 2
    if key not in _MODELS and kind.startswith("copy-"):
        _MODELS[key] = _copy_model(kind.removeprefix("copy-"), 0)
    if key not in _MODELS:
        torch.manual_seed(seed)
        model = tiny_architecture(kind, vocab_size=V, seed=seed)
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(8.0)
        _MODELS[key] = model.eval()
    return _MODELS[key]


def _copy_model(kind: str, seed: int, steps: int = 600):
    """A tiny model trained to copy (models that use their inputs): a BART that
    writes its source then EOS (2), or a Llama that repeats its prompt then EOS, so a row given
    another row's states or positions shows in its output. About 10 s each on 2 cores."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tiny_architecture(kind, vocab_size=V, seed=seed).train()
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(steps):
            n = int(torch.randint(1, 6, (1,), generator=g))
            src = torch.randint(3, V, (32, n), generator=g)
            eos = torch.full((32, 1), 2)
            if model.config.is_encoder_decoder:
                loss = model(input_ids=src, labels=torch.cat([src, eos], 1)).loss
            else:
                ids = torch.cat([src, src, eos], 1)
                loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.generation_config.eos_token_id = 2
    return model.eval()


def test_the_copy_models_copy():
    """They read their inputs: greedy decoding copies most drawn sources and prompts."""
    g = torch.Generator().manual_seed(9)
    src = torch.randint(3, V, (32, 4), generator=g)
    bart = _model("copy-bart", 0)
    out = bart.generate(src, max_new_tokens=6, do_sample=False, num_beams=1, pad_token_id=0)
    assert sum(o[1:5].tolist() == s.tolist() for o, s in zip(out, src, strict=True)) >= 24
    llama = _model("copy-llama", 0)
    mask = torch.ones_like(src)
    out = llama.generate(
        src, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0
    )
    assert sum(o[4:8].tolist() == s.tolist() for o, s in zip(out, src, strict=True)) >= 24


def _batch(prompts: list[list[int]], pad: int = 0, left: bool = True):
    width = max(map(len, prompts))
    ids, mask = [], []
    for p in prompts:
        fill = [pad] * (width - len(p))
        ids.append(fill + p if left else p + fill)
        ones = [1] * len(p)
        mask.append([0] * len(fill) + ones if left else ones + [0] * len(fill))
    return torch.tensor(ids), torch.tensor(mask)


prompts_st = st.lists(
    st.lists(st.integers(3, V - 1), min_size=1, max_size=6), min_size=1, max_size=4
)


class ConstantScorer:
    """log P_clf = a constant: conditional search must choose as plain search does."""

    def __init__(self, num_layers: int, hidden_size: int) -> None:
        self.num_layers, self.hidden_size = num_layers, hidden_size

    def init(self, n):
        return torch.zeros(n, 0)

    def score(self, state, hidden, candidates):
        return torch.full(candidates.shape, -0.3), state

    def reorder(self, state, index):
        return state[index]


class TokenScorer:
    """A deterministic attribute that depends on each hypothesis's hidden state and candidate:
    log P_clf = -|h_last[0]| * (candidate mod 3); it changes which beams survive."""

    def __init__(self, num_layers: int, hidden_size: int) -> None:
        self.num_layers, self.hidden_size = num_layers, hidden_size

    def init(self, n):
        return torch.zeros(n, 0)

    def score(self, state, hidden, candidates):
        h = hidden[:, -1, :1].abs()
        return -h * (candidates % 3).float(), state

    def reorder(self, state, index):
        return state[index]


def _same(got, want, tol=1e-4):
    assert [(h.tokens, h.finished, h.eos_token) for h in got] == [
        (h.tokens, h.finished, h.eos_token) for h in want
    ]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=tol)
    if want and want[0].conditional_score is not None:
        got_c = [h.conditional_score for h in got]
        assert got_c == pytest.approx([h.conditional_score for h in want], abs=tol)


@settings(max_examples=120, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "peaked-llama", "gpt2", "bart", "copy-bart", "copy-llama"]),
    seed=st.integers(0, 2),
    prompts=prompts_st,
    beams=st.integers(1, 4),
    max_new=st.integers(1, 6),
    eos=st.sampled_from([[2], [2, 5]]),
    finished=st.sampled_from(["aside", "on_beam"]),
    force=st.sampled_from([None, 0, 2]),
    clf=st.sampled_from([None, "constant", "token"]),
    k=st.sampled_from([None, 3]),
    scoring=st.sampled_from(
        [(0.0, True), (1.0, False), (2.0, "never"), (-1.0, False), (0.5, True)]
    ),
)
def test_each_row_of_a_batch_equals_the_row_alone(
    kind, seed, prompts, beams, max_new, eos, finished, force, clf, k, scoring
):
    """``scoring``: (length_penalty, early_stopping), generate's stopping rules (aside only)."""
    model = _model(kind, seed)
    ed = model.config.is_encoder_decoder
    ids, mask = _batch(prompts, left=not ed)  # seq2seq sources pad on the right
    if force is not None and force >= max_new:
        force = None
    layers = model.config.num_hidden_layers if not ed else model.config.decoder_layers
    scorer = None
    if clf == "constant":
        scorer = ConstantScorer(layers + 1, model.config.hidden_size)
    elif clf == "token":
        scorer = TokenScorer(layers + 1, model.config.hidden_size)
    kw = dict(
        num_beams=beams,
        max_new_tokens=max_new,
        eos_token_id=eos,
        finished=finished,
        force_length=force,
        classifier=scorer,
        k=k if scorer is not None else None,
        alpha=2.0,
    )
    if finished == "aside":
        kw.update(length_penalty=scoring[0], early_stopping=scoring[1])
    batch = beam_search_batch(model, ids, mask, **kw)
    assert len(batch) == len(prompts)
    for r, p in enumerate(prompts):
        alone = beam_search(model, torch.tensor([p]), **kw)
        _same(batch[r], alone)


def test_beam_search_refuses_a_batch_and_names_the_batch_function():
    model = _model("llama", 0)
    with pytest.raises(GencraftError, match="beam_search_batch"):
        beam_search(model, torch.tensor([[3, 4], [5, 6]]), num_beams=2, max_new_tokens=3)
    with pytest.raises(GencraftError, match="left-padded"):
        beam_search_batch(
            model,
            torch.tensor([[3, 4], [5, 0]]),
            torch.tensor([[1, 1], [1, 0]]),
            num_beams=2,
            max_new_tokens=3,
        )
    with pytest.raises(GencraftError, match="all padding"):
        beam_search_batch(
            model,
            torch.tensor([[3, 4], [0, 0]]),
            torch.tensor([[1, 1], [0, 0]]),
            num_beams=2,
            max_new_tokens=3,
        )


# -- exact search -------------------------------------------------------------------------
def _brute_force(model, prompt: list[int], eos: int, n: int, length: int | None):
    """The best output (EOS excluded) of at most n tokens, by enumerating every one."""
    v = model.config.vocab_size
    best, arg = -math.inf, None
    for size in range(n + 1) if length is None else [length]:
        for seq in itertools.product([t for t in range(v) if t != eos], repeat=size):
            ids = torch.tensor([prompt + list(seq) + [eos]])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].double(), -1)
            p = len(prompt)
            s = sum(lp[p - 1 + i, t].item() for i, t in enumerate([*seq, eos]))
            if s > best:
                best, arg = s, list(seq)
    return arg, best


@settings(max_examples=25, **SETTINGS)
@given(
    seed=st.integers(0, 3),
    prompts=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=3),
    length=st.sampled_from([None, 2]),
)
def test_batched_exact_search_equals_brute_force(seed, prompts, length):
    model = small_llama(seed, vocab=4)
    ids, mask = _batch(prompts)
    found = exact_mode_batch(model, ids, mask, eos_token_id=0, max_new_tokens=3, length=length)
    for r, p in enumerate(prompts):
        tokens, lp = _brute_force(model, p, 0, 3, length)
        assert found[r].exact and found[r].tokens == tokens
        assert found[r].log_prob == pytest.approx(lp, abs=1e-4)


@settings(max_examples=60, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "peaked-llama", "gpt2", "bart", "copy-bart", "copy-llama"]),
    seed=st.integers(0, 2),
    prompts=prompts_st,
    max_new=st.integers(0, 4),
    length=st.sampled_from([None, 1, 3]),
    max_nodes=st.sampled_from([None, 3, 12]),
    eos=st.sampled_from([[2], [2, 5]]),
)
def test_each_row_of_batched_exact_search_equals_the_row_alone(
    kind, seed, prompts, max_new, length, max_nodes, eos
):
    model = _model(kind, seed)
    if length is not None and length > max_new:
        length = None
    ed = model.config.is_encoder_decoder
    ids, mask = _batch(prompts, left=not ed)  # seq2seq sources pad on the right
    kw = dict(eos_token_id=eos, max_new_tokens=max_new, length=length, max_nodes=max_nodes)
    batch = exact_mode_batch(model, ids, mask, **kw)
    for r, p in enumerate(prompts):
        alone = exact_mode(model, torch.tensor([p]), **kw)
        got = batch[r]
        assert (got.tokens, got.exact, got.nodes) == (alone.tokens, alone.exact, alone.nodes)
        assert got.log_prob == pytest.approx(alone.log_prob, abs=1e-4)
        assert got.peak_kv_bytes == alone.peak_kv_bytes  # memory: the row's own, linear


class BanByRow(LogitsProcessor):
    """Reads the row's place in the batch: input i of b (its hypotheses are the i-th block of
    rows) cannot emit ``banned[i]``."""

    def __init__(self, banned: list[int]) -> None:
        self.banned = banned

    def __call__(self, input_ids, scores):
        n = scores.shape[0]
        rows = torch.arange(n) // (n // len(self.banned))
        scores = scores.clone()
        scores[torch.arange(n), torch.tensor(self.banned)[rows]] = float("-inf")
        return scores


class NoEndAfterEven(LogitsProcessor):
    """Reads the row's content: after an even id, no EOS (2 or 5) may come, so whether a
    row's mode can be empty follows from its own prompt."""

    def __call__(self, input_ids, scores):
        even = (input_ids[:, -1] % 2 == 0)[:, None]
        eos = torch.zeros_like(scores, dtype=torch.bool)
        eos[:, [2, 5]] = True
        return scores.masked_fill(even & eos, float("-inf"))


@settings(max_examples=50, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "bart", "copy-bart", "copy-llama"]),
    seed=st.integers(0, 2),
    rows=st.lists(
        st.tuples(
            st.lists(st.integers(3, V - 1), min_size=1, max_size=5),  # the prompt
            st.integers(6, V - 1),  # the token this row may not emit (BanByRow)
            st.one_of(st.none(), st.lists(st.integers(6, V - 1), max_size=3)),  # its seed
        ),
        min_size=1,
        max_size=4,
    ),
    processors=st.sampled_from(["none", "by row", "successor", "both"]),
    max_new=st.integers(1, 3),
    length=st.sampled_from([None, 1, 2]),
    max_nodes=st.sampled_from([None, 12]),
    eos=st.sampled_from([[2], [2, 5]]),
)
def test_each_row_of_exact_search_keeps_its_own_processor_rows_and_seed(
    kind, seed, rows, processors, max_new, length, max_nodes, eos
):
    """Rows that differ in prompt, padding, seed output and what a row-reading processor
    allows: each row's mode, nodes and exactness equal that row searched alone with the
    processor as it acts on that row."""
    model = _model(kind, seed)
    length = length if length is not None and length <= max_new else None
    prompts = [p for p, _, _ in rows]
    banned = [b for _, b, _ in rows]
    # a seed output within the limit (the empty output included), of the forced length if any
    initial = [s if s is None or length is None else (s + [6] * length)[:length] for *_, s in rows]
    initial = [s if s is None else s[:max_new] for s in initial]

    def chain(ban: list[int]) -> list:
        by_row = [BanByRow(ban)] if processors in ("by row", "both") else []
        return by_row + ([NoEndAfterEven()] if processors in ("successor", "both") else [])

    ids, mask = _batch(prompts, left=not model.config.is_encoder_decoder)
    kw = dict(eos_token_id=eos, max_new_tokens=max_new, length=length, max_nodes=max_nodes)
    batch = exact_mode_batch(
        model, ids, mask, initial=initial, logits_processor=chain(banned), **kw
    )
    for r, p in enumerate(prompts):
        alone = exact_mode(
            model,
            torch.tensor([p]),
            initial=initial[r],
            logits_processor=chain([banned[r]]),
            **kw,
        )
        got = batch[r]
        assert (got.tokens, got.exact, got.nodes) == (alone.tokens, alone.exact, alone.nodes)
        assert got.log_prob == pytest.approx(alone.log_prob, abs=1e-4)
        if processors in ("by row", "both"):
            assert banned[r] not in got.tokens


# -- generate(custom_generate=...) against generate's own beam search -----------------------
def _generate_both(model, ids, mask, **kw):
    kw = dict(do_sample=False, **kw)
    theirs = model.generate(input_ids=ids, attention_mask=mask, **kw)
    ours = model.generate(input_ids=ids, attention_mask=mask, custom_generate=cg.beam_search, **kw)
    return ours, theirs


class PenaliseEvenRows(LogitsProcessor):
    """A custom processor that reads the row: the hypotheses of even inputs cannot emit 7."""

    def __init__(self, beams: int) -> None:
        self.beams = beams

    def __call__(self, input_ids, scores):
        rows = torch.arange(scores.shape[0]) // self.beams
        scores = scores.clone()
        scores[rows % 2 == 0, 7] = float("-inf")
        return scores


@settings(max_examples=80, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    prompts=prompts_st,
    beams=st.integers(2, 4),
    length=st.sampled_from(["new", "max_length"]),
    n_return=st.integers(1, 2),
    processor=st.sampled_from([None, "ngram", "bad_words", "prefix_fn", "custom"]),
    eos=st.sampled_from(["model", "several"]),
    length_penalty=st.sampled_from([None, 0.0, 0.5, 1.0, 2.0, -1.0]),
    early_stopping=st.sampled_from([None, True, False, "never"]),
    pad=st.sampled_from([None, 7]),
)
def test_batched_beam_search_from_generate_equals_generate(
    kind,
    seed,
    prompts,
    beams,
    length,
    n_return,
    processor,
    eos,
    length_penalty,
    early_stopping,
    pad,
):
    """Under generate's defaults (None: not passed; 1.0 and False) and any explicit
    length_penalty and early_stopping, and with generate's own pad id."""
    model = _model(kind, seed)
    ed = model.config.is_encoder_decoder
    ids, mask = _batch(prompts, pad=model.generation_config.pad_token_id or 0, left=not ed)
    if processor == "prefix_fn":
        # 2 tokens allowed: more beams leave dead ones, which generate lets into its finished
        # set (gencraft does not: the module doc's one deviation)
        beams = 2
    kw: dict = dict(num_beams=beams, num_return_sequences=min(n_return, beams))
    for name, value in [
        ("length_penalty", length_penalty),
        ("early_stopping", early_stopping),
        ("pad_token_id", pad),
    ]:
        if value is not None:
            kw[name] = value
    if length == "new":
        kw["max_new_tokens"] = 5
    else:  # max_length counts the prompt of a causal LM, the decoder's start of a seq2seq
        kw["max_length"] = (1 if ed else ids.shape[1]) + 5
    if eos == "several":  # the EOS appended is the one that ended each output
        kw["eos_token_id"] = [model.generation_config.eos_token_id, 9, 11]
    if processor == "ngram":
        kw["no_repeat_ngram_size"] = 2
    elif processor == "bad_words":
        kw["bad_words_ids"] = [[4], [6, 8]]
    elif processor == "prefix_fn":
        # row 0 may emit only 5 or EOS; the other rows only 6 or EOS
        eos = model.generation_config.eos_token_id
        kw["prefix_allowed_tokens_fn"] = lambda b, sent: [5 if b == 0 else 6, eos]
    elif processor == "custom":
        kw["logits_processor"] = [PenaliseEvenRows(beams)]
    ours, theirs = _generate_both(
        model, ids, mask, return_dict_in_generate=True, output_scores=True, **kw
    )
    assert type(ours) is type(theirs)
    assert ours.sequences.tolist() == theirs.sequences.tolist()
    assert ours.sequences_scores.tolist() == pytest.approx(
        theirs.sequences_scores.tolist(), abs=1e-4
    )


def test_a_row_dependent_processor_acts_on_each_row():
    """The bug of the per-row loop: every row was treated as row 0."""
    model = _model("llama", 0)
    ids, mask = _batch([[3, 4, 5], [6, 7]])
    fn = lambda b, sent: [5 if b == 0 else 6]  # noqa: E731
    ours, theirs = _generate_both(
        model, ids, mask, num_beams=2, max_new_tokens=3, prefix_allowed_tokens_fn=fn
    )
    assert ours.tolist() == theirs.tolist()
    assert ours[1, -3:].tolist() == [6, 6, 6]
    exact = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=3,
        custom_generate=cg.exact_mode,
        length=2,  # exactly two tokens, then EOS (2)
        prefix_allowed_tokens_fn=lambda b, sent: [5 if b == 0 else 6, 2],
    )
    assert exact[:, ids.shape[1] :].tolist() == [[5, 5, 2], [6, 6, 2]]


def test_sequences_scores_only_with_output_scores_as_generate():
    model = _model("gpt2", 1)
    ids, mask = _batch([[3, 4, 5], [6, 7]])
    ours, theirs = _generate_both(
        model, ids, mask, num_beams=2, max_new_tokens=3, return_dict_in_generate=True
    )
    assert type(ours) is type(theirs)
    assert theirs.sequences_scores is None and ours.sequences_scores is None
    assert ours.sequences.tolist() == theirs.sequences.tolist()


@settings(max_examples=60, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "bart", "copy-bart", "copy-llama"]),
    seed=st.integers(0, 2),
    rows=st.lists(
        st.tuples(
            st.lists(st.integers(3, V - 1), min_size=1, max_size=5),
            st.integers(1, 6),  # the row's max_new_tokens
            st.one_of(st.none(), st.integers(0, 5)),  # its forced length
        ),
        min_size=1,
        max_size=4,
    ),
    beams=st.integers(1, 3),
    finished=st.sampled_from(["aside", "on_beam"]),
)
# two forced lengths in one batch (the draws seldom give them)
@example(
    kind="peaked-llama",
    seed=0,
    rows=[([3, 4, 5], 6, 1), ([6, 7], 6, 4)],
    beams=2,
    finished="aside",
)
def test_each_row_keeps_its_own_length_limit_and_forced_length(kind, seed, rows, beams, finished):
    model = _model(kind, seed)
    prompts = [p for p, _, _ in rows]
    limits = [n for _, n, _ in rows]
    forces = [f if f is not None and f < n else None for _, n, f in rows]
    ids, mask = _batch(prompts, left=not model.config.is_encoder_decoder)
    kw = dict(num_beams=beams, eos_token_id=[2], finished=finished)
    batch = beam_search_batch(model, ids, mask, max_new_tokens=limits, force_length=forces, **kw)
    for r, p in enumerate(prompts):
        alone = beam_search(
            model, torch.tensor([p]), max_new_tokens=limits[r], force_length=forces[r], **kw
        )
        _same(batch[r], alone)
        assert all(len(h.tokens) <= limits[r] for h in batch[r])
        if forces[r] is not None:
            assert all(len(h.tokens) == forces[r] for h in batch[r])


@settings(max_examples=40, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    rows=st.lists(
        st.tuples(st.lists(st.integers(3, V - 1), min_size=1, max_size=5), st.integers(1, 6)),
        min_size=1,
        max_size=4,
    ),
    beams=st.integers(1, 3),
    finished=st.sampled_from(["aside", "on_beam"]),
    early_stopping=st.sampled_from([True, False, "never"]),
)
def test_a_batch_makes_as_many_model_calls_as_its_longest_row(
    kind, seed, rows, beams, finished, early_stopping
):
    """Counts are outputs: a row alone makes one call per step until its last kept hypothesis
    completes (``early_stopping=True``), and a batch steps until its last row is done, in one
    model call per step, so its calls are the most that any of its rows makes alone."""
    model = _model(kind, seed)
    if finished == "on_beam":
        early_stopping = True
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    prompts = [p for p, _ in rows]
    limits = [n for _, n in rows]
    kw = dict(num_beams=beams, eos_token_id=[2], finished=finished, early_stopping=early_stopping)
    try:
        ids, mask = _batch(prompts, left=not model.config.is_encoder_decoder)
        beam_search_batch(model, ids, mask, max_new_tokens=limits, **kw)
        batch_calls, alone = len(calls), []
        for p, n in rows:
            calls.clear()
            hyps = beam_search(model, torch.tensor([p]), max_new_tokens=n, **kw)
            alone.append(len(calls))
            if early_stopping is True:  # a call per step until the last kept one completes
                assert alone[-1] == max(len(h.tokens) + 1 if h.finished else n for h in hyps)
    finally:
        handle.remove()
    assert batch_calls == max(alone)
    assert all(1 <= c <= n + 1 for c, n in zip(alone, limits, strict=True))


@settings(max_examples=40, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    prompts=prompts_st,
    beams=st.integers(1, 3),
    finished=st.sampled_from(["aside", "on_beam"]),
    max_new=st.integers(1, 6),
)
def test_a_processor_sees_each_hypothesis_s_own_tokens_in_both_beam_modes(
    kind, seed, prompts, beams, finished, max_new
):
    """An invariant in place of a reference: under ``NoRepeatNGramLogitsProcessor(2)`` no
    generated token of any returned hypothesis completes a bigram its own ids (prompt and
    tokens before it, as ``generate`` lays them out) already hold."""
    from transformers import NoRepeatNGramLogitsProcessor

    model = _model(kind, seed)
    ed = model.config.is_encoder_decoder
    ids, mask = _batch(prompts, left=not ed)
    kw = dict(num_beams=beams, max_new_tokens=max_new, eos_token_id=[2], finished=finished)
    batch = beam_search_batch(
        model, ids, mask, logits_processor=[NoRepeatNGramLogitsProcessor(2)], **kw
    )
    start = [model.generation_config.decoder_start_token_id] if ed else None
    for p, hyps in zip(prompts, batch, strict=True):
        for h in hyps:
            seq = (start or p) + h.tokens + ([h.eos_token] if h.finished else [])
            first = len(start or p)
            for i in range(max(first, 1), len(seq)):
                earlier = set(itertools.pairwise(seq[:i]))
                assert (seq[i - 1], seq[i]) not in earlier, (seq, i)


def test_beam_search_refuses_a_stepper_of_several_inputs_and_reports_eos_id_0():
    """A Stepper of two inputs is a batch: beam_search names beam_search_batch. An EOS id of 0
    is an id like any other: the hypotheses it ends report it."""
    from gencraft.search import HFStepper

    model = _model("llama", 0)
    stepper = HFStepper(model, torch.tensor([[3, 4], [5, 6]]), max_new_tokens=3)
    with pytest.raises(GencraftError, match="Stepper of one input; use beam_search_batch"):
        beam_search(stepper, num_beams=2, max_new_tokens=3)
    llama = small_llama(0, vocab=6)  # EOS 0
    for finished in ("aside", "on_beam"):
        hyps = beam_search(
            llama, torch.tensor([[1, 2]]), num_beams=3, max_new_tokens=4, finished=finished
        )
        assert any(h.finished for h in hyps)
        assert all((h.eos_token == 0) == h.finished for h in hyps)
        assert all(h.eos_token is None for h in hyps if not h.finished)
        res = beam_search_tensors(
            llama, torch.tensor([[1, 2]]), num_beams=3, max_new_tokens=4, finished=finished
        )
        assert res.finished[0, : len(hyps)].tolist() == [h.finished for h in hyps]


def test_conditional_search_weighs_the_classifier_once_by_default():
    """alpha's default is 1 (log P(y) + log P_clf, the thesis's score)."""
    model = _model("peaked-llama", 0)
    clf = TokenScorer(model.config.num_hidden_layers + 1, model.config.hidden_size)
    kw = dict(num_beams=3, max_new_tokens=4, eos_token_id=[2], classifier=clf)
    for prompt in ([3, 4, 5], [6], [9, 10]):
        default = beam_search(model, torch.tensor([prompt]), **kw)
        _same(default, beam_search(model, torch.tensor([prompt]), alpha=1.0, **kw))


class AllowFew(LogitsProcessor):
    """Fewer continuations than beams: only ids 3, 4 and EOS (2) may come next."""

    def __call__(self, input_ids, scores):
        return _allow_only(scores, [2, 3, 4])


def _allow_only(scores: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """``scores`` [N, V] with every id but ``ids`` at -inf."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    keep[:, ids] = True
    return scores.masked_fill(~keep, float("-inf"))


@settings(max_examples=40, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "copy-llama"]),
    seed=st.integers(0, 2),
    prompts=prompts_st,
    beams=st.integers(2, 5),
    finished=st.sampled_from(["aside", "on_beam"]),
    max_new=st.integers(1, 4),
)
def test_with_fewer_continuations_than_beams_every_hypothesis_is_real(
    kind, seed, prompts, beams, finished, max_new
):
    """Dead slots (no continuation left for them) never come back as hypotheses: every
    returned output is distinct, uses only allowed ids, and its score is its log-probability
    (recomputed with one forward over the prompt and output; on the beam, a hypothesis cut at
    the limit ends with Alg. 1's forced EOS, whose log-probability its score includes)."""
    model = _model(kind, seed)
    ids, mask = _batch(prompts)
    kw = dict(num_beams=beams, max_new_tokens=max_new, eos_token_id=[2], finished=finished)
    batch = beam_search_batch(model, ids, mask, logits_processor=[AllowFew()], **kw)
    for p, hyps in zip(prompts, batch, strict=True):
        outputs = [(tuple(h.tokens), h.finished) for h in hyps]
        assert hyps and len(set(outputs)) == len(outputs)
        for h in hyps:
            assert set(h.tokens) <= {3, 4}
            ends = h.finished or finished == "on_beam"
            seq = torch.tensor([p + h.tokens + ([2] if ends else [])])
            with torch.no_grad():
                logp = torch.log_softmax(model(seq).logits[0].double(), -1)
            want = sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(seq[0, len(p) :]))
            assert h.score == pytest.approx(want, abs=1e-4)


class FloorMarkedRows(LogitsProcessor):
    """A processor that floors every score of a hypothesis whose prompt holds id 11 and never
    lets 11 come next. Near float32's lowest finite value (as some user processors mask), a
    marked row has candidates, all far below transformers' "impossible" -1e9; at -inf, none."""

    def __init__(self, floor: float) -> None:
        self.floor = floor

    def __call__(self, input_ids, scores):
        marked = (input_ids == 11).any(1, keepdim=True)
        scores = scores.masked_fill(marked, self.floor)
        return scores.index_fill(1, torch.tensor([11]), float("-inf"))


@settings(max_examples=15, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2"]),
    seed=st.integers(0, 2),
    marked=st.lists(st.integers(3, 10), min_size=1, max_size=4),
    other=st.lists(st.integers(3, 10), min_size=1, max_size=4),
    beams=st.integers(1, 4),
    finished=st.sampled_from(["aside", "on_beam"]),
    max_new=st.integers(1, 4),
    floor=st.sampled_from([-math.inf, -3.0e38]),
)
@example("peaked-llama", 1, [3], [3], 1, "on_beam", 2, -3.0e38)  # the other row ends first
@example("peaked-llama", 1, [3], [3], 1, "aside", 2, -math.inf)
def test_a_row_with_only_floored_candidates_beside_a_normal_row_equals_it_alone(
    kind, seed, marked, other, beams, finished, max_new, floor
):
    """Whether a row's candidates are all below -1e9 is decided row by row: the floored row
    has no hypothesis (a score below -1e9 is no output), batched or alone, its neighbour
    equals itself alone, and the batch makes the calls of its longer row alone; a row with
    no candidate at all (-inf) ends at the first step."""
    model = _model(kind, seed)
    prompts = [other, [*marked, 11]]
    ids, mask = _batch(prompts)
    kw = dict(num_beams=beams, max_new_tokens=max_new, eos_token_id=[2], finished=finished)
    kw["logits_processor"] = [FloorMarkedRows(floor)]
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        batch = beam_search_batch(model, ids, mask, **kw)
        batch_calls, alone_calls = len(calls), []
        for r, p in enumerate(prompts):
            calls.clear()
            alone = beam_search(model, torch.tensor([p]), **kw)
            alone_calls.append(len(calls))
            assert bool(alone) == (r == 0)
            _same(batch[r], alone)
    finally:
        handle.remove()
    assert batch_calls == max(alone_calls)
    if floor == -math.inf:
        assert alone_calls[1] == 1


class EndAfterOne(LogitsProcessor):
    """EOS (2) or 3 may come first (after ``start`` ids: the prompt's width, or the decoder's
    start id), then only EOS: two hypotheses at most, so the other slots are dead."""

    def __init__(self, start: int) -> None:
        self.start = start

    def __call__(self, input_ids, scores):
        return _allow_only(scores, [2, 3] if input_ids.shape[1] == self.start else [2])


@settings(max_examples=15, **SETTINGS)
@given(
    kind=st.sampled_from(["peaked-llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    prompts=prompts_st,
    beams=st.integers(3, 5),
    max_new=st.integers(3, 6),
)
def test_on_the_beam_a_row_whose_other_slots_are_dead_stops_when_its_hypotheses_end(
    kind, seed, prompts, beams, max_new
):
    """Alg. 1 ends a row when its every slot is complete or dead: two hypotheses, EOS alone
    and 3 then EOS, take two model calls, batched or alone, whatever the limit."""
    model = _model(kind, seed)
    ids, mask = _batch(prompts, left=not model.config.is_encoder_decoder)
    ed = model.config.is_encoder_decoder
    kw = dict(num_beams=beams, max_new_tokens=max_new, eos_token_id=[2], finished="on_beam")
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        procs = [EndAfterOne(1 if ed else ids.shape[1])]
        batch = beam_search_batch(model, ids, mask, logits_processor=procs, **kw)
        counts = [len(calls)]
        for r, p in enumerate(prompts):
            calls.clear()
            procs = [EndAfterOne(1 if ed else len(p))]
            alone = beam_search(model, torch.tensor([p]), logits_processor=procs, **kw)
            _same(batch[r], alone)
            counts.append(len(calls))
    finally:
        handle.remove()
    assert counts == [2] * (len(prompts) + 1)
    for hyps in batch:
        assert sorted(tuple(h.tokens) for h in hyps) == [(), (3,)]
        assert all(h.finished and h.eos_token == 2 for h in hyps)
