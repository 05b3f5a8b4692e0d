"""gencraft.search: beam search against transformers' generate, Alg. 1 by hand, exact mode search
against brute-force enumeration, memory, and bad input."""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch
from method_testing import small_fame, small_llama
from transformers import BartConfig, BartForConditionalGeneration

from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.search import StepOutput, beam_search, exact_mode

PROMPT = [1, 3, 4]


def small_bart(seed: int, vocab: int = 6) -> BartForConditionalGeneration:
    """A random BART over ``vocab`` ids (EOS = decoder start = 2, pad = 1)."""
    torch.manual_seed(seed)
    cfg = BartConfig(
        vocab_size=vocab,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        init_std=0.5,
        forced_eos_token_id=None,
        forced_bos_token_id=None,
    )
    return BartForConditionalGeneration(cfg).eval()


def _hf_beams(model, ids, beams: int, new: int, **kw):
    g = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        num_beams=beams,
        do_sample=False,
        length_penalty=0.0,
        early_stopping=True,
        max_new_tokens=new,
        num_return_sequences=beams,
        output_scores=True,
        return_dict_in_generate=True,
        **kw,
    )
    start = 1 if model.config.is_encoder_decoder else ids.shape[1]
    return [
        (s[start:].tolist(), float(sc))
        for s, sc in zip(g.sequences, g.sequences_scores, strict=True)
    ]


def _assert_same_as_generate(hyps, hf, eos: int, pad: int) -> None:
    assert len(hyps) == len(hf)
    for h, (seq, score) in zip(hyps, hf, strict=True):
        ours = h.tokens + ([eos] if h.finished else [])
        assert seq[: len(ours)] == ours
        # transformers fills shorter outputs with pad (with EOS when the pad id is 0)
        assert all(t in (pad, eos) for t in seq[len(ours) :])
        assert h.score == pytest.approx(score, abs=1e-4)


# -- beam search core ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["tiny-llama", "tiny-gpt2", "tiny-bart", "tiny-t5", "tiny-bert2bert"]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_beam_search_equals_generate_registry_models(name, seed):
    model, tok = load_model(name, seed=seed)
    ids = torch.tensor([tok("hello there")["input_ids"]])
    gc = model.generation_config
    for beams in (2, 4):
        hyps = beam_search(model, ids, num_beams=beams, max_new_tokens=6)
        hf = _hf_beams(model, ids, beams, 6)
        _assert_same_as_generate(hyps, hf, gc.eos_token_id, gc.pad_token_id)


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_equals_generate_with_frequent_eos(seed):
    """Small peaky models end often: finished hypotheses, early stop and padding all happen."""
    for model, ids, eos, pad in (
        (small_llama(seed), torch.tensor([PROMPT]), 0, 0),
        (small_bart(seed), torch.tensor([[0, 3, 4, 2]]), 2, 1),
    ):
        for beams in (2, 3, 5):
            hyps = beam_search(model, ids, num_beams=beams, max_new_tokens=7, eos_token_id=eos)
            hf = _hf_beams(model, ids, beams, 7, eos_token_id=eos, pad_token_id=pad)
            _assert_same_as_generate(hyps, hf, eos, pad)


class ConstantScorer:
    """log P_clf = a constant for every candidate: must not change beam search's choices."""

    def __init__(self, num_layers: int, hidden_size: int, value: float = -0.7) -> None:
        self.num_layers, self.hidden_size, self.value = num_layers, hidden_size, value
        self.calls = 0

    def init(self, n):
        return torch.zeros(n, 0)

    def score(self, state, hidden, candidates):
        assert hidden.shape[1:] == (self.num_layers, self.hidden_size)
        assert candidates.shape[0] == hidden.shape[0]
        self.calls += 1
        return torch.full(candidates.shape, self.value), state

    def reorder(self, state, index):
        return state[index]


@pytest.mark.parametrize("seed", range(3))
def test_conditional_beam_search_with_constant_classifier_equals_generate(seed):
    cases = (
        (small_llama(seed, vocab=12), torch.tensor([PROMPT]), 0, 0),
        (small_bart(seed, vocab=12), torch.tensor([[0, 3, 4, 2]]), 2, 1),
    )
    for model, ids, eos, pad in cases:
        for beams in (2, 4):
            for k in (2 * beams, 12):
                clf = ConstantScorer(3, 16)  # both models: 2 decoder layers + embeddings, H = 16
                hyps = beam_search(
                    model,
                    ids,
                    num_beams=beams,
                    max_new_tokens=6,
                    eos_token_id=eos,
                    classifier=clf,
                    k=k,
                    alpha=2.0,
                )
                hf = _hf_beams(model, ids, beams, 6, eos_token_id=eos, pad_token_id=pad)
                _assert_same_as_generate(hyps, hf, eos, pad)
                assert clf.calls > 0
                for h in hyps:  # the final ranking adds log P_clf once (alpha = 1), not per step
                    assert h.conditional_score == pytest.approx(h.score - 0.7, abs=1e-4)


