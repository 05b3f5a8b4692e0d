"""Beam search and conditional beam search (Yoshida 2023, ch. 7, Alg. 1, eq. 7.4).

Hypotheses are the batch: each step runs the model once on the B live hypotheses' last tokens,
and the KV cache is reordered to follow the surviving beams (no prefix is recomputed).

With ``classifier=None`` and ``finished="aside"`` this is ``transformers``' beam search with
``do_sample=False, length_penalty=0.0, early_stopping=True`` and no logits processors: each step
keeps the max(2, 1 + E)·B best continuations of all live beams (E: the number of EOS ids, so
that B of them never end); the first B of them that end (EOS, or ``max_new_tokens`` reached)
join the finished set unless it is full; the best B that do not end stay live (an ended
hypothesis never continues); search stops when B hypotheses have finished. Scores are summed
log-probabilities including the EOS step.

At ``num_beams=1`` this is beam search with one beam, not ``generate``'s greedy path: logits
processors act on log-probabilities (as in ``generate``'s beam search), while greedy
``generate`` applies them to raw logits. The two agree for processors that commute with adding
a constant to a row (n-gram blocking, suppressed tokens, minimum lengths, top-k, a focus
vocabulary) and can differ for value-changing ones (a repetition penalty); a warning says so.

Conditional beam search ranks candidates by S(x_{1:t+1}) + alpha * log P_clf(a | x_{1:t+1})
(eq. 7.4): the classifier term is added fresh at each step, only to select, and never
accumulated into the running score S. Only the top-``k`` continuations of each live hypothesis
(by model likelihood) are scored by the classifier. Completed hypotheses:

* ``finished="aside"`` (default, ``transformers``' policy): they leave the beam for a finished
  set of B, ranked by the unweighted conditional score S + log P_clf (= S without classifier).
* ``finished="on_beam"`` (the thesis's Alg. 1): they stay on the beam with their score frozen,
  competing with live continuations, and can be evicted; search stops when every beam is
  complete or at ``max_new_tokens``, whose step is Alg. 1's forced EOS (lines 10-14: the only
  candidate is EOS, scored by the classifier, costing ``forced_eos``); the output ranks the
  final beam by the unweighted conditional score (α = 1).

Lengths: ``force_length=n`` counts the tokens before EOS; the thesis's tables count EOS too
(``length_includes_eos=True`` takes n in that convention: n - 1 tokens, then EOS).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.stepping import ProcessorChain, Stepper, resolve

NEG = -1.0e9  # transformers' "impossible" score; kept so that ties break as there

# processors whose choices do not change when a constant is added to a row: on log-probabilities
# (beam search) they act as on raw logits (generate's greedy path); a processor can also say so
# with a ``shift_invariant = True`` attribute (FAME's focus vocabulary does)
SHIFT_INVARIANT = {
    "NoRepeatNGramLogitsProcessor",
    "EncoderNoRepeatNGramLogitsProcessor",
    "SuppressTokensLogitsProcessor",
    "SuppressTokensAtBeginLogitsProcessor",
    "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor",
    "NoBadWordsLogitsProcessor",
    "PrefixConstrainedLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor",
    "ForcedEOSTokenLogitsProcessor",
    "TopKLogitsWarper",
    "LogitNormalization",
}


def _warn_one_beam(processors: Sequence[Any]) -> None:
    """``num_beams=1`` with a processor whose choice may depend on the logits' offset."""
    odd = [
        type(p).__name__
        for p in processors
        if not getattr(p, "shift_invariant", False) and type(p).__name__ not in SHIFT_INVARIANT
    ]
    if odd:
        warnings.warn(
            f"beam_search with num_beams=1 applies {', '.join(odd)} to log-probabilities, as "
            "generate's beam search does; generate's greedy path applies it to raw logits, so "
            "the two can choose differently",
            stacklevel=3,
        )


