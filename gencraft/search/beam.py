"""Beam search and conditional beam search (Yoshida 2023, ch. 7, Alg. 1, eq. 7.4).

One batched core (:func:`beam_search_tensors`): B rows (inputs) x K beams advance together, one
model call per step on the B·K live hypotheses' last tokens, and the KV cache is reordered to
follow the surviving beams (no prefix is recomputed). The state is tensor records of
``[B, K, ...]`` (:class:`Beams`: a row's finished set or its slots; :class:`Candidates`: a
step's continuations), as in ``transformers``' vectorised beam search; a row that is done stays
in the batch, masked. :func:`beam_search_batch` returns the same result as lists of
:class:`Hypothesis`, and :func:`beam_search` is the batch of one. Every setting is checked once
when the frozen :class:`BeamSettings` is built. Letters: B rows, K beams, V vocabulary, T steps, C
candidates of a row, N = B·K flattened hypotheses.

With ``classifier=None`` and ``finished="aside"`` this is ``transformers``' beam search with
``do_sample=False`` and the same ``length_penalty`` and ``early_stopping``: each step keeps the
max(2, 1 + E)·K best continuations of all live beams (E: the number of EOS ids, so that K of
them never end); of the first K of them, those that end (EOS, or ``max_new_tokens`` reached)
join the row's finished set, ranked by score / length^``length_penalty`` (length: the new tokens
with the EOS); the best K that do not end stay live (an ended hypothesis never continues). A row
stops as ``generate``'s rows do: ``early_stopping=True`` when K hypotheses have finished; False
or ``"never"`` when its best live score can no longer beat the worst finished one by
``generate``'s own heuristic (``"never"`` with a positive penalty: at the maximum length).
gencraft's own searches keep the thesis's scoring, which is the defaults here:
``length_penalty=0.0, early_stopping=True`` (summed log-probabilities, EOS step included; stop at
K finished). ``generate(custom_generate=beam_search)`` passes ``generate``'s values, so that it
equals ``generate``'s beam search under its defaults and any explicit value. One deviation: a
row with fewer than K possible continuations (a ``prefix_allowed_tokens_fn`` allowing fewer
tokens than beams) has dead beams, scored -1e9; ``generate`` lets their completions into the
finished set (where, by float32 rounding and ``topk``'s order on ties, they can fill it and stop
the row early, and be returned), while gencraft's finished set holds possible hypotheses only.

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
  set of K, ranked by the unweighted conditional score S + log P_clf (= S without classifier),
  over length^``length_penalty``; under a forced length, by S. The heuristic stop compares the
  best live model score S, an upper bound of its conditional score.
* ``finished="on_beam"`` (the thesis's Alg. 1): they stay on the beam with their score frozen,
  competing with live continuations, and can be evicted; search stops when every beam is
  complete or at ``max_new_tokens``, whose step is Alg. 1's forced EOS (lines 10-14: the only
  candidate is EOS, scored by the classifier, costing ``forced_eos``); the output ranks the
  final beam by the unweighted conditional score (α = 1). It takes no length penalty and no
  other stopping rule (``length_penalty=0.0, early_stopping=True`` only).

Lengths: ``force_length=n`` counts the tokens before EOS; the thesis's tables count EOS too
(``length_includes_eos=True`` takes n in that convention: n - 1 tokens, then EOS).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from numbers import Integral
from typing import Any, Literal, NamedTuple, Protocol

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.records import TensorRecord
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
            stacklevel=_outside(),
        )


def _outside() -> int:
    """The stack level of the first caller outside this module (what a warning points at)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


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


EarlyStopping = bool | Literal["never"]