class TableStepper:
    """Next-token distributions written out by hand; the cache is each row's prefix."""

    vocab_size = 3  # 0 = EOS, 1 = "a", 2 = "b"
    table: ClassVar[dict[tuple[int, ...], list[float]]] = {
        (): [0.5, 0.3, 0.2],
        (1,): [0.1, 0.8, 0.1],
        (2,): [0.6, 0.2, 0.2],
        (1, 1): [0.9, 0.05, 0.05],
    }

    def _lp(self, prefixes):
        rows = [self.table.get(p, [1 / 3] * 3) for p in prefixes]
        return torch.tensor(rows).log()

    def start(self):
        return StepOutput(self._lp([()]), [()])

    def step(self, tokens, cache):
        new = [(*p, int(t)) for p, t in zip(cache, tokens.tolist(), strict=True)]
        return StepOutput(self._lp(new), new)

    def reorder(self, cache, index):
        return [cache[i] for i in index.tolist()]


def test_on_beam_follows_algorithm_1_by_hand():
    """B = 2, max 3 tokens. Step 1: EOS (-0.693, complete) and "a" (-1.204) take both slots, so
    "b" is evicted. Step 2: the complete hypothesis stays (-0.693) and "a a" (-1.427) beats
    "a EOS"/"a b" (-3.507). Step 3 is the limit: Alg. 1 forces EOS, "a a EOS" (-1.532, the
    model's cost of EOS with forced_eos="model"; finished=False: cut at the limit) completes;
    every beam is complete. transformers' policy instead keeps "b" alive and finishes with
    "b EOS" (-2.120)."""
    ln = math.log
    on_beam = beam_search(
        TableStepper(), num_beams=2, max_new_tokens=3, eos_token_id=0, finished="on_beam"
    )
    assert [(h.tokens, h.finished) for h in on_beam] == [([], True), ([1, 1], False)]
    assert on_beam[0].score == pytest.approx(ln(0.5))
    assert on_beam[1].score == pytest.approx(ln(0.3) + ln(0.8) + ln(0.9))
    aside = beam_search(TableStepper(), num_beams=2, max_new_tokens=3, eos_token_id=0)
    assert [(h.tokens, h.finished) for h in aside] == [([], True), ([2], True)]
    assert aside[1].score == pytest.approx(ln(0.2) + ln(0.6))


class EosPenalty:
    """log P_clf = -5 for an EOS candidate, 0 otherwise (a "not empty" attribute)."""

    num_layers, hidden_size = 0, 0

    def init(self, n):
        return None

    def score(self, state, hidden, candidates):
        return (candidates == 0).float() * -5.0, state

    def reorder(self, state, index):
        return state


def test_conditional_on_beam_selects_by_classifier_but_scores_by_model():
    class Stepper(TableStepper):
        def start(self):
            return StepOutput(self._lp([()]), [()], torch.zeros(1, 0, 0))

        def step(self, tokens, cache):
            out = super().step(tokens, cache)
            return StepOutput(out.log_probs, out.cache, torch.zeros(len(out.cache), 0, 0))

    kw = dict(num_beams=2, max_new_tokens=3, eos_token_id=0, finished="on_beam")
    hyps = beam_search(Stepper(), classifier=EosPenalty(), **kw)
    ln = math.log
    # step 1: EOS selects at -0.693 - 5: "a" (-1.204) and "b" (-1.609) take the beam.
    # step 2: a a -1.427, b a / b b -3.219 beat a b -3.507 and both EOS (-5 each): a a, b a.
    # step 3 is the limit (Alg. 1 lines 10-14): the only candidate is EOS, at the model's
    # cost, and the classifier scores it (-5): a a EOS -1.532 - 5, b a EOS -4.317 - 5.
    assert [(h.tokens, h.finished) for h in hyps] == [([1, 1], False), ([2, 1], False)]
    want = [ln(0.3) + ln(0.8) + ln(0.9), ln(0.2) + ln(0.2) + ln(1 / 3)]
    for h, w in zip(hyps, want, strict=True):
        assert h.score == pytest.approx(w, abs=1e-5)  # the model score, not the selection
        assert h.conditional_score == pytest.approx(w - 5.0, abs=1e-5)  # forced EOS scored
    free = beam_search(Stepper(), classifier=EosPenalty(), forced_eos="free", **kw)
    assert [h.score for h in free] == pytest.approx([ln(0.3) + ln(0.8), ln(0.2) + ln(0.2)])


class LastTokenStepper(TableStepper):
    """TableStepper whose hidden state [N, 1, 1] is the last token (-1 at the root)."""

    def _hidden(self, prefixes):
        return torch.tensor([[[float(p[-1]) if p else -1.0]] for p in prefixes])

    def start(self):
        return StepOutput(self._lp([()]), [()], self._hidden([()]))

    def step(self, tokens, cache):
        out = super().step(tokens, cache)
        return StepOutput(out.log_probs, out.cache, self._hidden(out.cache))


