"""gencraft's decoders from plain ``generate()``: ``transformers`` takes a decoding method as
``model.generate(**inputs, custom_generate=<callable>)`` and calls it after preparing the
inputs, the generation config, the logits processors and the stopping criteria::

    from gencraft.search.custom_generate import beam_search, conditional_beam_search, exact_mode

    out = model.generate(**batch, num_beams=4, max_new_tokens=20, custom_generate=beam_search)
    out = model.generate(**batch, max_new_tokens=8, custom_generate=exact_mode, max_nodes=10_000)
    out = model.generate(**batch, num_beams=4, max_new_tokens=20,
                         custom_generate=conditional_beam_search, classifier=clf, k=10)

Each returns what ``generate`` returns: ``[B * num_return_sequences, L]`` ids (a causal LM's
rows keep their left padding, then the generated tokens and EOS; an encoder-decoder's start
with the decoder start id), right-padded as ``generate``'s beam search pads (the pad id, or
the first EOS id when the pad id is 0); with ``return_dict_in_generate=True`` a
``GenerateBeam*Output`` with ``sequences`` and, with ``output_scores=True``,
``sequences_scores`` (summed log-probabilities, as ``length_penalty=0`` gives). The method's
own arguments are keyword arguments of ``generate``.

A batch runs as one search: every input's beams advance in one model call per step (a causal
LM's left-padded prompts with their attention mask; an encoder-decoder's encoder outputs,
computed once by ``generate``, with theirs). Logits processors see the batch's ids
``[B * num_beams, prompt + t]`` as ``generate`` gives them, so a processor that depends on the
row (``prefix_allowed_tokens_fn``) acts on each row. Otherwise they apply as in
:func:`gencraft.search.beam_search`; of the
stopping criteria, the length and EOS criteria ``generate`` adds are honoured through
``max_new_tokens`` and the EOS ids, and any other is refused, naming it. The Hub-ready folders
of ``hub/`` load the same functions through ``custom_generate="path", trust_remote_code=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.introspect import eos_ids, pad_id
from gencraft.models.stepping import HFStepper
from gencraft.search.beam import search_stepper as _beam_search
from gencraft.search.exact import exact_mode_batch as _exact_mode

#: stopping criteria generate() adds from the generation config, honoured by the searches
_HONOURED = {"MaxLengthCriteria", "EosTokenCriteria", "MaxNewTokensCriteria"}

__all__ = ["beam_search", "conditional_beam_search", "exact_mode"]


def _check_criteria(stopping_criteria: Sequence[Any] | None, name: str) -> None:
    other = [type(c).__name__ for c in stopping_criteria or () if type(c).__name__ not in _HONOURED]
    if other:
        raise GencraftError(
            f"gencraft's {name} from generate() takes no stopping criteria other than the "
            f"length and EOS ones; got {', '.join(other)}"
        )


def _expand_size(generation_config: Any) -> int:
    """How many copies of each input generate() made before calling the decoder."""
    beams = int(getattr(generation_config, "num_beams", None) or 1)
    return max(beams, int(getattr(generation_config, "num_return_sequences", None) or 1))


def _stepper(
    model: nn.Module,
    input_ids: torch.Tensor,
    model_kwargs: dict[str, Any],
    every: int,
    pad: int,
    max_new: int,
    hidden: bool,
) -> HFStepper:
    """One stepper for the whole batch: a causal LM's left-padded prompts with their mask; an
    encoder-decoder's encoder outputs and mask (its input ids are then not read). generate()
    repeated each input ``every`` times: one copy of each is kept."""
    mask = model_kwargs.get("attention_mask")
    mask = mask[::every] if mask is not None else None
    enc = None
    if model.config.is_encoder_decoder:
        out = model_kwargs.get("encoder_outputs")
        if out is None:
            raise GencraftError("generate() passed no encoder_outputs to the custom decoder")
        enc = out[0] if not hasattr(out, "last_hidden_state") else out.last_hidden_state
        enc = enc[::every]
        ids = torch.full((enc.shape[0], 1), pad, dtype=torch.long, device=input_ids.device)
    else:
        ids = input_ids[::every]
    return HFStepper(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=max_new + 1,
        hidden=hidden,
        encoder_hidden=enc,
    )


def _max_new_tokens(generation_config: Any, input_ids: torch.Tensor) -> int:
    n = getattr(generation_config, "max_new_tokens", None)
    if n is None:
        n = int(generation_config.max_length) - input_ids.shape[1]
    if n < 1:
        raise GencraftError(f"max_new_tokens must be >= 1, got {n}")
    return int(n)


def _run(
    name: str,
    search: Callable[..., list[list[tuple[list[int], bool, int | None, float]]]],
    model: nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Sequence[Any] | None,
    stopping_criteria: Sequence[Any] | None,
    generation_config: Any,
    model_kwargs: dict[str, Any],
    hidden: bool = False,
) -> Any:
    """One search for the whole batch (``search(stepper, eos, max_new, processors)`` returns
    each input's outputs); the rows assembled as ``generate`` returns them."""
    _check_criteria(stopping_criteria, name)
    eos = eos_ids(model, generation_config.eos_token_id)
    pad = generation_config.pad_token_id
    pad = pad_id(model) if pad is None else int(pad)
    max_new = _max_new_tokens(generation_config, input_ids)
    n_return = int(getattr(generation_config, "num_return_sequences", None) or 1)
    processors = list(logits_processor or [])
    seqs, scores = [], []
    every = _expand_size(generation_config)
    stepper = _stepper(model, input_ids, model_kwargs, every, pad, max_new, hidden)
    found_rows = search(stepper, eos, max_new, processors)
    for i, found in enumerate(found_rows):
        b = i * every
        if len(found) < n_return:
            raise GencraftError(
                f"{name} found {len(found)} outputs for input {i}; num_return_sequences is "
                f"{n_return}"
            )
        for tokens, finished, eos_token, score in found[:n_return]:
            end = [eos_token if eos_token is not None else eos[0]] if finished else []
            seqs.append(input_ids[b].tolist() + tokens + end)
            scores.append(score)
    width = max(len(s) for s in seqs)
    fill = pad or eos[0]  # generate's beam search fills with the pad id, or EOS for pad id 0
    out = torch.full((len(seqs), width), fill, dtype=torch.long, device=input_ids.device)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, device=input_ids.device)
    if not getattr(generation_config, "return_dict_in_generate", False):
        return out
    from transformers.generation.utils import (
        GenerateBeamDecoderOnlyOutput,
        GenerateBeamEncoderDecoderOutput,
    )

    cls = (
        GenerateBeamEncoderDecoderOutput
        if model.config.is_encoder_decoder
        else GenerateBeamDecoderOnlyOutput
    )
    seq_scores = None  # as generate: only with output_scores=True
    if getattr(generation_config, "output_scores", False):
        seq_scores = torch.tensor(scores, device=input_ids.device)
    return cls(sequences=out, sequences_scores=seq_scores)


