"""The recurrent core of the pointer sentinel-LSTM: locked (variational) dropout and a
multi-layer LSTM with zoneout on its recurrent connections.

Shapes: B batch, T time steps, E input size, H hidden size, N layers.

* Locked dropout (Gal & Ghahramani 2016): one Bernoulli mask per sequence and feature, shared
  by every time step; identity at eval.
* Zoneout (Krueger et al. 2016): each step, each unit of c and h keeps its previous value with
  probability ``zoneout`` instead of taking the new one. ``zoneout_mask="per_step"`` (the zoneout
  paper) draws a fresh mask every step; ``"locked"`` draws one mask per sequence, like locked
  dropout. At eval, ``zoneout_eval="expectation"`` (the zoneout paper) blends
  ``p * previous + (1 - p) * new``; ``"none"`` uses the plain LSTM update.

With zoneout off (rates 0, or eval with ``zoneout_eval="none"``) each layer runs the fused
``nn.LSTM`` kernel; otherwise a step loop over the same parameters. Both give the same numbers.

The LSTM is a float32 island: its weights stay float32 when the model is cast (``.to(bf16)``,
``--dtype``), and it runs outside autocast (``--mixed-precision``) on float32 inputs, with
its outputs cast back to the input's dtype. A recurrence over hundreds of steps accumulates
rounding in half precision, and the CPU's oneDNN LSTM has no bfloat16 kernel.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

LSTMState = tuple[torch.Tensor, torch.Tensor]
"""``(h, c)``, each [N, B, H]: the state after the last step, per layer."""


def locked_dropout_mask(
    x: torch.Tensor, p: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A [B, 1, E] mask for ``x`` [B, T, E]: zeros with probability ``p``, else ``1 / (1 - p)``."""
    keep = torch.empty(x.shape[0], 1, x.shape[2], device=x.device, dtype=x.dtype)
    keep.bernoulli_(1.0 - p, generator=generator)
    return keep / (1.0 - p)


class LockedDropout(nn.Module):
    """Dropout whose mask is fixed across time steps: ``x`` [B, T, E] -> [B, T, E]."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout rate must lie in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` [B, 1, E] reuses a mask drawn earlier (e.g. for a regenerated window)."""
        if not self.training or self.p == 0.0:
            return x
        if mask is None:
            mask = locked_dropout_mask(x, self.p)
        return x * mask