class EndingScorer:
    """log P_clf of ending (EOS candidate): -100 at the root, -1 after "b", 0 after "a"."""

    num_layers, hidden_size = 1, 1

    def init(self, n):
        return None

    def score(self, state, hidden, candidates):
        last = hidden[:, 0, :1]  # [N, 1]
        end = torch.where(last < 0, -100.0, torch.where(last == 2, -1.0, 0.0))
        return (candidates == 0).float() * end, state

    def reorder(self, state, index):
        return state


def test_alpha_steers_selection_but_not_the_final_on_beam_ranking():
    """B = 2, L = 2, α = 3: step 1 keeps "a" and "b" (the root's EOS costs -100); step 2 forces
    EOS. "b EOS": S = ln .2 + ln .6 = -2.120, log P_clf = -1, so C = -3.120 and C' = -5.120;
    "a EOS": S = ln .3 + ln .1 = -3.507, C = C' = -3.507. Alg. 1 ranks by C (α = 1): "b"
    first; ranking by the weighted C' would put "a" first."""
    ln = math.log
    kw = dict(
        num_beams=2,
        max_new_tokens=2,
        eos_token_id=0,
        classifier=EndingScorer(),
        alpha=3.0,
        finished="on_beam",
    )
    hyps = beam_search(LastTokenStepper(), **kw)
    assert [h.tokens for h in hyps] == [[2], [1]]
    assert [h.conditional_score for h in hyps] == pytest.approx(
        [ln(0.2) + ln(0.6) - 1, ln(0.3) + ln(0.1)]
    )
    # a forced length (n = 1): EOS renormalised away at step 1 (a .6, b .4), forced at step 2
    # (the model's cost): S ranks "b" (-1.427) over "a" (-2.813); Alg. 1's output for a
    # deterministic attribute, the top of the beam under C', is "a" (-2.813 against -4.427)
    for ranking, order in (("score", [[2], [1]]), ("selection", [[1], [2]])):
        forced = beam_search(LastTokenStepper(), force_length=1, forced_ranking=ranking, **kw)
        assert [h.tokens for h in forced] == order
        assert sorted(h.score for h in forced) == pytest.approx(
            sorted([ln(0.6) + ln(0.1), ln(0.4) + ln(0.6)])
        )
    # the thesis's length convention counts the EOS: 2 there is 1 token here
    thesis = beam_search(LastTokenStepper(), force_length=2, length_includes_eos=True, **kw)
    assert [h.tokens for h in thesis] == [[2], [1]]


class RootEndingPenalty(EndingScorer):
    """log P_clf = -3 for ending at the root, 0 for everything else."""

    def score(self, state, hidden, candidates):
        root = hidden[:, 0, :1] < 0  # [N, 1]
        return (candidates == 0).float() * torch.where(root, -3.0, 0.0), state


def test_a_complete_slot_competes_by_its_selection_score():
    """B = 3, L = 3. Step 1 keeps "a", "b" and the empty output (EOS: S = ln .5 = -0.693 but
    C' = -3.693 after the classifier's -3). Step 2: the best live continuations are "a a"
    (-1.427), "b EOS" (-2.120) and "b a" (-3.219): all three beat the empty output's frozen
    C' (-3.693), which leaves the beam, though its model score (-0.693) is the best of all."""
    hyps = beam_search(
        LastTokenStepper(),
        num_beams=3,
        max_new_tokens=3,
        eos_token_id=0,
        classifier=RootEndingPenalty(),
        finished="on_beam",
    )
    assert sorted(h.tokens for h in hyps) == [[1, 1], [2], [2, 1]]


def test_force_length_gives_exact_lengths_and_renormalises():
    model = small_llama(0)
    ids = torch.tensor([PROMPT])
    for n in (1, 3, 5):
        hyps = beam_search(
            model, ids, num_beams=3, max_new_tokens=8, eos_token_id=0, force_length=n
        )
        assert hyps and all(len(h.tokens) == n and h.finished for h in hyps)
        # the score is the renormalised (EOS-free) log-likelihood of the n tokens: check one
        h = hyps[0]
        full = torch.tensor([PROMPT + h.tokens])
        with torch.no_grad():
            lp = torch.log_softmax(model(full).logits[0].float(), -1)
        want = 0.0
        for i, t in enumerate(h.tokens):
            row = lp[len(PROMPT) - 1 + i].clone()
            row[0] = -math.inf
            want += (row[t] - torch.logsumexp(row, 0)).item()
        end = lp[len(PROMPT) - 1 + n, 0].item()  # the forced EOS costs the model's log P(EOS)
        assert h.score == pytest.approx(want + end, abs=1e-4)
        free = beam_search(
            model,
            ids,
            num_beams=3,
            max_new_tokens=8,
            eos_token_id=0,
            force_length=n,
            forced_eos="free",
        )
        assert all(len(f.tokens) == n for f in free)
        for f in free:  # "free": the same search without the EOS step's cost
            full = torch.tensor([PROMPT + f.tokens])
            with torch.no_grad():
                lpf = torch.log_softmax(model(full).logits[0].float(), -1)
            rows = lpf[len(PROMPT) - 1 : len(PROMPT) - 1 + n].clone()
            rows[:, 0] = -math.inf
            ren = rows.log_softmax(-1).gather(1, torch.tensor(f.tokens)[:, None]).sum().item()
            assert f.score == pytest.approx(ren, abs=1e-4)
    with pytest.raises(GencraftError, match="forced_eos"):
        beam_search(model, ids, num_beams=2, max_new_tokens=4, force_length=2, forced_eos="x")


