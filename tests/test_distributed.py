"""Sharded evaluation and generation: shares are contiguous runs of the batches one
process cuts, padded only with marked dummies; results come back in input order, each index
once, on 1, 2 and 3 gloo processes; a rerun resumes from the partial files; ``gencraft
generate`` on 2 processes writes what 1 process writes."""

from __future__ import annotations

import io
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


RUN = {"model": {"name": "m", "weights": "w1"}, "inputs": ["a", "b"], "settings": {}, "seed": 0}


def test_a_rerun_resumes_from_the_partial_files(tmp_path):
    calls, stop = [], [True]

    def fn(batch):
        calls.append(batch)
        if len(calls) == 3 and stop[0]:
            raise KeyboardInterrupt  # the third batch never finishes
        return [i * i for i in batch]

    with pytest.raises(KeyboardInterrupt):
        map_sharded(fn, 11, 3, partial_dir=tmp_path, fingerprint=RUN)
    calls.clear()
    stop[0] = False
    assert map_sharded(fn, 11, 3, partial_dir=tmp_path, fingerprint=RUN) == [
        i * i for i in range(11)
    ]
    assert calls == [[6, 7, 8], [9, 10]]  # the two finished batches were not redone
    # a partial file of the same run on another process count counts too
    key = json.loads((tmp_path / "partial-0-of-1.jsonl").read_text().splitlines()[0])
    line = {"fingerprint": key["fingerprint"], "results": [[9, 81], [10, 100]]}
    (tmp_path / "partial-1-of-2.jsonl").write_text(json.dumps(line) + "\n")
    calls.clear()
    got = map_sharded(fn, 11, 3, partial_dir=tmp_path, fingerprint=RUN)
    assert got[9:] == [81, 100] and calls == []


CHANGES = {
    "model": {**RUN, "model": {"name": "other", "weights": "w1"}},
    "weights": {**RUN, "model": {"name": "m", "weights": "w2"}},
    "inputs": {**RUN, "inputs": ["a", "c"]},
    "settings": {**RUN, "settings": {"max_new_tokens": 5}},
    "seed": {**RUN, "seed": 1},
}


@settings(max_examples=25, deadline=None)
@given(
    changed=st.lists(st.sampled_from(sorted(CHANGES)), min_size=1, max_size=3, unique=True),
    batch=st.integers(1, 4),
    more_batch=st.booleans(),
)
def test_a_rerun_of_another_run_is_refused_naming_what_differs(
    tmp_path_factory, changed, batch, more_batch
):
    """Partial results of one run, then a rerun differing in drawn parts (model name, weights,
    inputs, settings, seed, batch size): refused before any batch runs, naming exactly the
    parts that differ; the same run resumes without a call."""
    folder = tmp_path_factory.mktemp("p")
    map_sharded(lambda b: [str(i) for i in b], 5, batch, partial_dir=folder, fingerprint=RUN)
    other = dict(RUN)
    for name in changed:
        key = "model" if name == "weights" else name
        other[key] = CHANGES[name][key]
    calls = []
    size = batch + 1 if more_batch else batch
    with pytest.raises(GencraftError) as err:
        map_sharded(lambda b: calls.append(b) or b, 5, size, partial_dir=folder, fingerprint=other)
    parts = sorted(
        {"model" if n == "weights" else n for n in changed}
        | ({"batch size"} if more_batch else set())
    )
    assert f"({', '.join(parts)} differ)" in str(err.value) and calls == []
    assert "--restart" in str(err.value) and "\n" not in str(err.value)
    got = map_sharded(lambda b: calls.append(b) or b, 5, batch, partial_dir=folder, fingerprint=RUN)
    assert got == [str(i) for i in range(5)] and calls == []