@dataclass(frozen=True)
class BeamSettings:
    """Every setting of a beam search, in the shape of ``transformers``' ``GenerationConfig``:
    built by the caller, frozen, and checked once when built (a bad value raises a
    ``GencraftError`` naming it). Pass it to :func:`beam_search_batch` as ``settings``, or
    give its fields there as keywords; keywords beside a ``settings`` override its fields
    (``dataclasses.replace``), and an unknown name is refused.

    Attributes:
        num_beams: K > 0.
        max_new_tokens: the limit L (generated tokens at most, EOS included): one int for
            every row, or one per row.
        force_length: the forced length n in tokens before EOS (one for every row, one per row
            with None for none, or None): the output has exactly n tokens, then EOS (EOS
            removed and renormalised before step n, forced at n; ch. 7.4).
        length_includes_eos: ``force_length`` counts the EOS, as the thesis's tables do (n - 1
            tokens, then EOS).
        classifier: an :class:`AttributeScorer` (conditional beam search) or None; one that
            says ``enabled = False`` is dropped with its ``k`` (plain search).
        k: continuations per hypothesis scored (by model likelihood); None: all V.
        alpha: weight of log P_clf during selection (>= 0); the output ranking uses 1.
        finished: ``"aside"`` (transformers) or ``"on_beam"`` (Alg. 1); see the module doc.
        forced_eos: a forced EOS's score: ``"model"`` log P(EOS | x_{1:n}), so an output that
            cannot end there pays for it; ``"free"`` log 1 = 0 (Alg. 1 at the maximum length).
        forced_ranking: with a forced length on the beam: ``"score"`` by S, or
            ``"selection"`` by Alg. 1's C' = S + α·log P_clf.
        length_penalty: finished scores are divided by length^length_penalty, as in
            ``generate`` (0: summed log-probabilities, the thesis's scoring).
        early_stopping: ``True``, ``False`` or ``"never"``, as in ``generate``.
        logits_processor: ``LogitsProcessor``s applied to each step's log-probabilities
            [N, V] with the hypotheses' ids so far [N, prompt + t], as ``generate``'s beam
            search applies them.
    """

    num_beams: int
    max_new_tokens: int | tuple[int, ...]
    force_length: int | tuple[int | None, ...] | None = None
    length_includes_eos: bool = False
    classifier: AttributeScorer | None = None
    k: int | None = None
    alpha: float = 1.0
    finished: Literal["aside", "on_beam"] = "aside"
    forced_eos: Literal["model", "free"] = "model"
    forced_ranking: Literal["score", "selection"] = "score"
    length_penalty: float = 0.0
    early_stopping: EarlyStopping = True
    logits_processor: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        fix = partial(object.__setattr__, self)  # frozen: normalise once, here
        fix("max_new_tokens", _integers("max_new_tokens", self.max_new_tokens, False))
        fix("force_length", _integers("force_length", self.force_length, True))
        fix("logits_processor", tuple(self.logits_processor or ()))
        if self.classifier is not None and not getattr(self.classifier, "enabled", True):
            fix("classifier", None)  # a disabled classifier: plain search
            fix("k", None)
        self._check()
        self.rows(_rows_given(self))  # each forced length against its limit

    @classmethod
    def from_generation_config(cls, config: Any, **method: Any) -> BeamSettings:
        """The settings ``generate`` asks for with ``config`` (a ``GenerationConfig``): its
        ``num_beams``, ``length_penalty`` and ``early_stopping`` with ``generate``'s defaults
        (1.0, False), and at one beam ``generate``'s greedy path (a row ends at its first EOS:
        0.0, True). ``method``: the other fields (``max_new_tokens`` when the config gives a
        ``max_length`` only; the method's own settings)."""
        beams = int(config.num_beams or 1)
        lp, early = config.length_penalty, config.early_stopping
        if beams == 1:
            lp, early = 0.0, True
        given = dict(
            num_beams=beams,
            length_penalty=1.0 if lp is None else lp,
            early_stopping=False if early is None else early,
        )
        if config.max_new_tokens is not None:
            given["max_new_tokens"] = int(config.max_new_tokens)
        return _settings(None, {**given, **method})

    def rows(self, n: int) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
        """Per row of a batch of ``n``: the limit, and the forced length in tokens before EOS
        (None: none). Raises a ``GencraftError`` when a per-row setting has another count."""
        limits = _per_row(self.max_new_tokens, n, "max_new_tokens")
        forces = _per_row(self.force_length, n, "force_length")
        counted = self.length_includes_eos
        return tuple(limits), tuple(
            _forced_length(m, f, counted) for m, f in zip(limits, forces, strict=True)
        )

    def _check(self) -> None:
        _choice("finished", self.finished, ("aside", "on_beam"))
        _choice("forced_eos", self.forced_eos, ("model", "free"))
        _choice("forced_ranking", self.forced_ranking, ("score", "selection"))
        _choice("early_stopping", self.early_stopping, (True, False, "never"))
        if self.num_beams < 1:
            raise GencraftError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.alpha < 0:
            raise GencraftError(f"alpha must be >= 0, got {self.alpha}")
        if not -1e4 < float(self.length_penalty) < 1e4:
            raise GencraftError(
                f"length_penalty must be a finite number in (-1e4, 1e4), got {self.length_penalty}"
            )
        if self.finished == "on_beam" and (
            self.length_penalty != 0 or self.early_stopping is not True
        ):
            raise GencraftError(
                "finished='on_beam' (the thesis's Alg. 1) ranks by the summed score and stops "
                "when every slot is complete: it takes length_penalty=0.0 and "
                f"early_stopping=True, got {self.length_penalty} and {self.early_stopping!r}"
            )

    def for_vocabulary(self, vocab_size: int) -> BeamSettings:
        """These settings with ``k`` checked against the vocabulary (a classifier scores all
        V continuations unless ``k`` says fewer)."""
        if self.k is not None and not 1 <= self.k <= vocab_size:
            raise GencraftError(f"k must be in [1, vocab size {vocab_size}], got {self.k}")
        if self.classifier is not None and self.k is None:
            return replace(self, k=vocab_size)
        return self


