"""The pointer sentinel mixture on top of any Hugging Face causal LM (beyond the paper, which
only used LSTMs): the base model's last hidden states are the window, its logits the softmax
component. Adds exactly H^2 + 2H parameters (query W, b and sentinel s).

Shapes: B batch, T sequence length, H the base model's hidden size, V its vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gencraft.errors import ConfigError, GencraftError
from gencraft.models.method import MethodModel
from gencraft.pointer.functional import (
    pointer_target_log_probs,
    sequence_mixture_log_probs,
    sequence_pointer_attention,
)

#: the files the head wrote before the shared method format (still loaded)
HEAD_CONFIG = "pointer_head_config.json"
HEAD_WEIGHTS = "pointer_head.safetensors"


@dataclass
class HeadOutput:
    """``loss``: mean NLL over the labelled positions; ``nll`` [B, T - 1] per next token (0 where
    unlabelled); ``gate`` [B, T]; ``log_probs`` [B, T, V] mixture log-probabilities (only with
    ``return_log_probs``); ``log_attn`` [B, T, T] (only with ``return_attention``)."""

    loss: torch.Tensor | None
    nll: torch.Tensor | None
    gate: torch.Tensor
    log_probs: torch.Tensor | None = None
    log_attn: torch.Tensor | None = None


def _hidden_size(model: nn.Module) -> int:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is None or not hasattr(out, "weight"):
        raise GencraftError(
            f"{type(model).__name__} has no output embedding (lm_head); PointerSentinelHead needs "
            "a causal LM such as LlamaForCausalLM or GPT2LMHeadModel"
        )
    return int(out.weight.shape[1])


class PointerSentinelHead(MethodModel):
    """``PointerSentinelHead(base, window=100, freeze_base=True)``: wraps a causal LM.

    Position t scores token t + 1 with ``g * p_base + sum of a_i over the window positions
    t - L + 1 .. t holding that token`` (eq. 6), the window being the base model's last-layer
    hidden states of the same sequence. Padding (``attention_mask`` 0, left or right) never
    enters a window. With ``freeze_base`` the base runs without gradient and in eval mode.
    Disabled (:meth:`disable`), the gate is 1 and the model is its base.
    """

    method = "pointer"
    legacy_files = (HEAD_CONFIG, HEAD_WEIGHTS)

    def __init__(
        self,
        base_model: nn.Module,
        window: int = 100,
        *,
        freeze_base: bool = True,
        base_name_or_path: str | None = None,
    ) -> None:
        super().__init__()
        if window < 1:
            raise ConfigError(f"window must be at least 1 position, got {window}")
        config = getattr(base_model, "config", None)
        if config is not None and getattr(config, "is_encoder_decoder", False):
            raise GencraftError(
                "PointerSentinelHead wraps decoder-only causal LMs; got an encoder-decoder"
            )
        self.base = base_model
        self.window = window
        self.freeze_base = freeze_base
        self.base_name_or_path = base_name_or_path or getattr(config, "_name_or_path", "") or ""
        h = _hidden_size(base_model)
        self.query = nn.Linear(h, h)  # W, b (eq. 2)
        self.sentinel = nn.Parameter(torch.zeros(h))
        nn.init.normal_(self.query.weight, std=h**-0.5)
        nn.init.zeros_(self.query.bias)
        p = next(base_model.parameters())
        self.query.to(p.device)
        self.sentinel.data = self.sentinel.data.to(p.device)
        if freeze_base:
            self._freeze(self.base)
            self.base.eval()

    def train(self, mode: bool = True) -> PointerSentinelHead:
        super().train(mode)
        if self.freeze_base:
            self.base.eval()
        return self

    def num_pointer_parameters(self) -> int:
        return sum(p.numel() for p in (*self.query.parameters(), self.sentinel))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        return_log_probs: bool = False,
        return_attention: bool = False,
    ) -> HeadOutput:
        """Args:
        input_ids: [B, T].
        attention_mask: [B, T], 1 = real token (default all ones).
        labels: [B, T] as in ``transformers`` (-100 = ignore; shifted inside): position t
            is scored on ``labels[:, t + 1]``. Default: ``input_ids`` where attended.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError("attention_mask must have the shape of input_ids")
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError("labels must have the shape of input_ids")
        grad = torch.is_grad_enabled() and not self.freeze_base
        with torch.set_grad_enabled(grad):
            out = self.base(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
            )
        hidden = out.hidden_states[-1].float()  # after the final norm, as fed to lm_head
        logits = out.logits
        valid = attention_mask.bool()
        log_attn, log_gate = self._attend(self._query(hidden), hidden, valid)
        loss = nll = None
        if labels is None:
            labels = input_ids.masked_fill(~valid, -100)
        target = labels[:, 1:]
        scored = (target != -100) & valid[:, :-1]  # no prediction from a padding position
        if scored.any():
            tgt = target.clamp_min(0)
            lv = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(2, tgt.unsqueeze(2))
            lp = pointer_target_log_probs(
                lv.squeeze(2), log_attn[:, :-1], log_gate[:, :-1], input_ids, tgt
            )
            nll = (-lp).masked_fill(~scored, 0.0)
            loss = nll.sum() / scored.sum()
        log_probs = None
        if return_log_probs:
            log_probs = sequence_mixture_log_probs(logits, log_attn, log_gate, input_ids)
        return HeadOutput(
            loss, nll, log_gate.exp(), log_probs, log_attn if return_attention else None
        )

    def _attend(
        self, query: torch.Tensor, states: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log_attn [B, T, S], log_gate [B, T]); disabled: no attention and gate 1."""
        if not self.enabled:
            shape = (*query.shape[:2], states.shape[1])
            log_attn = query.new_full(shape, float("-inf"))
            return log_attn, query.new_zeros(query.shape[:2])
        return sequence_pointer_attention(query, states, self.sentinel.float(), self.window, valid)

    def _query(self, hidden: torch.Tensor) -> torch.Tensor:
        """tanh(W h + b) [B, T, H] in float32 (eq. 2), whatever dtype the head is in: the
        pointer attention and the mixture always run in float32."""
        w, b = self.query.weight, self.query.bias
        return torch.tanh(nn.functional.linear(hidden.float(), w.float(), b.float()))

    # -- stepping (gencraft's beam search and exact mode search) ----------------------------
    def gencraft_step(
        self,
        tokens: torch.Tensor,
        cache: Any,
        *,
        start: bool,
        hidden: bool = False,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> Any:
        """Eq. 6 one position at a time, for :mod:`gencraft.models.stepping`.

        ``tokens`` [N, t] (the prompt at the start, then one token per hypothesis); ``cache``
        a ``DynamicCache`` holding the base's keys/values and, as one extra layer after them,
        the window: last-layer hidden states [N, 1, S, H] as keys and their token ids [N, 1, S,
        1] as values (so searches reorder, slice and rebuild it like any cache). A padded batch
        gives ``attention_mask`` [N, S] (padding never enters the window) and ``position_ids``
        [N, t]. Returns the next-token mixture log-probabilities [N, V] of the last position."""
        from gencraft.models.compat import DynamicCache, cache_kwargs, output_cache
        from gencraft.models.introspect import model_shape
        from gencraft.models.stepping import StepOutput

        n_layers = model_shape(self.base).layers  # the window is the layer after the base's
        if cache is None:
            cache = DynamicCache()
        padded = {}
        if attention_mask is not None:
            padded = {"attention_mask": attention_mask, "position_ids": position_ids}
        out = self.base(
            input_ids=tokens,
            **cache_kwargs(cache),
            **padded,
            use_cache=True,
            output_hidden_states=True,
        )
        cache = output_cache(out)
        last = out.hidden_states[-1].float()  # [N, t, H]
        ids = tokens.to(last.dtype)[:, None, :, None]
        cache.update(last[:, None], ids, n_layers)
        window = cache.layers[n_layers]
        states, state_ids = window.keys[:, 0], window.values[:, 0, :, 0].long()
        valid = attention_mask.bool() if attention_mask is not None else None
        log_attn, log_gate = self._attend(self._query(last[:, -1:]), states, valid)
        log_probs = sequence_mixture_log_probs(out.logits[:, -1:], log_attn, log_gate, state_ids)[
            :, 0
        ]
        h = None
        if hidden:
            h = torch.stack([x[:, -1, :] for x in out.hidden_states], dim=1).float()
        return StepOutput(log_probs, cache, h)

    # -- persistence ------------------------------------------------------------------------
    @property
    def method_config(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "hidden_size": self.query.in_features,
            "freeze_base": self.freeze_base,
            "base_name_or_path": self.base_name_or_path,
        }

    def method_payload(self) -> dict[str, Any]:
        return dict(self.method_config)

    def saves_base(self) -> bool:
        """The base is saved when it trains or has no loadable name."""
        return not self.freeze_base or not self.base_name_or_path

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "query.weight": self.query.weight,
            "query.bias": self.query.bias,
            "sentinel": self.sentinel,
        }

    def _set_enabled(self, on: bool) -> None:
        pass  # forward and gencraft_step read self.enabled

    @classmethod
    def from_method_payload(
        cls, payload: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, **kwargs: Any
    ) -> PointerSentinelHead:
        head = cls(
            base,
            payload["window"],
            freeze_base=payload["freeze_base"],
            base_name_or_path=payload["base_name_or_path"],
        )
        if head.query.in_features != payload["hidden_size"]:
            raise GencraftError(
                f"the base model's hidden size {head.query.in_features} differs from the saved "
                f"head's {payload['hidden_size']}"
            )
        with torch.no_grad():
            head.query.weight.copy_(tensors["query.weight"])
            head.query.bias.copy_(tensors["query.bias"])
            head.sentinel.copy_(tensors["sentinel"])
        return head
