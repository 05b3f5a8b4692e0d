"""Beam search and conditional beam search (Yoshida 2023, ch. 7, Alg. 1, eq. 7.4).

One batched core (:func:`beam_search_batch`): B inputs × K beams advance together, one model
call per step on the B·K live hypotheses' last tokens, and the KV cache is reordered to follow
the surviving beams (no prefix is recomputed). All state is ``[B, K, ...]`` tensors (running
tokens and scores, each row's finished set and stop flag), as in ``transformers``' vectorised
beam search; a row that is done stays in the batch, masked. :func:`beam_search` is the batch
of one. Below, B is the beam size of one input.

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
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.stepping import ProcessorChain, Stepper, batch_size, resolve

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
    """Beam search for one input; returns up to ``num_beams`` hypotheses, best first. The
    batch of one of :func:`beam_search_batch`.

    Args:
        model: a Hugging Face causal LM or encoder-decoder, or a ``Stepper`` of one input.
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
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise GencraftError(
            f"beam_search takes one input [1, P], got {list(input_ids.shape)}; use "
            "beam_search_batch for a batch"
        )
    if not isinstance(model, nn.Module) and batch_size(model) != 1:
        raise GencraftError("beam_search takes a Stepper of one input; use beam_search_batch")
    return beam_search_batch(
        model,
        input_ids,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
        classifier=classifier,
        k=k,
        alpha=alpha,
        eos_token_id=eos_token_id,
        finished=finished,
        force_length=force_length,
        forced_eos=forced_eos,
        logits_processor=logits_processor,
        length_includes_eos=length_includes_eos,
        forced_ranking=forced_ranking,
    )[0]


