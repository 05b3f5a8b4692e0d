"""Sharded evaluation and generation on accelerate's processes (the one sharding helper).

Under ``accelerate launch --num_processes N`` (or ``torchrun``) every process runs the same
command; :func:`map_sharded` gives each its share of the inputs and puts the results back in
input order:

* inputs are cut into batches of ``batch_size`` **as one process would cut them**, and each
  process takes a contiguous run of whole batches. So every batch, its padding included, is the
  one a single process decodes, and the outputs do not depend on the process count (exactly, in
  float32; a sampled decoder seeded per batch or per input draws the same);
* a process with fewer batches than the others (or none) gets marked dummy slots
  (:attr:`Share.slots`: ``None``), never a copy of a real input (accelerate's
  ``split_between_processes(apply_padding=True)`` repeats an input; its example's trimming keeps
  duplicates when more than the last process padded: accelerate #3483/#3485);
* results travel as ``(index, value)`` pairs through ``gather_object`` and are put back in input
  order on every process; an index missing or seen twice is an error naming it, never a silent
  wrong table;
* each process appends finished batches to its own partial file (``partial_dir``), so an
  interrupted run resumes without redoing them, whatever the process count of the next run;
* only the main process (:func:`is_main`) scores and writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencraft.errors import GencraftError


@dataclass(frozen=True)
class Share:
    """Process ``process`` of ``processes``: its batches ``[first_batch, stop_batch)`` of the
    ``total`` inputs cut into batches of ``batch_size``; every process has ``width`` batch
    slots (the largest share), its own first, then dummies."""

    process: int
    processes: int
    total: int
    batch_size: int
    first_batch: int
    stop_batch: int
    width: int

    def batches(self) -> list[list[int]]:
        """This process's batches: lists of input indices, as one process would cut them."""
        return [
            list(range(b * self.batch_size, min((b + 1) * self.batch_size, self.total)))
            for b in range(self.first_batch, self.stop_batch)
        ]

    @property
    def slots(self) -> list[list[int] | None]:
        """``width`` slots: this process's batches, then ``None`` (a marked dummy)."""
        own: list[list[int] | None] = list(self.batches())
        return own + [None] * (self.width - len(own))


def share_of(total: int, process: int, processes: int, batch_size: int) -> Share:
    """The contiguous run of whole batches process ``process`` takes: the first
    ``batches % processes`` processes take one batch more than the rest."""
    if processes < 1 or not 0 <= process < processes:
        raise GencraftError(f"process {process} of {processes} does not exist")
    if batch_size < 1:
        raise GencraftError(f"batch size must be >= 1, got {batch_size}")
    if total < 0:
        raise GencraftError(f"the input count must be >= 0, got {total}")
    batches = -(-total // batch_size)
    base, extra = divmod(batches, processes)
    first = process * base + min(process, extra)
    width = base + (extra > 0)
    return Share(
        process, processes, total, batch_size, first, first + base + (process < extra), width
    )


def process_info() -> tuple[int, int]:
    """(this process's index, the process count): accelerate's, or (0, 1) without a launcher."""
    import torch
    from accelerate.state import PartialState

    # without an accelerator, processes launched by accelerate or torchrun talk over gloo
    state = PartialState(cpu=not torch.cuda.is_available())
    return state.process_index, state.num_processes


def is_main() -> bool:
    """Whether this process scores and writes (process 0)."""
    return process_info()[0] == 0


def describe(what: str, total: int, batch_size: int) -> str:
    """The header line of a sharded command: inputs, processes and the per-process batch."""
    processes = process_info()[1]
    where = f"{processes} processes" if processes > 1 else "1 process"
    return f"{what}: {total} inputs on {where}, batches of {batch_size} per process"


def announce(what: str, total: int, batch_size: int) -> None:
    """Print :func:`describe`'s header to stderr, on the main process only."""
    import sys

    if is_main():
        print(describe(what, total, batch_size), file=sys.stderr, flush=True)


def gather_in_order(pairs: Sequence[tuple[int, Any]], total: int) -> list[Any]:
    """Every process's ``(index, value)`` pairs, gathered (``gather_object``) and put in input
    order: ``total`` values, on every process. Refuses a missing or repeated index."""
    from accelerate.utils import gather_object

    every = gather_object(list(pairs)) if process_info()[1] > 1 else list(pairs)
    seen: dict[int, Any] = {}
    twice: list[int] = []
    for i, v in every:
        if i in seen:
            twice.append(i)
        seen[i] = v
    missing = [i for i in range(total) if i not in seen]
    extra = sorted(i for i in seen if not 0 <= i < total)
    if twice or missing or extra:
        raise GencraftError(
            f"sharded results do not cover the {total} inputs once each: repeated "
            f"{sorted(set(twice))[:10]}, missing {missing[:10]}, outside {extra[:10]}"
        )
    return [seen[i] for i in range(total)]


def _load_partials(partial_dir: Path | None, total: int, batch_size: int) -> dict[int, Any]:
    """Finished ``(index, value)`` results of earlier runs (any process count) of the same
    inputs and batch size; lines of another input count or batch size are ignored."""
    done: dict[int, Any] = {}
    for path in sorted(partial_dir.glob("partial-*.jsonl")) if partial_dir else []:
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry["total"] == total and entry["batch_size"] == batch_size:
                done.update({int(i): v for i, v in entry["results"]})
    return done


def map_sharded(
    fn: Callable[[list[int]], list[Any]],
    total: int,
    batch_size: int,
    *,
    partial_dir: str | Path | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[Any]:
    """``fn`` on every batch of this process's share (``fn(indices) -> one JSON-able value per
    index``), gathered in input order: ``total`` values on every process. With
    ``partial_dir``, finished batches are appended to ``partial-<process>-of-<N>.jsonl`` and
    skipped on a rerun. ``on_batch(n)``: called with each batch's size (a progress bar)."""
    process, processes = process_info()
    share = share_of(total, process, processes, batch_size)
    folder = Path(partial_dir) if partial_dir is not None else None
    done = _load_partials(folder, total, batch_size)
    pairs: list[tuple[int, Any]] = []
    for batch in share.batches():
        if all(i in done for i in batch):
            values = [done[i] for i in batch]
        else:
            values = fn(batch)
            if len(values) != len(batch):
                raise GencraftError(f"a batch of {len(batch)} inputs gave {len(values)} results")
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
                line = {
                    "total": total,
                    "batch_size": batch_size,
                    "results": list(zip(batch, values, strict=True)),
                }
                with (folder / f"partial-{process}-of-{processes}.jsonl").open("a") as f:
                    f.write(json.dumps(line) + "\n")
        pairs += zip(batch, values, strict=True)
        if on_batch is not None:
            on_batch(len(batch))
    return gather_in_order(pairs, total)


def map_batches(
    fn: Callable[[list[int]], list[Any]],
    total: int,
    batch_size: int,
    *,
    shard: bool,
    on_batch: Callable[[int], None] | None = None,
) -> list[Any]:
    """``fn`` over the batches of ``total`` inputs in order: :func:`map_sharded` with
    ``shard``, else this process alone, with no launcher state touched (a library call)."""
    if shard:
        return map_sharded(fn, total, batch_size, on_batch=on_batch)
    out: list[Any] = []
    for batch in share_of(total, 0, 1, batch_size).batches():
        out += fn(batch)
        if on_batch is not None:
            on_batch(len(batch))
    return out
