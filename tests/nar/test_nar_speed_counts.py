"""`nar-speed`'s reported counts: the inputs decoded and each case's decoder calls per output,
against the decoders' own counts and the schedules' fixed lengths."""

from __future__ import annotations

import torch

from gencraft.studies.nar import NARSpeedSettings, _speed_cases, nar_speed_unit


def test_calls_per_output_are_each_decoders_own_counts(shared_data):
    s = NARSpeedSettings(
        model="tiny-bert",
        inputs=3,
        length=6,
        steps=3,
        samples=2,
        rounds=1,
        data_dir=str(shared_data),
    )
    r = nar_speed_unit(s)
    assert r["inputs"] == 3
    cases, per = _speed_cases(s)
    assert per == 3 and list(r["cases"]) == list(cases)
    with torch.no_grad():
        for name, fn in cases.items():
            calls = fn().model_calls
            assert len(calls) == 3
            assert r["cases"][name]["calls/output"] == sum(calls) / 3, name
    # fixed schedules: the autoregressive model writes length + EOS, Mask-Predict its steps
    assert r["cases"]["autoregressive, greedy"]["calls/output"] == s.length + 1
    assert r["cases"]["autoregressive, beam 4"]["calls/output"] == s.length + 1
    assert r["cases"]["Mask-Predict, 3 iterations"]["calls/output"] == s.steps
    assert all(c["s/output"] > 0 for c in r["cases"].values())
