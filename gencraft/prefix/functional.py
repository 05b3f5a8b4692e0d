"""DASP's attention pieces on tensors (Discourse-Aware Soft Prompting, §3.3-3.4).

Shapes: B batch, T queries, P prefix columns (virtual tokens), K = P + T key columns, S segments.

* :func:`prefix_block_mask`: which prefix columns each query may see (UniBlock): the P prefixes
  are cut into S contiguous groups, ``torch.arange(P).tensor_split(S)``, and a query in segment
  s sees group s only. Real-token columns are not this mask's business (they stay as the
  model's causal/padding mask has them).
* :func:`trunc_sparse_attention`: TruncSA, eq. 2: each key column's attention summed over the
  queries and normalised over the keys gives a key-importance distribution; the keys outside
  its top-p nucleus are zeroed in every row; rows are re-normalised (the paper does not say; it
  is the default here and can be turned off). The paper sparsifies BART's bidirectional
  encoder. In a causal stack (a decoder-only model, a decoder), summing over all queries would
  let later tokens choose the columns earlier positions see, so there each query uses the mass
  of the queries up to itself (``causal=True``; a deviation the paper never needed).
* :func:`soft_sparse_attention`: SoftSA, eqs. 3-4: a Gumbel-softmax sample of each attention
  row, softmax((log a + g) / τ) with a = softmax(scores), g = -log(-log u), u ~ U(0, 1) (the
  reading "π = the attention probabilities" of the paper's two).
"""

from __future__ import annotations

import torch

from gencraft.errors import ConfigError


def prefix_block_mask(
    segment_ids: torch.Tensor, num_virtual_tokens: int, num_segments: int
) -> torch.Tensor:
    """UniBlock's mask over the prefix columns.

    Args:
        segment_ids: [B, T] LongTensor, each query's segment in [0, S).
        num_virtual_tokens: P.
        num_segments: S (1 <= S <= P).

    Returns:
        [B, T, P] bool, True where the query may attend to the prefix column: column j is in
        group s = the group of ``torch.arange(P).tensor_split(S)`` that holds j.
    """
    p, s = num_virtual_tokens, num_segments
    if s < 1 or p < 1:
        raise ConfigError(f"need P >= 1 prefixes and S >= 1 segments, got P = {p}, S = {s}")
    if p < s:
        raise ConfigError(
            f"{p} prefixes cannot be split into {s} segment groups (each group needs at least "
            "one): use more virtual tokens or fewer segments"
        )
    if segment_ids.dim() != 2 or segment_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise ConfigError(
            f"segment_ids must be an integer tensor [B, T], got {segment_ids.dtype} of shape "
            f"{tuple(segment_ids.shape)}"
        )
    if segment_ids.numel() and (int(segment_ids.min()) < 0 or int(segment_ids.max()) >= s):
        raise ConfigError(
            f"segment_ids must lie in [0, {s}), got values in [{int(segment_ids.min())}, "
            f"{int(segment_ids.max())}]"
        )
    group = torch.empty(p, dtype=torch.long, device=segment_ids.device)
    for g, cols in enumerate(torch.arange(p).tensor_split(s)):
        group[cols.to(group.device)] = g
    return segment_ids.long()[..., None] == group  # [B, T, 1] vs [P] -> [B, T, P]


def column_mass(
    probs: torch.Tensor,
    query_mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    past: torch.Tensor | None = None,
) -> torch.Tensor:
    """ā of eq. 2: each key column's attention summed over the queries, in float32.

    Args:
        probs: [..., T, K] attention rows.
        query_mask: [..., T] bool (broadcastable), the queries that count (e.g. not padding).
        causal: each query gets the mass of the queries up to and including itself (a causal
            stack: query t's output must not depend on later tokens); else all queries share
            one sum (the paper's bidirectional encoder).
        past: causal only, [..., K0] (K0 <= K) the mass of the queries before these T, over
            the first K0 keys (cached decoding: the keys of earlier steps come first).

    Returns:
        [..., T, K] (causal) or [..., 1, K].
    """
    # the nucleus is piecewise constant in probs: no gradient, and nothing kept for backward
    weights = probs.detach().float()
    if query_mask is not None:
        weights = weights * query_mask[..., None].to(weights.dtype)
    if not causal:
        if past is not None:
            raise ValueError("past column mass is for causal stacks only")
        return weights.sum(dim=-2, keepdim=True)
    mass = weights.cumsum(dim=-2)
    if past is not None:
        k0, k = past.shape[-1], mass.shape[-1]
        if k0 > k:
            raise ValueError(f"past column mass covers {k0} keys, the call has {k}")
        mass = mass + torch.nn.functional.pad(past.float(), (0, k - k0))[..., None, :]
    return mass