def _integers(name: str, value: Any, none: bool) -> Any:
    """A setting given once or per row as ints (numpy's and torch's integers too; None where
    ``none`` allows it), refused in one line naming any other value."""
    one = isinstance(value, Integral) or (none and value is None)
    values = [value] if one else value
    try:
        bad = [v for v in values if not (isinstance(v, Integral) or (none and v is None))]
    except TypeError:  # neither an integer nor a sequence
        bad = [value]
    if isinstance(value, str | bytes):
        bad = [value]
    if bad:
        raise GencraftError(f"{name} takes an integer or one per row, got {bad[0]!r}")
    out = [None if v is None else int(v) for v in values]
    return out[0] if one else tuple(out)


def _rows_given(s: BeamSettings) -> int:
    """The row count the per-row settings give (1 when both are given once)."""
    counts = {len(v) for v in (s.max_new_tokens, s.force_length) if isinstance(v, tuple)}
    if len(counts) > 1:
        m, f = len(s.max_new_tokens), len(s.force_length)  # type: ignore[arg-type]
        raise GencraftError(f"max_new_tokens gives {m} values, force_length {f}; give one per row")
    return counts.pop() if counts else 1


def _choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    # `is`/type check too: early_stopping=1 is not True for generate
    if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
        raise GencraftError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def _forced_length(limit: int, force: int | None, includes_eos: bool) -> int | None:
    """A row's forced length in tokens before EOS, checked against its limit."""
    if includes_eos and force is not None:
        if force < 1:
            raise GencraftError(
                f"force_length={force} with length_includes_eos: the EOS alone is 1"
            )
        force -= 1
    if force is not None and not 0 <= force < limit:
        raise GencraftError(
            f"force_length={force} needs 0 <= force_length < max_new_tokens "
            f"({limit}): the EOS after the n tokens counts as a new token"
        )
    return force


def _per_row(value: Any, rows: int, name: str) -> list[Any]:
    """A setting given once or per row, as one value per row."""
    if value is None or isinstance(value, int):
        return [value] * rows
    values = list(value)
    if len(values) != rows:
        raise GencraftError(f"{name} gives {len(values)} values for {rows} rows")
    return values


