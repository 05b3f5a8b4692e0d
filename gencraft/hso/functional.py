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
   (:class:`gencraft.models.caches.KVStates`);
4. one Adam step (``steps=2``: two, HSO-2) with **per-state** first and second moments and
   per-state step counts for the bias correction (§3.2.1), moments dropped together with the
   states past ``max_context``.

A state is a layer's key or value vector at one position ([n_kv, d] per layer), after the
rotary embedding where the model has one; the thesis optimised GPT-2's keys and values the
same way.

**Batches** (:func:`hso_nll_batch`): B sequences run together, one forward and one backward
per window for the whole batch. Each row keeps its own states, Adam moments and step counts;
the rows are aligned at their first token internally (whatever side the caller padded), so a
row's padding comes after its last token, where no real token attends to it, and it enters
no loss and no update. The summed loss's gradient with respect to a row's states is that
row's own, so each row is what :func:`hso_nll` gives for it alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.hso.config import HSOConfig
from gencraft.models.caches import KVStates, flat_states, layer_pairs
from gencraft.models.compat import CACHE_ARG, DynamicCache, cache_kwargs, takes_cache
from gencraft.models.introspect import context_size, hf_model, is_causal_lm, model_shape
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


def check_batch(
    model: nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None, *, what: str
) -> list[torch.Tensor]:
    """``ids`` [B, N] with ``attention_mask`` [B, N] (each row one run of ones: padded on
    either side) -> each row's tokens [N_b] on the model's device."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise GencraftError(f"{what}: ids must be [B, N], got {getattr(ids, 'shape', ids)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(ids)
    if tuple(attention_mask.shape) != tuple(ids.shape):
        raise GencraftError(
            f"{what}: attention_mask {list(attention_mask.shape)} does not match ids "
            f"{list(ids.shape)}"
        )
    rows = []
    for b in range(ids.shape[0]):
        keep = attention_mask[b].bool()
        where = keep.nonzero().flatten()
        if where.numel() and int(where[-1] - where[0]) + 1 != where.numel():
            raise GencraftError(
                f"{what}: row {b}'s attention mask has padding between its tokens; pad on "
                "the left or the right only"
            )
        rows.append(check_causal_lm(model, ids[b][keep], what=f"{what} (row {b})"))
    return rows


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
    """The optimised caches of B aligned rows with their per-state Adam moments and counts.

    ``kv``/``m``/``v``: 2L tensors [B, n_kv, S, d] each (layer i's key at 2i, its value at
    2i + 1), float32 whatever the model's dtype (a bfloat16 state would round small updates
    away; the model reads a cast copy); ``count`` [B, S] the updates each state has had, on
    the states' device."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.kv: list[torch.Tensor] = []
        self.m: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.count = torch.zeros(rows, 0, dtype=torch.long, device=device)

    @property
    def length(self) -> int:
        return self.kv[0].shape[-2] if self.kv else 0

    def leaves(self, upto: int, grad: bool, dtype: torch.dtype) -> list[torch.Tensor] | None:
        """The first ``upto`` states as fresh leaves in the model's ``dtype`` (requiring grad
        when ``grad``)."""
        if not self.kv or upto == 0:
            return None
        return [t[..., :upto, :].detach().to(dtype).requires_grad_(grad) for t in self.kv]

    def grow(self, n: int, like: list[torch.Tensor]) -> None:
        """Zero moments and counts for ``n`` new (present) positions."""
        zeros = [torch.zeros_like(t[..., -n:, :], dtype=torch.float32) for t in like]
        none = [z[..., :0, :] for z in zeros]  # a context's first window: no moments yet
        self.m = [torch.cat([m, z], dim=-2) for m, z in zip(self.m or none, zeros, strict=True)]
        self.v = [torch.cat([v, z], dim=-2) for v, z in zip(self.v or none, zeros, strict=True)]
        new = torch.zeros(self.count.shape[0], n, dtype=torch.long, device=self.count.device)
        self.count = torch.cat([self.count, new], dim=1)

    def drop(self, keep: int | None) -> None:
        """Keep the newest ``keep`` states (and their moments and counts)."""
        if keep is None or self.length <= keep:
            return
        cut = self.length - keep
        self.kv, self.m, self.v = ([t[..., cut:, :] for t in x] for x in (self.kv, self.m, self.v))
        self.count = self.count[:, cut:]