# -- exact mode search -----------------------------------------------------------------------
def _brute_force(model, prefix_fn, eos: int, n: int, length: int | None = None):
    """Best sequence (EOS excluded) of at most n tokens by enumerating every one."""
    v = model.config.vocab_size
    best, arg = -math.inf, None
    for size in range(n + 1) if length is None else [length]:
        for seq in itertools.product([t for t in range(v) if t != eos], repeat=size):
            s = prefix_fn([*seq, eos])
            if s > best:
                best, arg = s, list(seq)
    return arg, best


def _causal_scorer(model, prompt):
    def score(seq):
        ids = torch.tensor([prompt + seq])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0].double(), -1)
        p = len(prompt)
        return sum(lp[p - 1 + i, t].item() for i, t in enumerate(seq))

    return score


def _seq2seq_scorer(model, src, start):
    def score(seq):
        dec = torch.tensor([[start, *seq]])
        with torch.no_grad():
            out = model(input_ids=torch.tensor([src]), decoder_input_ids=dec)
        lp = torch.log_softmax(out.logits[0].double(), -1)
        return sum(lp[i, t].item() for i, t in enumerate(seq))

    return score


@pytest.mark.parametrize("seed", range(5))
def test_exact_mode_equals_brute_force_causal(seed):
    model = small_llama(seed, vocab=5)
    score = _causal_scorer(model, PROMPT)
    ids = torch.tensor([PROMPT])
    r = exact_mode(model, ids, eos_token_id=0, max_new_tokens=4)
    tokens, lp = _brute_force(model, score, 0, 4)
    assert r.exact and r.tokens == tokens and r.log_prob == pytest.approx(lp, abs=1e-4)
    for n in (2, 4):
        r = exact_mode(model, ids, eos_token_id=0, max_new_tokens=4, length=n)
        tokens, lp = _brute_force(model, score, 0, 4, length=n)
        assert r.exact and r.tokens == tokens and r.log_prob == pytest.approx(lp, abs=1e-4)
        assert r.nodes <= sum(4**i for i in range(n + 1))  # pruning never adds work


@pytest.mark.parametrize("seed", range(3))
def test_exact_mode_initial_bound_prunes_without_changing_the_answer(seed):
    model = small_llama(seed, vocab=5)
    ids = torch.tensor([PROMPT])
    plain = exact_mode(model, ids, eos_token_id=0, max_new_tokens=4, length=3)
    for initial in ([1, 2, 3], plain.tokens):
        seeded = exact_mode(model, ids, eos_token_id=0, max_new_tokens=4, length=3, initial=initial)
        assert seeded.tokens == plain.tokens
        assert seeded.log_prob == pytest.approx(plain.log_prob, abs=1e-6)
    # seeded with the answer, the search expands no more nodes than without (plus 3 to score it)
    assert seeded.nodes <= plain.nodes + 3
    with pytest.raises(GencraftError, match="initial"):
        exact_mode(model, ids, eos_token_id=0, max_new_tokens=4, length=3, initial=[1, 0, 2])


def test_exact_mode_finds_non_empty_modes_too():
    """The brute-force check above is only meaningful if some modes are not empty."""
    found = [
        exact_mode(
            small_llama(s, vocab=5), torch.tensor([PROMPT]), eos_token_id=0, max_new_tokens=4
        ).tokens
        for s in range(5)
    ]
    assert any(found) and not all(found)


@pytest.mark.parametrize("seed", range(3))
def test_exact_mode_equals_brute_force_encoder_decoder(seed):
    model = small_bart(seed, vocab=5)
    src = [0, 3, 4, 2]
    score = _seq2seq_scorer(model, src, model.config.decoder_start_token_id)
    ids = torch.tensor([src])
    r = exact_mode(model, ids, eos_token_id=2, max_new_tokens=3)
    tokens, lp = _brute_force(model, score, 2, 3)
    assert r.exact and r.tokens == tokens and r.log_prob == pytest.approx(lp, abs=1e-4)
    r = exact_mode(model, ids, eos_token_id=2, max_new_tokens=3, length=3)
    tokens, lp = _brute_force(model, score, 2, 3, length=3)
    assert r.tokens == tokens and r.log_prob == pytest.approx(lp, abs=1e-4)


