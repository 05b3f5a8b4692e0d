"""HSO's input checks at their exact boundaries, its messages word for word, and the seconds
it reports (mutmut's survivors in hso/functional.py): each boundary is tried on both
sides, against the rule the docstrings state."""

from __future__ import annotations

import copy
import re
import time

import pytest
import torch
from test_hso import _ids

from gencraft.errors import GencraftError
from gencraft.hso import HSOConfig, hso_nll, hso_nll_batch, hso_prefill
from gencraft.models.introspect import context_size, model_shape


def test_the_vocabulary_bounds_are_zero_and_vocab_minus_one(llama):
    vocab = model_shape(llama).vocab
    edge = torch.tensor([[0, 5, vocab - 1, 7]])  # both ends of the vocabulary are tokens
    assert hso_nll(llama, edge, HSOConfig(window=2)).token_nll.shape == (3,)
    for bad in (vocab, -1):
        with pytest.raises(GencraftError) as e:
            hso_nll(llama, torch.tensor([[5, bad, 7]]))
        assert str(e.value) == f"HSO: ids outside the vocabulary [0, {vocab})"


def test_a_context_of_exactly_the_models_positions_is_allowed(llama):
    limit = context_size(llama)
    cfg = HSOConfig(window=limit // 2, lr=0.0)
    assert hso_nll(llama, _ids(limit + 1), cfg).token_nll.shape == (limit,)
    with pytest.raises(GencraftError) as e:
        hso_nll(llama, _ids(limit + 2), cfg)
    assert str(e.value) == (
        f"a context of {limit + 1} inputs exceeds the model's {limit} positions; "
        f"set reset_every (--reset-every) <= {limit}"
    )
    # reset_every bounds the context: the same long text is scored in pieces
    cut = HSOConfig(window=limit // 2, lr=0.0, reset_every=limit)
    assert hso_nll(llama, _ids(limit + 2), cut).token_nll.shape == (limit + 1,)


def test_batch_size_one_is_allowed_and_zero_is_named(llama):
    cfg = HSOConfig(window=3, reset_every=5)
    one = hso_nll(llama, _ids(16), cfg, batch_size=1)
    default = hso_nll(llama, _ids(16), cfg)
    assert torch.equal(one.token_nll, default.token_nll) and one.windows == default.windows
    with pytest.raises(GencraftError) as e:
        hso_nll(llama, _ids(16), cfg, batch_size=0)
    assert str(e.value) == "batch_size must be >= 1, got 0"


def test_bad_batch_shapes_are_named_word_for_word(llama):
    cases = [
        (torch.tensor([5, 6, 7]), None, "HSO: ids must be [B, N], got torch.Size([3])"),
        ([[5, 6, 7]], None, "HSO: ids must be [B, N], got [[5, 6, 7]]"),
        (
            torch.tensor([[5, 6, 7]]),
            torch.tensor([[1, 1]]),
            "HSO: attention_mask [1, 2] does not match ids [1, 3]",
        ),
        (
            torch.tensor([[5, 6, 7], [5, 6, 100000]]),
            None,
            f"HSO (row 1): ids outside the vocabulary [0, {model_shape(llama).vocab})",
        ),
        (
            torch.tensor([[5, 6, 7]]),
            torch.tensor([[1, 0, 1]]),
            "HSO: row 0's attention mask has padding between its tokens; pad on the left or "
            "the right only",
        ),
    ]
    for ids, mask, message in cases:
        with pytest.raises(GencraftError) as e:
            hso_nll_batch(llama, ids, mask)
        assert str(e.value) == message
    with pytest.raises(GencraftError) as e:
        hso_prefill(llama, torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    assert str(e.value) == "hso_prefill: prompts must be left-padded (as generate takes them)"
    with pytest.raises(GencraftError) as e:
        hso_nll(llama, torch.tensor([[5, 6], [7, 8]]))
    assert str(e.value) == "HSO: ids must be [1, N] or [N], got (2, 2)"


def test_max_context_of_exactly_the_prompt_is_allowed_in_the_prefill(llama):
    ids = _ids(9)
    assert hso_prefill(llama, ids, HSOConfig(window=3, max_context=8)) is not None
    with pytest.raises(GencraftError, match=r"^hso_prefill keeps the whole prompt's states"):
        hso_prefill(llama, ids, HSOConfig(window=3, max_context=7))


def test_the_reported_seconds_are_the_wall_time_of_the_call(llama):
    for kw in (dict(), dict(batch_size=2)):
        t0 = time.perf_counter()
        got = hso_nll(llama, _ids(20), HSOConfig(window=4, reset_every=7), **kw)
        wall = time.perf_counter() - t0
        assert 0 < got.seconds <= wall
    ids = torch.cat([_ids(12, 1), _ids(12, 2), _ids(12, 3)])
    t0 = time.perf_counter()
    rows = hso_nll_batch(llama, ids, None, HSOConfig(window=4))
    wall = time.perf_counter() - t0
    assert len({r.seconds for r in rows}) == 1  # an equal share each
    assert 0 < sum(r.seconds for r in rows) <= wall


def _bars(err: str) -> set[str]:
    return set(re.findall(r"(?<![A-Za-z])(HSO windows|HSO contexts)(?![A-Za-z])", err))


def test_progress_is_off_by_default_and_names_its_bars(llama, capfd):
    """Off unless asked; one context (or batch_size 1) shows the windows, several contexts
    batched show one bar over the contexts, never one per batch."""
    reset = HSOConfig(window=4, reset_every=7)
    hso_nll(llama, _ids(20), HSOConfig(window=4))
    hso_nll(llama, _ids(20), reset, batch_size=2)
    hso_nll_batch(llama, _ids(9), None, HSOConfig(window=4))
    hso_prefill(llama, _ids(9), HSOConfig(window=4))
    assert capfd.readouterr().err == ""
    for n, kw, bars in [
        (20, dict(cfg=HSOConfig(window=4)), {"HSO windows"}),
        (20, dict(cfg=reset), {"HSO windows"}),  # batch_size 1: one pass over the windows
        (20, dict(cfg=reset, batch_size=2), {"HSO contexts"}),  # 3 contexts
        (14, dict(cfg=reset, batch_size=2), {"HSO contexts"}),  # 2 contexts
    ]:
        hso_nll(llama, _ids(n), kw.pop("cfg"), progress=True, **kw)
        assert _bars(capfd.readouterr().err) == bars, (n, kw)
    hso_nll_batch(llama, _ids(9), None, HSOConfig(window=4), progress=True)
    assert _bars(capfd.readouterr().err) == {"HSO windows"}


def test_the_prefill_takes_one_prompt_as_n_and_names_its_rows(llama):
    ids = _ids(9)
    one = hso_prefill(llama, ids[0], HSOConfig(window=3))
    two = hso_prefill(llama, ids, HSOConfig(window=3))
    for a, b in zip(one.layers, two.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    with pytest.raises(GencraftError) as e:
        hso_prefill(llama, torch.tensor([[5, 6, 7], [5, 6, 100000]]))
    vocab = model_shape(llama).vocab
    assert str(e.value) == f"hso_prefill (row 1): ids outside the vocabulary [0, {vocab})"
    with pytest.raises(GencraftError) as e:
        hso_nll(llama, ids[None])
    assert str(e.value) == "HSO: ids must be [1, N] or [N], got (1, 1, 9)"


def test_a_diverging_window_is_named_by_its_tokens(llama):
    with pytest.raises(GencraftError) as e:
        hso_nll(llama, _ids(30), HSOConfig(window=5, lr=1e30, optimizer="sgd"))
    first, last = map(int, re.search(r"window of tokens (\d+)\.\.(\d+) is", str(e.value)).groups())
    assert first % 5 == 0 and last == first + 4  # targets t..t + k - 1 of a window of k


@pytest.mark.parametrize("cfg", [HSOConfig(window=1), HSOConfig(window=4, lr=1.0, optimizer="sgd")])
def test_settings_at_their_edges_still_move_the_states(llama, cfg):
    """A window of one token (so one cached state before the second window) and SGD at
    lr = 1 both optimise: the NLL after the first window leaves the plain model's."""
    plain = hso_nll(llama, _ids(12), HSOConfig(window=cfg.window, lr=0.0)).token_nll
    got = hso_nll(llama, _ids(12), cfg).token_nll
    assert torch.equal(got[: cfg.window], plain[: cfg.window])
    assert (got[cfg.window :] - plain[cfg.window :]).abs().max() > 1e-4


def test_a_causal_lm_without_a_cache_argument_is_named(llama):
    from transformers import LlamaForCausalLM

    from gencraft.models.compat import CACHE_ARG

    class NoCacheLM(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask)

    config = copy.deepcopy(llama.config)
    config.is_decoder = True  # a causal LM by its config, as a custom class would be
    with pytest.raises(GencraftError) as e:
        hso_nll(NoCacheLM(config), _ids(5))
    assert str(e.value) == f"HSO needs a KV cache; NoCacheLM takes none ({CACHE_ARG})"


def test_a_bfloat16_model_gets_states_in_its_dtype_and_scores_near_float32(llama):
    """The states stay float32 inside HSO but reach the model in its own dtype: a bfloat16
    model runs, and its NLL stays near the float32 model's."""
    ids, cfg = _ids(16), HSOConfig(window=4, lr=0.05)
    half = copy.deepcopy(llama).to(torch.bfloat16)
    got = hso_nll(half, ids, cfg).token_nll
    want = hso_nll(llama, ids, cfg).token_nll
    assert got.dtype == torch.float32
    assert (got - want).abs().max() < 0.1 * want.abs().max()
    cache = hso_prefill(half, ids, cfg)
    assert all(layer.keys.dtype == torch.bfloat16 for layer in cache.layers)
