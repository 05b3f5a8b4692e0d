"""Hidden-state optimisation (HSO; Yoshida 2023, ch. 3): with the weights frozen, take
gradient steps on the LM loss of the text seen so far with respect to the cached per-layer
keys and values, so that later predictions attend to the updated cache.

The windowed algorithm of §3.3, for a window x[t+1:t+k] after an optimised cache h̃[1:t]:

1. one forward pass over the window, attending to h̃[1:t], gives the present states
   h[t+1:t+k] and the predictions p[t+1:t+k];
2. the predictions are **recorded before any update** (no leakage: a prediction never sees
   an update made with its own target);
3. the window's summed cross-entropy against x[t+2:t+k+1] is differentiated with respect to
   every cached and present state (the full derivative, through the later states that depend
   on them); the present states' gradient is read from zero shifts added to them
   (:class:`gencraft.models.stepping.KVStates`);
4. one Adam step (``steps=2``: two, HSO-2) with **per-state** first and second moments and
   per-state step counts for the bias correction (§3.2.1), moments dropped together with the
   states past ``max_context``.

A state is a layer's key or value vector at one position ([n_kv, d] per layer), after the
rotary embedding where the model has one; the thesis optimised GPT-2's keys and values the
same way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.hso.config import HSOConfig
from gencraft.models.compat import CACHE_ARG, DynamicCache, cache_kwargs, takes_cache
from gencraft.models.introspect import context_size, hf_model, is_causal_lm, model_shape
from gencraft.models.stepping import KVStates
from gencraft.progress import tqdm


@dataclass
class TokenScores:
    """``token_nll`` [N - 1]: entry j - 1 is -log p(ids[j] | what the method had seen), in
    nats; ``windows``: forward/backward rounds run; ``seconds``: wall time."""

    token_nll: torch.Tensor
    windows: int
    seconds: float

    @property
    def perplexity(self) -> float:
        return math.exp(float(self.token_nll.mean()))


# ------------------------------------------------------------------------------ checks
def check_causal_lm(model: nn.Module, ids: torch.Tensor, *, what: str) -> torch.Tensor:
    """``ids`` [1, N] or [N] for a causal LM with a KV cache -> [N] on the model's device."""
    hf = hf_model(model)
    name = type(hf).__name__
    if not is_causal_lm(hf):
        raise GencraftError(f"{what} needs a causal LM with a KV cache; {name} is not one")
    if not takes_cache(hf):
        raise GencraftError(f"{what} needs a KV cache; {name} takes none ({CACHE_ARG})")
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise GencraftError(f"{what}: ids must be [1, N] or [N], got {tuple(ids.shape)}")
        ids = ids[0]
    if ids.dim() != 1:
        raise GencraftError(f"{what}: ids must be [1, N] or [N], got {tuple(ids.shape)}")
    if ids.numel() < 2:
        raise GencraftError(f"{what} needs at least 2 tokens to score one, got {ids.numel()}")
    vocab = model_shape(hf).vocab
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise GencraftError(f"{what}: ids outside the vocabulary [0, {vocab})")
    return ids.to(next(hf.parameters()).device)


def contexts(n_inputs: int, reset_every: int | None, model: nn.Module) -> list[tuple[int, int]]:
    """Input ranges [c0, c1) of the non-overlapping contexts over ``n_inputs`` inputs."""
    size = reset_every or n_inputs
    limit = context_size(model)
    if limit is not None and min(size, n_inputs) > limit:
        raise GencraftError(
            f"a context of {min(size, n_inputs)} inputs exceeds the model's {limit} positions; "
            f"set reset_every (--reset-every) <= {limit}"
        )
    return [(c, min(c + size, n_inputs)) for c in range(0, n_inputs, size)]


