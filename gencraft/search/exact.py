"""Exact mode search by depth-first search with pruning (Yoshida 2023, ch. 6; after Stahlberg &
Byrne 2019).

Log-probability never increases as tokens are added, so a partial hypothesis scoring at or
below the best complete one found so far cannot lead to a better one and is pruned. Every
visited node also yields a complete hypothesis for free: its prefix + EOS. Children are visited
in order of probability, so the first path explored is the greedy one and the bound tightens
early.

Memory (§6.2): a node keeps only its own token's key/value slice. The full cache it computed is
handed to its first child (which extends it and lets it go); if a second child is expanded, the
node rebuilds its full cache by concatenating the slices of its ancestors and keeps it for the
remaining children. A greedy path of depth d then holds O(d) key/values instead of O(d^2).

``length=n`` searches for the best sequence of exactly n tokens before EOS: EOS is not a
completion before depth n and is the only completion at depth n. Pruning still applies (the
bound is the best length-n sequence found), but it bites later, so this search is much harder.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.caches import (
    build_cache,
    concat_positions,
    kv_pairs,
    last_position,
    self_attention_layers,
    state_bytes,
)
from gencraft.models.stepping import HFStepper, ProcessorChain, Stepper, batch_size, resolve


@dataclass
class ModeResult:
    """``tokens``: the mode's generated ids, EOS excluded; ``log_prob``: its log-probability
    including the EOS step (-inf if no complete hypothesis was found); ``exact``: proven to be
    the mode (False when ``max_nodes`` stopped the search); ``nodes``: model calls (nodes
    expanded); ``seconds``: wall time; ``peak_kv_bytes``: the most key/value bytes held at
    once by the search (slices plus full caches)."""

    tokens: list[int]
    log_prob: float
    exact: bool
    nodes: int
    seconds: float = 0.0
    peak_kv_bytes: int = 0


class _Budget(Exception):
    pass


def exact_mode(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    *,
    eos_token_id: int | list[int] | None = None,
    max_new_tokens: int,
    length: int | None = None,
    max_nodes: int | None = None,
    max_seconds: float | None = None,
    initial: list[int] | None = None,
    logits_processor: Sequence[Any] | None = None,
    length_includes_eos: bool = False,
) -> ModeResult:
    """The most probable output of ``model`` for one input, found by DFS with pruning; the
    batch of one of :func:`exact_mode_batch`.

    Args:
        model: a Hugging Face causal LM or encoder-decoder, or a ``Stepper`` of one input.
        input_ids: [1, P] prompt (causal) or encoder input (encoder-decoder).
        eos_token_id: id or ids that end a sequence (default: the model's).
        max_new_tokens: the longest output considered, in tokens before EOS.
        length: n: the best output of exactly n tokens before EOS.
        max_nodes: stop after this many expanded nodes; the result is then the best found and
            ``exact`` is False.
        max_seconds: stop, in the same way, once this many seconds of wall time have passed
            since the search began (in a batch: since the batch's search began, as its rows
            advance together). Unlike ``max_nodes`` it depends on the machine.
        initial: a complete output (tokens before EOS; e.g. beam search's) whose
            log-probability seeds the pruning bound (the thesis does not say whether it starts
            from one; default: no bound). Its scoring steps count as nodes.
        logits_processor: ``LogitsProcessor``s applied to each node's log-probabilities
            (e.g. FAME's focus vocabulary): the search finds the mode of the processed
            distribution. Pruning needs scores that never increase along a path, so processed
            values must stay <= 0 (masking and renormalising do); anything else is refused.
        length_includes_eos: ``length`` counts the EOS token (the thesis's convention): the
            output has ``length - 1`` tokens before EOS.
    """
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise GencraftError(
            f"exact_mode takes one input [1, P], got {list(input_ids.shape)}; use "
            "exact_mode_batch for a batch"
        )
    return exact_mode_batch(
        model,
        input_ids,
        eos_token_id=eos_token_id,
        max_new_tokens=max_new_tokens,
        length=length,
        max_nodes=max_nodes,
        max_seconds=max_seconds,
        initial=None if initial is None else [initial],
        logits_processor=logits_processor,
        length_includes_eos=length_includes_eos,
    )[0]


def exact_mode_batch(
    model: nn.Module | Stepper,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    eos_token_id: int | list[int] | None = None,
    max_new_tokens: int,
    length: int | None = None,
    max_nodes: int | None = None,
    max_seconds: float | None = None,
    initial: Sequence[Sequence[int] | None] | None = None,
    logits_processor: Sequence[Any] | None = None,
    length_includes_eos: bool = False,
) -> list[ModeResult]:
    """The exact mode of each input of a batch: one DFS per row, each with its own stack,
    bound and ``max_nodes`` budget, advanced together: every model call expands the next node
    of every unfinished row (a causal LM's rows in one call, their caches left-padded; an
    encoder-decoder's in one call per decoder length). Returns one :class:`ModeResult` per
    row, what :func:`exact_mode` gives for that row alone; memory stays linear in depth per
    row.

    Args:
        model: a Hugging Face causal LM or encoder-decoder, or a ``Stepper``.
        input_ids: [B, P] prompts (causal LM: left-padded) or encoder inputs.
        attention_mask: [B, P] 1 for tokens, 0 for padding (default: none padded).
        initial: one seed output per row (or None for a row), as :func:`exact_mode`'s.
        the rest: as :func:`exact_mode`.
    """
    length = _checked_length(max_new_tokens, length, max_nodes, length_includes_eos)
    if max_seconds is not None and not max_seconds >= 0:
        raise GencraftError(f"max_seconds must be >= 0, got {max_seconds}")
    stepper, eos = resolve(
        model,
        input_ids,
        eos_token_id,
        max_new_tokens=max(1, max_new_tokens),  # the deepest node's forward fills P + max_new
        attention_mask=attention_mask,
    )
    b = batch_size(stepper)
    seeds = _seeds(initial, b, eos, stepper.vocab_size, max_new_tokens, length)
    if b > 1 and not _ragged(stepper):  # a wrapper whose state follows rows in blocks (FAME)
        if not isinstance(model, nn.Module):
            raise GencraftError(
                f"exact_mode_batch needs step_ragged on a Stepper of {b} inputs (each row's "
                "hypotheses stepped with caches of their own); give it one input at a time"
            )
        kw = dict(eos_token_id=eos, max_new_tokens=max_new_tokens, length=length)
        kw.update(max_nodes=max_nodes, max_seconds=max_seconds, logits_processor=logits_processor)
        masks = [None] * b if attention_mask is None else attention_mask.split(1)
        return [
            exact_mode_batch(model, ids, mask, initial=[seed], **kw)[0]
            for ids, mask, seed in zip(input_ids.split(1), masks, seeds, strict=True)
        ]
    limit = sys.getrecursionlimit()  # each level of the DFS is a generator frame
    sys.setrecursionlimit(max(limit, max_new_tokens + 1000))
    try:
        budget = (max_nodes, math.inf if max_seconds is None else max_seconds)
        return _search_rows(stepper, eos, max_new_tokens, length, budget, seeds, logits_processor)
    finally:
        sys.setrecursionlimit(limit)


def _checked_length(
    max_new_tokens: int, length: int | None, max_nodes: int | None, includes_eos: bool
) -> int | None:
    """The arguments checked; the forced length in tokens before EOS (or None)."""
    if length is not None and includes_eos:
        if length < 1:
            raise GencraftError(f"length={length} with length_includes_eos: the EOS alone is 1")
        length -= 1
    if max_new_tokens < 0:
        raise GencraftError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if length is not None and not 0 <= length <= max_new_tokens:
        raise GencraftError(f"length must be in [0, max_new_tokens={max_new_tokens}], got {length}")
    if max_nodes is not None and max_nodes < 1:
        raise GencraftError(f"max_nodes must be >= 1, got {max_nodes}")
    return length


def _seeds(
    initial: Sequence[Sequence[int] | None] | None,
    b: int,
    eos: list[int],
    vocab: int,
    max_new_tokens: int,
    length: int | None,
) -> list[list[int] | None]:
    """One checked seed output (or None) per row."""
    seeds: list[list[int] | None] = [None] * b
    if initial is None:
        return seeds
    if len(initial) != b:
        raise GencraftError(
            f"initial must give one seed (or None) per row: {b}, got {len(initial)}"
        )
    for r, seed in enumerate(initial):
        if seed is None:
            continue
        seed = [int(t) for t in seed]
        bad = [t for t in seed if t in eos or not 0 <= t < vocab]
        if bad or len(seed) > max_new_tokens or (length is not None and len(seed) != length):
            raise GencraftError(
                f"initial must be at most max_new_tokens={max_new_tokens} tokens (exactly "
                f"length={length} with length), inside the vocabulary and without EOS"
            )
        seeds[r] = seed
    return seeds


def _search_rows(
    stepper: Any,
    eos: list[int],
    max_new_tokens: int,
    length: int | None,
    budget: tuple[int | None, float],
    seeds: list[list[int] | None],
    logits_processor: Any,
) -> list[ModeResult]:
    """Every row's DFS advanced together: each model call expands the next node of every
    unfinished row (one ragged call). ``budget``: (max_nodes or None, max_seconds or inf)."""
    b = batch_size(stepper)
    process = ProcessorChain(stepper, logits_processor)
    t0 = time.perf_counter()
    out = stepper.start()
    caches = stepper.split(out.cache) if b > 1 else [out.cache]
    searches = [
        _DFS(eos, max_new_tokens, length, budget, _RowProcess(process, r, b), t0) for r in range(b)
    ]
    gens = {r: searches[r].run(out.log_probs[r : r + 1], caches[r], seeds[r]) for r in range(b)}
    results: list[ModeResult | None] = [None] * b
    pending: dict[int, tuple[int, Any]] = {}
    for r, gen in gens.items():
        _advance(gen, r, None, pending, results)
    while pending:
        order = list(pending)
        tokens = torch.tensor([pending[r][0] for r in order])
        if len(order) == 1 and b == 1:
            outs = [stepper.step(tokens, pending[order[0]][1])]
        else:
            rows = torch.tensor(order)
            outs = stepper.step_ragged(tokens, [pending[r][1] for r in order], rows)
        pending = {}
        for r, o in zip(order, outs, strict=True):
            _advance(gens[r], r, o, pending, results)
    return results  # type: ignore[return-value]


def _ragged(stepper: Any) -> bool:
    """Whether the stepper's hypotheses can be stepped with caches of their own: a plain
    model, or a wrapper that steps itself (the pointer head); not a wrapper whose state
    follows the rows in blocks (FAME's source). A hand-written Stepper: whether it has
    ``step_ragged``."""
    if not isinstance(stepper, HFStepper):
        return callable(getattr(stepper, "step_ragged", None))
    return stepper.custom is not None or stepper.model is stepper.hf


def _advance(gen: Any, r: int, value: Any, pending: dict, results: list) -> None:
    """Resume row r's search with ``value`` (a StepOutput; None to start it): its next step
    request goes to ``pending``, or its result to ``results``."""
    try:
        pending[r] = gen.send(value)
    except StopIteration as stop:
        results[r] = stop.value


class _RowProcess:
    """The processors of one row of a batch: called with a batch in which every row is this
    row's, so a processor that reads the row (``prefix_allowed_tokens_fn``) sees row r."""

    def __init__(self, chain: ProcessorChain, r: int, b: int) -> None:
        self.chain, self.r, self.b = chain, r, b

    def __bool__(self) -> bool:
        return bool(self.chain)

    def __call__(self, scores: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """``scores`` [1, V], ``generated`` [1, t] of row r -> processed [1, V]."""
        if self.b == 1:
            return self.chain(scores, generated)
        prefix = self.chain.prefix[self.r : self.r + 1].to(generated.device)
        ids = torch.cat([prefix, generated.to(prefix.device)], dim=1).expand(self.b, -1)
        out = scores.expand(self.b, -1).clone()
        for proc in self.chain.processors:
            out = proc(ids.to(out.device), out)
        return out[self.r : self.r + 1]


class _DFS:
    """One row's search, written as a generator: each model step it needs is yielded as
    ``(token, cache)`` and its ``StepOutput`` sent back, so a driver can batch the rows."""

    def __init__(
        self,
        eos: list[int],
        max_new: int,
        length: int | None,
        budget: tuple[int | None, float],
        process: Any,
        t0: float,
    ) -> None:
        self.eos, self.max_new, self.process = eos, max_new, process
        self.length, self.t0 = length, t0
        self.max_nodes, self.deadline = budget[0], t0 + budget[1]
        self.eos_set = set(eos)
        self.best = -math.inf
        self.best_tokens: list[int] = []
        self.nodes = 0
        self.kept = 0  # bytes of rebuilt full caches held by nodes on the current path
        self.peak = 0

    def _process(self, logp: torch.Tensor, prefix: list[int]) -> torch.Tensor:
        """The processed log-probabilities [V] (float64) after ``prefix``."""
        if not self.process:
            return logp
        out = self.process(logp.float()[None], torch.tensor([prefix], dtype=torch.long))[0]
        out = out.double()
        finite = out[torch.isfinite(out)]
        if finite.numel() and float(finite.max()) > 1e-6:
            raise GencraftError(
                "exact search needs processed scores <= 0 (log-probabilities, masked or "
                "renormalised) for its pruning; a logits processor returned "
                f"{float(finite.max()):.3g}"
            )
        return out

    def _seed(self, initial: list[int], log_probs: torch.Tensor, root: list):
        """Score ``initial`` + EOS along one path (a copy of the root cache) as the bound."""
        cache, lp, score = build_cache(root, self.cross), log_probs[0].double(), 0.0
        lp = self._process(lp, [])
        for i, t in enumerate(initial):
            score += lp[t].item()
            out = yield (t, cache)
            self.nodes += 1
            lp, cache = self._process(out.log_probs[0].double(), initial[: i + 1]), out.cache
        self.best = score + torch.logsumexp(lp[self.eos], dim=0).item()
        self.best_tokens = list(initial)

    def run(self, log_probs: torch.Tensor, cache: Any, initial: list[int] | None = None):
        """``log_probs`` [1, V] and ``cache`` (one row): the root's; returns a ModeResult."""
        exact = True
        self.nodes = 1
        root_kv = [(ly.keys.clone(), ly.values.clone()) for ly in self_attention_layers(cache)]
        self.cross = getattr(cache, "cross_attention_cache", None)
        if initial is not None:
            yield from self._seed(initial, log_probs, root_kv)
        try:
            yield from self._visit(
                [], 0.0, log_probs[0].double(), cache, [root_kv], state_bytes(root_kv)
            )
        except _Budget:
            exact = False
        return ModeResult(
            self.best_tokens,
            self.best,
            exact,
            self.nodes,
            time.perf_counter() - self.t0,
            self.peak,
        )

    def _visit(
        self,
        prefix: list[int],
        score: float,
        logp: torch.Tensor,
        cache: Any,
        path: list[list[tuple[torch.Tensor, torch.Tensor]]],
        path_bytes: int,
    ):
        """``logp`` [V] float64: next-token log-probs after ``prefix``; ``cache``: the full
        cache of ``prefix``, owned by this call; ``path``: the KV slices from the root (prompt
        first), ``path_bytes`` their size."""
        # held now: the slices on the path, the kept caches above, and this full cache
        self.peak = max(self.peak, path_bytes + self.kept + state_bytes(kv_pairs(cache)[0]))
        logp = self._process(logp, prefix)
        depth = len(prefix)
        eos_lp = torch.logsumexp(logp[self.eos], dim=0).item()
        if (self.length is None or depth == self.length) and score + eos_lp > self.best:
            self.best, self.best_tokens = score + eos_lp, list(prefix)
        if depth == (self.max_new if self.length is None else self.length):
            return
        kept = None
        for w in torch.argsort(logp, descending=True).tolist():
            if w in self.eos_set:
                continue
            child_score = score + logp[w].item()
            if child_score <= self.best:
                break  # children come in order of probability: every later one scores lower
            if self.max_nodes is not None and self.nodes >= self.max_nodes:
                raise _Budget
            if time.perf_counter() > self.deadline:
                raise _Budget
            if cache is not None:
                given, cache = cache, None  # the first child takes this full cache over
            else:
                if kept is None:  # second child: rebuild once from the slices, keep it
                    kept = build_cache(concat_positions(path), self.cross)
                    self.kept += path_bytes
                given = build_cache(
                    kv_pairs(kept)[0], self.cross
                )  # the step extends what it is given
            out = yield (w, given)
            child_lp, child_cache = out.log_probs[0].double(), out.cache
            del given, out
            self.nodes += 1
            kv = last_position(child_cache)
            yield from self._visit(
                [*prefix, w],
                child_score,
                child_lp,
                child_cache,
                [*path, kv],
                path_bytes + state_bytes(kv),
            )
            del child_cache
        if kept is not None:
            self.kept -= path_bytes