def _update(
    st: _States,
    values: list[torch.Tensor],
    grads: list[torch.Tensor],
    upd: torch.Tensor,
    cfg: HSOConfig,
) -> list[torch.Tensor]:
    """One optimiser step on the states where ``upd`` [B, S] (bool): the new values (2L
    tensors [B, n_kv, S, d]), and the moments and counts of ``st`` advanced."""
    on = upd[:, None, :, None]  # [B, 1, S, 1]
    grads = [g.float() for g in grads]
    if cfg.optimizer == "sgd":
        return [
            x - cfg.lr * torch.where(on, g, 0).to(x.dtype)
            for x, g in zip(values, grads, strict=True)
        ]
    b1, b2 = cfg.betas
    st.count = st.count + upd.long()
    c = st.count.clamp(min=1).double()
    bc1 = (1 - b1**c).float()[:, None, :, None]  # [B, 1, S, 1]: per-state bias corrections
    bc2 = (1 - b2**c).float()[:, None, :, None]
    st.m = [torch.where(on, b1 * m + (1 - b1) * g, m) for m, g in zip(st.m, grads, strict=True)]
    st.v = [torch.where(on, b2 * v + (1 - b2) * g * g, v) for v, g in zip(st.v, grads, strict=True)]
    steps = [
        cfg.lr * (m / bc1) / ((v / bc2).sqrt() + cfg.eps) for m, v in zip(st.m, st.v, strict=True)
    ]
    return [x - torch.where(on, d, 0).to(x.dtype) for x, d in zip(values, steps, strict=True)]


# ------------------------------------------------------------------------------ run
def _window_nll(model, x, targets, cache, positions) -> torch.Tensor:
    """[B, t] the NLL of ``targets`` [B, t] given ``x`` [B, t] after ``cache``."""
    out = model(input_ids=x, **cache_kwargs(cache), position_ids=positions, use_cache=True)
    logits = out.logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays
    nll = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return nll.view_as(targets)


@dataclass
class _Plan:
    """B rows aligned at their first token: ``ids`` [B, W] (padding after each row's end),
    ``is_input`` [B, W] (a token with a target), ``windows`` the (context start, window
    start, window end) of the longest row, ``own_windows`` each row's own count,
    ``n_inputs`` each row's inputs; the model's ``layers`` and weights' ``dtype`` (read once)."""

    ids: torch.Tensor
    is_input: torch.Tensor
    windows: list[tuple[int, int, int]]
    own_windows: list[int]
    n_inputs: list[int]
    layers: int
    dtype: torch.dtype


def _plan(model: nn.Module, rows: list[torch.Tensor], cfg: HSOConfig) -> _Plan:
    n_inputs = [r.numel() - 1 for r in rows]
    dev, width = rows[0].device, max(n_inputs) + 1
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=dev)
    for i, r in enumerate(rows):
        ids[i, : r.numel()] = r
    is_input = (
        torch.arange(width, device=dev)[None, :] < torch.tensor(n_inputs, device=dev)[:, None]
    )
    spans = lambda n: [  # noqa: E731
        (c0, t, min(t + cfg.window, c1))
        for c0, c1 in contexts(n, cfg.reset_every, model)
        for t in range(c0, c1, cfg.window)
    ]
    windows = spans(max(n_inputs))
    hf = hf_model(model)
    own = [len(spans(n)) for n in n_inputs]
    return _Plan(
        ids, is_input, windows, own, n_inputs, model_shape(hf).layers, next(hf.parameters()).dtype
    )


def _run(
    model: nn.Module,
    rows: list[torch.Tensor],
    cfg: HSOConfig,
    progress: bool,
) -> tuple[list[torch.Tensor], _States, list[int]]:
    """HSO over the B sequences ``rows`` (each [N_b]) together, each state reset at the start
    of each of its contexts: the recorded per-target NLL of each row [N_b - 1], the last
    contexts' states (rows aligned at their first token), and each row's number of windows."""
    hf = hf_model(model)
    plan = _plan(model, rows, cfg)
    dev = plan.ids.device
    out = torch.zeros(len(rows), plan.ids.shape[1] - 1, dtype=torch.float32, device=dev)
    st = _States(len(rows), dev)
    was_training = hf.training
    hf.eval()
    try:
        for c0, t, e in tqdm(plan.windows, desc="HSO windows", disable=not progress):
            if t == c0:
                st = _States(len(rows), dev)
            out[:, t:e] = _window(hf, st, plan, cfg, c0, t, e)
            st.drop(cfg.max_context)
    finally:
        hf.train(was_training)
    out = out.cpu()
    return [out[i, :n] for i, n in enumerate(plan.n_inputs)], st, plan.own_windows