def test_exact_mode_node_cap_reports_not_exact():
    model = small_llama(1, vocab=5)
    full = exact_mode(model, torch.tensor([PROMPT]), eos_token_id=0, max_new_tokens=5, length=5)
    capped = exact_mode(
        model, torch.tensor([PROMPT]), eos_token_id=0, max_new_tokens=5, length=5, max_nodes=6
    )
    assert full.exact and full.nodes > 6
    assert not capped.exact and capped.nodes == 6
    assert len(capped.tokens) == 5 and capped.log_prob <= full.log_prob + 1e-9


class FlatStepper:
    """A real model's cache, but P(EOS) = 0.4 and 0.2 for each of three other tokens, after any
    prefix."""

    vocab_size = 4

    def __init__(self, p_eos=0.4):
        from gencraft.models.stepping import HFStepper

        self.inner = HFStepper(small_llama(0, vocab=4), torch.tensor([[1, 3]]), max_new_tokens=8)
        rest = (1 - p_eos) / 3
        self.flat = torch.tensor([[p_eos, rest, rest, rest]]).log()

    def start(self):
        return StepOutput(self.flat, self.inner.start().cache)

    def step(self, tokens, cache):
        return StepOutput(self.flat, self.inner.step(tokens, cache).cache)


def test_dfs_pruning_proves_a_flat_mode_in_a_handful_of_nodes():
    """Without pruning DFS visits the whole tree (1 + 3 + ... + 3^6 = 1,093 nodes at depth 6).
    With it: P(EOS) = 0.4, the empty output beats every child (0.2) at once: 1 node;
    P(EOS) = 0.1: the three children (0.3) are expanded, their children (0.09) pruned: 4."""
    for p_eos, nodes in ((0.4, 1), (0.1, 4)):
        r = exact_mode(FlatStepper(p_eos), eos_token_id=0, max_new_tokens=6)
        assert r.exact and r.tokens == [] and r.nodes == nodes
        assert r.log_prob == pytest.approx(math.log(p_eos))


def _live_tensor_bytes() -> int:
    """Bytes of every tensor storage alive in the process (found by the garbage collector)."""
    import gc

    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if type(obj) in (torch.Tensor, torch.nn.Parameter):
            st = obj.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


class _MeasuringStepper:
    """Wraps a stepper; at its ``at``-th step records the tensor bytes alive in the process."""

    def __init__(self, inner, at):
        self.inner, self.at, self.steps, self.live = inner, at, 0, None
        self.vocab_size = inner.vocab_size

    def start(self):
        return self.inner.start()

    def step(self, tokens, cache):
        out = self.inner.step(tokens, cache)
        self.steps += 1
        if self.steps == self.at:
            self.live = _live_tensor_bytes()
        return out


def test_exact_mode_memory_measured_from_the_tensors_alive():
    """Independently of the search's own counter: the tensor storage alive at the deepest point
    of the first path grows linearly with depth (about 2 positions of key/values per step);
    a search keeping every node's full cache grows quadratically and fails both checks."""
    from gencraft.models.stepping import HFStepper

    model = small_llama(0, vocab=5, context=200)
    per_pos = 2 * 2 * 1 * 8 * 4  # layers x (K, V) x kv heads x head dim x float32 bytes
    held = {}
    for d in (16, 32, 64):
        st = _MeasuringStepper(HFStepper(model, torch.tensor([PROMPT]), max_new_tokens=d + 1), d)
        before = _live_tensor_bytes()
        exact_mode(st, eos_token_id=0, max_new_tokens=d, length=d, max_nodes=d + 1)
        held[d] = st.live - before
        assert held[d] <= 3 * (len(PROMPT) + d + 1) * per_pos
    assert held[64] - held[32] <= 2.3 * (held[32] - held[16])  # linear: 2x; quadratic: ~3.7x


def test_exact_mode_memory_grows_linearly_with_depth():
    """The first path DFS explores (length-conditional, so it goes the whole way down) holds the
    slices plus one full cache: about 2 x (prompt + depth) positions, not depth^2."""
    model = small_llama(0, vocab=5, context=200)
    per_pos = 2 * 2 * 1 * 8 * 4  # layers x (K, V) x kv heads x head dim x float32 bytes
    peaks = {}
    for d in (8, 32, 128):
        r = exact_mode(
            model,
            torch.tensor([PROMPT]),
            eos_token_id=0,
            max_new_tokens=d,
            length=d,
            max_nodes=d + 1,
        )
        peaks[d] = r.peak_kv_bytes
        assert r.peak_kv_bytes <= 2 * (len(PROMPT) + d + 1) * per_pos
    assert peaks[128] / peaks[8] < 2 * 128 / 8  # linear, not quadratic


