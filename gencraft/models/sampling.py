"""Batched sampling with a generator per input (the one sampler of gencraft).

``sample_batch`` draws ``n`` samples of each of B inputs in one batch of B·n rows, one model
call per step through the shared stepper (:class:`~gencraft.models.stepping.HFStepper`: a
causal LM's left-padded prompts, or an encoder-decoder's padded encoder inputs). Input ``b``
draws from its own ``torch.Generator`` seeded ``seeds[b]``, so its samples do not depend on the
inputs beside it, on the batch size or on the process that drew them (up to float rounding
under padding: a draw within ~1e-7 of a boundary could flip). ``transformers`` logits
processors (``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``,
``EpsilonLogitsWarper``...) shape the distribution; they see ``generate``'s ids (the padded
prompts or the decoder start, then the samples so far), one row per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.stepping import HFStepper


def sample_batch(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    n: int,
    max_new_tokens: int,
    seeds: Sequence[int],
    eos_token_id: Sequence[int],
    processors: Sequence[Any] = (),
) -> list[list[int]]:
    """``n`` samples of each input of ``input_ids`` [B, P] (``attention_mask`` [B, P]):
    B·n token lists, input 0's n first, each through its first EOS (one of ``eos_token_id``)
    or ``max_new_tokens`` long. ``seeds`` [B]: each input's generator seed. ``processors``
    change the next-token scores (log-probabilities [B·n, V]) before the draw."""
    if n < 1:
        raise GencraftError(f"n (samples per input) must be >= 1, got {n}")
    if len(seeds) != input_ids.shape[0]:
        raise GencraftError(f"{len(seeds)} seeds for {input_ids.shape[0]} inputs; give one each")
    if not eos_token_id:
        raise GencraftError("sample_batch needs the EOS ids that end a sample")
    with torch.no_grad():  # a context, not a decorator: mutmut mutates undecorated bodies
        stepper = HFStepper(
            model, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens
        )
        b = stepper.batch_size
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        out = stepper.start()
        log_probs = out.log_probs.repeat_interleave(n, 0)  # [B·n, V]
        cache = stepper.reorder(out.cache, torch.arange(b).repeat_interleave(n))
        prefix = stepper.prefix_ids().repeat_interleave(n, 0)
        eos = torch.tensor(sorted(set(eos_token_id)), device=prefix.device)
        drawn = torch.empty(b * n, 0, dtype=torch.long, device=prefix.device)
        done = torch.zeros(b * n, dtype=torch.bool, device=prefix.device)
        for t in range(max_new_tokens):
            scores = log_probs
            for p in processors:
                scores = p(torch.cat([prefix, drawn], 1), scores)
            probs = torch.softmax(scores.float(), -1).cpu().view(b, n, -1)
            tok = torch.cat(
                [torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(gens)]
            )
            tok = torch.where(done, eos[0], tok.view(-1).to(done.device))  # ended rows repeat EOS
            drawn = torch.cat([drawn, tok[:, None]], 1)
            done |= torch.isin(tok, eos)
            if bool(done.all()) or t + 1 == max_new_tokens:
                break
            out = stepper.step(tok, cache)
            log_probs, cache = out.log_probs, out.cache
    ends = set(eos.tolist())
    return [
        s[: next((j + 1 for j, x in enumerate(s) if x in ends), len(s))] for s in drawn.tolist()
    ]
