"""Decoding a :class:`~gencraft.nar.NARSeq2Seq`: SUNDAE's iterative sampling, Mask-Predict's
iterative re-masking, and (for the autoregressive baseline) ``generate`` with beams.

Every decoder runs one input at a time (as a user calls it) and counts its **model calls**:
decoder forward passes, each over all of that input's samples or length candidates at once.
The encoder runs once per input and is not counted. Autoregressive beam search makes one
decoder call per generated token.

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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gencraft.errors import GencraftError
from gencraft.nar.config import SamplingConfig
from gencraft.nar.model import NARSeq2Seq
from gencraft.progress import tqdm


@dataclass
class NAROutput:
    """Per input: ``sequences`` the chosen target ids (no special tokens), ``scores`` their
    reranking scores, ``model_calls`` decoder calls, ``steps`` refinement steps taken,
    ``seconds`` wall time."""

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


def _encode_row(
    model: NARSeq2Seq,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    cfg: SamplingConfig,
    lengths: torch.Tensor | None,
    b: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One input's encoder states [1, S, H], its length candidates [k] (predicted, or row
    ``b`` of ``lengths`` given) and their log-probabilities [k] (0 for given lengths)."""
    enc = model.encode(src, src_mask).last_hidden_state
    if lengths is None:
        cands, cand_lp = length_candidates(model, enc, src_mask, cfg.length_candidates)
        return enc, cands[0], cand_lp[0]
    cands = lengths[b].to(src.device)
    return enc, cands, torch.zeros(cands.shape, device=src.device)


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
    if argmax:
        new = logits.argmax(-1)
    else:
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        new = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=generator).view_as(
            tokens
        )
    coins = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    update = (coins < proportion) & target_mask
    return torch.where(update, new, tokens), logits


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


