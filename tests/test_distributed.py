"""Sharded evaluation and generation (issue 44): shares are contiguous runs of the batches one
process cuts, padded only with marked dummies; results come back in input order, each index
once, on 1, 2 and 3 gloo processes; a rerun resumes from the partial files; ``gencraft
generate`` on 2 processes writes what 1 process writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.distributed import gather_in_order, map_sharded, share_of
from gencraft.errors import GencraftError

COUNTS = (0, 1, 17)


@settings(max_examples=80, deadline=None)
@given(total=st.integers(0, 40), processes=st.integers(1, 4), batch=st.integers(1, 5))
def test_shares_are_the_one_process_batches_split_contiguously(total, processes, batch):
    one = share_of(total, 0, 1, batch).batches()
    assert [i for b in one for i in b] == list(range(total))
    shares = [share_of(total, p, processes, batch) for p in range(processes)]
    assert [b for s in shares for b in s.batches()] == one  # in order, none lost or repeated
    sizes = [len(s.batches()) for s in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    for s in shares:  # every process has the same slots: its batches, then marked dummies
        assert len(s.slots) == max(sizes)
        assert s.slots[len(s.batches()) :] == [None] * (max(sizes) - len(s.batches()))


def test_gathering_refuses_a_missing_or_repeated_index():
    assert gather_in_order([(1, "b"), (0, "a")], 2) == ["a", "b"]
    with pytest.raises(GencraftError, match="repeated \\[0\\], missing \\[1\\]"):
        gather_in_order([(0, "a"), (0, "a")], 2)
    with pytest.raises(GencraftError, match="outside \\[5\\]"):
        gather_in_order([(0, "a"), (1, "b"), (5, "c")], 2)


def test_a_rerun_resumes_from_the_partial_files(tmp_path):
    calls, stop = [], [True]

    def fn(batch):
        calls.append(batch)
        if len(calls) == 3 and stop[0]:
            raise KeyboardInterrupt  # the third batch never finishes
        return [i * i for i in batch]

    with pytest.raises(KeyboardInterrupt):
        map_sharded(fn, 11, 3, partial_dir=tmp_path)
    calls.clear()
    stop[0] = False
    assert map_sharded(fn, 11, 3, partial_dir=tmp_path) == [i * i for i in range(11)]
    assert calls == [[6, 7, 8], [9, 10]]  # the two finished batches were not redone
    # a partial file of another run (another process count) counts too; another size not
    line = {"total": 11, "batch_size": 3, "results": [[9, 81], [10, 100]]}
    (tmp_path / "partial-1-of-2.jsonl").write_text(json.dumps(line) + "\n")
    calls.clear()
    assert map_sharded(fn, 11, 3, partial_dir=tmp_path)[9:] == [81, 100] and calls == []
    assert map_sharded(fn, 11, 4, partial_dir=tmp_path) == [i * i for i in range(11)]
    assert len(calls) == 3  # batch size 4: nothing reusable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
    env.update(WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(env)
    from gencraft.distributed import map_sharded, process_info

    seen, results = [], {}
    for total in (*COUNTS, world - 1, world + 1):
        for batch in (1, 2, 3):
            got = map_sharded(lambda b: (seen.append(b), [f"x{i}" for i in b])[1], total, batch)
            results[f"{total}/{batch}"] = got
    Path(out, f"{rank}.json").write_text(
        json.dumps({"info": process_info(), "seen": seen, "results": results})
    )
    import torch.distributed as dist

    dist.barrier()  # every process is done before any tears gloo down (a peer gone: SIGABRT)
    dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 3])
def test_every_process_gets_every_result_in_order_and_each_input_runs_once(world, tmp_path):
    mp.start_processes(
        _worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, start_method="spawn"
    )
    runs = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    assert [r["info"] for r in runs] == [[r, world] for r in range(world)]
    for key in runs[0]["results"]:
        total = int(key.split("/")[0])
        assert all(r["results"][key] == [f"x{i}" for i in range(total)] for r in runs)
    # across processes, each input of each run was decoded exactly once
    ran = sorted(i for r in runs for b in r["seen"] for i in b)
    want = sorted(i for t in (*COUNTS, world - 1, world + 1) for _ in (1, 2, 3) for i in range(t))
    assert ran == want


def _cli_runs(args: list[str], capsys) -> tuple[str, subprocess.CompletedProcess]:
    """``gencraft ARGS``'s stdout on this (one) process, and its run on two gloo processes
    under torchrun."""
    from gencraft.cli.main import main

    assert main(args) == 0
    one = capsys.readouterr().out
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    port = ["--master_port", str(_free_port())]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *port]
    two = subprocess.run(
        [*launch, "-m", "gencraft", *args], env=env, capture_output=True, text=True
    )
    assert two.returncode == 0, two.stderr[-1500:]
    return one, two


@pytest.mark.multiprocess
def test_generate_on_two_processes_prints_what_one_prints(capsys):
    """7 prompts in batches of 2 on 2 gloo processes (torchrun): the same JSON lines as one
    process, printed once (only the main process writes)."""
    prompts = [f"prompt number {i} is here" + " word" * (i % 5) for i in range(7)]
    args = ["generate", "--model", "tiny-llama", "--batch-size", "2", "--max-new-tokens", "5"]
    for p in prompts:
        args += ["--prompt", p]
    one, two = _cli_runs([*args, "--json"], capsys)
    assert "7 inputs on 2 processes, batches of 2 per process" in two.stderr
    lines = [json.loads(line) for line in two.stdout.splitlines() if line.startswith("{")]
    assert [r["id"] for r in lines] == list(range(7))
    assert two.stdout == one


@pytest.mark.multiprocess
def test_focus_generate_on_two_processes_writes_what_one_writes(shared_data, capsys):
    """XSum documents summarised on 2 processes (5 documents, batches of 2: 2 and 1 batches)
    give one process's summaries, printed once."""
    args = ["focus", "generate", "tiny-bart", "--limit", "5", "--batch-size", "2"]
    args += ["--max-new-tokens", "4", "--data-dir", str(shared_data), "--json", "--quiet"]
    one, two = _cli_runs(args, capsys)
    assert "5 inputs on 2 processes" in two.stderr
    assert two.stdout == one and one.count('"prediction"') == 5


