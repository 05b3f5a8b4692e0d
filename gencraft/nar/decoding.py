"""Decoding a :class:`~gencraft.nar.NARSeq2Seq`: SUNDAE's iterative sampling, Mask-Predict's
iterative re-masking, and (for the autoregressive baseline) ``generate`` with beams.

Every decoder takes a batch ``[B, S]`` and decodes it together (``batch_size`` rows at a time,
default all): the encoder runs once per batch, and each decoder call covers every row ×
sample × length candidate still running, so a batch costs about as many calls as its slowest
row. Each row counts its own **model calls** (the decoder calls it took part in) and stops by
its own rule (SUNDAE: when its samples stop changing; Mask-Predict: after its iterations); the
result of a row is what decoding it alone gives. A row's ``seconds`` is its batch's wall time
shared out evenly. Autoregressive decoding is one ``generate`` call per batch, one decoder call
per generated token: a row's ``model_calls`` are the batch's steps (it rides along until the
longest output ends).

SUNDAE's randomness is per row: each row draws from its own generator, seeded from
``SamplingConfig.seed`` and a hash of that row's source tokens (padding excluded). A source
therefore gets the same output whatever batch it is decoded in, whatever the batch's size or
order (up to the last bits of floating point, which a batched matmul may round differently).

**SUNDAE** (Savinov et al. 2022; Appendix A of the thesis): take the ``length_candidates``
most likely target lengths, and spread ``samples`` random starts over them (uniform random
tokens). At each step, draw from the model's prediction at ``temperature`` (or take its argmax,
``argmax_unrolled``) and keep the new token at a random ``proportion`` of the positions. A
sample stops when a step leaves it unchanged, and decoding stops after ``steps`` steps. The
best sample is the one whose tokens the model finds most likely given the sample itself (the
thesis does not say how it picked the best of 16; see ``SamplingConfig.rerank``).

**Mask-Predict** (Ghazvininejad et al. 2019): for each length candidate, start from all
[MASK] and predict every position. Then for t = 1..T-1, re-mask the n = ⌊L·(T−t)/T⌋ least
confident tokens and predict them again. The best candidate has the highest mean
log-probability.

**Confidence-threshold decoding** (``threshold=τ``; Fast-dLLM): instead of the schedule, each
call decides every undecided position whose probability is >= τ and at least the most
confident one (Mask-Predict unmasks it for good; SUNDAE freezes its new token); ``steps`` caps
the calls, the last deciding the rest. See :func:`most_confident` and docs/nar.md.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.nar.config import SamplingConfig
from gencraft.nar.model import NARSeq2Seq
from gencraft.progress import tqdm


@dataclass
class NAROutput:
    """Per input: ``sequences`` the chosen target ids (no special tokens), ``scores`` their
    reranking scores, ``model_calls`` the decoder calls it took part in, ``steps`` refinement
    steps taken, ``seconds`` its share of its batch's wall time."""

    sequences: list[list[int]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    model_calls: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, sequence: list[int], score: float, calls: int, steps: int, seconds: float):
        """Record one input's result."""
        self.sequences.append(sequence)
        self.scores.append(score)
        self.model_calls.append(calls)
        self.steps.append(steps)
        self.seconds.append(seconds)

    @property
    def tokens_per_call(self) -> list[float]:
        """Per input: output tokens per decoder call (an autoregressive decoder's is about 1)."""
        return [len(s) / max(c, 1) for s, c in zip(self.sequences, self.model_calls, strict=True)]


@dataclass
class RowResult:
    """One input's decoding: ``sequence`` the chosen target ids, ``score`` its reranking
    score, ``calls`` the decoder calls it took part in, ``steps`` its refinement steps."""

    sequence: list[int]
    score: float
    calls: int
    steps: int


