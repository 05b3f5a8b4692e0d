"""``gencraft reproduce throughput`` at the tiny scale: every decoder at every batch size, its
outputs checked (batched = generate / = the loop), and the ratios the docs quote."""

from __future__ import annotations

import json

import pytest
import torch

from gencraft.cli.main import main
from gencraft.studies.throughput import ZeroScorer, peak_memory_bytes


def test_throughput_runs_every_decoder_and_checks_its_outputs(shared_data, tmp_path):
    out = tmp_path / "tp"
    args = ["reproduce", "throughput", "--scale", "tiny", "--output", str(out)]
    assert main([*args, "--data-dir", str(shared_data)]) == 0
    units = json.loads((out / "results.json").read_text())["units"]
    decoders = ("beam", "conditional", "exact", "sundae", "mask-predict", "hso")
    assert sorted(units) == sorted(f"{d} b={b}" for d in decoders for b in (1, 4))
    for key, row in units.items():
        assert row["same"] is True, key  # the batched outputs are the loop's (or generate's)
        assert row["out/s"] > 0 and row["vs loop"] > 0
        assert ("time / peer" in row) == (row["decoder"] != "exact")
    for d in ("sundae", "mask-predict"):
        assert units[f"{d} b=4"]["tokens/call"] > units[f"{d} b=4"]["AR tokens/call"]
    report = (out / "report.md").read_text()
    assert "threads" in report and "load average" in report


def test_dynamic_evaluation_is_timed_when_named(shared_data, tmp_path):
    out = tmp_path / "de"
    args = ["reproduce", "throughput", "--scale", "tiny", "--decoders", "dynamic-eval"]
    assert main([*args, "--output", str(out), "--data-dir", str(shared_data)]) == 0
    units = json.loads((out / "results.json").read_text())["units"]
    assert sorted(units) == ["dynamic-eval b=1", "dynamic-eval b=4"]
    for key, row in units.items():
        assert row["same"] is True and row["vs loop"] > 0 and "time / peer" in row, key


def test_zero_scorer_and_peak_memory():
    import torch

    clf = ZeroScorer(3, 8)
    scores, _ = clf.score(clf.init(2), torch.zeros(2, 3, 8), torch.ones(2, 5, dtype=torch.long))
    assert scores.shape == (2, 5) and not scores.any()
    peak = peak_memory_bytes(lambda: torch.ones(2**22), torch.device("cpu"))
    assert peak is None or peak > 2**22  # the resident peak holds the 16 MiB tensor


def test_the_benchmark_checks_its_device_and_dtype_as_every_command(monkeypatch):
    """Through models.placement, before any model loads: one line naming the flag."""
    from gencraft.errors import ConfigError
    from gencraft.studies.throughput import ThroughputSettings, _context

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match="--device cuda"):
        _context(ThroughputSettings(decoders=("sundae",), device="cuda"))
    with pytest.raises(ConfigError, match="--dtype float16 on the CPU"):
        _context(ThroughputSettings(decoders=("sundae",), device="cpu", dtype="float16"))


def test_each_output_check_fails_when_the_batched_rows_are_not_the_loops(shared_data, monkeypatch):
    """The `same` column is a check that can fail: each LM decoder's batched output made to
    differ is refused (beam and conditional: rows reversed, against generate; HSO: rows
    reversed, against its loop; exact: every row one node more, against its loop)."""
    from dataclasses import replace

    import gencraft.hso
    import gencraft.search
    from gencraft.studies.runner import experiments
    from gencraft.studies.throughput import ThroughputSettings, _context, _lm_cases

    names = ("beam", "conditional", "exact", "hso")
    tiny = experiments()["throughput"].scales["tiny"]
    s = ThroughputSettings(**{**tiny, "decoders": names, "data_dir": str(shared_data)})
    ctx = _context(s)
    for name in names:
        assert _lm_cases(s, name, 4, ctx)["same"]() is True, name
    for module, fn, change in (
        (gencraft.search, "beam_search_batch", lambda rows: rows[::-1]),
        (
            gencraft.search,
            "exact_mode_batch",
            lambda rows: [replace(r, nodes=r.nodes + 1) for r in rows],
        ),
        (gencraft.hso, "hso_nll_batch", lambda rows: rows[::-1]),
    ):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, real=real, c=change, **k: c(real(*a, **k)))
    for name in names:
        assert _lm_cases(s, name, 4, ctx)["same"]() is False, name


@pytest.mark.parametrize("name", ["sundae", "mask-predict"])
def test_the_nar_check_compares_outputs_and_call_counts(name, shared_data, monkeypatch):
    """A batched NAR decode is the loop's only if both its outputs and its decoder calls per
    output agree: each made to differ alone is refused."""
    from dataclasses import replace

    import gencraft.nar.decoding as decoding
    from gencraft.studies.runner import experiments
    from gencraft.studies.throughput import ThroughputSettings, _context, _nar_cases

    tiny = experiments()["throughput"].scales["tiny"]
    s = ThroughputSettings(**{**tiny, "decoders": (name,), "data_dir": str(shared_data)})
    ctx = _context(s)
    assert _nar_cases(s, name, 3, ctx)["same"]() is True
    fn = "sundae_generate" if name == "sundae" else "mask_predict_generate"
    real = getattr(decoding, fn)
    for change in (
        lambda r: replace(r, model_calls=[c + 1 for c in r.model_calls]),
        lambda r: replace(r, sequences=[[*q[:-1], q[-1] + 1] for q in r.sequences]),
    ):

        def batched_differs(*a, change=change, **k):
            out = real(*a, **k)
            return change(out) if k.get("batch_size") is None else out

        monkeypatch.setattr(decoding, fn, batched_differs)
        assert _nar_cases(s, name, 3, ctx)["same"]() is False
