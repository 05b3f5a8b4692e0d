"""Causality of every DASP normaliser and blocking mode on causal stacks.

A decoder's position t must not see tokens after t. TruncSA as the paper defines it (for
BART's bidirectional encoder) sums each key column over all queries, which in a causal stack
lets later tokens pick the columns earlier positions may use. These tests change the tokens
after position j and check every logit before j is unchanged, and check that the training
forward equals cached step-by-step decoding (greedy logits, beam scores). The tiny models'
attention is made peaked (query weights scaled up) so that TruncSA's nucleus drops columns:
with near-uniform attention the bug would not show.
"""

from __future__ import annotations

import pytest
import torch

from gencraft.models.tiny import build_tiny_model
from gencraft.prefix import PrefixConfig, PrefixModel, sparse_attention
from gencraft.prefix.functional import column_mass, trunc_sparse_attention
from gencraft.prefix.segment import output_segment, uniform_segments

P = 4
T, J, NEW = 14, 6, 5
NORMALIZERS = ["softmax", "truncsa", "softsa", "sparsemax", "entmax15"]
BLOCKING = {
    "dense": {},
    "uniblock": {"encoder_segments": 2, "decoder_segments": 2, "blocked_layers": "all"},
    "hierblock": {"encoder_segments": 2, "decoder_segments": 2, "blocked_layers": "lower"},
}


def _peaked(name: str, seed: int = 0) -> torch.nn.Module:
    base = build_tiny_model(name, seed=seed)
    with torch.no_grad():
        for n, w in base.named_parameters():
            if n.endswith("q_proj.weight"):
                w.mul_(8.0)
            elif n.endswith("c_attn.weight"):  # GPT-2: q, k and v in one matrix
                w[:, : w.shape[0]].mul_(8.0)
    return base.eval()


def _model(name: str, normalizer: str, blocking: str, **extra) -> PrefixModel:
    if normalizer in ("sparsemax", "entmax15"):
        pytest.importorskip("entmax")
    cfg = PrefixConfig(
        num_virtual_tokens=P,
        normalizer=normalizer,
        top_p=0.5,
        tau=0.5,
        sparse_layers="all",
        init_seed=1,
        **BLOCKING[blocking],
        **extra,
    )
    return PrefixModel(_peaked(name), cfg).eval()


def _ids(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 250, (2, T), generator=g)
    changed = ids.clone()
    changed[:, J:] = torch.randint(5, 250, (2, T - J), generator=g)
    return ids, changed


@pytest.mark.parametrize("blocking", list(BLOCKING))
@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_later_tokens_leave_earlier_logits_unchanged(name, normalizer, blocking):
    model = _model(name, normalizer, blocking)
    ids, changed = _ids()
    kw = {}
    if blocking != "dense":  # the same segments for both inputs
        kw = {"segment_ids": uniform_segments(torch.ones_like(ids), 2)}
    with torch.no_grad():
        a = model(ids, **kw).logits
        b = model(changed, **kw).logits
    torch.testing.assert_close(a[:, :J], b[:, :J], rtol=0, atol=1e-5)
    assert (a[:, J:] - b[:, J:]).abs().max() > 1e-3  # the change is seen where it may be


def test_truncsa_changes_earlier_logits_when_summed_over_all_queries(monkeypatch):
    """The guard: the paper's global column sum on a causal stack breaks causality here."""
    import gencraft.prefix.attention as attention

    model = _model("tiny-llama", "truncsa", "dense")
    ids, changed = _ids()
    monkeypatch.setattr(
        attention.AttentionCall, "autoregressive", property(lambda call: False), raising=True
    )
    with torch.no_grad():
        a = model(ids).logits
        b = model(changed).logits
    assert (a[:, :J] - b[:, :J]).abs().max() > 1e-3


def _forward_logits(model: PrefixModel, prompt: torch.Tensor, seq: torch.Tensor, blocking: str):
    """The training forward's next-token logits for the generated tokens of ``seq``."""
    t, n = prompt.shape[1], seq.shape[1] - prompt.shape[1]
    kw = {}
    if blocking != "dense":
        prompt_seg = uniform_segments(torch.ones_like(prompt), 2)
        out_seg = output_segment(torch.arange(n), 2, NEW)[None].expand(seq.shape[0], -1)
        out_mask = torch.zeros_like(seq, dtype=torch.bool)
        out_mask[:, t:] = True
        kw = {"segment_ids": torch.cat([prompt_seg, out_seg], 1), "output_mask": out_mask}
    with torch.no_grad():
        return model(seq, **kw).logits[:, t - 1 : -1]


