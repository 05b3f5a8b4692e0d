"""Reading one layer's attention probabilities during any forward pass, through the
``transformers`` attention-function registry (no forked model files).

:func:`install_capture` registers ``"gencraft_capture"`` in ``AttentionInterface`` and switches
the model to it. Every attention call is passed on unchanged to the model's previous
implementation (``sdpa``, ``eager``, flash...); only the module chosen for capture additionally
computes its softmax probabilities [B, n, T, S] and stores them for the caller.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from gencraft.errors import GencraftError

IMPL = "gencraft_capture"
_STORE = "_gencraft_capture_store"
_ORIG = "_gencraft_original_attention"

# qualified-name suffixes of the final decoder layer's attention modules, per family
CROSS_ATTENTION_SUFFIXES = ("encoder_attn", "EncDecAttention", "crossattention.self")
SELF_ATTENTION_SUFFIXES = ("self_attn", "attn", "attention.self", "SelfAttention")


def attention_probs(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scaling + position_bias + mask), float32 [B, n, T, S]: what an eager
    implementation computes. ``query`` [B, n, T, d], ``key`` [B, n_kv, S, d]."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = repeat_kv(key, groups)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scale
    if position_bias is not None:
        scores = scores + position_bias.float()
    t, s = scores.shape[-2:]
    neg = torch.finfo(scores.dtype).min
    if attention_mask is not None:
        m = attention_mask[..., -s:] if attention_mask.shape[-1] > s else attention_mask
        # a finite fill: a fully masked row (left padding) stays NaN-free, as in eager
        scores = scores.masked_fill(~m, neg) if m.dtype == torch.bool else scores + m.float()
    elif (is_causal if is_causal is not None else getattr(module, "is_causal", False)) and t > 1:
        q_pos = torch.arange(t, device=scores.device).unsqueeze(1) + (s - t)
        scores = scores.masked_fill(torch.arange(s, device=scores.device) > q_pos, neg)
    return torch.softmax(scores, dim=-1)


def _capturing_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    original = getattr(module, _ORIG, "sdpa")
    store = getattr(module, _STORE, None)
    if original == "eager" or store is not None:
        probs = attention_probs(
            module, query, key, attention_mask, kwargs.get("scaling"), kwargs.get("is_causal"),
            kwargs.get("position_bias"),
        )  # fmt: skip
        if store is not None:
            store.append(probs)
        if original == "eager":
            p = nn.functional.dropout(probs, p=kwargs.get("dropout", 0.0), training=module.training)
            groups = getattr(module, "num_key_value_groups", 1)
            v = repeat_kv(value, groups) if groups > 1 else value
            out = torch.matmul(p.to(v.dtype), v).transpose(1, 2).contiguous()
            return out, probs
    fn = sdpa_attention_forward if original == "sdpa" else ALL_ATTENTION_FUNCTIONS[original]
    return fn(module, query, key, value, attention_mask, **kwargs)


# one name per mask format: the model keeps the masks its own implementation expects (sdpa's
# may be boolean or skipped in favour of is_causal; attention_probs handles each form)
IMPL_EAGER = "gencraft_capture_eager"
for _name, _mask in ((IMPL, sdpa_mask), (IMPL_EAGER, eager_mask)):
    AttentionInterface.register(_name, _capturing_attention)
    AttentionMaskInterface.register(_name, _mask)
SUPPORTED_ORIGINALS = ("sdpa", "eager")


def find_attention_module(model: nn.Module, kind: str) -> tuple[str, nn.Module]:
    """The final decoder layer's cross-attention (``kind="cross"``) or self-attention
    (``kind="self"``) module, by qualified name. Raises for architectures we do not know."""
    suffixes = CROSS_ATTENTION_SUFFIXES if kind == "cross" else SELF_ATTENTION_SUFFIXES
    root = model.get_decoder() if kind == "cross" and hasattr(model, "get_decoder") else model
    found = [(n, m) for n, m in root.named_modules() if n.split(".")[-1] in suffixes
             or any(n.endswith("." + s) for s in suffixes if "." in s)]  # fmt: skip
    if not found:
        raise GencraftError(
            f"unsupported architecture {type(model).__name__}: no {kind}-attention module named "
            f"like {', '.join(suffixes)} was found in its decoder"
        )
    return found[-1]


def install_capture(model: nn.Module, module: nn.Module) -> list[torch.Tensor]:
    """Route ``model``'s attention through the capturing function; return the list into which
    ``module`` appends its probabilities at each call (the caller clears it)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    for cfg in configs.values():
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if impl not in (IMPL, IMPL_EAGER):
            if impl not in SUPPORTED_ORIGINALS:
                raise GencraftError(
                    f"attention implementation {impl!r} cannot be read by FAME; load the model "
                    "with attn_implementation='sdpa' or 'eager'"
                )
            cfg._gencraft_original_attention = impl
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_gencraft_original_attention"):
            setattr(m, _ORIG, cfg._gencraft_original_attention)
    for cfg in configs.values():
        if getattr(cfg, "_attn_implementation", None) is not None or hasattr(
            cfg, "_attn_implementation_internal"
        ):
            original = cfg._gencraft_original_attention
            cfg._attn_implementation = IMPL_EAGER if original == "eager" else IMPL
    store: list[torch.Tensor] = []
    setattr(module, _STORE, store)
    return store