def beam_search_batch(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of inputs: every row's beams advance in one model call per
    step, and each row keeps its own finished hypotheses and stop. Returns one list of
    hypotheses per row, each what :func:`beam_search` returns for that row alone.

    Args:
        model: a Hugging Face causal LM or encoder-decoder, or a ``Stepper`` (of
            ``batch_size`` inputs).
        input_ids: [B, P] prompts (causal LM: left-padded) or encoder inputs (encoder-decoder:
            padded on either side); None for a Stepper.
        attention_mask: [B, P] 1 for tokens, 0 for padding (default: none padded).
        kwargs: the keyword arguments of :func:`beam_search`.
    """
    return search_stepper(model, input_ids, attention_mask, **kwargs)


def search_stepper(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    *,
    num_beams: int,
    max_new_tokens: int | Sequence[int],
    classifier: AttributeScorer | None = None,
    k: int | None = None,
    alpha: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    finished: Literal["aside", "on_beam"] = "aside",
    force_length: int | Sequence[int | None] | None = None,
    forced_eos: Literal["model", "free"] = "model",
    logits_processor: Sequence[Any] | None = None,
    length_includes_eos: bool = False,
    forced_ranking: Literal["score", "selection"] = "score",
) -> list[list[Hypothesis]]:
    """:func:`beam_search_batch` with its arguments spelt out (a ``Stepper`` may be given
    as ``model``, e.g. one built over ``generate``'s encoder outputs). ``max_new_tokens`` and
    ``force_length`` may be given per row (a sequence of B values; None: no forced length
    for that row)."""
    rows = batch_size(model) if not isinstance(model, nn.Module) else None
    if rows is None:
        rows = (
            input_ids.shape[0]
            if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2
            else 1
        )
    limits = _per_row(max_new_tokens, rows, "max_new_tokens")
    forces = _per_row(force_length, rows, "force_length")
    forces = [
        _check_arguments(
            num_beams,
            n,
            alpha,
            finished,
            f,
            forced_eos,
            length_includes_eos,
            forced_ranking,
        )
        for n, f in zip(limits, forces, strict=True)
    ]
    if classifier is not None and not getattr(classifier, "enabled", True):
        classifier, k = None, None  # a disabled classifier: plain beam search
    if num_beams == 1 and logits_processor:
        _warn_one_beam(logits_processor)
    stepper, eos = resolve(
        model,
        input_ids,
        eos_token_id,
        max_new_tokens=max(limits),
        hidden=classifier is not None,
        attention_mask=attention_mask,
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
        limits,
        classifier,
        k,
        alpha,
        eos,
        finished,
        forces,
        forced_eos,
        list(logits_processor or []),
        forced_ranking,
    )
    return search.run()


def _per_row(value: Any, rows: int, name: str) -> list[Any]:
    """A setting given once or per row, as one value per row."""
    if value is None or isinstance(value, int):
        return [value] * rows
    values = list(value)
    if len(values) != rows:
        raise GencraftError(f"{name} gives {len(values)} values for {rows} rows")
    return values


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x`` [B, C, *rest] at ``index`` [B, K] along dim 1: [B, K, *rest]."""
    shape = (*index.shape, *x.shape[2:])
    return x.gather(1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand(shape))


class _BeamSearch:
    """The batched search: B inputs x K beams, every tensor of state ``[B, K, ...]``; the
    model sees the N = B·K hypotheses flattened (input-major) in one call per step. A row
    that is done stays in the batch, masked: its state no longer changes."""

    def __init__(
        self,
        stepper: Stepper,
        num_beams: int,
        max_new: list[int],
        clf: AttributeScorer | None,
        k: int | None,
        alpha: float,
        eos: list[int],
        policy: str,
        force_length: list[int | None],
        forced_eos: str = "model",
        processors: list[Any] | None = None,
        forced_ranking: str = "score",
    ) -> None:
        self.s, self.K, self.clf = stepper, num_beams, clf
        self.B = batch_size(stepper)
        self.k, self.alpha, self.policy = k, alpha, policy
        self.forced_eos, self.forced_ranking = forced_eos, forced_ranking
        # per row: the length limit L and the forced length n (-1: none)
        self.max_new = max(max_new)
        self.limit = torch.tensor(max_new)
        self.force = torch.tensor([-1 if f is None else f for f in force_length])
        self.forced = self.force >= 0
        self.eos = torch.tensor(eos)
        self.process = ProcessorChain(stepper, processors)

    def _limit(self, t: int) -> torch.Tensor:
        """[B] bool: step t is Alg. 1's last (t = L) for the row: on the beam, only a forced
        EOS can follow."""
        last = (t + 1 == self.limit) & ~self.forced
        return last & (self.policy == "on_beam")

    def _transform(self, logp: torch.Tensor, t: int) -> torch.Tensor:
        """Length forcing (thesis 7.4), per row: no EOS before step n (renormalised), only EOS
        at n; and Alg. 1's forced EOS at the maximum length (on the beam). ``logp`` [N, V]."""
        before = self.forced & (t < self.force)
        only_eos = (self.forced & (t >= self.force)) | self._limit(t)
        if not bool(before.any() | only_eos.any()):
            return logp
        dev, kb = logp.device, logp.shape[0] // self.B
        eos = self.eos.to(dev)
        if bool(before.any()):
            cut = logp.index_fill(1, eos, float("-inf"))
            cut = cut - torch.logsumexp(cut, dim=-1, keepdim=True)
            logp = torch.where(before.to(dev).repeat_interleave(kb)[:, None], cut, logp)
        if bool(only_eos.any()):
            out = torch.full_like(logp, float("-inf"))
            # ending with any EOS id is one event: P(end) = sum of their probabilities
            end = torch.logsumexp(logp[:, eos], dim=-1) if self.forced_eos == "model" else 0
            out[:, eos[0]] = end
            logp = torch.where(only_eos.to(dev).repeat_interleave(kb)[:, None], out, logp)
        return logp

    def _candidates(
        self, logp: torch.Tensor, scores: torch.Tensor, hidden: Any, cstate: Any
    ) -> tuple[torch.Tensor, ...]:
        """Each row's candidates, [B, C] each: (selection, unconditional, conditional score,
        beam, token), and the classifier state extended by this position. ``logp`` [N, V],
        ``scores`` [B, K]; a beam's candidates are contiguous, beams in order."""
        (n, v), (b, kb) = logp.shape, scores.shape
        dev = logp.device
        if self.clf is None and (self.k is None or self.k >= v):
            flat = (scores.reshape(n, 1) + logp).view(b, kb * v)  # every continuation
            beam = torch.arange(kb, device=dev).repeat_interleave(v).expand(b, -1)
            tok = torch.arange(v, device=dev).repeat(kb).expand(b, -1)
            return flat, flat, flat, beam, tok, cstate
        top_lp, tok = logp.topk(self.k, dim=-1)  # [N, k], by model likelihood
        unc = scores.reshape(n, 1) + top_lp
        sel = cond = unc
        if self.clf is not None:
            clf_lp, cstate = self.clf.score(cstate, hidden, tok)
            dead = ~torch.isfinite(top_lp)  # impossible stays impossible, whatever the classifier
            cond = (unc + clf_lp.to(unc)).masked_fill(dead, NEG)
            sel = (unc + self.alpha * clf_lp.to(unc)).masked_fill(dead, NEG)
        beam = torch.arange(kb, device=dev).repeat_interleave(self.k).expand(b, -1)
        c = kb * self.k
        return sel.view(b, c), unc.view(b, c), cond.view(b, c), beam, tok.view(b, c), cstate

    def run(self) -> list[list[Hypothesis]]:
        return self._aside() if self.policy == "aside" else self._on_beam()

    def _start(self) -> Any:
        out = self.s.start()
        if out.log_probs.shape[0] != self.B:
            raise GencraftError(
                f"the stepper holds {self.B} inputs but started {out.log_probs.shape[0]} rows"
            )
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
        """The first step's N = B·K rows: (log-probs [N, V], cache, hidden states, classifier
        state, scores [B, K] with only beam 0 alive), each input's K rows copies of its
        prompt's (the prompt ran once)."""
        b, kb, dev = self.B, self.K, out.log_probs.device
        index = torch.arange(b, device=dev).repeat_interleave(kb)
        cache = self.s.reorder(out.cache, index) if kb > 1 else out.cache
        logp = out.log_probs.repeat_interleave(kb, 0)
        hidden = out.hidden.repeat_interleave(kb, 0) if out.hidden is not None else None
        cstate = self.clf.init(b * kb) if self.clf is not None else None
        scores = torch.full((b, kb), NEG, device=dev)
        scores[:, 0] = 0.0
        return logp, cache, hidden, cstate, scores

    def _advance(self, cache: Any, cstate: Any, src: torch.Tensor, feed: torch.Tensor):
        """Reorder the cache and classifier state to beams ``src`` [B, K] of each row and feed
        ``feed`` [B, K]: (log-probs [N, V], cache, hidden states, classifier state)."""
        b, kb = src.shape
        flat = (torch.arange(b, device=src.device)[:, None] * kb + src).view(-1)
        if self.clf is not None:
            cstate = self.clf.reorder(cstate, flat)
        cache = self.s.reorder(cache, flat)
        out = self.s.step(feed.reshape(-1), cache)
        return out.log_probs, out.cache, out.hidden, cstate

    # -- transformers' policy ----------------------------------------------------------------
    def _aside(self) -> list[list[Hypothesis]]:
        b, kb, t_max = self.B, self.K, self.max_new
        out = self._start()
        dev = out.log_probs.device
        logp, cache, hidden, cstate, scores = self._first_rows(out)
        eos = self.eos.to(dev)
        limit = self.limit.to(dev)
        tokens = torch.zeros(b, kb, 0, dtype=torch.long, device=dev)
        # the finished set of each row: K slots, best first; fin_ok marks the filled ones
        fin_tok = torch.zeros(b, kb, t_max, dtype=torch.long, device=dev)
        fin_len = torch.zeros(b, kb, dtype=torch.long, device=dev)
        fin_key = torch.full((b, kb), float("-inf"), device=dev)
        fin_score = torch.zeros(b, kb, device=dev)
        fin_eos = torch.full((b, kb), -1, dtype=torch.long, device=dev)
        fin_ok = torch.zeros(b, kb, dtype=torch.bool, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        for t in range(t_max):
            logp = self.process(logp, tokens.view(b * kb, t))
            logp = self._transform(logp, t)
            sel, unc, cond, beam, tok, cstate = self._candidates(logp, scores, hidden, cstate)
            n_keep = min(max(2, 1 + len(eos)) * kb, sel.shape[1])
            top_sel, idx = sel.topk(n_keep, dim=1)
            c_beam, c_tok = beam.gather(1, idx), tok.gather(1, idx)
            c_unc, c_cond = unc.gather(1, idx), cond.gather(1, idx)
            is_eos = torch.isin(c_tok, eos)
            ends = is_eos | (t + 1 == limit)[:, None]
            # finished: of the first K kept candidates, those that end, while the set has room
            m = min(kb, n_keep)
            room = ~done & (fin_ok.sum(1) < kb)
            new = ends[:, :m] & (top_sel[:, :m] > NEG / 2) & room[:, None]
            if bool(new.any()):
                grown = ~is_eos[:, :m]  # cut at the limit: the last token is kept
                seq = torch.zeros(b, m, t_max, dtype=torch.long, device=dev)
                seq[:, :, :t] = _take(tokens, c_beam[:, :m])
                seq[:, :, t] = torch.where(grown, c_tok[:, :m], 0)
                key = torch.where(self.forced.to(dev)[:, None], c_unc, c_cond)
                # merged with the old set, stably (old first): the K best stay
                all_ok = torch.cat([fin_ok, new], 1)
                all_key = torch.cat([fin_key, key[:, :m]], 1).masked_fill(~all_ok, float("-inf"))
                order = all_key.sort(dim=1, descending=True, stable=True).indices[:, :kb]
                fin_ok = all_ok.gather(1, order)
                fin_key = all_key.gather(1, order)
                fin_score = torch.cat([fin_score, c_unc[:, :m]], 1).gather(1, order)
                fin_len = torch.cat([fin_len, t + grown.long()], 1).gather(1, order)
                ends_with = torch.where(is_eos[:, :m], c_tok[:, :m], -1)
                fin_eos = torch.cat([fin_eos, ends_with], 1).gather(1, order)
                fin_tok = _take(torch.cat([fin_tok, seq], 1), order)
            # live: the best K of the kept candidates that do not end
            # (-inf, not NEG: an ended candidate must never come back as a live one)
            keep_key = top_sel.masked_fill(ends, float("-inf"))
            stuck = ~(keep_key > NEG / 2).any(1)  # e.g. force_length=0 after its EOS
            done = done | (fin_ok.sum(1) >= kb) | ends.all(1) | stuck
            if bool(done.all()):
                break
            nxt_key, nxt = keep_key.topk(kb, dim=1)
            src = c_beam.gather(1, nxt)
            scores = c_unc.gather(1, nxt).masked_fill(nxt_key == float("-inf"), NEG)
            new_tok = c_tok.gather(1, nxt)
            tokens = torch.cat([_take(tokens, src), new_tok[..., None]], dim=2)
            logp, cache, hidden, cstate = self._advance(cache, cstate, src, new_tok)
        results = []
        for r in range(b):
            row = []
            for j in torch.nonzero(fin_ok[r]).flatten().tolist():
                end = int(fin_eos[r, j])
                key = float(fin_key[r, j])
                row.append(
                    Hypothesis(
                        fin_tok[r, j, : int(fin_len[r, j])].tolist(),
                        float(fin_score[r, j]),
                        end >= 0,
                        key if self.clf is not None else None,
                        end if end >= 0 else None,
                    )
                )
            results.append(row)
        return results

    # -- the thesis's Alg. 1 -----------------------------------------------------------------
    def _on_beam(self) -> list[list[Hypothesis]]:
        b, kb, t_max = self.B, self.K, self.max_new
        out = self._start()
        dev = out.log_probs.device
        logp, cache, hidden, cstate, scores = self._first_rows(out)
        eos = self.eos.to(dev)
        # the K slots of each row: tokens, whether complete, the EOS that ended it (-1: none or
        # cut), and the selection and conditional scores frozen when it completed
        slot_tok = torch.zeros(b, kb, t_max, dtype=torch.long, device=dev)
        slot_len = torch.zeros(b, kb, dtype=torch.long, device=dev)
        slot_done = torch.zeros(b, kb, dtype=torch.bool, device=dev)
        slot_eos = torch.full((b, kb), -1, dtype=torch.long, device=dev)
        slot_sel = torch.zeros(b, kb, device=dev)
        slot_cond = torch.zeros(b, kb, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        arange_t = torch.arange(t_max, device=dev)
        for t in range(t_max):
            if self.process:  # each slot's tokens, left-padded with 0 to the step (t)
                at = arange_t[:t] - (t - slot_len[..., None])
                ids = slot_tok.gather(2, at.clamp_min(0)).masked_fill(at < 0, 0)
                logp = self.process(logp, ids.view(b * kb, t))
            logp = self._transform(logp, t)
            sel, unc, cond, beam, tok, cstate = self._candidates(logp, scores, hidden, cstate)
            c = sel.shape[1]
            # Alg. 1's selection: the K best of the live beams' continuations and the complete
            # slots (with their frozen scores); stable on ties, live (lower index) first
            live = ~slot_done.gather(1, beam)
            pool = torch.cat(
                [
                    sel.masked_fill(~live, float("-inf")),
                    slot_sel.masked_fill(~slot_done, float("-inf")),
                ],
                dim=1,
            )
            order = pool.sort(dim=1, descending=True, stable=True).indices[:, :kb]
            ch_sel = pool.gather(1, order)
            valid, eligible = ch_sel > NEG / 2, ch_sel > float("-inf")
            use = torch.where(valid.any(1, keepdim=True), valid, eligible)
            cont = order < c  # a live beam continued (else a complete slot staying)
            pick = order.clamp_max(c - 1)
            c_beam, c_tok = beam.gather(1, pick), tok.gather(1, pick)
            src = torch.where(cont, c_beam, order - c)
            src = torch.where(use, src, src[:, :1])  # unused slots: dead, fed from beam 0's
            is_eos = torch.isin(c_tok, eos) & cont
            grows = cont & ~is_eos
            new_tok = _take(slot_tok, src)
            new_len = slot_len.gather(1, src)
            at = new_len.clamp_max(t_max - 1)[..., None]  # a growing slot has t < t_max tokens
            grown = torch.where(grows[..., None], c_tok[..., None], new_tok.gather(2, at))
            new_tok.scatter_(2, at, grown)
            new_len = new_len + grows.long()
            ended = is_eos & ~self._limit(t).to(dev)[:, None]  # a forced EOS at L was a cut
            at_limit = (t + 1 == self.limit.to(dev))[:, None]
            new_done = torch.where(cont, is_eos | at_limit, slot_done.gather(1, src))
            new_eos = torch.where(cont, torch.where(ended, c_tok, -1), slot_eos.gather(1, src))
            new_sel = torch.where(cont, ch_sel, slot_sel.gather(1, src))
            new_cond = torch.where(cont, cond.gather(1, pick), slot_cond.gather(1, src))
            new_unc = torch.where(cont, unc.gather(1, pick), scores.gather(1, src))
            # fewer candidates than beams (tiny vocabularies): the rest are dead slots
            new_len = new_len.masked_fill(~use, 0)
            new_done = new_done | ~use
            new_eos = new_eos.masked_fill(~use, -1)
            new_sel, new_cond, new_unc = (
                x.masked_fill(~use, NEG) for x in (new_sel, new_cond, new_unc)
            )
            feed = torch.where(cont & use, c_tok, eos[0])
            # a row that is done keeps its slots
            keep = done[:, None]
            slot_tok = torch.where(keep[..., None], slot_tok, new_tok)
            slot_len = torch.where(keep, slot_len, new_len)
            slot_done = torch.where(keep, slot_done, new_done)
            slot_eos = torch.where(keep, slot_eos, new_eos)
            slot_sel = torch.where(keep, slot_sel, new_sel)
            slot_cond = torch.where(keep, slot_cond, new_cond)
            scores = torch.where(keep, scores, new_unc)
            done = slot_done.all(1)
            if bool(done.all()):
                break
            src = torch.where(keep, torch.arange(kb, device=dev).expand(b, -1), src)
            logp, cache, hidden, cstate = self._advance(cache, cstate, src, feed)
        return [
            self._ranked(r, slot_tok, slot_len, slot_eos, slot_sel, slot_cond, scores)
            for r in range(b)
        ]

    def _ranked(
        self, r, slot_tok, slot_len, slot_eos, slot_sel, slot_cond, scores
    ) -> list[Hypothesis]:
        """Row r's final slots, best first: by the conditional score (Alg. 1), or under a
        forced length by the model score (or the selection score, ``forced_ranking``)."""
        final, sel, cond = scores[r].tolist(), slot_sel[r].tolist(), slot_cond[r].tolist()

        forced = bool(self.forced[r])

        def key(j: int) -> float:
            if not forced:
                return -cond[j]  # Alg. 1: the unweighted conditional score
            # a forced length holds by construction: rank by S, or Alg. 1's C' order
            return -(sel[j] if self.forced_ranking == "selection" else final[j])

        ranked = sorted((j for j in range(self.K) if final[j] > NEG / 2), key=key)
        out = []
        for j in ranked:
            end = int(slot_eos[r, j])
            out.append(
                Hypothesis(
                    slot_tok[r, j, : int(slot_len[r, j])].tolist(),
                    final[j],
                    end >= 0,
                    cond[j] if self.clf is not None else None,
                    end if end >= 0 else None,
                )
            )
        return out
