"""gencraft's decoders from plain ``generate()``: ``transformers`` takes a decoding method as
``model.generate(**inputs, custom_generate=<callable>)`` and calls it after preparing the
inputs, the generation config, the logits processors and the stopping criteria::

    from gencraft.search.custom_generate import beam_search, conditional_beam_search, exact_mode

    out = model.generate(**batch, num_beams=4, max_new_tokens=20, custom_generate=beam_search)
    out = model.generate(**batch, max_new_tokens=8, custom_generate=exact_mode, max_nodes=10_000)
    out = model.generate(**batch, num_beams=4, max_new_tokens=20,
                         custom_generate=conditional_beam_search, classifier=clf, k=10)

Each returns what ``generate`` returns: ``[B * num_return_sequences, P + W]`` ids (a causal
LM's rows keep their left padding, then the generated tokens and EOS; an encoder-decoder's
start with the decoder start id), right-padded as ``generate``'s beam search pads (the pad id,
or the first EOS id when the pad id is 0); with ``return_dict_in_generate=True`` a
``GenerateBeam*Output`` with ``sequences`` and, with ``output_scores=True``,
``sequences_scores`` (what ranks the outputs: the summed log-probability, or the conditional
score, over length^``length_penalty``). The method's own arguments are keyword arguments of
``generate``. The output is built from the search's tensors (:class:`~gencraft.search.beam.
BeamResult`), never row by row.

``beam_search`` and ``conditional_beam_search`` take ``generate``'s ``length_penalty`` and
``early_stopping`` (defaults 1.0 and False, or any explicit value), so that
``custom_generate=beam_search`` gives what ``generate``'s own beam search gives. gencraft's
own functions default to the thesis's scoring (``length_penalty=0.0, early_stopping=True``);
to get that from ``generate``, pass those two values.

A batch runs as one search: every input's beams advance in one model call per step (a causal
LM's left-padded prompts with their attention mask; an encoder-decoder's encoder outputs,
computed once by ``generate``, with theirs). Logits processors see the batch's ids
``[B * num_beams, prompt + t]`` as ``generate`` gives them, so a processor that depends on the
row (``prefix_allowed_tokens_fn``) acts on each row. Of the stopping criteria, the length and
EOS criteria ``generate`` adds are honoured through ``max_new_tokens`` and the EOS ids, and any
other is refused, naming it; so are ``do_sample=True``, a ``streamer`` and ``synced_gpus``
(``generate`` itself drops the last two before calling a callable; the Hub folders refuse them
too). The Hub-ready folders of ``hub/`` load the same functions through
``custom_generate="path", trust_remote_code=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.cad import CADSettings, ContrastStepper
from gencraft.models.compat import given_cache
from gencraft.models.introspect import eos_ids, pad_id
from gencraft.models.stepping import HFStepper
from gencraft.search.beam import BeamResult, BeamSettings, beam_search_tensors
from gencraft.search.exact import ModeResult, exact_mode_batch

#: stopping criteria generate() adds from the generation config, honoured by the searches
_HONOURED = {"MaxLengthCriteria", "EosTokenCriteria", "MaxNewTokensCriteria"}

__all__ = ["beam_search", "conditional_beam_search", "context_aware", "exact_mode"]


def _check_call(
    name: str,
    stopping_criteria: Sequence[Any] | None,
    generation_config: Any,
    synced_gpus: bool,
    streamer: Any,
) -> None:
    """Refuse, in one line, what the search cannot honour."""
    other = [type(c).__name__ for c in stopping_criteria or () if type(c).__name__ not in _HONOURED]
    if other:
        raise GencraftError(
            f"gencraft's {name} from generate() takes no stopping criteria other than the "
            f"length and EOS ones; got {', '.join(other)}"
        )
    if streamer is not None:
        raise GencraftError(f"gencraft's {name} from generate() takes no streamer")
    if synced_gpus:
        raise GencraftError(f"gencraft's {name} from generate() does not run with synced_gpus")
    if generation_config.do_sample:
        raise GencraftError(
            f"gencraft's {name} from generate() does not sample: pass do_sample=False"
        )


def _expand_size(generation_config: Any) -> int:
    """How many copies of each input generate() made before calling the decoder."""
    beams = int(generation_config.num_beams or 1)
    return max(beams, int(generation_config.num_return_sequences or 1))


def _cache_length(cache: Any) -> int:
    """Positions a ``Cache`` (or legacy tuple of per-layer (key, value)) holds."""
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[-2]) if len(cache) else 0


def _stepper(
    model: nn.Module,
    input_ids: torch.Tensor,
    model_kwargs: dict[str, Any],
    generation_config: Any,
    hidden: bool,
) -> HFStepper:
    """One stepper for the whole batch: a causal LM's left-padded prompts with their mask; an
    encoder-decoder's encoder outputs and mask (its input ids are then not read). generate()
    repeated each input ``every`` times: one copy of each is kept."""
    cache = given_cache(model_kwargs)  # past_key_values, or cache from transformers 5.24
    given = 0 if cache is None else _cache_length(cache)
    if given:  # e.g. a prefix model's virtual tokens, or HSO's optimised states
        raise GencraftError(
            f"gencraft's decoders from generate() run {type(model).__name__} on the prompt "
            f"itself and would ignore the given past_key_values ({given} positions: a prefix "
            "model's or an optimised cache); decode without them"
        )
    every = _expand_size(generation_config)
    mask = model_kwargs.get("attention_mask")
    mask = mask[::every] if mask is not None else None
    enc = None
    if model.config.is_encoder_decoder:
        out = model_kwargs.get("encoder_outputs")
        if out is None:
            raise GencraftError("generate() passed no encoder_outputs to the custom decoder")
        enc = out[0]  # a BaseModelOutput's first field, or a tuple's
        enc = enc[::every]
        # placeholder ids, never read: the encoder's output is given
        ids = torch.zeros((enc.shape[0], 1), dtype=torch.long, device=enc.device)
    else:
        ids = input_ids[::every]
    return HFStepper(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=_max_new_tokens(generation_config, input_ids),
        hidden=hidden,
        encoder_hidden=enc,
    )


def _pad(model: nn.Module, generation_config: Any) -> int:
    pad = generation_config.pad_token_id
    return pad_id(model) if pad is None else int(pad)


def _max_new_tokens(generation_config: Any, input_ids: torch.Tensor) -> int:
    n = generation_config.max_new_tokens
    if n is None:
        n = int(generation_config.max_length) - input_ids.shape[1]
    if n < 1:
        raise GencraftError(f"max_new_tokens must be >= 1, got {n}")
    return int(n)


def _output(
    name: str,
    model: nn.Module,
    input_ids: torch.Tensor,
    generation_config: Any,
    result: BeamResult,
    greedy: bool = False,
) -> Any:
    """``generate``'s output from each row's first ``num_return_sequences`` outputs:
    ``[B * R, P + W]`` ids (prompt, tokens, EOS when finished, then the fill id: the pad id
    after ``greedy`` decoding, as ``generate``'s greedy pads), and with
    ``return_dict_in_generate`` a ``GenerateBeam*Output``."""
    n_return = int(generation_config.num_return_sequences or 1)
    short = ~result.valid[:, :n_return].all(1)
    if result.valid.shape[1] < n_return or bool(short.any()):
        i = int(short.nonzero()[0]) if bool(short.any()) else 0
        raise GencraftError(
            f"{name} found {int(result.valid[i].sum())} outputs for input {i}; "
            f"num_return_sequences is {n_return}"
        )
    out = result.map(lambda x: x[:, :n_return].flatten(0, 1))  # [B * R, ...]
    pad, eos = _pad(model, generation_config), eos_ids(model, generation_config.eos_token_id)
    # generate's beam search fills with the pad id, or EOS for pad id 0; its greedy, the pad id
    fill = pad if greedy else pad or eos[0]
    width = int((out.length + out.finished.long()).max())  # B >= 1
    at = torch.arange(width, device=out.tokens.device)
    tokens = torch.nn.functional.pad(out.tokens, (0, max(0, width - out.tokens.shape[1])))
    generated = torch.where(at < out.length[:, None], tokens[:, :width], fill)
    is_end = (at == out.length[:, None]) & out.finished[:, None]
    generated = torch.where(is_end, out.eos[:, None], generated)
    prompts = input_ids[:: _expand_size(generation_config)].repeat_interleave(n_return, 0)
    sequences = torch.cat([prompts, generated.to(prompts)], dim=1)
    if not generation_config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import (
        GenerateBeamDecoderOnlyOutput,
        GenerateBeamEncoderDecoderOutput,
    )

    cls = (
        GenerateBeamEncoderDecoderOutput
        if model.config.is_encoder_decoder
        else GenerateBeamDecoderOnlyOutput
    )
    scores = out.sequence_score if generation_config.output_scores else None
    return cls(sequences=sequences, sequences_scores=scores)


@dataclass
class GenerateCall:
    """What ``generate`` hands a ``custom_generate`` decoder, as one record: the model, its
    ``input_ids`` [B·R, P] (each input repeated R times), the processors and stopping
    criteria it built, its merged ``generation_config``, ``synced_gpus``, ``streamer`` and the
    model keywords (the attention mask, an encoder-decoder's encoder outputs)."""

    model: nn.Module
    input_ids: torch.Tensor
    logits_processor: Sequence[Any] | None
    stopping_criteria: Sequence[Any] | None
    generation_config: Any
    synced_gpus: bool
    streamer: Any
    model_kwargs: dict[str, Any]

    def check(self, name: str) -> None:
        """Refuse, in one line naming decoder ``name``, what the searches cannot honour."""
        c = self
        _check_call(name, c.stopping_criteria, c.generation_config, c.synced_gpus, c.streamer)

    def stepper(self, hidden: bool) -> HFStepper:
        """One stepper over the batch (:func:`_stepper`)."""
        return _stepper(
            self.model, self.input_ids, self.model_kwargs, self.generation_config, hidden
        )

    def max_new_tokens(self) -> int:
        return _max_new_tokens(self.generation_config, self.input_ids)

    def eos_ids(self) -> list[int]:
        return eos_ids(self.model, self.generation_config.eos_token_id)

    def output(self, name: str, result: BeamResult, greedy: bool = False) -> Any:
        return _output(name, self.model, self.input_ids, self.generation_config, result, greedy)


def _beam(
    name: str,
    call: GenerateCall,
    search: dict[str, Any],
    wrap: Callable[[HFStepper], Any] | None = None,
) -> Any:
    """The one builder of the beam decoders: ``search`` holds the method's own
    :class:`~gencraft.search.beam.BeamSettings` fields; the beams, limits, processors, length
    penalty and early stopping come from ``generate``
    (:meth:`~gencraft.search.beam.BeamSettings.from_generation_config`), the EOS ids too.
    ``wrap`` turns the prompts' stepper into the one searched (context-aware decoding's two
    streams)."""
    call.check(name)
    stepper: Any = call.stepper(search.get("classifier") is not None)
    if wrap is not None:
        stepper = wrap(stepper)
    settings = BeamSettings.from_generation_config(
        call.generation_config,
        max_new_tokens=call.max_new_tokens(),
        logits_processor=tuple(call.logits_processor or ()),
        **search,
    )
    result = beam_search_tensors(stepper, settings=settings, eos_token_id=call.eos_ids())
    return call.output(name, result, greedy=settings.num_beams == 1)


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
    ``num_beams``, ``length_penalty`` and ``early_stopping`` from the generation config;
    ``finished``, ``forced_eos``, ``force_length`` and ``length_includes_eos`` as there."""
    call = GenerateCall(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        model_kwargs,
    )
    search = {
        "finished": finished,
        "forced_eos": forced_eos,
        "force_length": force_length,
        "length_includes_eos": length_includes_eos,
    }
    return _beam("beam_search", call, search)


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
    conditional score (over length^``length_penalty``), which ``sequences_scores`` holds."""
    call = GenerateCall(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        model_kwargs,
    )
    if classifier is None:
        raise GencraftError("conditional_beam_search needs classifier=<an AttributeScorer>")
    search = {"classifier": classifier, "k": k, "alpha": alpha, "finished": finished}
    return _beam("conditional_beam_search", call, search)


def context_aware(
    model: nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Sequence[Any] | None = None,
    stopping_criteria: Sequence[Any] | None = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    cad_alpha: float = 0.5,
    cad_adaptive: bool = False,
    negative_input_ids: torch.Tensor | None = None,
    negative_attention_mask: torch.Tensor | None = None,
    finished: str = "aside",
    **model_kwargs: Any,
) -> Any:
    """Context-aware decoding (CAD, Shi et al. 2023) as ``generate(custom_generate=...)``:
    greedy (``num_beams`` 1) or beam search over log_softmax((1 + α)·log p(y | c, x) −
    α·log p(y | x)) by two streams (:class:`~gencraft.models.cad.ContrastStepper`). The inputs of
    ``generate`` are the context stream (prompt with its source); ``negative_input_ids``
    [B, P'] with ``negative_attention_mask`` are the context-free inputs, one per input (a
    causal LM's left-padded prompt without the source; an encoder-decoder's encoder input
    with an empty source). ``cad_alpha`` α >= 0; ``cad_adaptive`` takes α per row and step
    as the two distributions' Jensen-Shannon divergence in bits (AdaCAD)."""
    call = GenerateCall(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        model_kwargs,
    )
    cad = CADSettings(cad_alpha, cad_adaptive)
    if negative_input_ids is None:
        raise GencraftError(
            "context_aware needs negative_input_ids: the context-free inputs (the prompt "
            "without its source; an empty source for an encoder-decoder), one per input"
        )

    def wrap(context: HFStepper) -> ContrastStepper:
        plain = HFStepper(
            model,
            negative_input_ids.to(context.device),
            attention_mask=negative_attention_mask,
            max_new_tokens=call.max_new_tokens(),
        )
        return ContrastStepper(context, plain, cad)

    return _beam("context_aware", call, {"finished": finished}, wrap)


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
    call = GenerateCall(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        model_kwargs,
    )
    call.check("exact_mode")
    eos = call.eos_ids()
    rows = exact_mode_batch(
        call.stepper(False),
        eos_token_id=eos,
        max_new_tokens=call.max_new_tokens(),
        length=length,
        max_nodes=max_nodes,
        logits_processor=list(logits_processor or []),
        length_includes_eos=length_includes_eos,
    )
    return call.output("exact_mode", _modes(rows, eos[0]))


def _modes(rows: list[ModeResult], eos: int) -> BeamResult:
    """Exact search's modes as a one-output :class:`BeamResult` ([B, 1]); a mode not found
    (log-prob -inf: no seed, so its tokens are empty) is an empty, unfinished output."""
    width = max(len(r.tokens) for r in rows)
    tokens = [r.tokens + [0] * (width - len(r.tokens)) for r in rows]
    score = torch.tensor([[r.log_prob] for r in rows])
    return BeamResult(
        tokens=torch.tensor(tokens, dtype=torch.long).view(len(rows), 1, width),
        length=torch.tensor([[len(r.tokens)] for r in rows]),
        score=score,
        conditional=torch.full_like(score, float("nan")),
        sequence_score=score,
        finished=torch.isfinite(score),
        eos=torch.full((len(rows), 1), eos),
        valid=torch.ones(len(rows), 1, dtype=torch.bool),
    )


def hub_generate(decoder: Any, model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """What a ``hub/`` folder's ``generate`` does: ``transformers`` calls it with the raw
    arguments of ``model.generate``, which go back through ``generate`` with ``decoder``; a
    ``streamer`` or ``synced_gpus``, which ``generate`` would drop before calling a callable,
    is refused here."""
    kwargs.pop("custom_generate", None)
    kwargs.pop("trust_remote_code", None)
    for name in ("streamer", "synced_gpus"):
        if kwargs.get(name):
            raise GencraftError(f"gencraft's {decoder.__name__} from generate() takes no {name}")
    return model.generate(*args, custom_generate=decoder, **kwargs)