def test_partial_results_without_a_record_or_a_fingerprint_are_refused(tmp_path):
    line = {"total": 2, "batch_size": 1, "results": [[0, "x"]]}  # an older gencraft's line
    (tmp_path / "partial-0-of-1.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(GencraftError, match="no record of the run that made them"):
        map_sharded(lambda b: b, 2, 1, partial_dir=tmp_path, fingerprint=RUN)
    with pytest.raises(GencraftError, match="need a fingerprint"):
        map_sharded(lambda b: b, 2, 1, partial_dir=tmp_path / "new")
    assert map_sharded(lambda b: b, 2, 1, partial_dir=tmp_path / "new", fingerprint=RUN) == [0, 1]


def test_each_process_bar_counts_its_share_and_says_so(monkeypatch):
    """Under 2 processes, process 2's bar counts its 3 of 7 inputs and is labelled with them;
    one process leaves the bar as it was."""
    import gencraft.distributed as dist
    from gencraft.progress import tqdm

    monkeypatch.setattr(dist, "gather_in_order", lambda pairs, total: [v for _, v in pairs])
    monkeypatch.setattr(dist, "process_info", lambda: (1, 2))
    bar = tqdm(total=7, desc="generate", file=io.StringIO())
    assert map_sharded(lambda b: b, 7, 2, on_batch=bar.update) == [4, 5, 6]
    assert bar.total == 3 and bar.n == 3
    assert bar.desc.startswith("generate (process 2 of 2: 3 of 7 inputs)")
    monkeypatch.setattr(dist, "process_info", lambda: (0, 1))
    alone = tqdm(total=7, desc="generate", file=io.StringIO())
    map_sharded(lambda b: b, 7, 2, on_batch=alone.update)
    assert alone.total == 7 and alone.desc == "generate"


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


@pytest.mark.multiprocess
def test_generate_resumes_on_two_processes_from_one_process_partial_results(tmp_path, capsys):
    """One process stops after its first batch; the same command on 2 gloo processes reuses
    that batch (its kept value, marked here, comes back) and decodes the rest: in order, once.
    Another model on 2 processes is refused in one line by each."""
    import gencraft.models.generate as generate_module
    from gencraft.cli.main import main

    out = tmp_path / "gen.jsonl"
    args = ["generate", "--model", "tiny-llama", "--batch-size", "2", "--max-new-tokens", "3"]
    for i in range(5):
        args += ["--prompt", f"prompt number {i}"]
    args += ["--output", str(out)]
    real, calls = generate_module.generate_text, []

    def stopping(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    generate_module.generate_text = stopping
    try:
        assert main(args) == 130
    finally:
        generate_module.generate_text = real
    kept = out.parent / "gen.jsonl.partial" / "partial-0-of-1.jsonl"
    line = json.loads(kept.read_text())
    line["results"] = [[i, "KEPT"] for i, _ in line["results"]]
    kept.write_text(json.dumps(line) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launch += ["--master_port", str(_free_port()), "-m", "gencraft"]
    other = [a if a != "tiny-llama" else "tiny-gpt2" for a in args]
    refused = subprocess.run([*launch, *other], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "(model differ)" in refused.stderr
    two = subprocess.run([*launch, *args], env=env, capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-1500:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(5))
    assert [r["output"] for r in rows[:2]] == ["KEPT", "KEPT"]
    assert "KEPT" not in {r["output"] for r in rows[2:]}
    assert not (out.parent / "gen.jsonl.partial").exists()


def test_the_fingerprint_record_is_order_free_sized_and_keys_each_line(tmp_path, monkeypatch):
    """Each part's digest is 16 hex digits and does not depend on a dict's key order; the
    record names gencraft's version (a run of another version is refused naming it); every
    line carries the digest of the whole record; nested folders are made."""
    import gencraft
    from gencraft.distributed import fingerprint_of

    a = fingerprint_of({"settings": {"x": 1, "y": [1, 2]}})
    assert a == fingerprint_of({"settings": {"y": [1, 2], "x": 1}})
    assert set(a) == {"settings", "gencraft version"}
    assert all(len(v) == 16 and int(v, 16) >= 0 for v in a.values())
    folder = tmp_path / "a" / "b" / "out.jsonl.partial"
    assert map_sharded(lambda b: b, 3, 2, partial_dir=folder, fingerprint=RUN) == [0, 1, 2]
    record = json.loads((folder / "fingerprint.json").read_text())
    key = fingerprint_of({"all": record})["all"]
    lines = [json.loads(x) for x in (folder / "partial-0-of-1.jsonl").read_text().splitlines()]
    assert [x["fingerprint"] for x in lines] == [key, key]
    monkeypatch.setattr(gencraft, "__version__", "0.0.0-other")
    with pytest.raises(GencraftError) as err:
        map_sharded(lambda b: b, 3, 2, partial_dir=folder, fingerprint=RUN)
    assert str(err.value) == (
        f"{folder} holds partial results of another run (gencraft version differ); rerun as "
        "before to resume it, or remove that folder (the CLI: --restart) to start afresh"
    )


def test_a_foreign_line_and_a_wrong_count_are_refused_word_for_word(tmp_path):
    map_sharded(lambda b: b, 2, 1, partial_dir=tmp_path, fingerprint=RUN)
    foreign = tmp_path / "partial-1-of-2.jsonl"
    foreign.write_text(json.dumps({"fingerprint": "0" * 16, "results": [[1, 5]]}) + "\n")
    with pytest.raises(GencraftError) as err:
        map_sharded(lambda b: b, 2, 1, partial_dir=tmp_path, fingerprint=RUN)
    assert str(err.value) == f"{foreign} holds a line of another run; remove {tmp_path}"
    foreign.unlink()
    (tmp_path / "fingerprint.json").unlink()
    with pytest.raises(GencraftError) as err:
        map_sharded(lambda b: b, 2, 1, partial_dir=tmp_path, fingerprint=RUN)
    assert str(err.value) == (
        f"{tmp_path} holds partial results with no record of the run that made them (an older "
        "gencraft); remove that folder (the CLI: --restart) to start afresh"
    )
    with pytest.raises(GencraftError) as err:
        map_sharded(lambda b: [0, 0], 3, 1)
    assert str(err.value) == "a batch of 1 inputs gave 2 results"
    with pytest.raises(GencraftError) as err:
        map_sharded(lambda b: b, 3, 1, partial_dir=tmp_path / "x")
    assert str(err.value) == "partial results need a fingerprint of the run that makes them"


def test_a_bar_is_labelled_from_its_description_or_alone(monkeypatch):
    """Under 2 processes: a description set earlier (tqdm keeps it with ': ') is kept before
    the label; a bar without one gets the label alone; an ``on_batch`` that is no bar (a
    list's ``append``) is called and left alone."""
    import gencraft.distributed as dist
    from gencraft.progress import tqdm

    monkeypatch.setattr(dist, "gather_in_order", lambda pairs, total: [v for _, v in pairs])
    monkeypatch.setattr(dist, "process_info", lambda: (0, 2))
    bar = tqdm(total=5, file=io.StringIO())
    bar.set_description("summarize")
    map_sharded(lambda b: b, 5, 2, on_batch=bar.update)
    assert bar.desc.startswith("summarize (process 1 of 2: 4 of 5 inputs)")

    class Bare:
        total, label = 5, None

        def update(self, n: int) -> None:
            pass

        def set_description(self, text: str) -> None:
            self.label = text

    bare = Bare()
    map_sharded(lambda b: b, 5, 2, on_batch=bare.update)
    assert bare.label == "process 1 of 2: 4 of 5 inputs" and bare.total == 4
    seen: list[int] = []
    assert map_sharded(lambda b: b, 5, 2, on_batch=seen.append) == [0, 1, 2, 3]
    assert seen == [2, 2]


def test_shares_and_gathering_refuse_word_for_word():
    """Each refusal of ``share_of`` and ``gather_in_order`` at its boundary, and the first ten
    indices named at most; a repeated index alone (nothing missing) is refused too."""
    from pathlib import Path

    from gencraft.distributed import fingerprint_of

    for process, processes in ((0, 0), (2, 2), (-1, 2)):
        with pytest.raises(GencraftError) as err:
            share_of(5, process, processes, 1)
        assert str(err.value) == f"process {process} of {processes} does not exist"
    assert share_of(5, 1, 2, 1).batches() == [[3], [4]]
    with pytest.raises(GencraftError) as err:
        share_of(5, 0, 1, 0)
    assert str(err.value) == "batch size must be >= 1, got 0"
    with pytest.raises(GencraftError) as err:
        share_of(-1, 0, 1, 1)
    assert str(err.value) == "the input count must be >= 0, got -1"
    with pytest.raises(GencraftError, match=r"repeated \[0\], missing \[\], outside \[\]"):
        gather_in_order([(0, "a"), (0, "a"), (1, "b")], 2)
    with pytest.raises(GencraftError, match=r"outside \[2\]"):
        gather_in_order([(0, "a"), (1, "b"), (2, "c")], 2)
    with pytest.raises(GencraftError) as err:
        gather_in_order([(i, i) for i in range(12)] * 2, 24)
    assert f"repeated {list(range(10))}, missing {list(range(12, 22))}," in str(err.value)
    with pytest.raises(GencraftError) as err:
        gather_in_order([(i, i) for i in range(14)], 2)
    assert str(err.value).endswith(f"outside {list(range(2, 12))}")
    # a part that JSON cannot write as is (a path) is hashed by its text
    assert fingerprint_of({"p": Path("x/y")}) == fingerprint_of({"p": "x/y"})


@pytest.mark.multiprocess
def test_nar_eval_on_two_processes_writes_and_prints_what_one_does(shared_data, tmp_path, capsys):
    """5 E2E inputs in batches of 2 on 2 gloo processes: one process's scores and counts,
    printed once, and the predictions file one process writes."""
    from gencraft.cli.main import main

    args = ["nar", "eval", "tiny-bert", "--limit", "5", "--batch-size", "2", "--steps", "2"]
    args += ["--data-dir", str(shared_data), "--json", "--quiet", "--output"]
    assert main([*args, str(tmp_path / "one.jsonl")]) == 0
    one = capsys.readouterr().out
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launch += ["--master_port", str(_free_port()), "-m", "gencraft"]
    run = [*launch, *args, str(tmp_path / "two.jsonl")]
    two = subprocess.run(run, env=env, capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-1500:]

    def drop(text: str) -> dict:
        return {k: v for k, v in json.loads(text).items() if not k.startswith("seconds")}

    assert "nar eval: 5 inputs on 2 processes" in two.stderr
    assert drop(two.stdout) == drop(one) and drop(one)["outputs"] == 5
    written = (tmp_path / "one.jsonl").read_text()
    assert (tmp_path / "two.jsonl").read_text() == written
    assert [json.loads(line)["id"] for line in written.splitlines()] == list(range(5))