def _window(
    hf: nn.Module, st: _States, plan: _Plan, cfg: HSOConfig, c0: int, t: int, e: int
) -> torch.Tensor:
    """One window [t, e) of context c0 (§3.3): ``cfg.steps`` forward/backward/update rounds on
    ``st``; returns the window's NLL [B, e - t] recorded before any update."""
    layers, dtype = plan.layers, plan.dtype
    b = plan.ids.shape[0]
    x, targets = plan.ids[:, t:e], plan.ids[:, t + 1 : e + 1]
    real = plan.is_input[:, t:e]  # [B, t]: inputs with a target (not padding)
    positions = torch.arange(t - c0, e - c0, device=x.device).expand(b, -1)
    cached = st.length
    grad_cached = not cfg.present_only and cached > 0
    held = torch.cat([plan.is_input[:, t - cached : t], real], dim=1)  # [B, S]
    upd = held & real.any(1)[:, None]  # a row whose text has ended takes no update
    upd[:, : cached if cfg.present_only else 0] = False
    shifts, recorded = None, None
    for _ in range(cfg.steps):
        with torch.enable_grad():
            past = st.leaves(cached, grad_cached, dtype)
            cache = KVStates(layer_pairs(past) if past else None, shifts, num_layers=layers)
            nll = _window_nll(hf, x, targets, cache, positions)
            recorded = nll.detach().float() if recorded is None else recorded
            loss = (nll * real).sum()
            if not torch.isfinite(loss.detach()):
                raise GencraftError(
                    f"HSO: the loss of the window of tokens {t}..{e - 1} is {loss.item()}; "
                    f"lower lr (now {cfg.lr})"
                )
            values = [v.detach().float() for v in flat_states(cache.states())]
            if shifts is None:
                st.grow(e - t, values)
            if cfg.lr == 0:
                st.kv = values
                break
            present = flat_states(cache.shifts)
            grads = torch.autograd.grad(loss, present + (past if grad_cached else []))
        g_present, g_past = grads[: len(present)], grads[len(present) :] or None
        full = [  # every state's gradient: the cached ones' (zero when not optimised), then
            # the present ones'
            torch.cat([g_past[j] if g_past else torch.zeros_like(v[..., :cached, :]), g], -2)
            for j, (v, g) in enumerate(zip(values, g_present, strict=True))
        ]
        new = _update(st, values, full, upd, cfg)
        # HSO-2: the next step recomputes the present states from the updated cache and
        # shifts them by the updates they have had so far
        moved = [(nw - old)[..., cached:, :] for nw, old in zip(new, values, strict=True)]
        shifts = layer_pairs(
            [
                (d.detach() + m.to(d.dtype)).requires_grad_(True)
                for d, m in zip(present, moved, strict=True)
            ]
        )
        st.kv = new
    return recorded