# -- bad input -------------------------------------------------------------------------------
def test_bad_input_is_reported():
    model = small_llama(0, vocab=6, context=16)
    ids = torch.tensor([PROMPT])
    with pytest.raises(GencraftError, match="num_beams"):
        beam_search(model, ids, num_beams=0, max_new_tokens=4)
    with pytest.raises(GencraftError, match="k must be"):
        beam_search(
            model, ids, num_beams=2, max_new_tokens=4, classifier=ConstantScorer(3, 16), k=7
        )
    with pytest.raises(GencraftError, match="alpha"):
        beam_search(model, ids, num_beams=2, max_new_tokens=4, alpha=-1.0)
    with pytest.raises(GencraftError, match="another model"):
        beam_search(model, ids, num_beams=2, max_new_tokens=4, classifier=ConstantScorer(3, 32))
    with pytest.raises(GencraftError, match="context"):
        beam_search(model, torch.tensor([list(range(6)) * 3]), num_beams=2, max_new_tokens=4)
    with pytest.raises(GencraftError, match="context"):
        exact_mode(model, ids, max_new_tokens=20)
    with pytest.raises(GencraftError, match=r"\[1, P\]"):
        beam_search(model, torch.tensor([PROMPT, PROMPT]), num_beams=2, max_new_tokens=4)
    with pytest.raises(GencraftError, match="force_length"):
        beam_search(model, ids, num_beams=2, max_new_tokens=4, force_length=4)
    with pytest.raises(GencraftError, match="length must be"):
        exact_mode(model, ids, max_new_tokens=3, length=4)
    with pytest.raises(GencraftError, match="finished"):
        beam_search(model, ids, num_beams=2, max_new_tokens=4, finished="never")
    with pytest.raises(GencraftError, match="causal LM or encoder-decoder"):
        beam_search(torch.nn.Linear(2, 2), ids, num_beams=2, max_new_tokens=4)