@dataclass
class Hypothesis:
    """``tokens``: generated ids, EOS excluded; ``score``: summed log-probability (EOS step
    included when ``finished``); ``finished``: ended with EOS (False: cut at max_new_tokens);
    ``conditional_score``: score + log P_clf(a | x) at completion (classifier runs only);
    ``eos_token``: the EOS id that ended it (one of several ``eos_token_id``), None if cut."""

    tokens: list[int]
    score: float
    finished: bool
    conditional_score: float | None = None
    eos_token: int | None = None


@dataclass
class _Slot:
    """One beam slot of the thesis's Alg. 1: its tokens, whether it is complete (ended with
    the EOS id ``eos_token``, or cut at the limit), and the selection and conditional scores
    frozen when it completed."""

    tokens: list[int] = field(default_factory=list)
    done: bool = False
    eos_token: int | None = None
    sel: float = 0.0
    cond: float = 0.0

    @property
    def eos(self) -> bool:
        return self.eos_token is not None


@dataclass
class _Candidate:
    """One choice at a step of Alg. 1: live beam ``beam`` continued by ``token``, or a complete
    slot staying (``token`` None) with its frozen scores. ``sel``: the selection score (with
    α times the classifier), ``unc``: the model's, ``cond``: the conditional score."""

    sel: float
    unc: float
    cond: float
    beam: int
    token: int | None = None


@dataclass
class _Finished:
    """A hypothesis set aside (transformers' policy): its ranking ``key`` (the conditional
    score, or the model score under a forced length), model ``score``, tokens, the EOS id
    that ended it (None: cut at the limit)."""

    key: float
    score: float
    tokens: list[int]
    eos_token: int | None = None


class AttributeScorer(Protocol):
    """What conditional beam search needs from a classifier.

    ``hidden_size`` is checked against the model's (M+1) x H stacked hidden states.
    ``init(n)`` returns an empty per-hypothesis state for n rows; ``score(state, hidden,
    candidates)`` takes the state, ``hidden`` [N, M+1, H] (the current position's hidden states
    of every decoder layer, embeddings first) and ``candidates`` [N, k] token ids, and returns
    (log P(a | x_{1:t}, x_{t+1} = candidate) [N, k], the state extended by this position);
    ``reorder(state, index)`` selects rows."""

    num_layers: int
    hidden_size: int

    def init(self, n: int) -> Any: ...

    def score(
        self, state: Any, hidden: torch.Tensor, candidates: torch.Tensor
    ) -> tuple[torch.Tensor, Any]: ...

    def reorder(self, state: Any, index: torch.Tensor) -> Any: ...


def _check_arguments(
    num_beams: int,
    max_new_tokens: int,
    alpha: float,
    finished: str,
    force_length: int | None,
    forced_eos: str,
    length_includes_eos: bool,
    forced_ranking: str,
) -> int | None:
    """:func:`beam_search`'s arguments checked; returns the forced length in tokens before
    EOS."""
    if num_beams < 1:
        raise GencraftError(f"num_beams must be >= 1, got {num_beams}")
    if alpha < 0:
        raise GencraftError(f"alpha must be >= 0, got {alpha}")
    if finished not in ("aside", "on_beam"):
        raise GencraftError(f"finished must be 'aside' or 'on_beam', got {finished!r}")
    if forced_eos not in ("model", "free"):
        raise GencraftError(f"forced_eos must be 'model' or 'free', got {forced_eos!r}")
    if forced_ranking not in ("score", "selection"):
        raise GencraftError(
            f"forced_ranking must be 'score' or 'selection', got {forced_ranking!r}"
        )
    if length_includes_eos and force_length is not None:
        if force_length < 1:
            raise GencraftError(
                f"force_length={force_length} with length_includes_eos: the EOS alone is 1"
            )
        force_length -= 1
    if force_length is not None and not 0 <= force_length < max_new_tokens:
        raise GencraftError(
            f"force_length={force_length} needs 0 <= force_length < max_new_tokens "
            f"({max_new_tokens}): the EOS after the n tokens counts as a new token"
        )
    return force_length