# ------------------------------------------------------------------------------ state
class _States:
    """The optimised cache of one context with its per-state Adam moments and step counts.

    ``kv``/``m``/``v``: per layer (key, value) [1, n_kv, S, d], float32 whatever the model's
    dtype (a bfloat16 state would round small updates away; the model reads a cast copy);
    ``count`` [S] the updates each position has had."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.m: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.v: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.count = torch.zeros(0, dtype=torch.long)

    @property
    def length(self) -> int:
        return 0 if self.kv is None else self.kv[0][0].shape[-2]

    def leaves(
        self, upto: int, grad: bool, dtype: torch.dtype
    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The first ``upto`` states as fresh leaves in the model's ``dtype`` (requiring grad
        when ``grad``)."""
        if self.kv is None or upto == 0:
            return None
        return [
            tuple(t[..., :upto, :].detach().to(dtype).requires_grad_(grad) for t in p)
            for p in self.kv
        ]

    def grow(self, n: int, like: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Zero moments and counts for ``n`` new (present) positions."""

        def pad(old, new):
            z = torch.zeros_like(new[..., -n:, :], dtype=torch.float32)
            return z if old is None else torch.cat([old, z], dim=-2)

        none = [(None, None)] * len(like)
        self.m = [tuple(map(pad, old, new)) for old, new in zip(self.m or none, like, strict=True)]
        self.v = [tuple(map(pad, old, new)) for old, new in zip(self.v or none, like, strict=True)]
        self.count = torch.cat([self.count, torch.zeros(n, dtype=torch.long)])

    def drop(self, keep: int | None) -> None:
        """Keep the newest ``keep`` states (and their moments and counts)."""
        if keep is None or self.length <= keep:
            return
        cut = self.length - keep
        trim = lambda pairs: [tuple(t[..., cut:, :] for t in p) for p in pairs]  # noqa: E731
        self.kv, self.m, self.v = trim(self.kv), trim(self.m), trim(self.v)
        self.count = self.count[cut:]


def _update(
    st: _States,
    values: list[tuple[torch.Tensor, torch.Tensor]],
    grads: list[tuple[torch.Tensor, torch.Tensor]],
    first: int,
    cfg: HSOConfig,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One optimiser step on the states at positions >= ``first``: the new values, and the
    moments/counts of ``st`` advanced. ``values``/``grads``: per layer [1, n_kv, S, d]."""
    s = values[0][0].shape[-2]
    upd = torch.arange(s) >= first
    if cfg.optimizer == "sgd":
        return [
            tuple(
                x - cfg.lr * torch.where(upd[:, None].to(g.device), g, 0).to(x.dtype)
                for x, g in zip(pv, pg, strict=True)
            )
            for pv, pg in zip(values, grads, strict=True)
        ]
    b1, b2 = cfg.betas
    st.count = st.count + upd.long()
    c = st.count.clamp(min=1).double()
    bc1 = (1 - b1**c).float()[:, None]  # [S, 1]: per-state bias corrections
    bc2 = (1 - b2**c).float()[:, None]
    live = upd[:, None]
    out, new_m, new_v = [], [], []
    for pv, pg, pm, pq in zip(values, grads, st.m, st.v, strict=True):
        layer, lm, lv = [], [], []
        for x, g, m, v in zip(pv, pg, pm, pq, strict=True):
            g = g.float()
            dev = g.device
            m = torch.where(live.to(dev), b1 * m + (1 - b1) * g, m)
            v = torch.where(live.to(dev), b2 * v + (1 - b2) * g * g, v)
            step = cfg.lr * (m / bc1.to(dev)) / ((v / bc2.to(dev)).sqrt() + cfg.eps)
            layer.append(x - torch.where(live.to(dev), step, 0).to(x.dtype))
            lm.append(m)
            lv.append(v)
        out.append(tuple(layer))
        new_m.append(tuple(lm))
        new_v.append(tuple(lv))
    st.m, st.v = new_m, new_v
    return out


# ------------------------------------------------------------------------------ run
def _window_nll(model, x, targets, cache, positions) -> torch.Tensor:
    """[t] the NLL of ``targets`` given ``x`` [t] after ``cache``."""
    out = model(
        input_ids=x[None], **cache_kwargs(cache), position_ids=positions[None], use_cache=True
    )
    logits = out.logits[0]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays
    return nn.functional.cross_entropy(logits, targets, reduction="none")


def _pairs(flat) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def _run(
    model: nn.Module,
    ids: torch.Tensor,
    cfg: HSOConfig,
    ranges: list[tuple[int, int]],
    progress: bool,
) -> tuple[torch.Tensor, _States, int]:
    """HSO over ``ids`` [N], the state reset at each input range of ``ranges``: the recorded
    per-target NLL [N - 1], the last context's state, and the number of windows."""
    hf = hf_model(model)
    layers = model_shape(hf).layers
    out = torch.empty(ids.numel() - 1, dtype=torch.float32)
    windows = [
        (c0, t, min(t + cfg.window, c1)) for c0, c1 in ranges for t in range(c0, c1, cfg.window)
    ]
    st = _States(layers)
    dtype = next(hf.parameters()).dtype
    was_training = hf.training
    hf.eval()
    try:
        for c0, t, e in tqdm(windows, desc="HSO windows", disable=not progress):
            if t == c0:
                st = _States(layers)
            x, targets = ids[t:e], ids[t + 1 : e + 1]
            positions = torch.arange(t - c0, e - c0, device=ids.device)
            cached = st.length
            grad_cached = not cfg.present_only and cached > 0
            shifts = None
            for step in range(cfg.steps):
                with torch.enable_grad():
                    past = st.leaves(cached, grad_cached, dtype)
                    cache = KVStates(past, shifts, num_layers=layers)
                    nll = _window_nll(hf, x, targets, cache, positions)
                    if step == 0:
                        out[t:e] = nll.detach().cpu()  # recorded before any update
                    loss = nll.sum()
                    if not torch.isfinite(loss.detach()):
                        raise GencraftError(
                            f"HSO: the loss of the window of tokens {t}..{e - 1} is "
                            f"{loss.item()}; lower lr (now {cfg.lr})"
                        )
                    values = [tuple(v.detach().float() for v in p) for p in cache.states()]
                    if step == 0:
                        st.grow(e - t, values)
                    if cfg.lr == 0:
                        st.kv = values
                        break
                    inputs = [v for p in cache.shifts for v in p]
                    if grad_cached:
                        inputs += [v for p in past for v in p]
                    grads = torch.autograd.grad(loss, inputs)
                g_present = _pairs(grads[: 2 * layers])
                g_cached = _pairs(grads[2 * layers :]) if grad_cached else None
                g_full = [
                    tuple(
                        torch.cat(
                            [
                                g_cached[i][j]
                                if g_cached
                                else torch.zeros_like(values[i][j][..., :cached, :]),
                                g_present[i][j],
                            ],
                            dim=-2,
                        )
                        for j in range(2)
                    )
                    for i in range(layers)
                ]
                new = _update(st, values, g_full, cached if cfg.present_only else 0, cfg)
                # HSO-2: the next step recomputes the present states from the updated cache
                # and shifts them by the updates they have had so far
                shifts = [
                    tuple(
                        (
                            d.detach() + (nw[..., cached:, :] - old[..., cached:, :]).to(d.dtype)
                        ).requires_grad_(True)
                        for d, nw, old in zip(cache.shifts[i], new[i], values[i], strict=True)
                    )
                    for i in range(layers)
                ]
                st.kv = new
            st.drop(cfg.max_context)
    finally:
        hf.train(was_training)
    return out, st, len(windows)


def hso_nll(
    model: nn.Module, ids: torch.Tensor, config: HSOConfig | None = None, *, progress: bool = False
) -> TokenScores:
    """Per-target NLL of ``ids`` [1, N] (or [N]) under HSO with the weights frozen:
    ``token_nll`` [N - 1], each prediction recorded before the update that uses its target.
    With ``lr=0`` it equals the plain model's NLL over the same contexts."""
    cfg = config or HSOConfig()
    ids = check_causal_lm(model, ids, what="HSO")
    ranges = contexts(ids.numel() - 1, cfg.reset_every, model)
    t0 = time.perf_counter()
    nll, _, n = _run(model, ids, cfg, ranges, progress)
    return TokenScores(nll, n, time.perf_counter() - t0)


def hso_prefill(
    model: nn.Module, prompt_ids: torch.Tensor, config: HSOConfig | None = None
) -> DynamicCache:
    """Run HSO over ``prompt_ids`` [1, P] and return the optimised cache of its first P - 1
    tokens (a ``DynamicCache``): pass it with the whole prompt to ``model.generate`` or
    ``model(prompt_ids[:, -1:], past_key_values=cache)``, which feed the last prompt token
    on top of the optimised states (the thesis's few-shot use)."""
    cfg = config or HSOConfig()
    ids = check_causal_lm(model, prompt_ids, what="hso_prefill")
    if cfg.reset_every is not None or (
        cfg.max_context is not None and cfg.max_context < ids.numel() - 1
    ):
        raise GencraftError(
            "hso_prefill keeps the whole prompt's states: leave reset_every unset and "
            f"max_context unset or >= {ids.numel() - 1}"
        )
    ranges = contexts(ids.numel() - 1, None, model)
    _, st, _ = _run(model, ids, cfg, ranges, False)
    dtype = next(hf_model(model).parameters()).dtype
    return DynamicCache(ddp_cache_data=[tuple(t.detach().to(dtype) for t in p) for p in st.kv])
