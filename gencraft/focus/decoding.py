"""Focus decoding (FAME eq. 5): restrict generation to a per-document vocabulary V_k ∪ F.

* ``focus_sample,k``: V_k = k tokens drawn once per document from softmax(T_X), without
  replacement (the paper does not say how T_X becomes a distribution; softmax is our choice).
* ``focus_top,k``: V_k = the k highest-scoring tokens of T_X.
* oracle: V_k = the reference summary's tokens.

The restriction is a ``transformers`` ``LogitsProcessor``: disallowed tokens get -inf and, by
default, the row is re-normalised with ``log_softmax`` so that it holds log-probabilities over
V_k ∪ F (eq. 5). This matters under beam search, where ``generate`` applies processors after its
own ``log_softmax``: without the re-normalisation a beam's score is the sum of the *unrestricted*
log-probabilities of its tokens (``renormalize=False``, the reading of "0 otherwise" as zeroing
without renormalising). Greedy search and sampling are unaffected either way (softmax is
shift-invariant).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import torch
from transformers import LogitsProcessor


def focus_vocabulary(
    topic_logits: torch.Tensor,
    k: int,
    *,
    mode: Literal["sample", "top"] = "sample",
    frequent_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Allowed ids V_k ∪ F for one document, a sorted LongTensor.

    Args:
        topic_logits: [V], T_X of the document.
        k: |V_k|, 1 <= k <= V.
        mode: ``"sample"`` (without replacement from softmax(T_X), using ``generator``) or
            ``"top"``.
        frequent_ids: [F] ids always allowed (function words), or None.
    """
    if topic_logits.dim() != 1:
        raise ValueError(
            f"topic_logits must be one document's [V], got {tuple(topic_logits.shape)}"
        )
    v = topic_logits.shape[0]
    if not 1 <= k <= v:
        raise ValueError(f"k must lie in [1, |V| = {v}], got {k}")
    if mode == "sample":
        probs = torch.softmax(topic_logits.detach().float(), dim=0)
        gen_device = generator.device if generator is not None else probs.device
        chosen = torch.multinomial(probs.to(gen_device), k, replacement=False, generator=generator)
        chosen = chosen.to(topic_logits.device)
    elif mode == "top":
        chosen = torch.topk(topic_logits.detach(), k).indices
    else:
        raise ValueError(f"mode must be 'sample' or 'top', got {mode!r}")
    if frequent_ids is not None and frequent_ids.numel():
        chosen = torch.cat([chosen, frequent_ids.to(chosen.device).long()])
    return torch.unique(chosen)


def oracle_vocabulary(
    reference_ids: Sequence[int] | torch.Tensor,
    frequent_ids: torch.Tensor | None = None,
    *,
    exclude: Iterable[int] = (),
) -> torch.Tensor:
    """The oracle V_k: the reference summary's token ids (minus ``exclude``) ∪ F, sorted."""
    skip = set(exclude)
    ids = [int(t) for t in reference_ids if int(t) >= 0 and int(t) not in skip]
    out = torch.tensor(ids, dtype=torch.long)
    if frequent_ids is not None and frequent_ids.numel():
        out = torch.cat([out, frequent_ids.cpu().long()])
    return torch.unique(out)


class FocusLogitsProcessor(LogitsProcessor):
    """Sets every token outside a row's allowed set to -inf.

    Args:
        allowed_ids: one LongTensor of allowed ids per batch row (document); the
            ``num_beams`` (or ``num_return_sequences``) rows that ``generate`` expands a
            document into share its set.
        always_allowed: ids allowed in every row whatever the set (the model's special tokens:
            EOS, PAD), so that a hypothesis can always end.
        renormalize: re-normalise each masked row (``log_softmax``), so that scores are
            log-probabilities over the allowed set (eq. 5); False only masks.
    """

    #: its choices do not depend on a constant added to a row (gencraft.search's beam at 1)
    shift_invariant = True

    def __init__(
        self,
        allowed_ids: Sequence[torch.Tensor],
        *,
        always_allowed: Iterable[int | None] = (),
        renormalize: bool = True,
    ) -> None:
        if len(allowed_ids) == 0:
            raise ValueError("allowed_ids needs one tensor per batch row")
        for i, ids in enumerate(allowed_ids):
            if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.numel() == 0:
                raise ValueError(f"allowed_ids[{i}] must be a non-empty 1-D LongTensor")
        self.allowed_ids = [ids.long() for ids in allowed_ids]
        self.always_allowed = sorted({int(t) for t in always_allowed if t is not None})
        self.renormalize = renormalize
        self._mask: torch.Tensor | None = None
        self._blocked: torch.Tensor | None = None  # [rows, V], the expanded complement

    def mask(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        """[n_docs, V] bool, True = allowed."""
        if self._mask is None or self._mask.shape[1] != vocab_size or self._mask.device != device:
            m = torch.zeros(len(self.allowed_ids), vocab_size, dtype=torch.bool, device=device)
            for i, ids in enumerate(self.allowed_ids):
                if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
                    raise ValueError(f"allowed_ids[{i}] has ids outside [0, {vocab_size})")
                m[i, ids.to(device)] = True
            if self.always_allowed:
                m[:, [t for t in self.always_allowed if t < vocab_size]] = True
            self._mask = m
        return self._mask

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        rows, v = scores.shape
        n = len(self.allowed_ids)
        if rows % n:
            raise ValueError(f"{rows} score rows cannot be split among {n} documents' allowed sets")
        if self._blocked is None or self._blocked.shape != scores.shape:
            self._blocked = ~self.mask(v, scores.device).repeat_interleave(rows // n, dim=0)
        masked = scores.masked_fill(self._blocked.to(scores.device), float("-inf"))
        if not self.renormalize:
            return masked
        norm = torch.logsumexp(masked.float(), dim=-1, keepdim=True)
        # a row another processor already blocked entirely stays -inf (no NaN)
        norm = torch.where(torch.isfinite(norm), norm, torch.zeros_like(norm))
        return (masked.float() - norm).to(scores.dtype)


def peakiness(topic_logits: torch.Tensor, rank: int = 100) -> tuple[float, float]:
    """FAME footnote 12: slope of the line joining the top-1 and top-``rank`` logits of T_X,
    ``(T_(1) - T_(rank)) / (rank - 1)`` (x axis in ranks: our reading; the paper's 1.25 for
    51° fits it), averaged over documents; returns ``(slope, angle in degrees)``.

    Args:
        topic_logits: [V] or [B, V].
    """
    t = topic_logits.detach().float()
    t = t.unsqueeze(0) if t.dim() == 1 else t
    if t.shape[1] < rank:
        raise ValueError(f"need at least {rank} vocabulary entries, got {t.shape[1]}")
    top = torch.topk(t, rank, dim=1).values
    slope = float(((top[:, 0] - top[:, -1]) / (rank - 1)).mean())
    return slope, math.degrees(math.atan(slope))