def test_cli_beam_and_mode(capsys):
    import json

    from gencraft.cli.main import main

    assert (
        main(
            [
                "search",
                "beam",
                "hello",
                "--model",
                "tiny-llama",
                "--beams",
                "3",
                "--max-new-tokens",
                "6",
                "--force-length",
                "4",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(rows) == 3 and all(r["tokens"] == 4 and r["finished"] for r in rows)
    assert (
        main(
            [
                "search",
                "mode",
                "hello",
                "--model",
                "tiny-llama",
                "--max-new-tokens",
                "3",
                "--max-nodes",
                "50",
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["nodes"] <= 50 and set(row) >= {"text", "log_prob", "exact"}
    # the thesis's length convention: 4 counts the EOS, so 3 tokens come before it
    for cmd, length in (("beam", ["--force-length", "4"]), ("mode", ["--length", "4"])):
        args = ["search", cmd, "hello", "--model", "tiny-llama", "--max-new-tokens", "6"]
        assert (
            main(
                [
                    *args,
                    *length,
                    "--length-includes-eos",
                    "--max-nodes" if cmd == "mode" else "--beams",
                    "40" if cmd == "mode" else "2",
                ]
            )
            == 0
        )
        rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
        assert all(r["tokens"] == 3 for r in rows)


def test_prompts_reject_unknown_kind():
    from gencraft.search.prompts import instruction_texts

    with pytest.raises(GencraftError, match="unknown prompt kind"):
        instruction_texts("poetry", 3)


def test_force_length_zero_gives_only_the_empty_output():
    from gencraft.models import load_model
    from gencraft.search.prompts import encode_prompt

    model, tok = load_model("tiny-llama")
    ids = encode_prompt(tok, "Describe: name[X]")
    eos = model.generation_config.eos_token_id
    for finished in ("aside", "on_beam"):
        hyps = beam_search(
            model, ids, num_beams=3, max_new_tokens=4, force_length=0, finished=finished
        )
        assert hyps and all(h.tokens == [] and h.finished for h in hyps), finished
        assert all(eos not in h.tokens for h in hyps)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
def test_beam_search_with_logits_processors_equals_generate(name):
    """Processors see the same ids and scores as in generate's beam search (a no-repeat-ngram
    rule depends on the ids; suppressed tokens on the scores)."""
    from transformers import NoRepeatNGramLogitsProcessor, SuppressTokensLogitsProcessor

    model, tok = load_model(name, seed=0)
    ids = torch.tensor([tok("hello hello there")["input_ids"]])
    gc = model.generation_config
    plain = beam_search(model, ids, num_beams=3, max_new_tokens=8)
    for procs in (
        [NoRepeatNGramLogitsProcessor(2)],
        [SuppressTokensLogitsProcessor([104, 105, 106], device="cpu")],
    ):
        hyps = beam_search(model, ids, num_beams=3, max_new_tokens=8, logits_processor=procs)
        hf = _hf_beams(model, ids, 3, 8, logits_processor=procs)
        _assert_same_as_generate(hyps, hf, gc.eos_token_id, gc.pad_token_id)
        if isinstance(procs[0], NoRepeatNGramLogitsProcessor):  # the rule did act
            assert [h.tokens for h in hyps] != [h.tokens for h in plain]


class _EndHeavy:
    """The top non-EOS token gets probability 0.3, the EOS ids 0.2, 0.19, 0.18..., the other
    tokens the rest in the model's proportions: more hypotheses end at a step than there are
    beams. (Equal EOS probabilities would make the finished set a matter of tie-breaking.)"""

    def __init__(self, eos: list[int]) -> None:
        self.eos = torch.tensor(eos)

    def __call__(self, input_ids, scores):
        rows = torch.arange(scores.shape[0])
        eos_p = 0.2 - 0.01 * torch.arange(len(self.eos))
        others = scores.index_fill(1, self.eos, float("-inf"))
        top = others.argmax(-1)
        others[rows, top] = float("-inf")
        # the rest of the mass over the other tokens, in the model's proportions
        out = math.log(0.7 - float(eos_p.sum())) + torch.log_softmax(others, dim=-1)
        out[rows, top] = math.log(0.3)
        out[:, self.eos] = torch.log(eos_p)[None]
        return out


class _EndsAtFirst:
    """At the first step, EOS ids 0.3, 0.2, 0.15 around a top token of 0.25 (the others share
    0.1): of the 2·B best candidates more than B end, while the first B hold one EOS only.
    Afterwards the top token's path can never end, so a live beam filled from below matters."""

    def __init__(self, eos: list[int]) -> None:
        self.eos, self.first, self.top = torch.tensor(eos), None, None

    def __call__(self, input_ids, scores):
        if self.first is None:
            self.first = input_ids.shape[1]
        if input_ids.shape[1] > self.first:
            after_top = input_ids[:, self.first] == self.top  # [N]
            is_eos = torch.zeros(scores.shape[-1], dtype=torch.bool)
            is_eos[self.eos] = True
            return scores.masked_fill(after_top[:, None] & is_eos[None], float("-inf"))
        others = scores.index_fill(1, self.eos, float("-inf"))
        self.top = int(others[0].argmax())
        others[:, self.top] = float("-inf")
        out = math.log(0.1) + torch.log_softmax(others, dim=-1)
        out[:, self.top] = math.log(0.25)
        out[:, self.eos] = torch.log(torch.tensor([0.3, 0.2, 0.15][: len(self.eos)]))[None]
        return out


def _same_as_generate_several_eos(hyps, hf, eos: list[int], pad: int) -> None:
    """The same hypotheses with the same scores, best first (hypotheses with tied scores may
    come in either order: transformers ranks its finished set by its own sort)."""
    assert len(hyps) == len(hf)
    ours, theirs = [], []
    for h, (seq, score) in zip(hyps, hf, strict=True):
        assert not set(h.tokens) & set(eos), "an EOS id inside a hypothesis"
        assert h.finished == (h.eos_token is not None)
        mine = h.tokens + ([h.eos_token] if h.finished else [])
        assert all(t in (pad, *eos) for t in seq[len(mine) :])  # what generate pads with
        assert h.score == pytest.approx(score, abs=1e-4)
        ours.append(mine)
        theirs.append(seq[: len(mine)])
    assert sorted(ours) == sorted(theirs)


@pytest.mark.parametrize("seed", range(8))
def test_beam_search_equals_generate_with_several_eos_ids(seed):
    """Random configurations with 2-3 EOS ids, beams 2-4, with and without a processor that
    makes more hypotheses end at once than there are beams."""
    g = torch.Generator().manual_seed(seed)
    vocab = 12
    cases = (
        (small_llama(seed, vocab=vocab), torch.tensor([PROMPT]), 0),
        (small_bart(seed, vocab=vocab), torch.tensor([[0, 3, 4, 2]]), 1),
    )
    for model, ids, pad in cases:
        for beams in (2, 3, 4):
            n_eos = int(torch.randint(2, 4, (1,), generator=g))
            eos = sorted(int(t) for t in torch.randperm(vocab - 3, generator=g)[:n_eos] + 3)
            for procs in ([], [_EndHeavy(eos)], [_EndsAtFirst(eos)]):
                hyps = beam_search(
                    model,
                    ids,
                    num_beams=beams,
                    max_new_tokens=5,
                    eos_token_id=eos,
                    logits_processor=procs,
                )
                hf = _hf_beams(
                    model,
                    ids,
                    beams,
                    5,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    logits_processor=procs,
                )
                _same_as_generate_several_eos(hyps, hf, eos, pad)


def test_ended_hypotheses_never_continue_when_more_end_than_there_are_beams():
    """The issue's case: 2 beams, 3 EOS ids, each about 0.2 and the top token 0.3. With 2·B
    candidates kept, ended ones filled the live beams and came back with EOS inside."""
    model = small_llama(0, vocab=12)
    eos = [5, 7, 9]
    hyps = beam_search(
        model,
        torch.tensor([PROMPT]),
        num_beams=2,
        max_new_tokens=5,
        eos_token_id=eos,
        logits_processor=[_EndHeavy(eos)],
    )
    assert hyps and all(not set(h.tokens) & set(eos) for h in hyps)
    # step 1 keeps top, EOS 5, 7, 9; only EOS 5 is among the first B; top goes on, then EOS 5
    assert [(h.tokens, h.eos_token) for h in hyps] == [([], 5), ([hyps[1].tokens[0]], 5)]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.2), math.log(0.3 * 0.2)], abs=1e-5)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
def test_one_beam_equals_greedy_generate_for_offset_free_processors(name):
    """num_beams=1 is greedy generate's choice for processors unmoved by a row offset, and
    warns for a value-changing one (a repetition penalty), whose greedy choice differs."""
    import warnings

    from transformers import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    model, tok = load_model(name, seed=0)
    ids = torch.tensor([tok("hello hello there")["input_ids"]])
    start = 1 if model.config.is_encoder_decoder else ids.shape[1]
    eos = model.generation_config.eos_token_id
    for procs in ([], [NoRepeatNGramLogitsProcessor(2)]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (hyp,) = beam_search(model, ids, num_beams=1, max_new_tokens=8, logits_processor=procs)
        greedy = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            num_beams=1,
            max_new_tokens=8,
            logits_processor=procs,
        )[0, start:].tolist()
        assert greedy[: len(hyp.tokens) + hyp.finished] == hyp.tokens + [eos] * hyp.finished
    with pytest.warns(UserWarning, match="RepetitionPenaltyLogitsProcessor"):
        beam_search(
            model,
            ids,
            num_beams=1,
            max_new_tokens=4,
            logits_processor=[RepetitionPenaltyLogitsProcessor(2.0)],
        )


@pytest.mark.parametrize("renormalize", [False, True])
def test_exact_mode_under_a_focus_vocabulary_equals_brute_force(renormalize):
    """FAME composes with exact search: the mode of a FAME model restricted to V_k ∪ F (focus
    decoding's processor, masked only or re-normalised over the set) equals the best sequence
    over those tokens by enumeration."""
    from gencraft.focus import FocusLogitsProcessor

    fame = small_fame(3, vocab=6)
    allowed = torch.tensor([2, 3])  # V_k; F = {1}; EOS = 0 always allowed
    proc = FocusLogitsProcessor(
        [torch.tensor([1, 2, 3])], always_allowed={0}, renormalize=renormalize
    )
    ids = torch.tensor([PROMPT])
    free = exact_mode(fame, ids, max_new_tokens=3)
    assert 4 in free.tokens  # the unrestricted mode leaves V_k ∪ F: the restriction matters
    r = exact_mode(fame, ids, max_new_tokens=3, logits_processor=[proc])
    span = torch.arange(len(PROMPT) + 4) < len(PROMPT)
    best, arg = -math.inf, None
    for n in range(4):
        for seq in itertools.product([1, *allowed.tolist()], repeat=n):
            full = torch.tensor([[*PROMPT, *seq, 0]])
            with torch.no_grad():
                out = fame(input_ids=full, source_mask=span[: full.shape[1]][None])
            logits = out.logits[0].double()
            if renormalize:
                logits[:, 4:] = -math.inf
            lp = torch.log_softmax(logits, -1)
            s = sum(lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate([*seq, 0]))
            if s > best:
                best, arg = s, list(seq)
    assert r.exact and r.tokens == arg and r.log_prob == pytest.approx(best, abs=1e-4)
    assert set(r.tokens) <= {1, 2, 3}


def test_exact_mode_refuses_processors_that_raise_scores():
    class Boost:
        def __call__(self, input_ids, scores):
            return scores + 1.0

    model = small_llama(0)
    with pytest.raises(GencraftError, match="processed scores <= 0"):
        exact_mode(model, torch.tensor([PROMPT]), max_new_tokens=2, logits_processor=[Boost()])


class TwoEosStepper(TableStepper):
    """Two EOS ids, 0 and 3 (e.g. <|endoftext|> and <|im_end|>); 1 = "a", 2 = "b"."""

    vocab_size = 4
    table: ClassVar[dict[tuple[int, ...], list[float]]] = {
        (): [0.2, 0.4, 0.1, 0.3],
        (1,): [0.3, 0.2, 0.1, 0.4],
        (2,): [0.1, 0.5, 0.2, 0.2],
    }

    def _lp(self, prefixes):
        rows = [self.table.get(p, [0.25] * 4) for p in prefixes]
        return torch.tensor(rows).log()


def test_ending_with_several_eos_ids_is_one_event():
    """P(end) is the sum over the EOS ids (log-sum-exp), not the first id's or the largest's:
    in sequence scoring and in forced-EOS scoring of a forced length."""
    from gencraft.models.stepping import sequence_log_prob

    ln = math.log
    got = sequence_log_prob(TwoEosStepper(), None, [1], eos_token_id=[0, 3])
    assert got == pytest.approx(ln(0.4) + ln(0.3 + 0.4))
    # a forced length of 1: both EOS renormalised away at step 1, then the end forced at the
    # model's cost of ending, 0.3 + 0.4 after "a" and 0.1 + 0.2 after "b"
    hyps = beam_search(
        TwoEosStepper(), num_beams=2, max_new_tokens=3, eos_token_id=[0, 3], force_length=1
    )
    scores = {tuple(h.tokens): h.score for h in hyps}
    assert scores[(1,)] == pytest.approx(ln(0.4 / 0.5) + ln(0.7))
    assert scores[(2,)] == pytest.approx(ln(0.1 / 0.5) + ln(0.3))
