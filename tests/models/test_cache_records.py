"""The caches of models/stepping.py that carry more than keys and values (mutmut's survivors
and untested mutants): a RowStateCache moves its per-row tensors with its rows under
every operation ``generate`` applies, ``row_state_cache`` builds the right shape for each kind
of model, and KVStates starts from given, empty or no states."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.models import load_model
from gencraft.models.caches import KVStates, RowStateCache, row_state_cache


def _layers(b: int, s: int, n_layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(b * 100 + s)
    return [
        (torch.randn(b, 1, s, 4, generator=g), torch.randn(b, 1, s, 4, generator=g))
        for _ in range(n_layers)
    ]


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 4),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("reorder"), st.lists(st.integers(0, 3), min_size=1, max_size=6)),
            st.tuples(st.just("repeat"), st.integers(1, 3)),
            st.tuples(st.just("select"), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_row_state_moves_with_the_rows_under_every_cache_operation(b, ops):
    """Per-row tensors (any shape after dim 0, any key) follow the keys and values: each row's
    state stays beside that row's keys after reorders, repeats and selections."""
    cache = RowStateCache(_layers(b, 3))
    rows = torch.arange(b, dtype=torch.float32)
    cache.row_state["mass"] = rows[:, None].repeat(1, 5)
    cache.row_state[("layer", 1)] = rows[:, None, None].repeat(1, 2, 2)
    keys = cache.layers[0].keys
    for op, arg in ops:
        n = cache.row_state["mass"].shape[0]
        if op == "reorder":
            idx = torch.tensor([i % n for i in arg])
            cache.reorder_cache(idx)
            keys = keys[idx]
        elif op == "repeat":
            cache.batch_repeat_interleave(arg)
            keys = keys.repeat_interleave(arg, dim=0)
        else:
            idx = torch.tensor(sorted({i % n for i in arg}))
            cache.batch_select_indices(idx)
            keys = keys[idx]
    assert torch.equal(cache.layers[0].keys, keys)
    # each row's state is still the row it came from, which its keys tell
    origin = [next(r for r in range(b) if torch.equal(k, _layers(b, 3)[0][0][r])) for k in keys]
    want = torch.tensor(origin, dtype=torch.float32)
    assert torch.equal(cache.row_state["mass"], want[:, None].repeat(1, 5))
    assert torch.equal(cache.row_state[("layer", 1)], want[:, None, None].repeat(1, 2, 2))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bart"])
def test_row_state_cache_fits_the_kind_of_model(name):
    from gencraft.models.compat import DynamicCache, EncoderDecoderCache

    model, _ = load_model(name, seed=0)
    cache = row_state_cache(model)
    if name == "tiny-bart":
        assert isinstance(cache, EncoderDecoderCache)
        assert isinstance(cache.self_attention_cache, RowStateCache)
        assert type(cache.cross_attention_cache) is DynamicCache
    else:
        assert isinstance(cache, RowStateCache) and cache.row_state == {}


def test_kv_states_need_states_or_a_layer_count():
    with pytest.raises(Exception) as e:
        KVStates()
    assert str(e.value) == "KVStates needs states or num_layers"


@pytest.mark.parametrize("start", [0, 3])
def test_kv_states_start_from_given_or_empty_states(start):
    """Empty states (S = 0) give an empty cache; the next forward's states are appended after
    the given ones, with the shift added."""
    states = _layers(2, start)
    cache = KVStates(states)
    assert cache.get_seq_length() == start
    new = _layers(2, 2)
    k, _ = cache.layers[0].update(*new[0])
    assert torch.equal(k[:, :, start:], new[0][0])  # zero shift: the new states as given
    assert torch.equal(k[:, :, :start], states[0][0])
    assert cache.shifts[0][0].requires_grad and cache.get_seq_length() == start + 2


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 4), s=st.integers(1, 5), n_layers=st.integers(1, 3))
def test_a_cache_split_into_rows_and_joined_is_the_cache(b, s, n_layers):
    """select_row(cache, i) holds row i of every layer's keys and values, as copies; cat_rows of
    all the rows gives the cache back."""
    from transformers import DynamicCache

    from gencraft.models.caches import cat_rows, select_row

    layers = _layers(b, s, n_layers)
    cache = DynamicCache(layers)
    rows = [select_row(cache, i) for i in range(b)]
    for i, row in enumerate(rows):
        assert len(row.layers) == n_layers
        for ly, whole, (k, v) in zip(row.layers, cache.layers, layers, strict=True):
            assert torch.equal(ly.keys, k[i : i + 1]) and torch.equal(ly.values, v[i : i + 1])
            # copies: a row keeps no view of the whole batch's storage
            assert ly.keys.untyped_storage().data_ptr() != whole.keys.untyped_storage().data_ptr()
            assert (
                ly.values.untyped_storage().data_ptr() != whole.values.untyped_storage().data_ptr()
            )
    joined = cat_rows(rows)
    for ly, (k, v) in zip(joined.layers, layers, strict=True):
        assert torch.equal(ly.keys, k) and torch.equal(ly.values, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int8])
def test_state_bytes_counts_every_byte_of_keys_and_values(dtype):
    from gencraft.models.caches import state_bytes

    kv = [(torch.zeros(2, 3, 4, 5, dtype=dtype), torch.zeros(2, 3, 1, 5, dtype=dtype))] * 2
    size = torch.zeros((), dtype=dtype).element_size()
    assert state_bytes(kv) == 2 * (120 + 30) * size
    assert state_bytes([]) == 0


def test_the_row_state_wrapper_passes_each_call_on_to_its_model(monkeypatch):
    """RowStateGeneration's forward is its model's (arguments and keywords passed on); its
    generate decodes over a fresh row-state cache, over a cache it is given, or without one
    under ``use_cache=False``, each with the model's own tokens; a wrapper not yet built (as
    when it is being copied) has no ``base`` instead of recursing."""
    import gencraft.models.caches as caches
    from gencraft.models.caches import RowStateGeneration

    base, _ = load_model("tiny-llama")
    model = RowStateGeneration(base)
    ids = torch.tensor([[0, 0, 7, 8, 9], [3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        assert torch.equal(
            model(ids, attention_mask=mask).logits, base(ids, attention_mask=mask).logits
        )
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    want = base.generate(ids, **kw)
    built = []
    real = caches.row_state_cache
    monkeypatch.setattr(caches, "row_state_cache", lambda m: built.append(m) or real(m))
    assert torch.equal(model.generate(ids, **kw), want) and built == [base]
    given = real(base)
    assert torch.equal(model.generate(ids, past_key_values=given, **kw), want)
    assert len(built) == 1 and given.get_seq_length() > 0  # the given cache was used
    assert torch.equal(model.generate(ids, use_cache=False, **kw), want) and len(built) == 1
    assert torch.equal(model.generate(ids, use_cache=True, **kw), want) and len(built) == 2
    assert not hasattr(RowStateGeneration.__new__(RowStateGeneration), "base")
