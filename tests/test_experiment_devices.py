"""Experiments put their model where the user's accelerator is (a GPU run of hso-fewshot once
ran on the CPU beside an idle H100): each one's model is loaded on ``default_device()``."""

from __future__ import annotations

import importlib

import pytest

from gencraft.experiments import reproduce

LOADS_ITS_MODEL = {
    "hso-lm": "gencraft.hso.experiments",
    "hso-fewshot": "gencraft.hso.experiments",
    "search-speed": "gencraft.search.experiments",
    "search-cad-speed": "gencraft.search.experiments",
    "search-mbr": "gencraft.search.experiments",
    "search-memory": "gencraft.search.experiments",
    "search-empty": "gencraft.search.experiments",
    "search-errors": "gencraft.search.experiments",
    "search-conditional": "gencraft.search.experiments",
}


class _Loaded(Exception):
    """Stops the experiment once its model was asked for."""


@pytest.mark.parametrize("name", sorted(LOADS_ITS_MODEL))
def test_an_experiment_loads_its_model_on_the_default_device(name, monkeypatch, tmp_path):
    module = importlib.import_module(LOADS_ITS_MODEL[name])
    asked = []

    def load_model(model, **kw):
        asked.append(kw.get("device"))
        raise _Loaded

    monkeypatch.setattr(module, "load_model", load_model)
    monkeypatch.setattr(module, "default_device", lambda: "cuda:3")
    with pytest.raises(_Loaded):
        reproduce(name, scale="tiny", output=tmp_path)
    assert asked == ["cuda:3"]
