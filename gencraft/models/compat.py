"""Every place gencraft depends on the ``transformers`` release, in one file.

Supported: the range ``pyproject.toml`` declares, 5.5 <= transformers < 6 (tested at its floor
5.5.0, at the CI pin 5.23.0 and at the newest release 5.25.0, ``constraints/``). What moved
between those releases, and how it is read here:

* the cache argument and output field: ``past_key_values`` until 5.23, ``cache`` from 5.24
  (the old name is deprecated there, and from 5.25 even asking an output for it logs a
  warning): :data:`CACHE_ARG`, :func:`cache_kwargs`,
  :func:`output_cache`, :func:`takes_cache`;
* gencraft's own ``ModelOutput`` classes carry the cache under that same name
  (:data:`CACHE_ARG`);
* the attention-function registry and the mask-function registry (:data:`AttentionInterface`,
  :data:`ALL_ATTENTION_FUNCTIONS`, :data:`AttentionMaskInterface`,
  :data:`ALL_MASK_ATTENTION_FUNCTIONS`) and ``repeat_kv``;
* the cache classes (:data:`Cache`, :data:`DynamicCache`, :data:`EncoderDecoderCache`,
  :data:`DynamicLayer`).

(``token_type_ids``, which broke 4.57.6, never reach a model from gencraft: it builds its own
``input_ids``/``attention_mask`` batches, :func:`gencraft.models.generate.build_inputs`.)

The next release should be one file to adapt: this one.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import transformers
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - before the per-layer cache classes
    DynamicLayer = None  # type: ignore[assignment,misc]

try:
    from transformers.integrations.sdpa_attention import repeat_kv
except ImportError:  # pragma: no cover
    from transformers.models.llama.modeling_llama import repeat_kv

#: the name of the cache argument of a model's forward and of its outputs' cache field
CACHE_ARG = (
    "cache"
    if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    else "past_key_values"
)
#: every name a cache has gone by (the argument, an output field), the newest first
CACHE_NAMES = ("cache", "past_key_values")

__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ALL_MASK_ATTENTION_FUNCTIONS",
    "CACHE_ARG",
    "CACHE_NAMES",
    "AttentionInterface",
    "AttentionMaskInterface",
    "Cache",
    "DynamicCache",
    "DynamicLayer",
    "EncoderDecoderCache",
    "cache_kwargs",
    "output_cache",
    "repeat_kv",
    "takes_cache",
]


def cache_kwargs(cache_value: Any) -> dict[str, Any]:
    """``{CACHE_ARG: cache}``: the keyword a model's forward takes its cache by."""
    return {CACHE_ARG: cache_value}


def output_cache(output: Any) -> Any:
    """The cache a model's output carries (None when it has none). An old name is read only
    where the output declares it (a plain dict, or an output class of older code): asking a
    5.25 ``ModelOutput`` for ``past_key_values`` logs a deprecation warning."""
    if not isinstance(output, dict):
        return None
    declared = getattr(output, "__dataclass_fields__", None)
    for name in CACHE_NAMES:
        if (name == CACHE_ARG or declared is None or name in declared) and name in output:
            return output[name]
    return None


def given_cache(kwargs: dict[str, Any]) -> Any:
    """The cache passed in a forward's keyword arguments, under either name."""
    for name in CACHE_NAMES:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


@cache
def _forward_params(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def takes_cache(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes a KV cache (under either name)."""
    params = _forward_params(type(model))
    return any(n in params for n in CACHE_NAMES)