def hso_nll(
    model: nn.Module,
    ids: torch.Tensor,
    config: HSOConfig | None = None,
    *,
    progress: bool = False,
    batch_size: int | None = None,
    shard: bool = False,
) -> TokenScores:
    """Per-target NLL of ``ids`` [1, N] (or [N]) under HSO with the weights frozen:
    ``token_nll`` [N - 1], each prediction recorded before the update that uses its target.
    With ``lr=0`` it equals the plain model's NLL over the same contexts. The batch of one of
    :func:`hso_nll_batch`; with ``reset_every``, the contexts are independent, and
    ``batch_size`` of them run together (the same numbers, up to float rounding). With
    ``shard``, the batches of contexts are shared out among accelerate's processes
    (:func:`gencraft.distributed.map_sharded`; the same batches as one process, so the same
    numbers on any process count) and every process gets the whole result."""
    cfg = config or HSOConfig()
    ids = check_causal_lm(model, ids, what="HSO")
    if batch_size is not None and batch_size < 1:
        raise GencraftError(f"batch_size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    ranges = contexts(ids.numel() - 1, cfg.reset_every, model)
    size = batch_size or 1
    if not shard and (size == 1 or len(ranges) == 1):
        nll, _, windows = _run(model, [ids], cfg, progress)
        return TokenScores(nll[0], windows[0], time.perf_counter() - t0)
    rows = [ids[c0 : c1 + 1] for c0, c1 in ranges]  # context j: its inputs and their targets

    def batch(idx: list[int]) -> list[tuple[torch.Tensor, int]]:
        nll, _, windows = _run(model, [rows[i] for i in idx], cfg, False)
        return list(zip(nll, windows, strict=True))

    bar = tqdm(total=len(rows), desc="HSO contexts", disable=not progress)
    from gencraft.distributed import map_batches

    parts = map_batches(batch, len(rows), size, shard=shard, on_batch=bar.update)
    bar.close()
    nll = torch.cat([p[0] for p in parts])
    return TokenScores(nll, sum(p[1] for p in parts), time.perf_counter() - t0)


def hso_nll_batch(
    model: nn.Module,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: HSOConfig | None = None,
    *,
    progress: bool = False,
) -> list[TokenScores]:
    """HSO over a batch of sequences ``ids`` [B, N], padded on either side as
    ``attention_mask`` [B, N] says, with the weights frozen: one forward and one backward per
    window for the whole batch; each row has its own optimised states, Adam moments and step
    counts, and padding enters no loss and no state. Returns one :class:`TokenScores` per row
    (``token_nll`` [N_b - 1] over its own tokens; ``seconds`` the batch's time shared out),
    each what :func:`hso_nll` gives for that row alone."""
    cfg = config or HSOConfig()
    rows = check_batch(model, ids, attention_mask, what="HSO")
    t0 = time.perf_counter()
    nll, _, windows = _run(model, rows, cfg, progress)
    share = (time.perf_counter() - t0) / len(rows)
    return [TokenScores(x, w, share) for x, w in zip(nll, windows, strict=True)]


def hso_prefill(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    config: HSOConfig | None = None,
    attention_mask: torch.Tensor | None = None,
) -> DynamicCache:
    """Run HSO over ``prompt_ids`` [B, P] (left-padded as ``attention_mask`` says, as
    ``generate`` takes them) and return the optimised cache of each prompt's tokens but its
    last (a ``DynamicCache`` of P - 1 positions; a shorter prompt's states sit at the end,
    zeros before them): pass it with the whole prompts (and their mask) to ``model.generate``,
    which feeds the last prompt token on top of the optimised states (the thesis's few-shot
    use), or ``model(prompt_ids[:, -1:], past_key_values=cache)`` when unpadded."""
    cfg = config or HSOConfig()
    if prompt_ids.dim() == 1:
        prompt_ids = prompt_ids[None]
    rows = check_batch(model, prompt_ids, attention_mask, what="hso_prefill")
    if attention_mask is not None:
        mask = attention_mask.bool()
        if bool((mask[:, 1:] < mask[:, :-1]).any()):
            raise GencraftError("hso_prefill: prompts must be left-padded (as generate takes them)")
    longest = max(r.numel() for r in rows) - 1
    if cfg.reset_every is not None or (cfg.max_context is not None and cfg.max_context < longest):
        raise GencraftError(
            "hso_prefill keeps the whole prompt's states: leave reset_every unset and "
            f"max_context unset or >= {longest}"
        )
    _, st, _ = _run(model, rows, cfg, False)
    dtype = next(hf_model(model).parameters()).dtype
    width = prompt_ids.shape[1] - 1
    layers = []
    for pair in layer_pairs(st.kv):  # aligned at the first token -> left-padded as the prompts are
        placed = []
        for t in pair:
            out = t.new_zeros(t.shape[0], t.shape[1], width, t.shape[3])
            for i, r in enumerate(rows):
                n = r.numel() - 1
                out[i, :, width - n :] = t[i, :, :n]
            placed.append(out.detach().to(dtype))
        layers.append(tuple(placed))
    return DynamicCache(ddp_cache_data=layers)
