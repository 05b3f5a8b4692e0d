"""Sharded perplexity: windowed NLL, HSO, dynamic evaluation, the pointer LSTM and
recurrence's overlaps on 2 and 3 gloo processes give every process what one process computes
(the pointer: up to float rounding, each process batching its own streams); on one process the
sharded path equals the unsharded one; ``gencraft hso eval`` on 2 processes prints one
process's rows once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.test_distributed import _cli_runs, _free_port

WINDOW, OVERLAPS = 6, (0, 2, 3)


def _setup():
    """The same tiny models and stream on every process (seeded)."""
    from gencraft.hso import DynamicEvalConfig, HSOConfig
    from gencraft.models import load_model
    from gencraft.pointer.lstm import PointerSentinelConfig, PointerSentinelLSTM
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM

    lm, _ = load_model("tiny-llama", seed=0)
    torch.manual_seed(0)
    rec = RecurrentLM(load_model("tiny-llama", seed=1)[0], RecurrenceConfig(window=WINDOW))
    rec.eval()
    torch.manual_seed(0)
    cfg = dict(vocab_size=60, hidden_size=16, embedding_size=8, window=5)
    pointer = PointerSentinelLSTM(PointerSentinelConfig(**cfg))
    ids = torch.randint(3, 200, (47,), generator=torch.Generator().manual_seed(3))
    hso = HSOConfig(window=3, reset_every=9, steps=2, lr=0.05)
    de = DynamicEvalConfig(window=4, lr=0.01, reset_every=11)
    return lm, rec, pointer, ids, hso, de


def _scores(shard: bool) -> dict[str, object]:
    """Every sharded scorer's result (on this process)."""
    from gencraft.hso import dynamic_eval_nll, hso_nll
    from gencraft.metrics import windowed_nll
    from gencraft.pointer.evaluate import evaluate as pointer_eval
    from gencraft.recurrence.evaluate import score_overlaps

    lm, rec, pointer, ids, hso, de = _setup()
    out = {
        "windows": windowed_nll(lm, ids, window=5, overlap=1, batch_size=2, shard=shard),
        "hso": hso_nll(lm, ids, hso, batch_size=2, shard=shard).token_nll,
        "hso_windows": hso_nll(lm, ids, hso, batch_size=2, shard=shard).windows,
        "de": dynamic_eval_nll(lm, ids, de, shard=shard).token_nll,
        "pointer": pointer_eval(pointer, ids % 60, batch_size=3, bptt=4, shard=shard)["nll"],
        "overlaps": [
            r["block_nll"]
            for r in score_overlaps(rec, ids, 40, window=WINDOW, overlaps=OVERLAPS, shard=shard)
        ],
    }
    return out


def _worker(rank: int, world: int, port: int, out: str) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
    env.update(WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(env)
    torch.set_num_threads(1)
    torch.save(_scores(True), Path(out, f"{rank}.pt"))
    import torch.distributed as dist

    dist.barrier()  # every process is done before any tears gloo down
    dist.destroy_process_group()


def _same(got: dict, want: dict) -> None:
    for key in ("windows", "hso", "de"):
        assert torch.equal(got[key], want[key]), key
    assert got["hso_windows"] == want["hso_windows"] and got["overlaps"] == want["overlaps"]
    assert got["pointer"] == pytest.approx(want["pointer"], rel=1e-6)


def test_on_one_process_the_sharded_scorers_equal_the_unsharded_ones():
    from gencraft.hso import dynamic_eval_nll, hso_nll
    from gencraft.metrics import windowed_nll

    torch.set_num_threads(1)
    got = _scores(True)
    lm, _, _, ids, hso, de = _setup()
    assert torch.equal(got["windows"], windowed_nll(lm, ids, window=5, overlap=1, batch_size=2))
    torch.testing.assert_close(got["hso"], hso_nll(lm, ids, hso).token_nll)
    assert torch.equal(got["de"], dynamic_eval_nll(lm, ids, de).token_nll)
    assert got["windows"].shape == got["hso"].shape == got["de"].shape == (46,)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 3])
def test_every_process_gets_what_one_process_scores(world, tmp_path):
    torch.set_num_threads(1)
    want = _scores(False)
    mp.start_processes(
        _worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, start_method="spawn"
    )
    for rank in range(world):
        _same(torch.load(tmp_path / f"{rank}.pt"), want)


@pytest.mark.multiprocess
def test_hso_eval_on_two_processes_prints_what_one_prints(shared_data, capsys):
    args = ["hso", "eval", "--model", "tiny-llama", "--corpus", "wikitext-2", "--split", "valid"]
    args += ["--max-words", "120", "--reset-every", "40", "--window", "8", "--batch-size", "2"]
    args += ["--dynamic-eval", "--data-dir", str(shared_data), "--json", "--quiet"]
    one, two = _cli_runs(args, capsys)
    assert "hso eval (contexts): " in two.stderr and "on 2 processes" in two.stderr

    def drop(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("seconds", "ms/token")} for r in rows]

    assert drop(json.loads(two.stdout)) == drop(json.loads(one))
    assert [r["method"] for r in json.loads(one)] == ["baseline", "hso", "dynamic eval"]