@pytest.mark.multiprocess
def test_search_errors_on_two_processes_prints_what_one_prints(capsys):
    """Greedy, beam 2 and exact search on 5 prompts in batches of 2 (2 batches and 1) on 2
    gloo processes: one process's lines and summary, printed once."""
    args = ["search", "errors", "--model", "tiny-llama", "a", "bb", "ccc", "dddd", "eeeee"]
    args += ["--batch-size", "2", "--max-nodes", "50", "--max-new-tokens", "3", "--beams", "1", "2"]
    one, two = _cli_runs(args, capsys)
    assert "search errors: 5 inputs on 2 processes, batches of 2 per process" in two.stderr
    assert two.stdout == one and one.count('"input"') == 5 and one.count('"summary"') == 3


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "method", [["sundae", "--samples", "2"], ["mask-predict", "--threshold", "0.5"]]
)
def test_nar_generate_on_two_processes_prints_what_one_prints(method, capsys):
    """SUNDAE (its samples seeded from each source) and threshold Mask-Predict on 5 sources in
    batches of 2 on 2 gloo processes: one process's outputs, scores and call counts, once."""
    args = ["nar", "generate", "tiny-bert", "--sources", "a b", "c d e", "f", "g h", "i j k l"]
    args += ["--batch-size", "2", "--steps", "3", "--method", *method, "--json", "--quiet"]
    one, two = _cli_runs(args, capsys)
    assert "nar generate: 5 inputs on 2 processes" in two.stderr

    def drop(text: str) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(text)]

    assert drop(two.stdout) == drop(one) and len(drop(one)) == 5
