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
  the folder records a fingerprint of what made them (inputs, model, settings, seed, gencraft
  version), and a rerun that differs in any of them is refused, naming what differs;
* only the main process (:func:`is_main`) scores and writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
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


#: the partial folder's record of the run that made it (:func:`check_partials`)
FINGERPRINT_FILE = "fingerprint.json"


def fingerprint_of(parts: Mapping[str, Any]) -> dict[str, str]:
    """Each named part of what makes a run's outputs (its inputs' content, the model and its
    weights, every setting, the seed), hashed to 16 hex digits, plus gencraft's version: the
    record a partial folder keeps (:func:`map_sharded`). Parts are JSON-able values."""
    import hashlib

    from gencraft import __version__

    def digest(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    return {**{k: digest(v) for k, v in parts.items()}, "gencraft version": digest(__version__)}


def check_partials(folder: Path, fingerprint: dict[str, str]) -> None:
    """Refuse in one line a partial folder another run made, naming the parts that differ
    and how to start afresh; a folder with no partial results yet is taken as new."""
    written = folder / FINGERPRINT_FILE
    lines = list(folder.glob("partial-*.jsonl")) if folder.is_dir() else []
    if not written.is_file():
        if lines:
            raise GencraftError(
                f"{folder} holds partial results with no record of the run that made them (an "
                "older gencraft); remove that folder (the CLI: --restart) to start afresh"
            )
        return
    recorded = json.loads(written.read_text())
    differ = sorted(k for k in {*recorded, *fingerprint} if recorded.get(k) != fingerprint.get(k))
    if differ:
        raise GencraftError(
            f"{folder} holds partial results of another run ({', '.join(differ)} differ); "
            "rerun as before to resume it, or remove that folder (the CLI: --restart) to "
            "start afresh"
        )


def _record_fingerprint(folder: Path, fingerprint: dict[str, str]) -> None:
    """Write the folder's fingerprint once, atomically (several processes may race)."""
    import os

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / FINGERPRINT_FILE
    if target.is_file():
        return
    temp = folder / f".{FINGERPRINT_FILE}.{os.getpid()}"
    temp.write_text(json.dumps(fingerprint, sort_keys=True))
    temp.replace(target)


def _load_partials(folder: Path | None, key: str) -> dict[int, Any]:
    """Finished ``(index, value)`` results of earlier runs (any process count) whose lines
    carry ``key``, the run's fingerprint digest."""
    done: dict[int, Any] = {}
    for path in sorted(folder.glob("partial-*.jsonl")) if folder else []:
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("fingerprint") != key:  # cannot pass check_partials; never reused
                raise GencraftError(f"{path} holds a line of another run; remove {folder}")
            done.update({int(i): v for i, v in entry["results"]})
    return done


def _label_bar(on_batch: Callable[[int], None] | None, share: Share) -> None:
    """Under several processes, the progress bar whose ``update`` is ``on_batch`` counts this
    process's share and says so ("process 2 of 2: 3 of 7 inputs"): each process draws its
    own bar, and one that stopped at its share would read as unfinished."""
    bar = getattr(on_batch, "__self__", None)
    if share.processes < 2 or bar is None or not hasattr(bar, "set_description"):
        return
    mine = sum(len(b) for b in share.batches())
    bar.total = mine
    label = f"process {share.process + 1} of {share.processes}: {mine} of {share.total} inputs"
    desc = str(getattr(bar, "desc", "") or "").rstrip(": ")
    bar.set_description(f"{desc} ({label})" if desc else label)


def map_sharded(
    fn: Callable[[list[int]], list[Any]],
    total: int,
    batch_size: int,
    *,
    partial_dir: str | Path | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[Any]:
    """``fn`` on every batch of this process's share (``fn(indices) -> one JSON-able value per
    index``), gathered in input order: ``total`` values on every process. With
    ``partial_dir``, finished batches are appended to ``partial-<process>-of-<N>.jsonl`` and
    skipped on a rerun of the same run: ``fingerprint`` names what makes the outputs (the
    inputs, the model, the settings, the seed; :func:`fingerprint_of`), and a folder another
    run made is refused before any batch runs. ``on_batch(n)``: called with each batch's size
    (a progress bar's ``update``; under several processes the bar is relabelled with this
    process's share)."""
    process, processes = process_info()
    share = share_of(total, process, processes, batch_size)
    folder = Path(partial_dir) if partial_dir is not None else None
    record, key = {}, ""
    if folder is not None:
        if fingerprint is None:
            raise GencraftError("partial results need a fingerprint of the run that makes them")
        record = fingerprint_of({**fingerprint, "input count": total, "batch size": batch_size})
        key = fingerprint_of({"all": record})["all"]
        check_partials(folder, record)
    done = _load_partials(folder, key)
    _label_bar(on_batch, share)
    pairs: list[tuple[int, Any]] = []
    for batch in share.batches():
        if all(i in done for i in batch):
            values = [done[i] for i in batch]
        else:
            values = fn(batch)
            if len(values) != len(batch):
                raise GencraftError(f"a batch of {len(batch)} inputs gave {len(values)} results")
            if folder is not None:
                _record_fingerprint(folder, record)
                line = {"fingerprint": key, "results": list(zip(batch, values, strict=True))}
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
