"""Speed and memory measurements that hold on a shared machine: every speed experiment
(``gencraft reproduce *-speed``) times the variants it compares in one process, interleaved,
and reports each variant's ratio to the baseline as the median of per-round ratios.

Why interleave: on a shared 2-core machine the load changes from second to second; variants
run one after another (or in separate processes) see different loads, and their ratios moved
by ±30% from run to run. Here each variant runs right beside a run of the baseline (ABAB...,
the pair's order alternating), so a burst of load hits both alike and cancels in the pair's
ratio; the median over rounds drops the pairs a burst split.

Durations a run records (a unit's seconds, a training's time, seconds per output) use
:func:`running_clock`, which leaves out the time the process was stopped (Ctrl-Z, SIGSTOP, a
suspended cluster job): a paused run's estimates and rates stay those of its work.

Memory: :func:`saved_tensor_bytes` counts the bytes autograd keeps for backward, exact and the
same on every device (the activation memory a method adds); on CUDA
:func:`cuda_peak_bytes` gives the allocator's peak as well.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

from gencraft.errors import GencraftError

if TYPE_CHECKING:  # torch loads on first use: the CLI's help reads this module's clock
    import torch

# bound once: a test's fake time.perf_counter or time.sleep leaves the watch alone
_perf, _sleep = time.perf_counter, time.sleep
#: the stop watch's heartbeat (seconds), and how late a beat must be to count as stopped
HEARTBEAT = 1.0
STOP_GAP = 4.0


class _Stops:
    """Seconds this process has spent stopped, seen by a daemon thread that sleeps
    :data:`HEARTBEAT` seconds at a time: a beat more than :data:`STOP_GAP` late means every
    thread was held (SIGSTOP or SIGTSTP until SIGCONT, Slurm's ``scontrol suspend``), and the
    lateness counts. A sleeping thread is otherwise woken within milliseconds, even on a busy
    machine, since torch and Python's own switching release the GIL (one C call holding the
    GIL past the gap would count as a stop)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._lock = threading.Lock()
        self._pid: int | None = None  # the process whose thread beats (a fork has none)
        self._last = 0.0  # the last beat's time

    def start(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                threading.Thread(target=self._beat, name="gencraft-stops", daemon=True).start()
                self._pid = os.getpid()

    def _beat(self) -> None:
        self._last = _perf()
        while True:
            _sleep(HEARTBEAT)
            self.see(_perf())

    def see(self, now: float) -> None:
        """A beat at ``now``: one more than :data:`STOP_GAP` late adds its lateness."""
        late = now - self._last - HEARTBEAT
        if late > STOP_GAP:
            self.total += late
        self._last = now


_STOPS = _Stops()


def running_clock() -> float:
    """Seconds, like :func:`time.perf_counter`, on a clock that stands still while the
    process is stopped (:class:`_Stops`; seen from the first call on): the difference of two
    readings is the time the process was running between them."""
    _STOPS.start()
    return _perf() - _STOPS.total


@dataclass
class Timing:
    """One variant: ``seconds`` (median of its rounds), ``ratio`` (median over rounds of its
    time over the baseline's in the same round) and the spread of those ratios: ``low`` and
    ``high`` (the quartiles), ``spread`` = (high - low) / 2 / ratio, a relative ±."""

    seconds: float
    ratio: float
    low: float
    high: float
    rounds: int

    @property
    def spread(self) -> float:
        return (self.high - self.low) / 2 / self.ratio if self.ratio else float("nan")

    def row(self) -> dict[str, Any]:
        return {
            "median s": self.seconds,
            "ratio": self.ratio,
            "ratio q25": self.low,
            "ratio q75": self.high,
            "± spread": f"{100 * self.spread:.1f}%",
        }


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def synchronize() -> None:
    """Wait for queued CUDA work, so a timer sees it (no-op on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(
    cases: dict[str, Callable[[], Any]],
    baseline: str,
    *,
    rounds: int,
    warmup: int = 1,
    progress: bool = False,
) -> dict[str, Timing]:
    """Time every case against ``baseline`` in adjacent pairs, ABAB...: in each round, each
    other case runs right after (or, every other round, right before) a run of the baseline,
    the cases taken in an order that rotates from round to round. Per case: the median
    seconds and the median over rounds of its pair's ratio (with the quartiles), after
    ``warmup`` untimed calls of each.

    >>> import time
    >>> t = interleaved({"a": lambda: time.sleep(0.002), "b": lambda: time.sleep(0.004)},
    ...                 "a", rounds=5)
    >>> 1.5 < t["b"].ratio < 2.5 and t["a"].ratio == 1.0
    True
    """
    if baseline not in cases:
        raise GencraftError(f"baseline {baseline!r} is not one of the cases {sorted(cases)}")
    if rounds < 1:
        raise GencraftError(f"rounds must be >= 1, got {rounds}")
    from gencraft.progress import tqdm

    others = [k for k in cases if k != baseline]
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    ratios: dict[str, list[float]] = {k: [] for k in others}
    for r in tqdm(range(rounds), desc="rounds", disable=not progress):
        turn = r % len(others) if others else 0
        for k in others[turn:] + others[:turn]:
            pair = (baseline, k) if r % 2 == 0 else (k, baseline)
            got = {name: _time(cases[name]) for name in pair}
            for name, t in got.items():
                times[name].append(t)
            ratios[k].append(got[k] / got[baseline])
        if not others:
            times[baseline].append(_time(cases[baseline]))
    out = {baseline: Timing(median(times[baseline]), 1.0, 1.0, 1.0, rounds)}
    for k in others:
        q = ratios[k]
        out[k] = Timing(
            median(times[k]),
            median(q),
            _quantile(q, 0.25),
            _quantile(q, 0.75),
            rounds,
        )
    return {k: out[k] for k in cases}


def _time(fn: Callable[[], Any]) -> float:
    synchronize()
    t0 = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - t0


def saved_tensor_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` builds its loss (the
    backward pass is then run and freed). Tensors saved twice count twice: an upper bound on
    the activation memory, exact for what the method adds to it."""
    import torch

    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return total


def cuda_peak_bytes(fn: Callable[[], Any]) -> int | None:
    """Peak CUDA memory allocated during ``fn()`` above what was allocated before (None on
    CPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    fn()
    synchronize()
    return torch.cuda.max_memory_allocated() - start