def nucleus_rows(
    probs: torch.Tensor, mass: torch.Tensor, top_p: float, renormalize: bool = True
) -> torch.Tensor:
    """Zero the keys outside the top-p nucleus of ``mass`` [..., T|1, K] (normalised over the
    keys: the key-importance distribution) in ``probs`` [..., T, K]; the key that crosses
    ``top_p`` is kept (at least one key). ``renormalize``: rows re-normalised over the kept
    keys; a row with no mass left on them stays all zero (no NaN)."""
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must lie in (0, 1], got {top_p}")
    importance = mass / mass.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float).tiny)
    sorted_imp, order = importance.sort(dim=-1, descending=True)
    before = sorted_imp.cumsum(dim=-1) - sorted_imp  # mass of the more important keys
    keep_sorted = before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # [..., T|1, K]
    out = probs.masked_fill(~keep, 0.0)  # autograd keeps a bool mask, not a float one
    if renormalize:
        total = out.sum(dim=-1, keepdim=True)
        out = torch.where(total > 0, out / total.clamp_min(torch.finfo(out.dtype).tiny), out)
    return out


def trunc_sparse_attention(
    probs: torch.Tensor,
    top_p: float,
    renormalize: bool = True,
    *,
    query_mask: torch.Tensor | None = None,
    causal: bool = False,
    past_mass: torch.Tensor | None = None,
) -> torch.Tensor:
    """TruncSA (eq. 2) on attention probabilities.

    Args:
        probs: [..., T, K] attention rows (each sums to 1 over its allowed keys).
        top_p: the nucleus mass in (0, 1]; the key that crosses it is kept (at least one key).
        renormalize: rows re-normalised over the kept keys; a row with no mass left on them
            stays all zero (no NaN).
        query_mask: [..., T] bool (broadcastable), the queries whose rows count in the column
            sums (e.g. not padding); default all.
        causal: key importance from the queries up to each query (see :func:`column_mass`);
            default: from all queries, one nucleus for every row (the paper's encoder).
        past_mass: causal only, [..., K0] the column mass of earlier queries (cached decoding).

    Returns:
        [..., T, K], the rows with the keys outside the nucleus zeroed.
    """
    mass = column_mass(probs, query_mask, causal=causal, past=past_mass)
    return nucleus_rows(probs, mass, top_p, renormalize)


def soft_sparse_attention(
    scores: torch.Tensor,
    tau: float,
    generator: torch.Generator | None = None,
    noise: bool = True,
) -> torch.Tensor:
    """SoftSA (eqs. 3-4): a Gumbel-softmax relaxation of each attention row.

    Args:
        scores: [..., K] attention logits (masked keys at -inf).
        tau: temperature τ > 0 (paper: 1.0, 0.1, 0.01).
        generator: draws u = ``torch.rand(scores.shape, generator=generator, ...)``.
        noise: False gives the noiseless softmax(log a / τ) (e.g. at evaluation).

    Returns:
        [..., K] rows summing to 1 over the unmasked keys; a fully masked row is all zero.
    """
    if not tau > 0:
        raise ConfigError(f"tau must be > 0, got {tau}")
    work = torch.promote_types(scores.dtype, torch.float32)  # float32 at least (float64 stays)
    log_a = torch.log_softmax(scores.to(work), dim=-1)
    if noise:
        u = torch.rand(scores.shape, generator=generator, device=scores.device)
        u = u.clamp(min=torch.finfo(torch.float).tiny)  # u = 0 would give g = -inf
        log_a = log_a - torch.log(-torch.log(u))
    out = torch.softmax(log_a / tau, dim=-1)
    return torch.nan_to_num(out, nan=0.0).to(scores.dtype)