def beam_search(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    *,
    num_beams: int,
    max_new_tokens: int,
    classifier: AttributeScorer | None = None,
    k: int | None = None,
    alpha: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    finished: Literal["aside", "on_beam"] = "aside",
    force_length: int | None = None,
    forced_eos: Literal["model", "free"] = "model",
    logits_processor: Sequence[Any] | None = None,
    length_includes_eos: bool = False,
    forced_ranking: Literal["score", "selection"] = "score",
) -> list[Hypothesis]:
    """Beam search for one input; returns up to ``num_beams`` hypotheses, best first.

    Args:
        model: a Hugging Face causal LM or encoder-decoder, or a ``Stepper``.
        input_ids: [1, P] prompt (causal) or encoder input (encoder-decoder); None for a Stepper.
        num_beams: B > 0.
        max_new_tokens: generated tokens at most, EOS included; a hypothesis reaching it ends.
        classifier: an ``AttributeScorer`` for conditional beam search; None for plain search.
        k: continuations per hypothesis scored by the classifier (default: all).
        alpha: weight of log P_clf during selection (>= 0); the output ranking uses alpha = 1.
        eos_token_id: id or ids ending a hypothesis; default the model's.
        finished: ``"aside"`` (transformers) or ``"on_beam"`` (thesis Alg. 1); see module doc.
        force_length: n: every output has exactly n tokens before EOS: EOS is removed and the
            distribution renormalised before step n, and EOS is forced at step n (ch. 7.4).
        forced_eos: the score of a forced EOS (at ``force_length``, and with ``"on_beam"`` at
            ``max_new_tokens``): ``"model"`` (default) the model's own log P(EOS | x_{1:n}), so
            an output that cannot end there (a cut sentence) pays for it, as in the thesis's
            reported likelihoods; ``"free"``: log 1 = 0 (its Alg. 1 at the maximum length),
            which makes every prefix of length n a complete output.
        logits_processor: ``transformers`` ``LogitsProcessor``s (e.g. FAME's focus vocabulary),
            applied to each step's log-probabilities [B, V] with the hypotheses' ids so far
            [B, prompt + t] (the decoder start for encoder-decoders), as ``generate`` applies
            them in beam search (no renormalisation by the search).
        length_includes_eos: ``force_length`` counts the EOS token (the thesis's tables'
            convention): the output has ``force_length - 1`` tokens before EOS.
        forced_ranking: with ``force_length`` and ``"on_beam"``, the final order: ``"score"``
            (default) by the model score S (the attribute holds for every output); or
            ``"selection"``: the final beam's order under C' = S + α·log P_clf, which is what
            Alg. 1 returns for a deterministic attribute (b_best = 1).
    """
    force_length = _check_arguments(
        num_beams,
        max_new_tokens,
        alpha,
        finished,
        force_length,
        forced_eos,
        length_includes_eos,
        forced_ranking,
    )
    if classifier is not None and not getattr(classifier, "enabled", True):
        classifier, k = None, None  # a disabled classifier: plain beam search
    if num_beams == 1 and logits_processor:
        _warn_one_beam(logits_processor)
    stepper, eos = resolve(
        model, input_ids, eos_token_id, max_new_tokens=max_new_tokens, hidden=classifier is not None
    )
    v = stepper.vocab_size
    if classifier is not None:
        k = v if k is None else k
        if not 1 <= k <= v:
            raise GencraftError(f"k must be in [1, vocab size {v}], got {k}")
    elif k is not None and not 1 <= k <= v:
        raise GencraftError(f"k must be in [1, vocab size {v}], got {k}")
    search = _BeamSearch(
        stepper,
        num_beams,
        max_new_tokens,
        classifier,
        k,
        alpha,
        eos,
        finished,
        force_length,
        forced_eos,
        list(logits_processor or []),
        forced_ranking,
    )
    return search.run()


