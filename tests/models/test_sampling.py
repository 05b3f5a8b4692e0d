"""The one batched sampler: each input draws from its own generator, so a batch of
prompts of different lengths gives each the samples it draws alone, with processors that read
each row's ids; samples follow the processed distribution."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import NoRepeatNGramLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

from gencraft.errors import GencraftError
from gencraft.models.prompts import pad_batch
from gencraft.models.sampling import sample_batch
from tests.search.test_batch import SETTINGS, V, _model


@settings(max_examples=10, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2", "bart"]),
    prompts=st.lists(
        st.lists(st.integers(3, V - 1), min_size=1, max_size=6), min_size=1, max_size=4
    ),
    n=st.integers(1, 3),
    seed=st.integers(0, 9),
    ngram=st.sampled_from([0, 2]),
    top_k=st.sampled_from([None, 3]),
)
def test_a_batch_samples_what_each_input_samples_alone(kind, prompts, n, seed, ngram, top_k):
    model = _model(kind, 0)
    procs = ([NoRepeatNGramLogitsProcessor(ngram)] if ngram else []) + (
        [TopKLogitsWarper(top_k)] if top_k else []
    )

    def draw(rows, seeds):
        batch = pad_batch([{"input_ids": p} for p in rows], 0, left=kind != "bart")
        return sample_batch(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            n=n,
            max_new_tokens=6,
            seeds=seeds,
            eos_token_id=[2],
            processors=procs,
        )

    together = draw(prompts, [seed + i for i in range(len(prompts))])
    alone = [s for i, p in enumerate(prompts) for s in draw([p], [seed + i])]
    assert together == alone
    for i, s in enumerate(together):
        assert 2 not in s[:-1] and (s[-1] == 2 or len(s) == 6)
        if ngram:  # no sampled token completes a bigram seen before it, prompt included
            owner = prompts[i // n]
            full = (owner if kind != "bart" else [model.config.decoder_start_token_id]) + s
            for k in range(len(full) - len(s), len(full)):
                assert (full[k - 1], full[k]) not in set(itertools.pairwise(full[:k]))


def test_samples_follow_the_processed_distribution():
    model = _model("llama", 1)
    ids = torch.tensor([[3, 5, 7]])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
    top = lp.topk(2).indices
    want = torch.zeros(V)
    want[top] = lp[top].exp() / lp[top].exp().sum()
    rows = sample_batch(
        model,
        ids,
        n=4000,
        max_new_tokens=1,
        seeds=[0],
        eos_token_id=[2],
        processors=[TopKLogitsWarper(2)],
    )
    freq = torch.bincount(torch.tensor([r[0] for r in rows]), minlength=V) / 4000
    assert (freq - want).abs().max() < 0.03, (freq, want)


def test_bad_sampling_arguments_are_named():
    model = _model("llama", 0)
    ids = torch.tensor([[3, 4]])
    with pytest.raises(GencraftError, match=r"^1 seeds for 2 inputs; give one each$"):
        sample_batch(model, ids.repeat(2, 1), n=1, max_new_tokens=2, seeds=[0], eos_token_id=[2])
    with pytest.raises(GencraftError, match=r"^3 seeds for 1 inputs; give one each$"):
        sample_batch(model, ids, n=1, max_new_tokens=2, seeds=[0, 1, 2], eos_token_id=[2])
    with pytest.raises(GencraftError, match=r"^n \(samples per input\) must be >= 1, got 0$"):
        sample_batch(model, ids, n=0, max_new_tokens=2, seeds=[0], eos_token_id=[2])


def _reference(model, prompt, *, n, new, seed, eos, procs):
    """One input alone, without a cache or padding: each step a full forward of its n rows,
    log-softmax, the processors, one draw per row from the input's own generator; a row that
    ended repeats the smallest EOS id; each sample cut after its first EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.tensor([prompt] * n)
    ed = model.config.is_encoder_decoder
    ids = torch.full((n, 1), model.config.decoder_start_token_id) if ed else src
    drawn, done = torch.empty(n, 0, dtype=torch.long), torch.zeros(n, dtype=torch.bool)
    for _ in range(new):
        with torch.no_grad():
            full = torch.cat([ids, drawn], 1)
            out = model(input_ids=src, decoder_input_ids=full) if ed else model(input_ids=full)
        scores = torch.log_softmax(out.logits[:, -1].float(), -1)
        for p in procs:
            scores = p(full, scores)
        tok = torch.multinomial(torch.softmax(scores, -1), 1, generator=g)[:, 0]
        tok = torch.where(done, min(eos), tok)
        drawn, done = torch.cat([drawn, tok[:, None]], 1), done | torch.isin(tok, torch.tensor(eos))
        if bool(done.all()):
            break
    return [s[: next((j + 1 for j, x in enumerate(s) if x in eos), len(s))] for s in drawn.tolist()]


@settings(max_examples=12, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2", "bart"]),
    prompts=st.lists(
        st.lists(st.integers(3, V - 1), min_size=1, max_size=5), min_size=1, max_size=3
    ),
    n=st.integers(1, 3),
    new=st.integers(1, 7),
    seeds=st.lists(st.integers(0, 99), min_size=3, max_size=3),
    eos=st.sampled_from([[2], [7, 2], [5], [2, 5, 9]]),
    temperature=st.sampled_from([None, 0.7, 1.6]),
)
def test_each_sample_is_the_full_forward_reference_of_its_input(
    kind, prompts, n, new, seeds, eos, temperature
):
    """Against a sampler written from the definition, input by input; the model calls are the
    longest sample's length (one per drawn position, none after every row ended)."""
    model = _model(kind, 0)
    procs = [TemperatureLogitsWarper(temperature)] if temperature else []
    batch = pad_batch([{"input_ids": p} for p in prompts], 0, left=kind != "bart")
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        got = sample_batch(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            n=n,
            max_new_tokens=new,
            seeds=seeds[: len(prompts)],
            eos_token_id=eos,
            processors=procs,
        )
    finally:
        hook.remove()
    want = [
        s
        for p, seed in zip(prompts, seeds, strict=False)
        for s in _reference(model, p, n=n, new=new, seed=seed, eos=eos, procs=procs)
    ]
    assert got == want
    assert len(calls) == max(len(s) for s in got)
    assert all(len(s) <= new and not set(s[:-1]) & set(eos) for s in got)


def test_an_eos_list_of_none_is_refused_before_any_model_call():
    model = _model("llama", 0)
    with pytest.raises(GencraftError, match=r"^sample_batch needs the EOS ids that end a sample$"):
        sample_batch(
            model, torch.tensor([[3, 4]]), n=1, max_new_tokens=2, seeds=[0], eos_token_id=[]
        )
