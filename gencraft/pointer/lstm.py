"""The pointer sentinel-LSTM (Merity et al. 2016): embedding, zoneout LSTM, softmax, and the
sentinel-gated pointer over the last L outputs of the final layer.

Shapes: B batch, T positions scored, M window memory (states before the chunk), H hidden,
E embedding, V vocabulary, N layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.method import MethodModel
from gencraft.pointer.config import PointerSentinelConfig
from gencraft.pointer.functional import (
    pointer_loss,
    pointer_target_log_probs,
    sequence_mixture_log_probs,
    sequence_pointer_attention,
)
from gencraft.pointer.rnn import LockedDropout, LSTMState, ZoneoutLSTM, locked_dropout_mask

CONFIG_NAME = "pointer_config.json"
WEIGHTS_NAME = "model.safetensors"


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's medium model: 2 x 650, L = 100, 0.5 locked dropout and zoneout.
    "medium": dict(
        hidden_size=650,
        num_layers=2,
        window=100,
        dropout=0.5,
        output_dropout=0.5,
        zoneout_c=0.5,
        zoneout_h=0.5,
    ),
    # CPU-sized: 2 x 256, lighter regularisation for a ~20-minute budget, and no zoneout, so each
    # layer runs the fused LSTM kernel (about 3x faster on CPU than the zoneout step loop).
    "small": dict(
        hidden_size=256,
        num_layers=2,
        window=100,
        dropout=0.25,
        output_dropout=0.25,
        zoneout_c=0.0,
        zoneout_h=0.0,
    ),
    # For tests: seconds on one core.
    "tiny": dict(
        hidden_size=32,
        num_layers=2,
        window=20,
        dropout=0.1,
        output_dropout=0.1,
        zoneout_c=0.1,
        zoneout_h=0.1,
    ),
}


def _check_targets(targets: torch.Tensor | None, b: int, t: int) -> None:
    """Targets [B, T'] score the last T' of T inputs: refuse any other shape."""
    if targets is not None and (
        targets.dim() != 2 or targets.shape[0] != b or not 0 < targets.shape[1] <= t
    ):
        raise ValueError(
            f"targets must be [B, T'] with B = {b} and 0 < T' <= T = {t} (they score the last "
            f"T' inputs), got {tuple(targets.shape)}"
        )


@dataclass
class PointerOutput:
    """Result of :meth:`PointerSentinelLSTM.forward`.

    Attributes:
        nll: [B, T] negative log-likelihood of each target (None without targets).
        pointer_nll: [B, T] eq. 9 (None without pointer or targets).
        gate: [B, T] sentinel gate g (None without pointer).
        log_attn: [B, T, M + T] window attention (only with ``return_attention``).
        outputs: [B, T, H] last layer's outputs after output dropout (the next window memory).
        state: final LSTM state; kept_state: the state after ``keep_state_at`` steps.
        logits: [B, T, V] softmax-component logits (only with ``return_logits``).
    """

    nll: torch.Tensor | None
    pointer_nll: torch.Tensor | None
    gate: torch.Tensor | None
    log_attn: torch.Tensor | None
    outputs: torch.Tensor
    state: LSTMState
    kept_state: LSTMState | None
    logits: torch.Tensor | None = None


class PointerSentinelLSTM(MethodModel):
    """Embedding -> N-layer zoneout LSTM -> (softmax over V) mixed with a pointer over the last
    ``window`` outputs by a sentinel gate. ``pointer=False`` is the plain LSTM baseline.

    The pointer adds exactly H^2 + 2H parameters: the query projection W, b (eq. 2) and the
    sentinel s (eq. 7).
    """

    def __init__(self, config: PointerSentinelConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embedding = nn.Embedding(c.vocab_size, c.emb_size)
        self.rnn = ZoneoutLSTM(
            c.emb_size,
            c.hidden_size,
            c.num_layers,
            dropout=c.dropout,
            zoneout_c=c.zoneout_c,
            zoneout_h=c.zoneout_h,
            zoneout_mask=c.zoneout_mask,
            zoneout_eval=c.zoneout_eval,
        )
        self.output_dropout = LockedDropout(c.output_dropout)
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size)
        if c.tie_weights:
            self.decoder.weight = self.embedding.weight
        if c.pointer:
            self.query = nn.Linear(c.hidden_size, c.hidden_size)  # W, b of eq. 2
            self.sentinel = nn.Parameter(torch.empty(c.hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r = self.config.init_range
        for p in self.parameters():
            nn.init.uniform_(p, -r, r)
        nn.init.zeros_(self.decoder.bias)

    @classmethod
    def from_preset(cls, preset: str, vocab_size: int, **overrides: Any) -> PointerSentinelLSTM:
        if preset not in PRESETS:
            raise GencraftError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        return cls(PointerSentinelConfig(vocab_size=vocab_size, **{**PRESETS[preset], **overrides}))

    # -- pieces -------------------------------------------------------------------------------
    def sample_masks(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        """Locked-dropout masks for one batch: per-layer inputs and the output, [B, 1, *]."""
        dtype = self.embedding.weight.dtype  # masks in the weights' dtype (bf16/fp16 too)
        ref = torch.empty(batch_size, 1, self.config.emb_size, device=device, dtype=dtype)
        masks: dict[str, Any] = {"layers": self.rnn.sample_masks(ref), "output": None}
        if self.training and self.output_dropout.p > 0:
            out_ref = ref.new_empty(batch_size, 1, self.config.hidden_size)
            masks["output"] = locked_dropout_mask(out_ref, self.output_dropout.p)
        return masks

    def encode(
        self,
        input_ids: torch.Tensor,
        state: LSTMState | None = None,
        *,
        masks: dict[str, Any] | None = None,
        keep_state_at: int | None = None,
    ) -> tuple[torch.Tensor, LSTMState, LSTMState | None]:
        """Run the LSTM over ``input_ids`` [B, T]: ``(outputs [B, T, H] after output dropout,
        final state, kept state)``. The pointer's window holds these outputs."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if input_ids.numel() and (
            int(input_ids.min()) < 0 or int(input_ids.max()) >= self.config.vocab_size
        ):
            raise ValueError(f"input_ids must lie in [0, {self.config.vocab_size})")
        if masks is None:
            masks = self.sample_masks(input_ids.shape[0], input_ids.device)
        x = self.embedding(input_ids)
        out, state, kept = self.rnn(x, state, masks=masks["layers"], keep_state_at=keep_state_at)
        out = self.output_dropout(out, masks["output"])
        return out, state, kept

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        state: LSTMState | None = None,
        *,
        memory: torch.Tensor | None = None,
        memory_ids: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        masks: dict[str, Any] | None = None,
        keep_state_at: int | None = None,
        force_gate: bool = False,
        return_attention: bool = False,
        return_logits: bool = False,
    ) -> PointerOutput:
        """Score ``targets`` [B, T'] (T' <= T) given ``input_ids`` [B, T]: target j follows input
        T - T' + j, so only the last T' positions are scored (k1 < k2 in truncated BPTT).

        Args:
            state: LSTM state before ``input_ids[:, 0]`` (zeros if None).
            memory: [B, M, H] outputs of the positions just before ``input_ids`` (the window
                reaches into them), with ``memory_ids`` [B, M] their words and ``memory_mask``
                [B, M] bool (False = no such position, e.g. before the stream start).
            masks: dropout masks from :meth:`sample_masks` (a regenerated window must share
                them); drawn here if None.
            force_gate: set g = 1 (all mass to the softmax): the model is then exactly the
                plain LSTM with the same weights.
        """
        out, state, kept = self.encode(input_ids, state, masks=masks, keep_state_at=keep_state_at)
        c = self.config
        b, t = input_ids.shape
        _check_targets(targets, b, t)
        n_scored = targets.shape[1] if targets is not None else t
        scored = out[:, t - n_scored :]
        logits = self.decoder(scored)
        nll = pointer_nll = gate = log_attn = None
        if c.pointer and not force_gate and self.enabled:  # disabled: the softmax alone
            window = self._window(out, input_ids, memory, memory_ids, memory_mask)
            log_attn, log_gate = sequence_pointer_attention(
                torch.tanh(self.query(scored)), window[0], self.sentinel, c.window, window[2]
            )
            gate = log_gate.exp()
            if targets is not None:
                log_vocab = torch.log_softmax(logits.float(), dim=-1)
                lv_t = log_vocab.gather(2, targets.unsqueeze(2)).squeeze(2)
                nll = -pointer_target_log_probs(lv_t, log_attn, log_gate, window[1], targets)
                pointer_nll = pointer_loss(log_attn, log_gate, window[1], targets)
            if not return_attention:
                log_attn = None
        elif targets is not None:
            nll = nn.functional.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten(), reduction="none"
            ).view_as(targets)
        return PointerOutput(
            nll, pointer_nll, gate, log_attn, out, state, kept, logits if return_logits else None
        )

    def _window(
        self,
        out: torch.Tensor,
        input_ids: torch.Tensor,
        memory: torch.Tensor | None,
        memory_ids: torch.Tensor | None,
        memory_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What the pointer can reach: (states [B, M' + T, H], their ids [B, M' + T], valid
        [B, M' + T] bool or None), the last ``window - 1`` memory positions (M') before the
        outputs ``out`` [B, T, H] of ``input_ids``."""
        if memory is None:
            return out, input_ids, None
        if memory_ids is None or memory_ids.shape != memory.shape[:2]:
            raise ValueError("memory_ids must be given, [B, M] matching memory")
        cut = memory.shape[1] - min(memory.shape[1], self.config.window - 1)
        states = torch.cat([memory[:, cut:].to(out.dtype), out], dim=1)
        ids = torch.cat([memory_ids[:, cut:], input_ids], dim=1)
        if memory_mask is None:
            return states, ids, None
        ones = torch.ones_like(input_ids, dtype=torch.bool)
        return states, ids, torch.cat([memory_mask[:, cut:], ones], dim=1)

    def full_log_probs(
        self,
        logits: torch.Tensor,
        log_attn: torch.Tensor | None,
        gate: torch.Tensor | None,
        state_ids: torch.Tensor,
    ) -> torch.Tensor:
        """[B, T, V] mixture log-probabilities (eq. 6) from a forward pass run with
        ``return_logits`` and ``return_attention``; ``state_ids`` [B, S] as for the window."""
        if log_attn is None or gate is None:
            return torch.log_softmax(logits.float(), dim=-1)
        return sequence_mixture_log_probs(logits, log_attn, gate.log(), state_ids)

    # -- persistence --------------------------------------------------------------------------
    def num_pointer_parameters(self) -> int:
        """H^2 + 2H with the pointer, else 0."""
        if not self.config.pointer:
            return 0
        return sum(p.numel() for p in (*self.query.parameters(), self.sentinel))

    # -- the method contract (a model trained as a whole: no base to give back) -------------
    method = "pointer"
    legacy_files = (CONFIG_NAME, WEIGHTS_NAME)

    @property
    def method_config(self) -> PointerSentinelConfig:
        return self.config

    def method_payload(self) -> dict[str, Any]:
        return {"config": self.config.to_dict()}

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        skip = ("decoder.weight",) if self.config.tie_weights else ()  # tied to the embedding
        return {k: v for k, v in self.state_dict().items() if k not in skip}

    @classmethod
    def base_task(cls, payload: dict[str, Any]) -> None:
        return None

    def _set_enabled(self, on: bool) -> None:
        if not self.config.pointer:
            raise GencraftError("this is the plain LSTM (pointer=False): nothing to disable")

    @classmethod
    def from_method_payload(
        cls, payload: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, **kwargs: Any
    ) -> PointerSentinelLSTM:
        saved = payload.get("config", payload)  # pre-format saves hold the settings at the top
        model = cls(PointerSentinelConfig.from_dict(saved))
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        tied = model.config.tie_weights
        missing = [k for k in missing if not (tied and k == "decoder.weight")]
        if missing or unexpected:
            raise GencraftError(
                f"the saved weights do not match their config: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        return model

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        base: Any = None,
        device: str | torch.device | None = None,
        dtype: Any = None,
    ) -> PointerSentinelLSTM:
        """The saved model, on ``device`` in ``dtype`` (its LSTM stays float32)."""
        return super().from_pretrained(directory, device=device, dtype=dtype)