@torch.no_grad()
def sundae_generate(
    model: NARSeq2Seq,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: SamplingConfig | None = None,
    *,
    noise: torch.Tensor,
    lengths: torch.Tensor | None = None,
    progress: bool = False,
) -> NAROutput:
    """SUNDAE sampling for each row of ``input_ids`` [B, S] (see the module doc).

    Args:
        noise: the ids random starts are drawn from (:func:`~gencraft.nar.functional.noise_ids`).
        lengths: [B] or [B, k] target lengths to use instead of the predicted ones (oracle
            lengths, or a user's choice).
    """
    cfg = config or SamplingConfig()
    attention_mask = _check_source(model, input_ids, attention_mask)
    if lengths is not None:
        lengths = torch.as_tensor(lengths).view(input_ids.shape[0], -1)
        _check_lengths(model, lengths)
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    out = NAROutput()
    for b in tqdm(range(input_ids.shape[0]), desc="sundae", disable=not progress):
        t0 = time.perf_counter()
        src_mask = attention_mask[b : b + 1].to(dev)
        enc, cands, cand_lp = _encode_row(
            model, input_ids[b : b + 1].to(dev), src_mask, cfg, lengths, b
        )
        pick = torch.arange(cfg.samples, device=dev) % cands.numel()
        row_len = cands[pick].tolist()
        mask = _padded(row_len, dev)
        n = len(row_len)
        enc_n, src_mask_n = enc.expand(n, -1, -1), src_mask.expand(n, -1)
        tokens = noise.to(dev)[torch.randint(noise.numel(), mask.shape, generator=gen, device=dev)]
        tokens = tokens.masked_fill(~mask, model.config.pad_token_id or 0)
        final_logits = torch.zeros(*mask.shape, model.decoder.config.vocab_size, device=dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        calls = steps = 0
        for _ in range(cfg.steps):
            live = (~done).nonzero().flatten()
            new, logits = sundae_step(
                model,
                tokens[live],
                mask[live],
                enc_n[live],
                src_mask_n[live],
                temperature=cfg.temperature,
                proportion=cfg.proportion,
                argmax=cfg.argmax_unrolled,
                generator=gen,
            )
            calls += 1
            steps += 1
            same = (new == tokens[live]).all(1)
            final_logits[live[same]] = logits[same].float()  # the prediction given the final sample
            done[live[same]] = True
            tokens[live] = new
            if bool(done.all()):
                break
        live = (~done).nonzero().flatten()
        if live.numel():  # one more call scores the samples still changing
            final_logits[live] = model.decode_logits(
                tokens[live], enc_n[live], src_mask_n[live], mask[live].long()
            ).float()
            calls += 1
        best, scores = rerank(
            _token_logp(final_logits, tokens, mask), mask, cand_lp[pick], cfg.rerank
        )
        seq = tokens[best, : row_len[best]].tolist()
        out.add(seq, float(scores[best]), calls, steps, time.perf_counter() - t0)
    return out


@torch.no_grad()
def mask_predict_generate(
    model: NARSeq2Seq,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: SamplingConfig | None = None,
    *,
    mask_id: int,
    lengths: torch.Tensor | None = None,
    progress: bool = False,
) -> NAROutput:
    """Mask-Predict for each row of ``input_ids`` [B, S]: ``config.steps`` iterations on each of
    ``config.length_candidates`` lengths (``samples``, ``temperature`` and ``proportion`` do not
    apply; decoding is deterministic)."""
    cfg = config or SamplingConfig()
    attention_mask = _check_source(model, input_ids, attention_mask)
    if lengths is not None:
        lengths = torch.as_tensor(lengths).view(input_ids.shape[0], -1)
        _check_lengths(model, lengths)
    dev = next(model.parameters()).device
    out = NAROutput()
    big_t = cfg.steps
    for b in tqdm(range(input_ids.shape[0]), desc="mask-predict", disable=not progress):
        t0 = time.perf_counter()
        src_mask = attention_mask[b : b + 1].to(dev)
        enc, cands, _ = _encode_row(model, input_ids[b : b + 1].to(dev), src_mask, cfg, lengths, b)
        row_len = cands.tolist()
        mask = _padded(row_len, dev)
        n = len(row_len)
        enc_n, src_mask_n = enc.expand(n, -1, -1), src_mask.expand(n, -1)
        tokens = torch.full(mask.shape, mask_id, dtype=torch.long, device=dev)
        logp = torch.zeros(mask.shape, device=dev)
        todo = mask.clone()
        calls = 0
        for t in range(big_t):
            logits = model.decode_logits(tokens, enc_n, src_mask_n, mask.long())
            calls += 1
            best_lp, best_tok = torch.log_softmax(logits.float(), dim=-1).max(-1)
            tokens = torch.where(todo, best_tok, tokens)
            logp = torch.where(todo, best_lp, logp)
            if t + 1 == big_t:
                break
            k = torch.tensor([int(ell * (big_t - 1 - t) / big_t) for ell in row_len], device=dev)
            if int(k.max()) == 0:
                break
            todo = least_confident(logp, mask, k)
            tokens = tokens.masked_fill(todo, mask_id)
        scores = (logp * mask).sum(1) / mask.sum(1)
        best = int(scores.argmax())
        seq = tokens[best, : row_len[best]].tolist()
        out.add(seq, float(scores[best]), calls, calls, time.perf_counter() - t0)
    return out


@torch.no_grad()
def autoregressive_generate(
    model: NARSeq2Seq,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    num_beams: int = 4,
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    progress: bool = False,
) -> NAROutput:
    """Beam search with ``generate`` on a causal-decoder model (the BERT2BERT baseline), one
    input at a time; a model call is one decoder step over the beams. ``min_new_tokens``
    keeps EOS away until then (``nar-speed`` fixes every output's length with it)."""
    attention_mask = _check_source(model, input_ids, attention_mask, bidirectional=False)
    dev = next(model.parameters()).device
    end, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    out = NAROutput()
    for b in tqdm(range(input_ids.shape[0]), desc="beam", disable=not progress):
        t0 = time.perf_counter()
        gen = model.generate(
            input_ids=input_ids[b : b + 1].to(dev),
            attention_mask=attention_mask[b : b + 1].to(dev),
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            output_scores=True,
            output_logits=num_beams == 1,
            return_dict_in_generate=True,
        )
        seq = gen.sequences[0, 1:].tolist()
        seq = (
            [t for t in seq[: seq.index(end)] if t != pad]
            if end in seq
            else [t for t in seq if t != pad]
        )
        score = getattr(gen, "sequences_scores", None)
        if score is None:  # greedy: its tokens' log-probabilities, before any processor
            step_lp = torch.stack(gen.logits, 1)[0].float().log_softmax(-1)  # [T, V]
            score = step_lp.gather(1, gen.sequences[0, 1:, None]).sum()
        else:
            score = score[0]
        steps = len(gen.scores)
        out.add(seq, float(score), steps, steps, time.perf_counter() - t0)
    return out