def beam_search(
    model: nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Sequence[Any] | None = None,
    stopping_criteria: Sequence[Any] | None = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    finished: str = "aside",
    forced_eos: str = "model",
    force_length: int | None = None,
    length_includes_eos: bool = False,
    **model_kwargs: Any,
) -> Any:
    """gencraft's :func:`~gencraft.search.beam_search` as ``generate(custom_generate=...)``:
    ``num_beams`` from the generation config; ``finished``, ``forced_eos``,
    ``force_length`` and ``length_includes_eos`` as there."""
    beams = int(generation_config.num_beams or 1)

    def search(stepper, eos, max_new, processors):
        rows = _beam_search(
            stepper,
            None,
            num_beams=beams,
            max_new_tokens=max_new,
            eos_token_id=eos,
            finished=finished,  # type: ignore[arg-type]
            force_length=force_length,
            forced_eos=forced_eos,  # type: ignore[arg-type]
            logits_processor=processors,
            length_includes_eos=length_includes_eos,
        )
        return [[(h.tokens, h.finished, h.eos_token, h.score) for h in hyps] for hyps in rows]

    return _run(
        "beam_search",
        search,
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        model_kwargs,
    )


def conditional_beam_search(
    model: nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Sequence[Any] | None = None,
    stopping_criteria: Sequence[Any] | None = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    classifier: Any = None,
    k: int | None = None,
    alpha: float = 1.0,
    finished: str = "aside",
    **model_kwargs: Any,
) -> Any:
    """Conditional beam search (thesis ch. 7) as ``generate(custom_generate=...)``:
    ``classifier`` an :class:`~gencraft.search.AttributeScorer` (required), ``k`` and
    ``alpha`` as in :func:`~gencraft.search.beam_search`; outputs ranked by their
    conditional score, which ``sequences_scores`` holds."""
    if classifier is None:
        raise GencraftError("conditional_beam_search needs classifier=<an AttributeScorer>")
    beams = int(generation_config.num_beams or 1)

    def search(stepper, eos, max_new, processors):
        rows = _beam_search(
            stepper,
            None,
            num_beams=beams,
            max_new_tokens=max_new,
            eos_token_id=eos,
            classifier=classifier,
            k=k,
            alpha=alpha,
            finished=finished,  # type: ignore[arg-type]
            logits_processor=processors,
        )
        return [
            [(h.tokens, h.finished, h.eos_token, h.conditional_score) for h in hyps]
            for hyps in rows
        ]

    return _run(
        "conditional_beam_search",
        search,
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        model_kwargs,
        hidden=True,
    )


def exact_mode(
    model: nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Sequence[Any] | None = None,
    stopping_criteria: Sequence[Any] | None = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    length: int | None = None,
    max_nodes: int | None = None,
    length_includes_eos: bool = False,
    **model_kwargs: Any,
) -> Any:
    """The exact mode (:func:`~gencraft.search.exact_mode`) as ``generate(custom_generate=
    ...)``: the most probable output of at most ``max_new_tokens`` tokens before EOS (or of
    exactly ``length``); ``max_nodes`` bounds the search. One output per input; an input
    whose search found no complete output gives its prompt alone."""

    def search(stepper, eos, max_new, processors):
        rows = _exact_mode(
            stepper,
            eos_token_id=eos,
            max_new_tokens=max_new,
            length=length,
            max_nodes=max_nodes,
            logits_processor=processors,
            length_includes_eos=length_includes_eos,
        )
        return [
            [([], False, None, r.log_prob)]
            if r.log_prob == float("-inf")
            else [(r.tokens, True, None, r.log_prob)]
            for r in rows
        ]

    return _run(
        "exact_mode",
        search,
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        model_kwargs,
    )