def _decode_batches(
    name: str,
    rows: int,
    batch_size: int | None,
    progress: bool,
    run: Callable[[slice], list[RowResult]],
) -> NAROutput:
    """The one driver of every decoder: ``run`` decodes each chunk of ``batch_size`` rows
    (default all) and returns one :class:`RowResult` per row; a row's ``seconds`` is its
    chunk's wall time shared out evenly."""
    out = NAROutput()
    bar = tqdm(total=rows, desc=name, disable=not progress)
    for chunk in _chunks(rows, batch_size):
        t0 = time.perf_counter()
        results = run(chunk)
        share = (time.perf_counter() - t0) / len(results)
        for r in results:
            out.add(r.sequence, r.score, r.calls, r.steps, share)
        bar.update(len(results))
    bar.close()
    return out


def _check_source(
    model: NARSeq2Seq, input_ids: Any, attention_mask: Any, *, bidirectional: bool = True
) -> torch.Tensor:
    """The attention mask [B, S] (ones when None), after checking the model and the inputs;
    ``bidirectional``: the decoder must be (SUNDAE, Mask-Predict) or must not be (beam)."""
    if not isinstance(model, NARSeq2Seq):
        raise GencraftError(
            f"this decoding needs a NARSeq2Seq (mlm_to_seq2seq), got {type(model).__name__}"
        )
    if model.nar_settings.bidirectional != bidirectional:
        raise GencraftError(
            "non-autoregressive decoding needs a bidirectional decoder; this model's is causal "
            "(decode it with beam search)"
            if bidirectional
            else "autoregressive decoding needs a model converted with bidirectional=False"
        )
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.dtype != torch.long
    ):
        raise GencraftError("input_ids must be a LongTensor of shape [B, S]")
    if input_ids.shape[1] == 0:
        raise GencraftError("input_ids has no source tokens")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise GencraftError(
            f"attention_mask {list(attention_mask.shape)} does not match input_ids "
            f"{list(input_ids.shape)}"
        )
    return attention_mask


def _check_lengths(model: NARSeq2Seq, lengths: torch.Tensor) -> None:
    top = model.max_target_length
    bad = [int(v) for v in lengths.flatten() if not 1 <= int(v) <= top]
    if bad:
        raise GencraftError(
            f"target length {bad[0]} is outside [1, {top}] (the model's max_target_length "
            f"within its {model.config.decoder.max_position_embeddings} positions)"
        )