class _BeamSearch:
    def __init__(
        self,
        stepper: Stepper,
        b: int,
        max_new: int,
        clf: AttributeScorer | None,
        k: int | None,
        alpha: float,
        eos: list[int],
        policy: str,
        force_length: int | None,
        forced_eos: str = "model",
        processors: list[Any] | None = None,
        forced_ranking: str = "score",
    ) -> None:
        self.s, self.b, self.max_new, self.clf = stepper, b, max_new, clf
        self.k, self.alpha, self.policy, self.force_length = k, alpha, policy, force_length
        self.forced_eos, self.forced_ranking = forced_eos, forced_ranking
        self.eos = torch.tensor(eos)
        self.process = ProcessorChain(stepper, processors)

    def _limit(self, t: int) -> bool:
        """Step t is Alg. 1's last (t = L): on the beam, only a forced EOS can follow."""
        return self.policy == "on_beam" and self.force_length is None and t + 1 == self.max_new

    def _transform(self, logp: torch.Tensor, t: int) -> torch.Tensor:
        """Length forcing (thesis 7.4): no EOS before step n (renormalised), only EOS at n;
        and Alg. 1's forced EOS at the maximum length (on the beam)."""
        n = self.force_length
        if n is None and not self._limit(t):
            return logp
        eos = self.eos.to(logp.device)
        if n is not None and t < n:
            logp = logp.index_fill(1, eos, float("-inf"))
            return logp - torch.logsumexp(logp, dim=-1, keepdim=True)
        out = torch.full_like(logp, float("-inf"))
        # ending with any EOS id is one event: P(end) = sum of their probabilities
        out[:, eos[0]] = torch.logsumexp(logp[:, eos], dim=-1) if self.forced_eos == "model" else 0
        return out

    def _candidates(self, logp: torch.Tensor, scores: torch.Tensor, hidden: Any, cstate: Any):
        """Flat candidates of the B live rows: (selection, unconditional, conditional, beam,
        token) each [N], and the classifier state extended by this position."""
        b, v = logp.shape
        dev = logp.device
        if self.clf is None and (self.k is None or self.k >= v):
            flat = (scores[:, None] + logp).reshape(-1)  # every continuation of every beam
            beam = torch.arange(b, device=dev).repeat_interleave(v)
            return flat, flat, flat, beam, torch.arange(v, device=dev).repeat(b), cstate
        top_lp, tok = logp.topk(self.k, dim=-1)  # [B, k], by model likelihood
        unc = scores[:, None] + top_lp
        sel = cond = unc
        if self.clf is not None:
            clf_lp, cstate = self.clf.score(cstate, hidden, tok)
            dead = ~torch.isfinite(top_lp)  # impossible stays impossible, whatever the classifier
            cond = (unc + clf_lp.to(unc)).masked_fill(dead, NEG)
            sel = (unc + self.alpha * clf_lp.to(unc)).masked_fill(dead, NEG)
        beam = torch.arange(b, device=dev)[:, None].expand_as(tok)
        return (
            sel.reshape(-1),
            unc.reshape(-1),
            cond.reshape(-1),
            beam.reshape(-1),
            tok.reshape(-1),
            cstate,
        )

    def run(self) -> list[Hypothesis]:
        return self._aside() if self.policy == "aside" else self._on_beam()

    def _start(self) -> Any:
        out = self.s.start()
        if self.clf is not None:
            want = (self.clf.num_layers, self.clf.hidden_size)
            got = tuple(out.hidden.shape[1:]) if out.hidden is not None else None
            if got != want:
                raise GencraftError(
                    f"the classifier reads {want[0]} layers x {want[1]} hidden states, but this "
                    f"model gives {got[0]} x {got[1]}: it was trained for another model"
                    if got
                    else "this model gives no hidden states for the classifier"
                )
        return out

    def _first_rows(self, out: Any) -> tuple[Any, ...]:
        """The first step's B rows: (log-probs, cache, hidden states, classifier state, scores
        with only row 0 alive), every row a copy of the prompt's."""
        b, dev = self.b, out.log_probs.device
        cache = self.s.reorder(out.cache, torch.zeros(b, dtype=torch.long, device=dev))
        logp = out.log_probs.expand(b, -1)
        hidden = out.hidden.expand(b, *out.hidden.shape[1:]) if out.hidden is not None else None
        cstate = self.clf.init(b) if self.clf is not None else None
        scores = torch.full((b,), NEG, device=dev)
        scores[0] = 0.0
        return logp, cache, hidden, cstate, scores

    # -- transformers' policy ----------------------------------------------------------------
    def _aside(self) -> list[Hypothesis]:
        b = self.b
        out = self._start()
        dev = out.log_probs.device
        logp, cache, hidden, cstate, scores = self._first_rows(out)
        tokens = torch.zeros(b, 0, dtype=torch.long, device=dev)
        eos = self.eos.to(dev)
        done: list[_Finished] = []
        for t in range(self.max_new):
            logp = self.process(logp, tokens)
            logp = self._transform(logp, t)
            sel, unc, cond, beam, tok, cstate = self._candidates(logp, scores, hidden, cstate)
            n_keep = min(max(2, 1 + len(eos)) * b, sel.numel())
            top_sel, idx = sel[None].topk(n_keep, dim=-1)
            idx = idx[0]
            c_beam, c_tok = beam[idx], tok[idx]
            c_unc, c_cond = unc[idx], cond[idx]
            is_eos = torch.isin(c_tok, eos)
            ends = is_eos | (t + 1 == self.max_new)
            # finished: the first B of the kept candidates that end, while the finished set has room
            if len(done) < b:
                new = []
                for j in torch.nonzero(ends[:b]).flatten().tolist():
                    if top_sel[0, j] <= NEG / 2:
                        continue
                    seq = tokens[c_beam[j]].tolist() + ([] if is_eos[j] else [int(c_tok[j])])
                    key = c_unc[j] if self.force_length is not None else c_cond[j]
                    end = int(c_tok[j]) if is_eos[j] else None
                    new.append(_Finished(float(key), float(c_unc[j]), seq, end))
                done = sorted(done + new, key=lambda r: -r.key)[:b]
            if len(done) >= b or bool(ends.all()):
                break
            # live: the best B of the kept candidates that do not end
            # (-inf, not NEG: an ended candidate must never come back as a live one)
            keep_key = top_sel[0].masked_fill(ends, float("-inf"))
            if not bool((keep_key > NEG / 2).any()):
                break  # no live continuation is possible (e.g. force_length=0 after its EOS)
            # (with max(2, 1 + E)·B kept, at least B of them do not end)
            nxt = keep_key.topk(b).indices
            rows = c_beam[nxt]
            scores = c_unc[nxt].clone()
            new_tok = c_tok[nxt]
            tokens = torch.cat([tokens[rows], new_tok[:, None]], dim=1)
            if self.clf is not None:
                cstate = self.clf.reorder(cstate, rows)
            cache = self.s.reorder(cache, rows)
            out = self.s.step(new_tok, cache)
            logp, cache, hidden = out.log_probs, out.cache, out.hidden
        return [
            Hypothesis(
                f.tokens,
                f.score,
                f.eos_token is not None,
                f.key if self.clf is not None else None,
                f.eos_token,
            )
            for f in done
        ]

    # -- the thesis's Alg. 1 -----------------------------------------------------------------
    def _on_beam(self) -> list[Hypothesis]:
        out = self._start()
        dev = out.log_probs.device
        logp, cache, hidden, cstate, scores = self._first_rows(out)
        beams = [_Slot() for _ in range(self.b)]
        for t in range(self.max_new):
            logp = self._transform(self.process(logp, self._token_rows(beams)), t)
            flat = self._candidates(logp, scores, hidden, cstate)
            cstate = flat[-1]
            chosen = self._choose(beams, scores, *flat[:-1])
            beams, rows, new_tok, scores = self._advance(beams, chosen, t, dev)
            if all(bm.done for bm in beams):
                break
            idx = torch.tensor(rows, device=dev)
            if self.clf is not None:
                cstate = self.clf.reorder(cstate, idx)
            cache = self.s.reorder(cache, idx)
            # complete rows are fed a dummy token; their outputs are never used
            out = self.s.step(torch.tensor(new_tok, device=dev), cache)
            logp, cache, hidden = out.log_probs, out.cache, out.hidden
        return self._ranked(beams, scores)

    def _token_rows(self, beams: list[_Slot]) -> torch.Tensor:
        """The slots' tokens [B, width], left-padded with 0 (for the logits processors)."""
        width = max(len(bm.tokens) for bm in beams)
        rows = [[0] * (width - len(bm.tokens)) + bm.tokens for bm in beams]
        return torch.tensor(rows, dtype=torch.long).view(len(beams), width)

    def _choose(
        self,
        beams: list[_Slot],
        scores: torch.Tensor,
        sel: torch.Tensor,
        unc: torch.Tensor,
        cond: torch.Tensor,
        beam: torch.Tensor,
        tok: torch.Tensor,
    ) -> list[_Candidate]:
        """Alg. 1's selection: the B best of the live beams' continuations and the complete
        slots (which compete with their frozen scores), by selection score."""
        b = self.b
        live = [i for i, bm in enumerate(beams) if not bm.done]
        keep = torch.isin(beam, torch.tensor(live, device=beam.device))
        # only the B best live continuations can be chosen; sort those (stable on ties)
        masked = sel.masked_fill(~keep, 2 * NEG)
        threshold = masked.topk(min(b, sel.numel())).values[-1]
        top = torch.nonzero(keep & (masked >= threshold)).flatten().tolist()
        cands = [
            _Candidate(float(sel[j]), float(unc[j]), float(cond[j]), int(beam[j]), int(tok[j]))
            for j in top
        ]
        cands += [
            _Candidate(bm.sel, float(scores[i]), bm.cond, i)
            for i, bm in enumerate(beams)
            if bm.done
        ]
        cands.sort(key=lambda c: -c.sel)  # stable: earlier (live, lower index) first on ties
        return [c for c in cands if c.sel > NEG / 2][:b] or cands[:b]

    def _advance(
        self, beams: list[_Slot], chosen: list[_Candidate], t: int, dev: torch.device
    ) -> tuple[list[_Slot], list[int], list[int], torch.Tensor]:
        """The next slots from the chosen candidates: (slots, the row each comes from, the
        token each row is fed, model scores)."""
        eos = self.eos.tolist()
        slots, rows, feed, unc = [], [], [], []
        for c in chosen:
            old = beams[c.beam]
            if c.token is None:  # a complete hypothesis stays
                slot = replace(old)
            else:
                is_eos = c.token in eos
                ends = is_eos or t + 1 == self.max_new
                seq = old.tokens + ([] if is_eos else [c.token])
                # a forced EOS at the limit completes the slot, but it was cut there
                ended = is_eos and not self._limit(t)
                slot = _Slot(seq, ends, c.token if ended else None, c.sel, c.cond)
            slots.append(slot)
            rows.append(c.beam)
            feed.append(eos[0] if c.token is None else c.token)
            unc.append(c.unc)
        while len(slots) < self.b:  # fewer candidates than beams (tiny vocabularies)
            slots.append(_Slot([], True, None, NEG, NEG))
            rows.append(rows[0])
            feed.append(eos[0])
            unc.append(NEG)
        return slots, rows, feed, torch.tensor(unc, device=dev)

    def _ranked(self, beams: list[_Slot], scores: torch.Tensor) -> list[Hypothesis]:
        """The final slots, best first: by the conditional score (Alg. 1), or under a forced
        length by the model score (or the selection score, ``forced_ranking``)."""
        final = {id(bm): sc for bm, sc in zip(beams, scores.tolist(), strict=True)}

        def key(bm: _Slot) -> float:
            if self.force_length is None:
                return -bm.cond  # Alg. 1: the unweighted conditional score
            # a forced length holds by construction: rank by S, or Alg. 1's C' order
            return -(bm.sel if self.forced_ranking == "selection" else final[id(bm)])

        ranked = sorted((bm for bm in beams if final[id(bm)] > NEG / 2), key=key)
        return [
            Hypothesis(
                bm.tokens,
                final[id(bm)],
                bm.eos,
                bm.cond if self.clf is not None else None,
                bm.eos_token,
            )
            for bm in ranked
        ]