class ZoneoutLSTM(nn.Module):
    """N stacked LSTM layers with locked dropout on each layer's input and zoneout on c and h.

    Locked dropout on the *last* layer's output is left to the caller (it also feeds the
    pointer), see :class:`gencraft.pointer.PointerSentinelLSTM`.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        *,
        dropout: float = 0.0,
        zoneout_c: float = 0.0,
        zoneout_h: float = 0.0,
        zoneout_mask: Literal["per_step", "locked"] = "per_step",
        zoneout_eval: Literal["expectation", "none"] = "expectation",
    ) -> None:
        super().__init__()
        for name, rate in (("zoneout_c", zoneout_c), ("zoneout_h", zoneout_h)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {rate}")
        if zoneout_mask not in ("per_step", "locked"):
            raise ValueError(f"zoneout_mask must be 'per_step' or 'locked', got {zoneout_mask!r}")
        if zoneout_eval not in ("expectation", "none"):
            raise ValueError(f"zoneout_eval must be 'expectation' or 'none', got {zoneout_eval!r}")
        if num_layers < 1 or hidden_size < 1:
            raise ValueError("num_layers and hidden_size must be positive")
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.zoneout_c, self.zoneout_h = zoneout_c, zoneout_h
        self.zoneout_mask, self.zoneout_eval = zoneout_mask, zoneout_eval
        self.input_dropout = LockedDropout(dropout)
        self.layers = nn.ModuleList(
            nn.LSTM(input_size if i == 0 else hidden_size, hidden_size, batch_first=True)
            for i in range(num_layers)
        )

    def zero_state(self, batch_size: int, device: torch.device | None = None) -> LSTMState:
        dtype = self.layers[0].weight_hh_l0.dtype  # the state in the weights' dtype
        z = torch.zeros(self.num_layers, batch_size, self.hidden_size, device=device, dtype=dtype)
        return z, z.clone()

    def sample_masks(self, x: torch.Tensor) -> list[torch.Tensor | None]:
        """Locked-dropout masks for each layer's input, [B, 1, E_layer]; None at eval."""
        if not self.training or self.input_dropout.p == 0.0:
            return [None] * self.num_layers
        masks = [locked_dropout_mask(x, self.input_dropout.p)]
        ref = x.new_empty(x.shape[0], 1, self.hidden_size)
        masks += [locked_dropout_mask(ref, self.input_dropout.p) for _ in self.layers[1:]]
        return masks

    def _zoneout_active(self) -> bool:
        if self.zoneout_c == 0.0 and self.zoneout_h == 0.0:
            return False
        return self.training or self.zoneout_eval == "expectation"

    def forward(
        self,
        x: torch.Tensor,
        state: LSTMState | None = None,
        *,
        masks: list[torch.Tensor | None] | None = None,
        keep_state_at: int | None = None,
    ) -> tuple[torch.Tensor, LSTMState, LSTMState | None]:
        """Run ``x`` [B, T, E] from ``state`` (zeros if None), in the weights' dtype (float32
        in a half-precision model: the module docstring says why); outputs in ``x``'s dtype,
        states in the weights' dtype.

        Args:
            masks: per-layer input dropout masks from :meth:`sample_masks` (drawn here if None).
            keep_state_at: also return the state after the first ``keep_state_at`` steps
                (0 <= keep_state_at <= T), e.g. to carry a stream position other than the end.

        Returns:
            ``(outputs [B, T, H], final_state, state_at_keep or None)``; outputs are the last
            layer's h before any output dropout.
        """
        dtype, run = x.dtype, self.layers[0].weight_hh_l0.dtype  # float32 (or float64)
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(run)
            if state is not None:
                state = (state[0].to(run), state[1].to(run))
            if masks is not None:
                masks = [m if m is None else m.to(run) for m in masks]
            out, final, kept = self._run(x, state, masks, keep_state_at)
        return out.to(dtype), final, kept

    def _apply(self, fn, recurse: bool = True):
        # a cast to half precision leaves the LSTM's weights as they were (float32, not
        # rounded to half and back); moves to a device still apply
        before = {name: p.data for name, p in self.named_parameters()}
        super()._apply(fn, recurse)
        for name, p in self.named_parameters():
            if p.dtype in (torch.float16, torch.bfloat16):
                old = before[name]
                keep = old.dtype if old.dtype not in (torch.float16, torch.bfloat16) else None
                p.data = old.to(device=p.device, dtype=keep or torch.float32)
        return self

    def _run(
        self,
        x: torch.Tensor,
        state: LSTMState | None,
        masks: list[torch.Tensor | None] | None,
        keep_state_at: int | None,
    ) -> tuple[torch.Tensor, LSTMState, LSTMState | None]:
        b, t = x.shape[0], x.shape[1]
        if state is None:
            state = self.zero_state(b, x.device)
        if masks is None:
            masks = self.sample_masks(x)
        if keep_state_at is not None and not 0 <= keep_state_at <= t:
            raise ValueError(f"keep_state_at must lie in [0, {t}], got {keep_state_at}")
        hs, cs, hk, ck = [], [], [], []
        out = x
        for i, layer in enumerate(self.layers):
            inp = out if masks[i] is None else out * masks[i]
            h0, c0 = state[0][i], state[1][i]
            if self._zoneout_active():
                out, (h, c), kept = self._loop(layer, inp, h0, c0, keep_state_at)
            else:
                out, (h, c), kept = _fused(layer, inp, h0, c0, keep_state_at)
            hs.append(h)
            cs.append(c)
            if kept is not None:
                hk.append(kept[0])
                ck.append(kept[1])
        kept_state = (torch.stack(hk), torch.stack(ck)) if keep_state_at is not None else None
        return out, (torch.stack(hs), torch.stack(cs)), kept_state

    def _loop(
        self,
        layer: nn.LSTM,
        x: torch.Tensor,
        h: torch.Tensor,
        c: torch.Tensor,
        keep_at: int | None,
    ) -> tuple[torch.Tensor, LSTMState, LSTMState | None]:
        t = x.shape[1]
        xw = torch.nn.functional.linear(x, layer.weight_ih_l0, layer.bias_ih_l0 + layer.bias_hh_l0)
        w_hh = layer.weight_hh_l0.t()
        zc, zh = self.zoneout_c, self.zoneout_h
        locked = self.zoneout_mask == "locked"
        mc = mh = None
        if self.training and locked:
            mc, mh = _keep_masks(h, zc, zh)
        outs: list[torch.Tensor] = []
        kept = (h, c) if keep_at == 0 else None
        for s in range(t):
            gates = torch.addmm(xw[:, s], h, w_hh)
            i, f, g, o = gates.chunk(4, dim=1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)
            if self.training:
                if not locked:
                    mc, mh = _keep_masks(h, zc, zh)
                c = c_new if mc is None else torch.where(mc, c, c_new)
                h = h_new if mh is None else torch.where(mh, h, h_new)
            else:  # expectation of the zoneout mask
                c = torch.lerp(c_new, c, zc) if zc else c_new
                h = torch.lerp(h_new, h, zh) if zh else h_new
            outs.append(h)
            if keep_at is not None and s + 1 == keep_at:
                kept = (h, c)
        return torch.stack(outs, dim=1), (h, c), kept


def _keep_masks(
    ref: torch.Tensor, zc: float, zh: float
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Boolean [B, H] masks, True = keep the previous value (zoneout)."""
    mc = torch.rand_like(ref) < zc if zc else None
    mh = torch.rand_like(ref) < zh if zh else None
    return mc, mh


def _fused(
    layer: nn.LSTM, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, keep_at: int | None
) -> tuple[torch.Tensor, LSTMState, LSTMState | None]:
    state = (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous())
    if keep_at is None or keep_at == x.shape[1]:
        out, (h1, c1) = layer(x, state)
        kept = (h1[0], c1[0]) if keep_at is not None else None
        return out, (h1[0], c1[0]), kept
    if keep_at == 0:
        out, (h1, c1) = layer(x, state)
        return out, (h1[0], c1[0]), (h, c)
    out_a, mid = layer(x[:, :keep_at], state)
    out_b, (h1, c1) = layer(x[:, keep_at:], mid)
    return torch.cat([out_a, out_b], dim=1), (h1[0], c1[0]), (mid[0][0], mid[1][0])