def length_candidates(
    model: NARSeq2Seq, enc_hidden: torch.Tensor, attention_mask: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely target lengths [B, k] (never 0) and their log-probabilities."""
    logp = torch.log_softmax(model.length_logits(enc_hidden, attention_mask).float(), dim=-1)
    logp[:, 0] = -torch.inf
    k = min(k, logp.shape[1] - 1)
    top = logp.topk(k, dim=-1)
    return top.indices, top.values


def _padded(lengths: list[int], device: torch.device) -> torch.Tensor:
    """[N, max(lengths)] bool: the valid positions of each row."""
    n = torch.tensor(lengths, device=device)
    return torch.arange(int(n.max()), device=device)[None, :] < n[:, None]


def sundae_step(
    model: NARSeq2Seq,
    tokens: torch.Tensor,
    target_mask: torch.Tensor,
    enc_hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    proportion: float = 1.0,
    argmax: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SUNDAE update of ``tokens`` [N, L] (valid where ``target_mask``): the new tokens
    [N, L] and the logits [N, L, V] they were drawn from. A position takes its new token with
    probability ``proportion`` (0 keeps every token, 1 replaces all). Draws: the samples
    [N·L] (unless ``argmax``), then the update coins [N, L]."""
    if not 0 <= proportion <= 1:
        raise GencraftError(f"proportion must lie in [0, 1], got {proportion}")
    logits = model.decode_logits(tokens, enc_hidden, attention_mask, target_mask.long())
    new = sundae_draw(
        logits,
        tokens,
        target_mask,
        temperature=temperature,
        proportion=proportion,
        argmax=argmax,
        generator=generator,
    )
    return new, logits


def sundae_draw(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    target_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    proportion: float = 1.0,
    argmax: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """SUNDAE's draw from ``logits`` [N, L, V]: the updated ``tokens`` [N, L] (see
    :func:`sundae_step`). The generator draws the sampling uniforms [N, L] (unless
    ``argmax``), then the update coins [N, L]."""
    dev = tokens.device
    uniforms = None if argmax else torch.rand(tokens.shape, generator=generator, device=dev)
    coins = torch.rand(tokens.shape, generator=generator, device=dev)
    return sundae_update(
        logits,
        tokens,
        target_mask,
        uniforms,
        coins,
        temperature=temperature,
        proportion=proportion,
        argmax=argmax,
    )


def sundae_update(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    target_mask: torch.Tensor,
    uniforms: torch.Tensor | None,
    coins: torch.Tensor,
    *,
    temperature: float = 1.0,
    proportion: float = 1.0,
    argmax: bool = False,
) -> torch.Tensor:
    """SUNDAE's update of ``tokens`` [N, L] from ``logits`` [N, L, V] and the random numbers
    drawn for it: each position's new token is the inverse CDF of its distribution at
    ``temperature`` at ``uniforms`` [N, L] (or the argmax), taken where ``coins`` [N, L] <
    ``proportion`` and ``target_mask``."""
    if argmax:
        new = logits.argmax(-1)
    else:
        new = inverse_cdf(torch.softmax(logits.float() / temperature, dim=-1), uniforms)
    update = (coins < proportion) & target_mask
    return torch.where(update, new, tokens)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Samples [...] from the distributions ``probs`` [..., V] at ``uniforms`` [...] in [0, 1):
    the first index whose cumulative probability exceeds u·total, so a token of probability 0
    is never drawn. u·total < total always holds in floating point for u < 1 (the product
    rounds to nearest, and total·(1 - u) is at least half a unit of its last place), so some
    index exceeds it: no clamp is needed."""
    cdf = probs.cumsum(-1)
    at = (uniforms[..., None] * cdf[..., -1:]).contiguous()
    return torch.searchsorted(cdf, at, right=True)[..., 0]


def row_seed(seed: int, source: list[int]) -> int:
    """The seed of one row's generator: ``seed`` and a hash of its source tokens, so a
    source draws the same randomness in any batch."""
    digest = hashlib.blake2b(f"{seed}:{source}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _chunks(n: int, batch_size: int | None) -> list[slice]:
    if batch_size is not None and batch_size < 1:
        raise GencraftError(f"batch_size must be >= 1, got {batch_size}")
    size = batch_size or max(n, 1)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _encode_batch(
    model: NARSeq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    cfg: SamplingConfig,
    lengths: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The encoder states [b, S, H] of a batch, its length candidates [b, k] (predicted, or
    the rows of ``lengths`` given) and their log-probabilities [b, k] (0 for given lengths)."""
    enc = model.encode(src, src_mask).last_hidden_state
    if lengths is None:
        cands, cand_lp = length_candidates(model, enc, src_mask, cfg.length_candidates)
        return enc, cands, cand_lp
    cands = lengths.to(src.device)
    return enc, cands, torch.zeros(cands.shape, device=src.device)


def _token_logp(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, L]: log p(token_i | ...) at valid positions, 0 elsewhere."""
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None])[..., 0]
    return lp * mask


def rerank(
    token_logp: torch.Tensor, mask: torch.Tensor, len_logp: torch.Tensor, how: str
) -> tuple[int, torch.Tensor]:
    """(index of the best sample, scores [N]) of N samples: ``token_logp`` [N, L] each
    token's log-probability (0 at padding), ``mask`` [N, L] valid positions, ``len_logp`` [N]
    the log-probability of each sample's length; ``how``: ``SamplingConfig.rerank``."""
    total = token_logp.sum(1)
    if how == "sum-logprob":
        scores = total
    else:
        mean = total / mask.sum(1)
        scores = mean + len_logp if how == "mean-logprob+length" else mean
    return int(scores.argmax()), scores


def least_confident(logp: torch.Tensor, mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mask-Predict's re-masking: bool [N, L], the ``k[n]`` valid positions of row n whose
    predicted tokens have the lowest log-probability ``logp`` [N, L] (ties: leftmost first)."""
    rank = logp.masked_fill(~mask, torch.inf).argsort(dim=1, stable=True).argsort(dim=1)
    return (rank < k[:, None]) & mask


def most_confident(
    logp: torch.Tensor, undecided: torch.Tensor, threshold: float, last: bool = False
) -> torch.Tensor:
    """Confidence-threshold decoding's choice (Fast-dLLM): bool [N, L], the ``undecided``
    positions whose token has probability ``exp(logp)`` >= ``threshold`` (``threshold`` 1:
    none by that rule), and each row's single most confident undecided position (ties:
    leftmost), so a row with anything undecided decides at least one. ``last``: every
    undecided position (the step budget is spent)."""
    if last:
        return undecided.clone()
    at = logp.masked_fill(~undecided, -torch.inf)
    pick = (at.exp() >= threshold) & undecided if threshold < 1 else torch.zeros_like(undecided)
    top = at.argmax(1)
    pick[torch.arange(pick.shape[0], device=pick.device), top] |= undecided.any(1)
    return pick


def sundae_generate(
    model: NARSeq2Seq,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: SamplingConfig | None = None,
    *,
    noise: torch.Tensor,
    lengths: torch.Tensor | None = None,
    progress: bool = False,
    batch_size: int | None = None,
    threshold: float | None = None,
) -> NAROutput:
    """SUNDAE sampling for every row of ``input_ids`` [B, S] (see the module doc): all rows ×
    samples in one decoder call per step.

    Args:
        noise: the ids random starts are drawn from (:func:`~gencraft.nar.functional.noise_ids`).
        lengths: [B] or [B, k] target lengths to use instead of the predicted ones (oracle
            lengths, or a user's choice).
        batch_size: rows decoded together (default: all).
        threshold: confidence-threshold decoding (default: ``config.threshold``; None: the
            fixed steps): each step redraws every unfrozen position and freezes those whose
            new token has probability >= ``threshold`` (at least the most confident one).
    """
    cfg = _with_threshold(config or SamplingConfig(), threshold)
    attention_mask = _check_source(model, input_ids, attention_mask)
    lengths = _given_lengths(model, input_ids, lengths)
    dev = next(model.parameters()).device

    def run(rows: slice) -> list[RowResult]:
        src, src_mask = input_ids[rows].to(dev), attention_mask[rows].to(dev)
        given = lengths[rows] if lengths is not None else None
        enc, cands, cand_lp = _encode_batch(model, src, src_mask, cfg, given)
        return _sundae_batch(model, src, src_mask, enc, cands, cand_lp, cfg, noise.to(dev))

    with torch.no_grad():
        return _decode_batches("sundae", input_ids.shape[0], batch_size, progress, run)


def _given_lengths(model: NARSeq2Seq, input_ids: torch.Tensor, lengths: Any) -> torch.Tensor | None:
    """Given target lengths as [B, k] (from [B] or [B, k]), checked against the model."""
    if lengths is None:
        return None
    lengths = torch.as_tensor(lengths).view(input_ids.shape[0], -1)
    _check_lengths(model, lengths)
    return lengths


@dataclass
class _Samples:
    """SUNDAE's N = b·n samples of a batch of b rows (row r's are rows r·n .. r·n + n - 1):
    ``tokens`` [N, L], ``mask`` [N, L] their valid positions, ``owner`` [N] each one's row,
    ``widths`` each row's longest sample (its draws span that many positions), ``generators``
    each row's own, seeded from the seed and its source."""

    tokens: torch.Tensor
    mask: torch.Tensor
    owner: torch.Tensor
    widths: list[int]
    generators: list[torch.Generator]

    def uniforms(self, index: torch.Tensor) -> torch.Tensor:
        """[len(index), L] uniforms for the samples ``index`` (ascending), each row's drawn
        from its own generator over its own width (0 past it)."""
        owner = self.owner[index]
        out = torch.zeros(index.shape[0], self.tokens.shape[1], device=self.tokens.device)
        counts = torch.bincount(owner, minlength=len(self.widths)).tolist()
        start = 0
        for r, count in enumerate(counts):  # a row's samples are contiguous in index
            if count:
                w = self.widths[r]
                shape = (count, w)
                out[start : start + count, :w] = torch.rand(
                    shape, generator=self.generators[r], device=out.device
                )
                start += count
        return out


def _sundae_start(
    model: NARSeq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    lengths: torch.Tensor,
    seed: int,
    noise: torch.Tensor,
) -> _Samples:
    """Random starts: each row's samples of ``lengths`` [b, n] get uniform noise tokens, drawn
    from the row's generator (its first draw)."""
    dev, (b, n) = src.device, lengths.shape
    mask = _padded(lengths.flatten().tolist(), dev)  # [N, L]
    widths = lengths.max(1).values.tolist()
    gens = [
        torch.Generator(device=dev).manual_seed(row_seed(seed, src[r][src_mask[r].bool()].tolist()))
        for r in range(b)
    ]
    pad = model.config.pad_token_id or 0
    tokens = torch.full(mask.shape, pad, dtype=torch.long, device=dev)
    for r in range(b):
        draw = torch.randint(noise.numel(), (n, widths[r]), generator=gens[r], device=dev)
        tokens[r * n : (r + 1) * n, : widths[r]] = noise[draw]
    owner = torch.arange(b, device=dev).repeat_interleave(n)
    return _Samples(tokens.masked_fill(~mask, pad), mask, owner, widths, gens)


def _took_part(owner: torch.Tensor, live: torch.Tensor, b: int) -> torch.Tensor:
    """[b] bool: the rows owning at least one of the ``live`` samples (``owner`` [N])."""
    return torch.bincount(owner[live], minlength=b) > 0


def _sundae_refine(
    model: NARSeq2Seq, s: _Samples, enc: torch.Tensor, src_mask: torch.Tensor, cfg: SamplingConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SUNDAE's steps over the samples ``s`` (``enc`` [N, S, H], ``src_mask`` [N, S] per
    sample): every live sample in one decoder call per step, sampled all at once from each
    row's uniforms (coins after samples, per step). A sample stops when a step leaves it
    unchanged. Returns each sample's tokens scored given itself [N, L] and each row's steps
    and calls [b] (the calls include one that scores the samples still changing)."""
    b = len(s.widths)
    tok_lp = torch.zeros(s.mask.shape, device=s.mask.device)
    done = torch.zeros(s.owner.shape[0], dtype=torch.bool, device=s.mask.device)
    steps = torch.zeros(b, dtype=torch.long, device=s.mask.device)
    for _ in range(cfg.steps):
        live = (~done).nonzero().flatten()
        if live.numel() == 0:
            break
        logits = model.decode_logits(s.tokens[live], enc[live], src_mask[live], s.mask[live].long())
        uniforms = None if cfg.argmax_unrolled else s.uniforms(live)
        coins = s.uniforms(live)
        old = s.tokens[live]
        new = sundae_update(
            logits,
            old,
            s.mask[live],
            uniforms,
            coins,
            temperature=cfg.temperature,
            proportion=cfg.proportion,
            argmax=cfg.argmax_unrolled,
        )
        steps += _took_part(s.owner, live, b)
        same = (new == old).all(1)
        stopped = live[same]
        tok_lp[stopped] = _token_logp(logits[same], new[same], s.mask[stopped])
        done[stopped] = True
        s.tokens[live] = new
    live = (~done).nonzero().flatten()
    calls = steps.clone()
    if live.numel():  # one more call scores the samples still changing
        logits = model.decode_logits(s.tokens[live], enc[live], src_mask[live], s.mask[live].long())
        tok_lp[live] = _token_logp(logits, s.tokens[live], s.mask[live])
        calls += _took_part(s.owner, live, b)
    return tok_lp, steps, calls


def _sundae_freeze(
    model: NARSeq2Seq, s: _Samples, enc: torch.Tensor, src_mask: torch.Tensor, cfg: SamplingConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SUNDAE with confidence-threshold freezing: each step redraws every unfrozen position of
    the live samples (one decoder call, each row's uniforms), and freezes the new tokens whose
    probability under the model (temperature 1) is >= ``cfg.threshold``, at least the most
    confident one; the step budget's last call freezes the rest. A sample stops when all its
    positions are frozen, and a token is scored by its log-probability when it froze (no
    extra scoring call). Returns (scores [N, L], steps [b], calls [b]) as
    :func:`_sundae_refine` does."""
    b = len(s.widths)
    tok_lp = torch.zeros(s.mask.shape, device=s.mask.device)
    undecided = s.mask.clone()
    calls = torch.zeros(b, dtype=torch.long, device=s.mask.device)
    zeros = torch.zeros(s.mask.shape, device=s.mask.device)
    for t in range(cfg.steps):
        live = undecided.any(1).nonzero().flatten()
        if live.numel() == 0:
            break
        logits = model.decode_logits(s.tokens[live], enc[live], src_mask[live], s.mask[live].long())
        uniforms = None if cfg.argmax_unrolled else s.uniforms(live)
        new = sundae_update(
            logits,
            s.tokens[live],
            undecided[live],
            uniforms,
            zeros[live],
            temperature=cfg.temperature,
            argmax=cfg.argmax_unrolled,
        )
        lp = _token_logp(logits, new, s.mask[live])
        pick = most_confident(lp, undecided[live], cfg.threshold, last=t + 1 == cfg.steps)
        tok_lp[live] = torch.where(pick, lp, tok_lp[live])
        undecided[live] &= ~pick
        s.tokens[live] = new
        calls += _took_part(s.owner, live, b)
    return tok_lp, calls.clone(), calls


def _with_threshold(cfg: SamplingConfig, threshold: float | None) -> SamplingConfig:
    """``cfg`` with ``threshold`` when one is given (checked as the config checks it)."""
    return cfg if threshold is None else replace(cfg, threshold=threshold)


def _sundae_batch(
    model: NARSeq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    enc: torch.Tensor,
    cands: torch.Tensor,
    cand_lp: torch.Tensor,
    cfg: SamplingConfig,
    noise: torch.Tensor,
) -> list[RowResult]:
    """One batch of b rows: ``cfg.samples`` samples spread over each row's length candidates
    ``cands`` [b, k] (log-probabilities ``cand_lp``), refined, and each row's best."""
    n = cfg.samples
    pick = torch.arange(n, device=src.device) % cands.shape[1]
    s = _sundae_start(model, src, src_mask, cands[:, pick], cfg.seed, noise)
    refine = _sundae_refine if cfg.threshold is None else _sundae_freeze
    tok_lp, steps, calls = refine(model, s, enc[s.owner], src_mask[s.owner], cfg)
    results = []
    for r in range(len(s.widths)):
        at = slice(r * n, (r + 1) * n)
        best, scores = rerank(tok_lp[at], s.mask[at], cand_lp[r, pick], cfg.rerank)
        length = int(s.mask[r * n + best].sum())
        seq = s.tokens[r * n + best, :length].tolist()
        results.append(RowResult(seq, float(scores[best]), int(calls[r]), int(steps[r])))
    return results


def mask_predict_generate(
    model: NARSeq2Seq,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: SamplingConfig | None = None,
    *,
    mask_id: int,
    lengths: torch.Tensor | None = None,
    progress: bool = False,
    batch_size: int | None = None,
    threshold: float | None = None,
) -> NAROutput:
    """Mask-Predict for every row of ``input_ids`` [B, S]: ``config.steps`` iterations on each
    of ``config.length_candidates`` lengths, all rows × candidates in one decoder call per
    iteration (``samples``, ``temperature`` and ``proportion`` do not apply; decoding is
    deterministic). ``batch_size``: rows decoded together (default: all). ``threshold``:
    confidence-threshold decoding instead of the fixed schedule (default:
    ``config.threshold``; None: the fixed steps): each call unmasks every masked position whose
    prediction has probability >= ``threshold``, and at least the most confident one."""
    cfg = _with_threshold(config or SamplingConfig(), threshold)
    attention_mask = _check_source(model, input_ids, attention_mask)
    lengths = _given_lengths(model, input_ids, lengths)
    dev = next(model.parameters()).device

    def run(rows: slice) -> list[RowResult]:
        src, src_mask = input_ids[rows].to(dev), attention_mask[rows].to(dev)
        given = lengths[rows] if lengths is not None else None
        enc, cands, _ = _encode_batch(model, src, src_mask, cfg, given)
        if cfg.threshold is not None:
            return _mask_predict_threshold(model, src_mask, enc, cands, cfg, mask_id)
        return _mask_predict_batch(model, src_mask, enc, cands, cfg.steps, mask_id)

    with torch.no_grad():
        return _decode_batches("mask-predict", input_ids.shape[0], batch_size, progress, run)


@dataclass
class _Candidates:
    """Mask-Predict's N = b·k candidates of a batch of b rows (row r's are rows r·k ..
    r·k + k - 1): ``tokens`` [N, L] from all [MASK], their ``logp`` [N, L], the valid ``mask``
    [N, L], each one's ``owner`` row [N] and length ``row_len`` [N], the encoder states and
    source mask per candidate, and each row's decoder ``calls`` [b]."""

    tokens: torch.Tensor
    logp: torch.Tensor
    mask: torch.Tensor
    owner: torch.Tensor
    row_len: torch.Tensor
    enc: torch.Tensor
    src_mask: torch.Tensor
    calls: torch.Tensor

    @classmethod
    def start(cls, enc: torch.Tensor, src_mask: torch.Tensor, cands: torch.Tensor, mask_id: int):
        dev = src_mask.device
        b, k = cands.shape
        owner = torch.arange(b, device=dev).repeat_interleave(k)
        row_len = cands.flatten()
        mask = _padded(row_len.tolist(), dev)
        tokens = torch.full(mask.shape, mask_id, dtype=torch.long, device=dev)
        zeros = torch.zeros(mask.shape, device=dev)
        calls = torch.zeros(b, dtype=torch.long, device=dev)
        return cls(tokens, zeros, mask, owner, row_len, enc[owner], src_mask[owner], calls)

    def predict(self, model: NARSeq2Seq, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder call on candidates ``idx``: each position's best (log-prob [n, L],
        token [n, L]); counts a call for each row with a candidate in ``idx``."""
        logits = model.decode_logits(
            self.tokens[idx], self.enc[idx], self.src_mask[idx], self.mask[idx].long()
        )
        self.calls += torch.bincount(self.owner[idx], minlength=self.calls.shape[0]) > 0
        return torch.log_softmax(logits.float(), dim=-1).max(-1)

    def results(self) -> list[RowResult]:
        """Each row's candidate of the highest mean log-probability (its steps: its calls)."""
        b = self.calls.shape[0]
        scores = ((self.logp * self.mask).sum(1) / self.mask.sum(1)).view(b, -1)
        k, out = scores.shape[1], []
        for r in range(b):
            best = int(scores[r].argmax())
            seq = self.tokens[r * k + best, : int(self.row_len[r * k + best])].tolist()
            calls = int(self.calls[r])
            out.append(RowResult(seq, float(scores[r, best]), calls, calls))
        return out


def _mask_predict_batch(
    model: NARSeq2Seq,
    src_mask: torch.Tensor,
    enc: torch.Tensor,
    cands: torch.Tensor,
    big_t: int,
    mask_id: int,
) -> list[RowResult]:
    """One batch of b rows × k length candidates: each row's best (its steps are its calls).
    A row's candidates iterate together until its ⌊L·(T−t)/T⌋ reaches 0 for all of them."""
    c = _Candidates.start(enc, src_mask, cands, mask_id)
    b, k = cands.shape
    todo = c.mask.clone()
    running = torch.ones(b, dtype=torch.bool, device=src_mask.device)  # rows still iterating
    for t in range(big_t):
        idx = running[c.owner].nonzero().flatten()
        best_lp, best_tok = c.predict(model, idx)
        c.tokens[idx] = torch.where(todo[idx], best_tok, c.tokens[idx])
        c.logp[idx] = torch.where(todo[idx], best_lp, c.logp[idx])
        if t + 1 == big_t:
            break
        n_mask = c.row_len * (big_t - 1 - t) // big_t  # ⌊L·(T−t)/T⌋ with t counted from 1
        running &= n_mask.view(b, k).amax(1) > 0  # a row whose count reached 0 is finished
        if not bool(running.any()):
            break
        todo = least_confident(c.logp, c.mask, n_mask) & running[c.owner][:, None]
        c.tokens = c.tokens.masked_fill(todo, mask_id)
    return c.results()


def _mask_predict_threshold(
    model: NARSeq2Seq,
    src_mask: torch.Tensor,
    enc: torch.Tensor,
    cands: torch.Tensor,
    cfg: SamplingConfig,
    mask_id: int,
) -> list[RowResult]:
    """Mask-Predict with confidence-threshold unmasking, on b rows × k length candidates:
    from all [MASK], each call predicts the masked positions of the candidates still masked
    and unmasks those whose prediction has probability >= ``cfg.threshold``, at least the
    most confident one (never re-masking); the ``cfg.steps``-th call unmasks the rest. A
    candidate stops when nothing is masked, a row when its candidates have; its calls are
    the calls it took part in. The best candidate has the highest mean log-probability."""
    c = _Candidates.start(enc, src_mask, cands, mask_id)
    todo = c.mask.clone()
    for t in range(cfg.steps):
        idx = todo.any(1).nonzero().flatten()
        if idx.numel() == 0:
            break
        best_lp, best_tok = c.predict(model, idx)
        pick = most_confident(best_lp, todo[idx], cfg.threshold, last=t + 1 == cfg.steps)
        c.tokens[idx] = torch.where(pick, best_tok, c.tokens[idx])
        c.logp[idx] = torch.where(pick, best_lp, c.logp[idx])
        todo[idx] &= ~pick
    return c.results()


def autoregressive_generate(
    model: NARSeq2Seq,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    num_beams: int = 4,
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    progress: bool = False,
    batch_size: int | None = None,
) -> NAROutput:
    """Beam search with ``generate`` on a causal-decoder model (the BERT2BERT baseline): one
    ``generate`` call per batch of ``batch_size`` rows (default: all); a model call is one
    decoder step over the batch's beams. ``min_new_tokens`` keeps EOS away until then
    (``nar-speed`` fixes every output's length with it)."""
    attention_mask = _check_source(model, input_ids, attention_mask, bidirectional=False)
    dev = next(model.parameters()).device

    def run(rows: slice) -> list[RowResult]:
        gen = model.generate(
            input_ids=input_ids[rows].to(dev),
            attention_mask=attention_mask[rows].to(dev),
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            output_scores=True,
            output_logits=num_beams == 1,
            return_dict_in_generate=True,
        )
        return [_generated_row(model, gen, i) for i in range(gen.sequences.shape[0])]

    with torch.no_grad():
        return _decode_batches("beam", input_ids.shape[0], batch_size, progress, run)


def _generated_row(model: NARSeq2Seq, gen: Any, i: int) -> RowResult:
    """Row ``i`` of a ``generate`` output: its tokens up to EOS (padding dropped), its score
    (beam: ``sequences_scores``; greedy: its tokens' log-probabilities before any processor),
    and the batch's steps as its calls."""
    end, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    steps = len(gen.scores)
    seq = gen.sequences[i, 1:].tolist()
    seq = [t for t in (seq[: seq.index(end)] if end in seq else seq) if t != pad]
    score = getattr(gen, "sequences_scores", None)
    if score is None:
        step_lp = torch.stack(gen.logits, 1)[i].float().log_softmax(-1)  # [T, V]
        made = gen.sequences[i, 1:]
        ends = (made == end).nonzero().flatten()
        own = int(ends[0]) + 1 if ends.numel() else made.shape[0]  # not the padding
        score = step_lp[:own].gather(1, made[:own, None]).sum()
    else:
        score = score[i]
    return RowResult(seq, float(score), steps, steps)
