"""Experiments put their model where the user's accelerator is (a GPU run of hso-fewshot once
ran on the CPU beside an idle H100): each one's model is loaded on ``default_device()``."""

from __future__ import annotations

import importlib

import pytest

from gencraft.studies.runner import experiments, reproduce

LOADS_ITS_MODEL = {
    "hso-lm": "gencraft.studies.hso",
    "hso-fewshot": "gencraft.studies.hso",
    "search-speed": "gencraft.studies.search_speed",
    "search-cad-speed": "gencraft.studies.search_speed",
    "search-mbr": "gencraft.studies.search_mbr",
    "search-memory": "gencraft.studies.search_speed",
    "search-empty": "gencraft.studies.search_empty",
    "search-errors": "gencraft.studies.search_errors",
    "search-conditional": "gencraft.studies.search_conditional",
}


class _Loaded(Exception):
    """Stops the experiment once its model was asked for."""


@pytest.mark.parametrize("name", sorted(LOADS_ITS_MODEL))
def test_an_experiment_loads_its_model_on_the_default_device(
    name, monkeypatch, tmp_path, shared_data
):
    module = importlib.import_module(LOADS_ITS_MODEL[name])
    fields = experiments()[name].settings.__dataclass_fields__
    # the data where a study reads its prompts before it loads the model
    over = {"data_dir": str(shared_data)} if "data_dir" in fields else {}
    asked = []

    def load_model(model, **kw):
        asked.append(kw.get("device"))
        raise _Loaded

    monkeypatch.setattr(module, "load_model", load_model)
    monkeypatch.setattr(module, "default_device", lambda: "cuda:3")
    with pytest.raises(_Loaded):
        reproduce(name, scale="tiny", output=tmp_path, overrides=over)
    assert asked == ["cuda:3"]