def _greedy(model, ids: torch.Tensor, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """(the cached greedy decoding's logits [B, NEW, V] float32, its sequences)."""
    out = model.generate(
        ids,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **kw,
    )
    return torch.stack(out.logits, dim=1).float(), out.sequences


@pytest.mark.parametrize("blocking", list(BLOCKING))
@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_training_forward_equals_cached_greedy_decoding(name, normalizer, blocking):
    model = _model(name, normalizer, blocking)
    prompt, _ = _ids(1)
    stepped, seq = _greedy(model, prompt)
    full = _forward_logits(model, prompt, seq, blocking).float()
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_truncsa_beam_scores_equal_the_forward_of_each_beam(name):
    """Beam search reorders the running column mass with the beams."""
    model = _model(name, "truncsa", "dense")
    prompt, _ = _ids(2)
    out = model.generate(
        prompt[:1],
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        num_beams=3,
        num_return_sequences=3,
        length_penalty=0.0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    seq = out.sequences
    logp = torch.log_softmax(_forward_logits(model, prompt[:1].expand(3, -1), seq, "dense"), -1)
    new = seq[:, prompt.shape[1] :]
    total = logp.gather(-1, new[..., None]).squeeze(-1).sum(-1)
    torch.testing.assert_close(total, out.sequences_scores.float(), rtol=1e-4, atol=1e-4)


def test_encoder_decoder_decoder_truncsa_is_causal_and_equals_stepping():
    model = PrefixModel(
        build_tiny_model("tiny-bart", seed=0),
        PrefixConfig(num_virtual_tokens=P, normalizer="truncsa", top_p=0.5, sparse_stack="decoder"),
    ).eval()
    with torch.no_grad():
        for n, w in model.base.named_parameters():
            if n.endswith("q_proj.weight"):
                w.mul_(8.0)
    src, _ = _ids(3)
    stepped, dec = _greedy(model, src)
    with torch.no_grad():
        full = model(src, decoder_input_ids=dec[:, :-1]).logits
        changed = dec[:, :-1].clone()
        changed[:, 3:] = 7
        other = model(src, decoder_input_ids=changed).logits
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(full[:, :3], other[:, :3], rtol=0, atol=1e-5)


def test_sparse_attention_generate_carries_the_column_mass():
    """RowStateGeneration(base).generate decodes TruncSA with the running column mass (its
    cached greedy logits equal one full forward pass), leaving ``base`` untouched, whose own
    generate is refused in one line naming the wrapper."""
    from gencraft.errors import ConfigError
    from gencraft.models.caches import RowStateGeneration

    base = _peaked("tiny-llama")
    cfg = PrefixConfig(normalizer="truncsa", top_p=0.5, sparse_layers="all")
    handle = sparse_attention(base, cfg)
    prompt, _ = _ids(4)
    model = RowStateGeneration(base)
    stepped, seq = _greedy(model, prompt, pad_token_id=0)
    with torch.no_grad():
        full = base(seq).logits[:, prompt.shape[1] - 1 : -1]
        assert torch.equal(model(seq).logits, base(seq).logits)  # the forward is base's
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)
    assert model.config is base.config and "generate" not in vars(base)
    with pytest.raises(ConfigError, match=r"RowStateGeneration\(model\)\.generate"):
        _greedy(base, prompt, pad_token_id=0)
    handle.remove()


def test_column_mass_is_a_prefix_sum_and_continues_from_the_past():
    g = torch.Generator().manual_seed(0)
    # 2 prefix columns then 5 tokens; query i sees the prefixes and tokens 0..i
    seen = torch.arange(7) <= torch.arange(5)[:, None] + 2
    probs = torch.rand(2, 3, 5, 7, generator=g).masked_fill(~seen, -1e9).softmax(-1)
    mask = torch.tensor([[False, True, True, True, True], [True] * 5])[:, None]
    mass = column_mass(probs, mask, causal=True)
    hand = torch.stack(
        [(probs[..., : i + 1, :] * mask[..., : i + 1, None]).sum(-2) for i in range(5)], -2
    )
    torch.testing.assert_close(mass, hand)
    # the last two queries after the first three: the same rows as all five at once
    head = column_mass(probs[..., :3, :5], mask[..., :3], causal=True)[..., -1, :]
    tail = column_mass(probs[..., 3:, :], mask[..., 3:], causal=True, past=head)
    torch.testing.assert_close(tail, mass[..., 3:, :])
    rows = trunc_sparse_attention(probs, 0.5, causal=True)
    for i in range(5):  # row i is eq. 2 over the queries 0..i
        only = trunc_sparse_attention(probs[..., : i + 1, :], 0.5)[..., -1, :]
        torch.testing.assert_close(rows[..., i, :], only)
