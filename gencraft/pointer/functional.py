"""The pointer sentinel mixture (Merity et al. 2016, eqs. 2-8) as functions on tensors.

Shapes: B batch, L window length, H hidden size, V vocabulary.

    z_i  = q . h_i                      scores over the window         (eq. 3)
    a    = softmax([z ; q . s])         one softmax over L + 1 entries  (eq. 7)
    g    = a[L]                         the sentinel's share = the gate
    p(w) = g * p_vocab(w) + sum_{i : x_i = w} a_i                       (eqs. 5, 6, 8)

The paper writes a in R^{V+1} and g = a[V+1]; it means L + 1 (window plus sentinel). Every
occurrence of a word in the window adds its attention to that word. The result is computed in
log space, with no NaN (value or gradient) for an empty window, a target absent from the window,
or padded (masked) window positions.
"""

from __future__ import annotations

import torch


def _check_shapes(
    vocab_logits: torch.Tensor | None,
    query: torch.Tensor,
    window_states: torch.Tensor,
    window_ids: torch.Tensor | None,
    sentinel: torch.Tensor,
    window_mask: torch.Tensor | None,
) -> None:
    if query.dim() != 2:
        raise ValueError(f"query must be [B, H], got shape {tuple(query.shape)}")
    b, h = query.shape
    if window_states.dim() != 3 or window_states.shape[0] != b or window_states.shape[2] != h:
        raise ValueError(
            f"window_states must be [B, L, H] = [{b}, L, {h}], got {tuple(window_states.shape)}"
        )
    if sentinel.shape != (h,):
        raise ValueError(f"sentinel must be [H] = [{h}], got shape {tuple(sentinel.shape)}")
    bl = tuple(window_states.shape[:2])
    if window_ids is not None and tuple(window_ids.shape) != bl:
        raise ValueError(f"window_ids must be [B, L] = {list(bl)}, got {tuple(window_ids.shape)}")
    if window_ids is not None and window_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"window_ids must be an integer tensor, got {window_ids.dtype}")
    if window_mask is not None:
        if tuple(window_mask.shape) != bl:
            raise ValueError(
                f"window_mask must be [B, L] = {list(bl)}, got {tuple(window_mask.shape)}"
            )
        if window_mask.dtype != torch.bool:
            raise ValueError(f"window_mask must be bool (True = valid), got {window_mask.dtype}")
    if vocab_logits is not None and (vocab_logits.dim() != 2 or vocab_logits.shape[0] != b):
        raise ValueError(f"vocab_logits must be [B, V] with B={b}, got {tuple(vocab_logits.shape)}")