def _settings(settings: BeamSettings | None, overrides: dict[str, Any]) -> BeamSettings:
    """``settings`` with ``overrides`` replaced (or built from them alone), an unknown name
    refused in one line."""
    known = {f.name for f in fields(BeamSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise GencraftError(
            f"beam search has no setting {', '.join(map(repr, unknown))}; BeamSettings has "
            f"{', '.join(sorted(known))}"
        )
    if settings is not None:
        return replace(settings, **overrides)
    missing = [n for n in ("num_beams", "max_new_tokens") if n not in overrides]
    if missing:
        raise GencraftError(
            f"beam search needs {' and '.join(missing)} (or settings=BeamSettings(...))"
        )
    return BeamSettings(**overrides)


@dataclass
class Beams(TensorRecord):
    """K hypotheses of each of B rows (a row's finished set, or its slots on the beam).

    ``tokens`` [B, K, T] generated ids, EOS excluded (0 past ``length``); ``length`` [B, K];
    ``score`` [B, K] summed log-probability S (EOS step included); ``cond`` [B, K] S + log
    P_clf at completion (= S without a classifier); ``key`` [B, K] what ranks it (finished
    set: S or the conditional score over length^length_penalty; on the beam: the selection
    score frozen at completion); ``eos`` [B, K] the EOS id that ended it (-1: none, or cut at
    the limit); ``done`` [B, K] bool (finished set: the slot is filled; on the beam: the
    hypothesis is complete)."""

    tokens: torch.Tensor
    length: torch.Tensor
    score: torch.Tensor
    cond: torch.Tensor
    key: torch.Tensor
    eos: torch.Tensor
    done: torch.Tensor

    @classmethod
    def empty(cls, rows: int, beams: int, steps: int, device: torch.device) -> Beams:
        """No hypothesis: every slot empty, keys -inf."""
        zeros = torch.zeros(rows, beams, device=device)
        return cls(
            tokens=torch.zeros(rows, beams, steps, dtype=torch.long, device=device),
            length=zeros.long(),
            score=zeros,
            cond=zeros.clone(),
            key=torch.full_like(zeros, float("-inf")),
            eos=torch.full_like(zeros, -1, dtype=torch.long),
            done=zeros.bool(),
        )


@dataclass
class Candidates(TensorRecord):
    """A step's continuations of each row, [B, C] each: ``sel`` the selection score (S, plus
    α·log P_clf), ``score`` the model score S, ``cond`` S + log P_clf, ``beam`` the beam it
    continues, ``token`` the token it adds. A beam's candidates are contiguous, beams in
    order."""

    sel: torch.Tensor
    score: torch.Tensor
    cond: torch.Tensor
    beam: torch.Tensor
    token: torch.Tensor


@dataclass
class BeamResult(TensorRecord):
    """Each row's outputs, best first; a row with fewer outputs than K has its ``valid`` ones
    first. ``tokens`` [B, K, T] (EOS excluded; 0 past ``length``); ``length`` [B, K];
    ``score`` [B, K] summed log-probability (EOS step included when finished);
    ``conditional`` [B, K] score + log P_clf at completion (NaN without a classifier);
    ``sequence_score`` [B, K] the value the row's outputs are ranked by (what ``generate``
    reports as ``sequences_scores``); ``finished`` [B, K] ended with EOS (False: cut at the
    limit); ``eos`` [B, K] the EOS id that ended it (-1: cut); ``valid`` [B, K] the slot
    holds an output."""

    tokens: torch.Tensor
    length: torch.Tensor
    score: torch.Tensor
    conditional: torch.Tensor
    sequence_score: torch.Tensor
    finished: torch.Tensor
    eos: torch.Tensor
    valid: torch.Tensor

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Each row's valid outputs as :class:`Hypothesis` lists, best first."""
        tokens, length, score, cond, eos, valid = (
            x.tolist()
            for x in (self.tokens, self.length, self.score, self.conditional, self.eos, self.valid)
        )
        rows = []
        for r in range(len(valid)):
            rows.append(
                [
                    Hypothesis(
                        tokens[r][j][: length[r][j]],
                        score[r][j],
                        eos[r][j] >= 0,
                        None if cond[r][j] != cond[r][j] else cond[r][j],  # NaN: no classifier
                        eos[r][j] if eos[r][j] >= 0 else None,
                    )
                    for j in range(len(valid[r]))
                    if valid[r][j]
                ]
            )
        return rows


def beam_search(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    settings: BeamSettings | None = None,
    *,
    eos_token_id: int | list[int] | None = None,
    **overrides: Any,
) -> list[Hypothesis]:
    """Beam search for one input; returns up to ``num_beams`` hypotheses, best first: the batch
    of one of :func:`beam_search_batch`.

    ``model``: a Hugging Face causal LM or encoder-decoder, or a ``Stepper`` of one input;
    ``input_ids`` [1, P] its prompt (causal) or encoder input (encoder-decoder), None for a
    Stepper; ``settings`` and ``overrides``: :class:`BeamSettings` and its fields;
    ``eos_token_id`` the id or ids ending a hypothesis (default: the model's)."""
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise GencraftError(
            f"beam_search takes one input [1, P], got {list(input_ids.shape)}; use "
            "beam_search_batch for a batch"
        )
    if not isinstance(model, nn.Module) and batch_size(model) != 1:
        raise GencraftError("beam_search takes a Stepper of one input; use beam_search_batch")
    settings = _settings(settings, overrides)
    result = beam_search_tensors(model, input_ids, None, settings, eos_token_id=eos_token_id)
    return result.hypotheses()[0]


def beam_search_batch(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    settings: BeamSettings | None = None,
    *,
    eos_token_id: int | list[int] | None = None,
    **overrides: Any,
) -> list[list[Hypothesis]]:
    """Beam search over a batch: one list of hypotheses per row, best first, each what
    :func:`beam_search` returns for that row alone. The arguments are
    :func:`beam_search_tensors`', which returns the same outputs as tensors."""
    settings = _settings(settings, overrides)
    return beam_search_tensors(
        model, input_ids, attention_mask, settings, eos_token_id=eos_token_id
    ).hypotheses()


def _rows(model: nn.Module | Stepper, input_ids: torch.Tensor | None) -> int:
    """The batch size: a Stepper's own, else ``input_ids``' rows (a 1-D prompt: one row)."""
    rows = batch_size(model) if not isinstance(model, nn.Module) else None
    if rows is not None:
        return rows
    two_d = isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2
    return input_ids.shape[0] if two_d else 1


def beam_search_tensors(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    settings: BeamSettings | None = None,
    *,
    eos_token_id: int | list[int] | None = None,
    **overrides: Any,
) -> BeamResult:
    """The batched search; returns each row's outputs as tensors (:class:`BeamResult`).

    ``model``: a Hugging Face causal LM or encoder-decoder, or a ``Stepper`` of B inputs (e.g.
    one built over ``generate``'s encoder outputs); ``input_ids`` [B, P] prompts (causal LM:
    left-padded) or encoder inputs (padded on either side), None for a Stepper;
    ``attention_mask`` [B, P] 1 for tokens (default: none padded). ``settings``: a
    :class:`BeamSettings`; ``overrides``: its fields, replacing those of ``settings`` or, with
    none, building it (``num_beams`` and ``max_new_tokens`` then needed). ``eos_token_id``:
    the id or ids ending a hypothesis (default: the model's)."""
    settings = _settings(settings, overrides)
    limits, forces = settings.rows(_rows(model, input_ids))
    if settings.num_beams == 1 and settings.logits_processor:
        _warn_one_beam(settings.logits_processor)
    stepper, eos = resolve(
        model,
        input_ids,
        eos_token_id,
        max_new_tokens=max(limits),
        hidden=settings.classifier is not None,
        attention_mask=attention_mask,
    )
    cfg = settings.for_vocabulary(stepper.vocab_size)
    return _BeamSearch(stepper, cfg, _Rows(limits, forces), eos).run()


class _Rows(NamedTuple):
    """Per row: the limit L and the forced length n before EOS (None: none)."""

    limits: tuple[int, ...]
    forces: tuple[int | None, ...]


@dataclass
class _ModelState:
    """What the next step starts from: ``log_probs`` [N, V] of the next token, the KV
    ``cache`` and the ``hidden`` states [N, L+1, H] (classifier runs) of the N = B·K
    hypotheses, and the classifier's per-hypothesis state."""

    log_probs: torch.Tensor
    cache: Any
    hidden: torch.Tensor | None
    clf_state: Any


class _BeamSearch:
    """One batched search over a stepper of B inputs, K beams each; ``run`` returns the
    :class:`BeamResult`."""

    def __init__(
        self, stepper: Stepper, settings: BeamSettings, rows: _Rows, eos: list[int]
    ) -> None:
        self.stepper, self.cfg, self.clf = stepper, settings, settings.classifier
        self.B, self.K = batch_size(stepper), settings.num_beams
        self.T = max(rows.limits)
        # per row: the limit L and the forced length n (-1: none); moved to the model's device
        # at the start
        self.limit = torch.tensor(rows.limits)
        self.force = torch.tensor([-1 if f is None else f for f in rows.forces])
        self.forced = self.force >= 0
        self.eos = torch.tensor(eos)
        self.process = ProcessorChain(stepper, list(settings.logits_processor))

    def run(self) -> BeamResult:
        return self._aside() if self.cfg.finished == "aside" else self._on_beam()

    # -- shared steps -------------------------------------------------------------------------
    def _start(self) -> tuple[_ModelState, torch.Tensor]:
        """The prompts run once; the first step's N = B·K rows are copies of each input's
        (only beam 0 alive). Returns the model state and the running scores [B, K]."""
        out = self.stepper.start()
        if out.log_probs.shape[0] != self.B:
            raise GencraftError(
                f"the stepper holds {self.B} inputs but started {out.log_probs.shape[0]} rows"
            )
        self._check_classifier(out.hidden)
        dev = out.log_probs.device
        self.limit, self.force, self.forced, self.eos = (
            x.to(dev) for x in (self.limit, self.force, self.forced, self.eos)
        )
        index = torch.arange(self.B, device=dev).repeat_interleave(self.K)
        state = _ModelState(
            log_probs=out.log_probs.repeat_interleave(self.K, 0),
            cache=self.stepper.reorder(out.cache, index) if self.K > 1 else out.cache,
            hidden=out.hidden.repeat_interleave(self.K, 0) if out.hidden is not None else None,
            clf_state=self.clf.init(self.B * self.K) if self.clf is not None else None,
        )
        scores = torch.full((self.B, self.K), NEG, device=dev)
        scores[:, 0] = 0.0
        return state, scores

    def _check_classifier(self, hidden: torch.Tensor | None) -> None:
        if self.clf is None:
            return
        want = (self.clf.num_layers, self.clf.hidden_size)
        got = tuple(hidden.shape[1:]) if hidden is not None else None
        if got != want:
            raise GencraftError(
                f"the classifier reads {want[0]} layers x {want[1]} hidden states, but this "
                f"model gives {got[0]} x {got[1]}: it was trained for another model"
                if got
                else "this model gives no hidden states for the classifier"
            )

    def _last_step(self, t: int) -> torch.Tensor:
        """[B] bool: step t is Alg. 1's last for the row (t + 1 = L, on the beam, no forced
        length): only a forced EOS can follow."""
        last = (t + 1 == self.limit) & ~self.forced
        return last & (self.cfg.finished == "on_beam")

    def _log_probs(self, state: _ModelState, ids: torch.Tensor, t: int) -> torch.Tensor:
        """Step t's log-probabilities [N, V]: the logits processors on ``ids`` [N, t], then
        length forcing (thesis 7.4), per row: no EOS before step n (renormalised), only EOS at
        n; and Alg. 1's forced EOS at the maximum length (on the beam)."""
        logp = self.process(state.log_probs, ids)
        before = self.forced & (t < self.force)
        only_eos = (self.forced & (t >= self.force)) | self._last_step(t)
        if not bool(before.any() | only_eos.any()):
            return logp
        if bool(before.any()):
            cut = logp.index_fill(1, self.eos, float("-inf"))
            cut = cut - torch.logsumexp(cut, dim=-1, keepdim=True)
            logp = torch.where(before.repeat_interleave(self.K)[:, None], cut, logp)
        if bool(only_eos.any()):
            out = torch.full_like(logp, float("-inf"))
            # ending with any EOS id is one event: P(end) = sum of their probabilities
            end = (
                torch.logsumexp(logp[:, self.eos], dim=-1) if self.cfg.forced_eos == "model" else 0
            )
            out[:, self.eos[0]] = end
            logp = torch.where(only_eos.repeat_interleave(self.K)[:, None], out, logp)
        return logp

    def _candidates(
        self, logp: torch.Tensor, scores: torch.Tensor, state: _ModelState
    ) -> tuple[Candidates, Any]:
        """Each row's candidates (:class:`Candidates`, [B, C]) from ``logp`` [N, V] and the
        running scores [B, K], and the classifier state extended by this position."""
        (n, v), (b, K), dev = logp.shape, scores.shape, logp.device
        k = self.cfg.k
        if self.clf is None and (k is None or k >= v):
            flat = (scores.reshape(n, 1) + logp).view(b, K * v)  # every continuation
            beam = torch.arange(K, device=dev).repeat_interleave(v).expand(b, -1)
            token = torch.arange(v, device=dev).repeat(K).expand(b, -1)
            return Candidates(flat, flat, flat, beam, token), state.clf_state
        top_lp, token = logp.topk(k, dim=-1)  # [N, k], by model likelihood
        score = scores.reshape(n, 1) + top_lp
        sel = cond = score
        clf_state = state.clf_state
        if self.clf is not None:
            clf_lp, clf_state = self.clf.score(clf_state, state.hidden, token)
            dead = ~torch.isfinite(top_lp)  # impossible stays impossible, whatever the classifier
            cond = (score + clf_lp.to(score)).masked_fill(dead, NEG)
            sel = (score + self.cfg.alpha * clf_lp.to(score)).masked_fill(dead, NEG)
        beam = torch.arange(K, device=dev).repeat_interleave(k).expand(b, -1)
        c = K * k
        flat = (sel.view(b, c), score.view(b, c), cond.view(b, c), beam, token.view(b, c))
        return Candidates(*flat), clf_state

    def _advance(
        self, state: _ModelState, clf_state: Any, src: torch.Tensor, feed: torch.Tensor
    ) -> _ModelState:
        """Reorder the cache and the classifier state to beams ``src`` [B, K] of each row and
        feed ``feed`` [B, K]: the next step's model state."""
        b, K = src.shape
        flat = (torch.arange(b, device=src.device)[:, None] * K + src).view(-1)
        if self.clf is not None:
            clf_state = self.clf.reorder(clf_state, flat)
        out = self.stepper.step(feed.reshape(-1), self.stepper.reorder(state.cache, flat))
        return _ModelState(out.log_probs, out.cache, out.hidden, clf_state)

    # -- transformers' policy: finished hypotheses aside ----------------------------------------
    def _aside(self) -> BeamResult:
        state, scores = self._start()
        dev = scores.device
        live = Beams.empty(self.B, self.K, self.T, dev)
        live.score = scores
        finished = Beams.empty(self.B, self.K, self.T, dev)
        done = torch.zeros(self.B, dtype=torch.bool, device=dev)
        improvable = torch.ones(self.B, dtype=torch.bool, device=dev)
        for t in range(self.T):
            ids = live.tokens[:, :, :t].reshape(self.B * self.K, t)
            cand, clf_state = self._candidates(self._log_probs(state, ids, t), live.score, state)
            top, ends = self._top_candidates(cand, t)
            finished = self._merge_finished(finished, top, ends, live, t, open=~done)
            live, src, alive = self._next_live(top, ends, live, t)
            improvable = improvable & self._improvable(live, finished, t)
            full = finished.done.all(1) & (self.cfg.early_stopping is True)
            done = done | full | ends.all(1) | ~alive | ~improvable
            if bool(done.all()):
                break
            state = self._advance(state, clf_state, src, live.tokens[:, :, t])
        return self._finished_result(finished)

    def _top_candidates(self, cand: Candidates, t: int) -> tuple[Candidates, torch.Tensor]:
        """The max(2, 1 + E)·K best candidates of each row by selection score, best first
        ([B, C'] each), and which of them end [B, C'] (EOS, or the row's limit reached)."""
        n_keep = min(max(2, 1 + len(self.eos)) * self.K, cand.sel.shape[1])
        top = cand.gather(cand.sel.topk(n_keep, dim=1).indices)
        ends = torch.isin(top.token, self.eos) | (t + 1 == self.limit)[:, None]
        return top, ends

    def _merge_finished(
        self,
        finished: Beams,
        top: Candidates,
        ends: torch.Tensor,
        live: Beams,
        t: int,
        open: torch.Tensor,
    ) -> Beams:
        """``transformers``' ``_update_finished_beams``: of the first K candidates, those that
        end join the finished set (rows ``open`` [B] only, and not a full one under
        ``early_stopping=True``), keyed by their score over length^length_penalty; the K best
        of the old and the new stay (stably: old first on ties)."""
        K = self.K
        full = finished.done.all(1) & (self.cfg.early_stopping is True)
        first = top.map(lambda x: x[:, :K])
        is_eos = torch.isin(first.token, self.eos)
        rank = torch.where(self.forced[:, None], first.score, first.cond)
        # float64 pow: a large penalty gives inf (keys -0.0, ties kept in order), not an error
        key = rank / torch.tensor(t + 1.0, dtype=torch.float64).pow(self.cfg.length_penalty).item()
        # only possible hypotheses (generate also admits a dead beam's, scored about -1e9)
        new = ends[:, :K] & (first.sel > NEG / 2) & (open & ~full)[:, None]
        if not bool(new.any()):
            return finished
        grown = ~is_eos  # cut at the limit: the last token is kept
        parent = live.gather(first.beam)
        parent.tokens[:, :, t] = torch.where(grown, first.token, 0)
        arrivals = Beams(
            tokens=parent.tokens,
            length=t + grown.long(),
            score=first.score,
            cond=first.cond,
            key=key,
            eos=torch.where(is_eos, first.token, -1),
            done=new,
        )
        merged = finished.cat(arrivals)
        merged.key = merged.key.masked_fill(~merged.done, float("-inf"))
        order = merged.key.sort(dim=1, descending=True, stable=True).indices[:, :K]
        return merged.gather(order)

    def _next_live(
        self, top: Candidates, ends: torch.Tensor, live: Beams, t: int
    ) -> tuple[Beams, torch.Tensor, torch.Tensor]:
        """``transformers``' ``_get_running_beams_for_next_iteration``: the best K candidates
        that do not end. Returns the live beams (token t written), each one's parent beam
        [B, K], and whether the row has any live candidate [B]."""
        # -inf, not NEG: an ended candidate must never come back as a live one
        keep = top.sel.masked_fill(ends, float("-inf"))
        alive = (keep > NEG / 2).any(1)  # none: e.g. force_length=0 after its EOS
        key, index = keep.topk(self.K, dim=1)
        chosen = top.gather(index)
        nxt = live.gather(chosen.beam)
        # a live beam holds t + 1 tokens: its length is the step's (arrivals count their own)
        nxt.tokens[:, :, t] = chosen.token
        nxt.score = chosen.score.masked_fill(key == float("-inf"), NEG)
        return nxt, chosen.beam, alive

    def _improvable(self, live: Beams, finished: Beams, t: int) -> torch.Tensor:
        """[B] bool, ``transformers``' ``_check_early_stop_heuristic``: the row's finished
        set is not full, or its best live score over the hypothetical length^length_penalty
        beats its worst finished key (length: the live beams' t + 1 tokens; ``"never"`` with
        a positive penalty: the row's limit)."""
        lp = self.cfg.length_penalty
        if self.cfg.early_stopping == "never" and lp > 0:
            best = live.score.max(1).values / self.limit.double().pow(lp).float()
        else:
            best = (
                live.score.max(1).values / torch.tensor(t + 1.0, dtype=torch.float64).pow(lp).item()
            )
        return ~finished.done.all(1) | (best > finished.key.min(1).values)

    def _finished_result(self, finished: Beams) -> BeamResult:
        """The finished sets as the result: already best first, filled slots first."""
        return BeamResult(
            tokens=finished.tokens,
            length=finished.length,
            score=finished.score,
            conditional=self._conditional(finished.cond),
            sequence_score=finished.key,
            finished=finished.eos >= 0,
            eos=finished.eos,
            valid=finished.done,
        )

    def _conditional(self, cond: torch.Tensor) -> torch.Tensor:
        return cond if self.clf is not None else torch.full_like(cond, float("nan"))

    # -- the thesis's Alg. 1: finished hypotheses on the beam ----------------------------------
    def _on_beam(self) -> BeamResult:
        state, scores = self._start()
        slots = Beams.empty(self.B, self.K, self.T, scores.device)
        slots.score, slots.key = scores, torch.zeros_like(scores)
        done = torch.zeros(self.B, dtype=torch.bool, device=scores.device)
        for t in range(self.T):
            cand, clf_state = self._candidates(
                self._log_probs(state, self._slot_ids(slots, t), t), slots.score, state
            )
            choice = self._select_on_beam(cand, slots)
            kept = done[:, None]  # a row that is done keeps its slots
            slots = slots.where(kept, self._update_slots(slots, cand, choice, t))
            done = slots.done.all(1)
            if bool(done.all()):
                break
            src = torch.where(kept, torch.arange(self.K, device=done.device), choice.src)
            feed = torch.where(choice.cont & choice.use, choice.token, self.eos[0])
            state = self._advance(state, clf_state, src, feed)
        return self._ranked_result(slots)

    def _slot_ids(self, slots: Beams, t: int) -> torch.Tensor:
        """Each slot's tokens, left-padded with 0 to the step: [N, t] (for the processors)."""
        if not self.process:
            return slots.tokens[:, :, :0].reshape(self.B * self.K, 0)
        at = torch.arange(t, device=slots.length.device) - (t - slots.length[..., None])
        ids = slots.tokens.gather(2, at.clamp_min(0)).masked_fill(at < 0, 0)
        return ids.view(self.B * self.K, t)

    def _select_on_beam(self, cand: Candidates, slots: Beams) -> _Choice:
        """Alg. 1's selection: the K best of the live beams' continuations and the complete
        slots (with their frozen keys); stable on ties, continuations (lower index) first."""
        c = cand.sel.shape[1]
        live = ~slots.done.gather(1, cand.beam)
        pool = torch.cat(
            [
                cand.sel.masked_fill(~live, float("-inf")),
                slots.key.masked_fill(~slots.done, float("-inf")),
            ],
            dim=1,
        )
        order = pool.sort(dim=1, descending=True, stable=True).indices[:, : self.K]
        key = pool.gather(1, order)
        valid, eligible = key > NEG / 2, key > float("-inf")
        use = torch.where(valid.any(1, keepdim=True), valid, eligible)
        cont = order < c  # a live beam continued (else a complete slot staying)
        pick = order.clamp_max(c - 1)
        chosen = cand.gather(pick)
        src = torch.where(cont, chosen.beam, order - c)
        src = torch.where(use, src, src[:, :1])  # unused slots: dead, fed from beam 0's
        return _Choice(key=key, use=use, cont=cont, pick=pick, src=src, token=chosen.token)

    def _update_slots(self, slots: Beams, cand: Candidates, choice: _Choice, t: int) -> Beams:
        """The slots after the selection: a continued beam grows by its token (or completes
        with EOS, or at the limit); a complete slot stays as it was; an unused one is dead."""
        chosen = cand.gather(choice.pick)
        parent = slots.gather(choice.src)
        is_eos = torch.isin(choice.token, self.eos) & choice.cont
        grows = choice.cont & ~is_eos
        at = parent.length.clamp_max(self.T - 1)[..., None]  # a growing slot has t < T tokens
        grown = torch.where(grows[..., None], choice.token[..., None], parent.tokens.gather(2, at))
        ended = is_eos & ~self._last_step(t)[:, None]  # a forced EOS at L was a cut
        continued = Beams(
            tokens=parent.tokens.scatter(2, at, grown),
            length=parent.length + grows.long(),
            score=chosen.score,
            cond=chosen.cond,
            key=choice.key,
            eos=torch.where(ended, choice.token, -1),
            done=is_eos | (t + 1 == self.limit)[:, None],
        )
        new = continued.where(choice.cont, parent)
        # fewer candidates than beams (tiny vocabularies): the rest are dead slots
        dead = ~choice.use
        return replace(
            new,
            length=new.length.masked_fill(dead, 0),
            done=new.done | dead,
            eos=new.eos.masked_fill(dead, -1),
            key=new.key.masked_fill(dead, NEG),
            cond=new.cond.masked_fill(dead, NEG),
            score=new.score.masked_fill(dead, NEG),
        )

    def _ranked_result(self, slots: Beams) -> BeamResult:
        """Each row's final slots, best first: by the conditional score (Alg. 1), or under a
        forced length by the model score (or the selection score, ``forced_ranking``)."""
        by_forced = slots.key if self.cfg.forced_ranking == "selection" else slots.score
        rank = torch.where(self.forced[:, None], by_forced, slots.cond)
        valid = slots.score > NEG / 2
        by_rank = rank.masked_fill(~valid, float("-inf")).sort(dim=1, descending=True, stable=True)
        valid_first = (
            valid.gather(1, by_rank.indices).long().sort(dim=1, descending=True, stable=True)
        )
        order = by_rank.indices.gather(1, valid_first.indices)
        return BeamResult(
            tokens=slots.tokens,
            length=slots.length,
            score=slots.score,
            conditional=self._conditional(slots.cond),
            sequence_score=rank,
            finished=slots.eos >= 0,
            eos=slots.eos,
            valid=valid,
        ).gather(order)


@dataclass
class _Choice(TensorRecord):
    """Alg. 1's selection of each row's K slots, [B, K] each: ``key`` the chosen selection
    score, ``use`` the slot is filled, ``cont`` it continues a live beam (else a complete slot
    stays), ``pick`` the candidate's index, ``src`` the slot or beam it comes from, ``token``
    the candidate's token."""

    key: torch.Tensor
    use: torch.Tensor
    cont: torch.Tensor
    pick: torch.Tensor
    src: torch.Tensor
    token: torch.Tensor
