"""The recurrent model of Yoshida 2023, ch. 2, on any Hugging Face causal LM.

A text is cut into windows of T tokens that start every T - o tokens (:func:`window_schedule`;
the same windows as the overlap evaluation). Window 1 runs the unmodified model. After each
window every layer's hidden states are pooled (eq. 2.1),

    z = pool_i  Σ_ℓ softmax(α)_ℓ h_i^(ℓ)        (ℓ = 1..L, no embedding layer)

an FFN maps z to h_prev, and the next window's self-attention at ``insert_layer`` gets h_prev
as one extra key and value (not a query): every position of the window can attend to it.
h_prev goes through that layer's input norm and its own key/value projections, with no
position embedding; it reaches the attention through gencraft's attention dispatcher (an
``extend`` plug-in), not a forked model file.

Training backpropagates through all windows of a sequence. With ``checkpoint=True`` only the
pooled state h_prev [B, H] (and the window's token ids) is kept per window; each window's
activations are recomputed in the backward pass (bottleneck checkpointing, §2.2).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import CausalLMOutput

from gencraft.config import check
from gencraft.errors import ConfigError, GencraftError
from gencraft.metrics.lm import Window, window_schedule
from gencraft.models.attention import (
    AttentionCall,
    AttentionPlugin,
    ExtraKeyValues,
    architecture,
    attach,
    attention_context,
    current_context,
    input_norm,
    project_key_value,
    select_sites,
)
from gencraft.models.introspect import hf_model, is_causal_lm, model_shape
from gencraft.models.method import MethodModel
from gencraft.recurrence.config import RecurrenceConfig

_ACT = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}


class _HPrevSlot(AttentionPlugin):
    """Adds h_prev (from the attention context) as one key/value column at one layer."""

    def __init__(self, norm: nn.Module | None) -> None:
        self.norm = norm

    def active(self, call: AttentionCall) -> bool:
        return (current_context().memory or {}).get(id(self)) is not None

    def extend(self, call: AttentionCall) -> ExtraKeyValues:
        h = current_context().memory[id(self)]  # [B, H]
        x = h[:, None, :].to(call.query.dtype)
        if self.norm is not None:
            x = self.norm(x)
        k, v = project_key_value(call.module, x)  # [B, n_kv, 1, d]
        return ExtraKeyValues(k, v)


class RecurrentLM(MethodModel):
    """``base`` (a causal LM) with recurrence between windows.

    Args:
        base: a Hugging Face causal LM; its attention is routed through gencraft's dispatcher.
        config: :class:`RecurrenceConfig`.

    Disabled (:meth:`disable`), no state passes between windows: each window is the base's.
    """

    method = "recurrence"
    legacy_files = ("recurrence_config.json", "recurrence.safetensors")

    def __init__(self, base: nn.Module, config: RecurrenceConfig | None = None) -> None:
        super().__init__()
        self.config = config or RecurrenceConfig()
        hf = hf_model(base)
        if not is_causal_lm(hf):
            raise GencraftError(f"RecurrentLM needs a causal LM; {type(hf).__name__} is not one")
        self.base = base
        shape = model_shape(hf)
        if not 0 <= self.config.insert_layer < shape.layers:
            raise ConfigError(
                f"insert_layer must be in [0, {shape.layers}) for this {shape.layers}-layer "
                f"model, got {self.config.insert_layer}"
            )
        self.layer_logits = nn.Parameter(torch.zeros(shape.layers))  # α_ℓ of eq. 2.1
        widths = [shape.hidden, *self.config.ffn_hidden, shape.hidden]
        parts: list[nn.Module] = []
        for i in range(len(widths) - 1):
            parts.append(nn.Linear(widths[i], widths[i + 1]))
            if i < len(widths) - 2:
                parts.append(_ACT[self.config.activation]())
        self.ffn = nn.Sequential(*parts)
        try:  # fail now, naming the model, not in the second window
            site, module = select_sites(
                hf, kind="self", stack="decoder", layers=[self.config.insert_layer]
            )[0]
            self.slot = _HPrevSlot(input_norm(hf, site) if self.config.hprev_norm else None)
            project_key_value(
                module, torch.zeros(1, 1, shape.hidden, dtype=next(hf.parameters()).dtype)
            )
        except GencraftError as err:
            raise GencraftError(f"RecurrentLM cannot attach to {architecture(hf)}: {err}") from None
        self._handle = attach(hf, self.slot, modules=[module])
        if not self.config.train_base:
            self._freeze(hf)

    # ------------------------------------------------------------------ one window
    def pool(self, hidden_states: tuple[torch.Tensor, ...], n: int) -> torch.Tensor:
        """Eq. 2.1 over the first ``n`` positions: ``hidden_states`` (L + 1) x [B, t, H],
        embeddings first -> z [B, H]."""
        w = torch.softmax(self.layer_logits.float(), dim=0)
        stacked = torch.stack(hidden_states[1:], dim=0)[:, :, :n]  # [L, B, n, H]
        z = torch.einsum("l,lbnh->bh", w, stacked.float())  # float32 in any model dtype
        return z / n if self.config.pooling == "mean" else z

    def transform(self, z: torch.Tensor) -> torch.Tensor:
        """The FFN z [B, H] -> h_prev [B, H], in float32 whatever dtype the model is in."""
        x = z.float()
        for layer in self.ffn:
            if isinstance(layer, nn.Linear):
                x = nn.functional.linear(x, layer.weight.float(), layer.bias.float())
            else:
                x = layer(x)
        return x

    def _window(
        self,
        x: torch.Tensor,
        h_prev: torch.Tensor | None,
        targets: torch.Tensor,
        offset: int,
        want: str,
        stride: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One window: inputs ``x`` [B, t] after ``h_prev`` [B, H] (None: the first) ->
        (summed NLL of ``targets`` [B, s] predicted by positions offset.., h_next [B, H],
        and ``want``: "logits" those positions' logits [B, s, V], "nll" their NLL [B, s]).
        ``stride``: T - o of this pass's overlap o, the positions the next window does not
        repeat (pooled unless ``pool_positions="all"``)."""
        with attention_context(memory={id(self.slot): h_prev}):
            out = self.base(input_ids=x, output_hidden_states=True, use_cache=False)
        n_pool = x.shape[1] if self.config.pool_positions == "all" else min(stride, x.shape[1])
        h_next = self.transform(self.pool(out.hidden_states, n_pool))
        rows = out.logits[:, offset : offset + targets.shape[1]].float()
        nll = nn.functional.cross_entropy(
            rows.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none"
        ).view_as(targets)
        extra = {"logits": rows.detach(), "nll": nll.detach()}.get(want)
        return nll.sum(), h_next, extra

    # ------------------------------------------------------------------ the text
    def schedule(self, n: int, overlap: int | None = None) -> list[Window]:
        """The windows over ``n`` tokens: inputs up to position n - 1."""
        o = self.config.overlap if overlap is None else overlap
        return window_schedule(n + 1, self.config.window, o)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        return_logits: bool = True,
        overlap: int | None = None,
        _want: str | None = None,
    ) -> CausalLMOutput:
        """``input_ids`` [B, N] -> ``loss`` (mean NLL over the targets ``labels[:, 1:]`` that are
        not -100; ``labels`` default to ``input_ids``) and ``logits`` [B, N, V], each position's
        logits from the window that scores its target (None with ``return_logits=False``)."""
        if input_ids.dim() != 2:
            raise GencraftError(f"input_ids must be [B, N], got shape {tuple(input_ids.shape)}")
        check(input_ids.shape[1] >= 2, f"need at least 2 tokens, got {input_ids.shape[1]}")
        labels = input_ids if labels is None else labels
        if labels.shape != input_ids.shape:
            raise GencraftError(
                f"labels {tuple(labels.shape)} must match input_ids {tuple(input_ids.shape)}"
            )
        b, n = input_ids.shape
        # target N does not exist: pad with -100 so the last window can run on position N - 1
        padded = torch.cat([labels, labels.new_full((b, 1), -100)], dim=1)
        use_ckpt = self.config.checkpoint and torch.is_grad_enabled() and self.training
        want = _want or ("logits" if return_logits else "none")
        h, total, logits = None, input_ids.new_zeros((), dtype=torch.float32), []
        # this pass's overlap decides the pooled positions (§2.3: a model trained at one
        # overlap is evaluated at another "by changing which positions are pooled")
        stride = self.config.window - (self.config.overlap if overlap is None else overlap)
        for w in self.schedule(n, overlap):
            x = input_ids[:, w.start : w.end]
            targets = padded[:, w.first : w.end + 1]
            args = (x, h, targets, w.first - 1 - w.start, want, stride)
            if use_ckpt:
                nll, h, rows = checkpoint(self._window, *args, use_reentrant=False)
            else:
                nll, h, rows = self._window(*args)
            total = total + nll
            if not self.config.recurrent or not self.enabled:  # the same windows, no state
                h = None
            if rows is not None:
                logits.append(rows)
        count = (labels[:, 1:] != -100).sum()
        loss = total / count.clamp(min=1)
        return CausalLMOutput(loss=loss, logits=torch.cat(logits, dim=1) if logits else None)

    def token_nll(self, ids: torch.Tensor, overlap: int | None = None) -> torch.Tensor:
        """Per-target NLL [N - 1] of ``ids`` [1, N] (or [N]), h_prev carried across windows."""
        ids = ids[None] if ids.dim() == 1 else ids
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise GencraftError(f"ids must be [1, N] or [N], got shape {tuple(ids.shape)}")
        with torch.no_grad():
            out = self.forward(ids, overlap=overlap, _want="nll")
        return out.logits[0, :-1].cpu()  # per-target NLL; the last position has no target

    def windowed_token_nll(self, ids: torch.Tensor, *, window: int, overlap: int) -> torch.Tensor:
        """:func:`gencraft.metrics.windowed_nll`'s hook: :meth:`token_nll` on this model's own
        windows (``window`` must be its window)."""
        check(
            window == self.config.window,
            f"this RecurrentLM runs windows of {self.config.window} tokens, not {window}",
        )
        return self.token_nll(ids, overlap=overlap)

    def recurrence_state_dict(self) -> dict[str, torch.Tensor]:
        """The recurrence's own tensors (α and the FFN), without the base model."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("base.")}

    # ------------------------------------------------------------------ the contract
    @property
    def method_config(self) -> RecurrenceConfig:
        return self.config

    @property
    def base_model(self) -> nn.Module:
        return hf_model(self.base)

    def method_payload(self) -> dict[str, Any]:
        return {"recurrence": asdict(self.config), "base_name_or_path": None}

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        return self.recurrence_state_dict()

    def saves_base(self) -> bool:
        return True  # unless saved with base_name_or_path and a frozen base

    def save_pretrained(
        self,
        directory: str | Path,
        *,
        save_base: bool | None = None,
        base_name_or_path: str | None = None,
    ) -> Path:
        """The recurrence's tensors and config, and the base under ``base/`` when it trains
        or is not named (``base_name_or_path``)."""
        if save_base is None:
            save_base = self.config.train_base or not base_name_or_path
        return super().save_pretrained(
            directory, save_base=save_base, base_name_or_path=base_name_or_path
        )

    def _set_enabled(self, on: bool) -> None:
        pass  # forward reads self.enabled

    def _detach(self) -> None:
        self._handle.remove()

    @classmethod
    def from_method_payload(
        cls, payload: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, **kwargs: Any
    ) -> RecurrentLM:
        model = cls(base, RecurrenceConfig(**payload["recurrence"]))
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if not k.startswith("base.")]
        if missing or unexpected:
            raise GencraftError(
                f"the saved recurrence weights do not match its config: missing "
                f"{missing[:5]}, unexpected {unexpected[:5]}"
            )
        return model