def pointer_attention(
    query: torch.Tensor,
    window_states: torch.Tensor,
    sentinel: torch.Tensor,
    window_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-attention over the window and log-gate (eq. 7).

    Args:
        query: [B, H], already ``tanh(W h + b)`` (eq. 2).
        window_states: [B, L, H], the last layer's states of the L previous positions.
        sentinel: [H], the sentinel vector s.
        window_mask: [B, L] bool, True where the window position holds a real state.

    Returns:
        ``(log_attn [B, L], log_gate [B])``: log a_i (-inf at masked positions) and log g; the
        L + 1 probabilities ``exp`` of these sum to 1 per row.
    """
    _check_shapes(None, query, window_states, None, sentinel, window_mask)
    return _log_attention(query, window_states, sentinel, window_mask)


def _log_attention(
    query: torch.Tensor,
    window_states: torch.Tensor,
    sentinel: torch.Tensor,
    window_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pointer_attention` without the input checks (callers have done them)."""
    z = torch.einsum("blh,bh->bl", window_states, query)  # (B, L)  eq. 3
    if window_mask is not None:
        z = z.masked_fill(~window_mask, float("-inf"))
    s = (query @ sentinel).unsqueeze(1)  # (B, 1)
    log_a = torch.log_softmax(torch.cat([z, s], dim=1), dim=1)  # (B, L + 1)  eq. 7
    return log_a[:, :-1], log_a[:, -1]


def pointer_sentinel_log_probs(
    vocab_logits: torch.Tensor,
    query: torch.Tensor,
    window_states: torch.Tensor,
    window_ids: torch.Tensor,
    sentinel: torch.Tensor,
    window_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log of the pointer sentinel mixture ``g * p_vocab + sum_{i: x_i = w} a_i`` (eqs. 6, 8).

    Args:
        vocab_logits: [B, V], logits of the softmax component (eq. 1).
        query: [B, H], already tanh-projected (eq. 2).
        window_states: [B, L, H]; L may be 0 (first token of a stream).
        window_ids: [B, L] long, the word at each window position (any value where masked).
        sentinel: [H].
        window_mask: [B, L] bool, True = valid position; None = all valid.

    Returns:
        ``(log_probs [B, V], gate [B])``; ``log_probs.exp()`` sums to 1 over V. Computed in
        float32 at least (half inputs are upcast).
    """
    _check_shapes(vocab_logits, query, window_states, window_ids, sentinel, window_mask)
    v = vocab_logits.shape[1]
    valid = (
        window_mask if window_mask is not None else torch.ones_like(window_ids, dtype=torch.bool)
    )
    ids = window_ids.long()
    if bool(((ids < 0) | (ids >= v))[valid].any()):
        raise ValueError(f"window_ids at valid positions must lie in [0, {v})")
    dtype = torch.promote_types(vocab_logits.dtype, torch.float32)
    log_attn, log_gate = _log_attention(
        query.to(dtype), window_states.to(dtype), sentinel.to(dtype), window_mask
    )
    # pointer mass per word: sum the attention of every occurrence (eq. 5)
    mass = torch.zeros(vocab_logits.shape, dtype=dtype, device=vocab_logits.device)
    mass = mass.scatter_add(1, ids.where(valid, 0), log_attn.exp())  # (B, V)
    present = mass > 0
    log_mass = torch.where(present, torch.where(present, mass, 1.0).log(), float("-inf"))
    log_vocab = torch.log_softmax(vocab_logits.to(dtype), dim=-1) + log_gate.unsqueeze(1)
    log_probs = torch.where(present, torch.logaddexp(log_vocab, log_mass), log_vocab)
    return log_probs, log_gate.exp()


def band_window_mask(
    n_queries: int, n_states: int, window: int, device: torch.device | None = None
) -> torch.Tensor:
    """[T, S] bool: query t (at sequence position S - T + t) sees states j with
    ``S - T + t - window < j <= S - T + t``, i.e. the last ``window`` positions, itself included."""
    if window < 1:
        raise ValueError(f"window must be a positive number of positions, got {window}")
    if n_queries > n_states:
        raise ValueError(f"more queries ({n_queries}) than states ({n_states})")
    pos = torch.arange(n_queries, device=device).unsqueeze(1) + (n_states - n_queries)
    j = torch.arange(n_states, device=device).unsqueeze(0)
    return (j <= pos) & (j > pos - window)


def sequence_pointer_attention(
    query: torch.Tensor,
    states: torch.Tensor,
    sentinel: torch.Tensor,
    window: int,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 7 for every position of a sequence at once, each over its own sliding window.

    Args:
        query: [B, T, H], tanh-projected queries of the last T positions.
        states: [B, S, H], S >= T; the last T states belong to the query positions, the first
            S - T precede them (window memory).
        sentinel: [H].
        window: L; position t attends to the L states ending at (and including) its own.
        valid: [B, S] bool, False for padding or positions before a stream's start.

    Returns:
        ``(log_attn [B, T, S], log_gate [B, T])``; ``log_attn`` is -inf outside each window.
    """
    b, t, h = query.shape
    if states.dim() != 3 or states.shape[0] != b or states.shape[2] != h:
        raise ValueError(f"states must be [B, S, H] = [{b}, S, {h}], got {tuple(states.shape)}")
    if sentinel.shape != (h,):
        raise ValueError(f"sentinel must be [H] = [{h}], got shape {tuple(sentinel.shape)}")
    allowed = band_window_mask(t, states.shape[1], window, query.device).unsqueeze(0)
    if valid is not None:
        if tuple(valid.shape) != tuple(states.shape[:2]) or valid.dtype != torch.bool:
            raise ValueError(f"valid must be a bool [B, S] = {list(states.shape[:2])} tensor")
        allowed = allowed & valid.unsqueeze(1)
    z = torch.bmm(query, states.transpose(1, 2)).masked_fill(~allowed, float("-inf"))
    s = (query @ sentinel).unsqueeze(2)  # (B, T, 1)
    log_a = torch.log_softmax(torch.cat([z, s], dim=2), dim=2)
    return log_a[..., :-1], log_a[..., -1]


def pointer_target_log_probs(
    log_vocab_target: torch.Tensor,
    log_attn: torch.Tensor,
    log_gate: torch.Tensor,
    state_ids: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """log p(target) under eq. 6/8 without materialising [B, T, V].

    Args:
        log_vocab_target: [B, T], log p_vocab(target).
        log_attn, log_gate: from :func:`sequence_pointer_attention`, [B, T, S] and [B, T].
        state_ids: [B, S], the word at each state position.
        targets: [B, T].

    Returns:
        [B, T]: ``log(g * p_vocab(y) + sum_{i in window, x_i = y} a_i)``.
    """
    return torch.logaddexp(
        log_gate + log_vocab_target, _log_target_mass(log_attn, state_ids, targets)
    )


def _log_target_mass(
    log_attn: torch.Tensor, state_ids: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """log sum_{i in window, x_i = y} a_i, [B, T]; -inf (with zero, not NaN, gradient) when the
    target is absent. A stable logsumexp with the row maximum taken out: the shifted sum is
    >= 1 wherever the target is present, so neither 1 / mass overflows (summing in linear space
    did, for attention weights that underflow, as with SmolLM2's large hidden states) nor an
    all -inf row gets a NaN gradient."""
    hit = state_ids.unsqueeze(1) == targets.unsqueeze(2)  # (B, T, S)
    masked = log_attn.masked_fill(~hit, float("-inf"))
    top = masked.amax(2, keepdim=True)  # (B, T, 1)
    present = torch.isfinite(top)
    shift = torch.where(present, top, torch.zeros_like(top))
    total = (masked - shift).exp().sum(2)  # >= 1 where present
    present = present.squeeze(2)
    log_mass = torch.where(present, total, torch.ones_like(total)).log() + shift.squeeze(2)
    return torch.where(present, log_mass, torch.full_like(log_mass, float("-inf")))


def pointer_loss(
    log_attn: torch.Tensor, log_gate: torch.Tensor, state_ids: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Eq. 9 per position, [B, T]: ``-log(g + sum_{i in window, x_i = y} a_i)``."""
    return -torch.logaddexp(log_gate, _log_target_mass(log_attn, state_ids, targets))


def sequence_mixture_log_probs(
    vocab_logits: torch.Tensor,
    log_attn: torch.Tensor,
    log_gate: torch.Tensor,
    state_ids: torch.Tensor,
) -> torch.Tensor:
    """Full mixture log-probabilities (eq. 6 with eq. 8) for every position, [B, T, V].

    Args:
        vocab_logits: [B, T, V]; log_attn [B, T, S] and log_gate [B, T] from
            :func:`sequence_pointer_attention`; state_ids [B, S].
    """
    log_vocab = torch.log_softmax(vocab_logits.float(), dim=-1)
    b, t, s = log_attn.shape
    mass = torch.zeros_like(log_vocab).scatter_add_(
        2, state_ids.unsqueeze(1).expand(b, t, s), log_attn.exp().to(log_vocab.dtype)
    )
    present = mass > 0
    log_mass = torch.where(present, torch.where(present, mass, 1.0).log(), float("-inf"))
    mixed = log_vocab + log_gate.unsqueeze(2).to(log_vocab.dtype)
    return torch.where(present, torch.logaddexp(mixed, log_mass), mixed)
