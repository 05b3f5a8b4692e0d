"""Work a run's results.json records but its folder no longer holds (the results copied to
another machine, a cleaned or new checkout): a finished training whose model is gone runs
again when a unit that reads the model is left; an unfinished one whose checkpoint is gone
starts over; the campaign's plan counts both before anything runs."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.studies.campaign import CLAIMS, CampaignSettings, plan_rows, run_states
from gencraft.studies.runner import (
    ExperimentRun,
    Kept,
    get_experiment,
    kept_models,
    lost_work,
    reproduce,
)


def _saved(folder) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_kept_models_name_each_trainings_folder_and_its_readers():
    keys = ["train a", "tune a", "test a", "train ab", "test ab", "curve a 15", "curve ab 1"]
    got = kept_models(keys)
    assert got == {
        "train a": Kept("a/best", "a/checkpoint", ("tune a", "test a", "curve a 15")),
        "train ab": Kept("ab/best", "ab/checkpoint", ("test ab", "curve ab 1")),
    }


@settings(max_examples=60, deadline=None)
@given(
    made=st.lists(st.booleans(), min_size=3, max_size=3),
    saved=st.lists(st.booleans(), min_size=3, max_size=3),
    state=st.lists(st.sampled_from(["done", "going", "none"]), min_size=3, max_size=3),
    read=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_lost_work_is_a_finished_model_gone_with_a_reader_left_or_a_checkpoint_gone(
    tmp_path_factory, made, saved, state, read
):
    folder = tmp_path_factory.mktemp("run")
    kept, units, progress, redo, restart = {}, {}, {}, [], []
    for i in range(3):
        kept[f"train m{i}"] = Kept(f"m{i}/best", f"m{i}/checkpoint", (f"eval m{i}",))
        for sub, exists in (("best", made[i]), ("checkpoint", saved[i])):
            if exists:
                (folder / f"m{i}" / sub).mkdir(parents=True)
        if read[i]:
            units[f"eval m{i}"] = 1.0
        if state[i] == "done":
            units[f"train m{i}"] = {"steps": 3}
            if not made[i] and not read[i]:
                redo.append(f"train m{i}")
        elif state[i] == "going":
            progress[f"train m{i}"] = [1, 3]
            if not saved[i]:
                restart.append(f"train m{i}")
    assert lost_work(kept, folder, units, progress) == (redo, restart)


def _toy(tmp_path) -> ExperimentRun:
    """A run whose ``train m`` leaves ``m/best`` and whose ``eval m`` reads it."""
    exp = dataclasses.replace(
        get_experiment("campaign"),
        kept=lambda s: {"train m": Kept("m/best", "m/checkpoint", ("eval m",))},
    )
    return ExperimentRun(tmp_path, exp, CampaignSettings(), "tiny")


def _train(tmp_path, value: list[int]):
    def compute():
        (tmp_path / "m" / "best").mkdir(parents=True, exist_ok=True)
        return {"loss": value[0], "wall_seconds": value[0] * 10.0}

    return compute


def test_a_finished_training_whose_model_is_gone_runs_again_and_says_how_it_differs(
    tmp_path, capsys
):
    value = [1]
    run = _toy(tmp_path)
    run.unit("train m", _train(tmp_path, value))
    shutil.rmtree(tmp_path / "m")
    value[0] = 2
    run = _toy(tmp_path)  # the reader is left: the training is forgotten, said once
    assert "train m" not in run.units and run.earlier == {
        "train m": {"loss": 1, "wall_seconds": 10.0}
    }
    assert "'train m' runs again" in capsys.readouterr().out
    assert run.unit("train m", _train(tmp_path, value)) == {"loss": 2, "wall_seconds": 20.0}
    assert "'train m' again: loss 2 (before: 1)" in capsys.readouterr().out
    run.unit("eval m", lambda: 5)
    shutil.rmtree(tmp_path / "m")
    run = _toy(tmp_path)  # every reader finished: nothing to run again
    assert run.units == {"train m": {"loss": 2, "wall_seconds": 20.0}, "eval m": 5}
    assert capsys.readouterr().out == ""
    (tmp_path / "m" / "best").mkdir(parents=True)
    data = _saved(tmp_path)
    del data["units"]["eval m"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    run = _toy(tmp_path)  # the model is there: kept
    assert "train m" in run.units and capsys.readouterr().out == ""
    shutil.rmtree(tmp_path / "m")
    run = _toy(tmp_path)
    run.unit("train m", _train(tmp_path, value))
    assert "'train m' again: the same result as before" in capsys.readouterr().out


def test_a_training_to_run_again_stays_so_in_results_json_until_it_has_run(tmp_path, capsys):
    """An invocation stopped before the training ran again: the next one still knows it as a
    training run again (its earlier result saved beside the units), and says so once."""
    value = [1]
    run = _toy(tmp_path)
    run.unit("train m", _train(tmp_path, value))
    shutil.rmtree(tmp_path / "m")
    run = _toy(tmp_path)
    run.unit("other", lambda: 3)  # any save, then the invocation stops
    assert _saved(tmp_path)["units_earlier"] == {"train m": {"loss": 1, "wall_seconds": 10.0}}
    capsys.readouterr()
    run = _toy(tmp_path)
    assert run.earlier == {"train m": {"loss": 1, "wall_seconds": 10.0}}
    assert "train m" not in run.units and capsys.readouterr().out == ""
    value[0] = 2
    run.unit("train m", _train(tmp_path, value))
    assert "'train m' again: loss 2 (before: 1)" in capsys.readouterr().out
    assert "units_earlier" not in _saved(tmp_path) and run.earlier == {}
    assert _toy(tmp_path).earlier == {}


def test_the_plan_counts_a_saved_training_to_run_again_as_again(tmp_path):
    claim = CLAIMS["recurrence"]
    name = claim.runs["tiny"][0][0]
    folder = tmp_path / "recurrence" / name
    folder.mkdir(parents=True)
    data = {
        "units": {"eval baseline valid": 1.0},
        "unit_seconds": {"train baseline": 60.0},
        "units_earlier": {"train baseline": {"steps": 3}},
    }
    (folder / "results.json").write_text(json.dumps(data))
    state = run_states(claim, "tiny", tmp_path, None)[0]
    assert state.lost == {"train baseline": {"steps": 3}} and list(state.units) == [
        "eval baseline valid"
    ]
    row = next(r for r in plan_rows(CampaignSettings(claims=("recurrence",)), "tiny", tmp_path))
    assert row["units"] == f"1 done, {len(state.expected) - 1} left (1 again, its model gone)"


def test_a_training_whose_checkpoint_is_gone_starts_over(tmp_path, capsys):
    run = _toy(tmp_path)
    run.progress["train m"], run.partial["train m"] = [4, 10], 40.0
    run._save()
    run = _toy(tmp_path)
    assert "train m" not in run.progress and "train m" not in run.partial
    assert "'train m' starts over" in capsys.readouterr().out
    (tmp_path / "m" / "checkpoint").mkdir(parents=True)
    run.progress["train m"], run.partial["train m"] = [4, 10], 40.0
    run._save()
    run = _toy(tmp_path)
    assert run.progress["train m"] == [4, 10] and run.partial["train m"] == 40.0


def test_a_recurrence_run_copied_without_its_models_trains_them_again_for_the_verdict(
    shared_data, tmp_path, capsys
):
    """The campaign's own case: a finished run kept only as results.json, resumed with the
    verdict's evaluation. Both trainings run again (the same models: seeded alike), every other
    unit and its time is kept, and the new evaluations read the new models."""
    over = {"data_dir": str(shared_data), "train_overlap": 4}
    reproduce("recurrence-lm", scale="tiny", output=tmp_path, overrides=over)
    before = _saved(tmp_path)
    for name in ("baseline", "recurrent"):
        shutil.rmtree(tmp_path / name)
    capsys.readouterr()
    over["verdict_words"] = 600
    reproduce("recurrence-lm", scale="tiny", output=tmp_path, overrides=over)
    out = capsys.readouterr().out
    after = _saved(tmp_path)
    for name in ("baseline", "recurrent"):
        assert f"'train {name}' runs again" in out
        assert f"'train {name}' again: the same result as before" in out
        assert (tmp_path / name / "best").is_dir()
    evals = {k: t for k, t in before["unit_seconds"].items() if not k.startswith("train ")}
    assert {k: after["unit_seconds"][k] for k in evals} == evals
    assert {k: after["units"][k] for k in evals} == {k: before["units"][k] for k in evals}
    assert sorted(set(after["units"]) - set(before["units"])) == [
        "eval baseline verdict",
        "eval recurrent verdict",
    ]


def test_the_plan_counts_a_model_gone_as_left_at_its_own_time(tmp_path):
    claim = CLAIMS["recurrence"]
    name = claim.runs["tiny"][0][0]
    folder = tmp_path / "recurrence" / name
    folder.mkdir(parents=True)
    seconds = {"train baseline": 600.0, "train recurrent": 1200.0}
    data = {"units": {k: {"steps": 3} for k in seconds}, "unit_seconds": seconds}
    (folder / "results.json").write_text(json.dumps(data))
    s = CampaignSettings(claims=("recurrence",))

    def row():
        return next(r for r in plan_rows(s, "tiny", tmp_path) if r["run"] == name)

    state = run_states(claim, "tiny", tmp_path, None)[0]
    assert sorted(state.lost) == sorted(seconds) and not state.units
    n = len(state.expected)
    assert row()["units"] == f"0 done, {n} left (2 again, its model gone)"
    assert row()["minutes left (est.)"] >= 30.0  # both trainings at their own time
    for m in ("baseline", "recurrent"):
        (folder / m / "best").mkdir(parents=True)
    assert row()["units"] == f"2 done, {n - 2} left"
    assert row()["minutes left (est.)"] < 30.0
    data["units"] = {"train baseline": {"steps": 3}}
    data["unit_progress"], data["unit_partial_seconds"] = (
        {"train recurrent": [1, 3]},
        {"train recurrent": 50.0},
    )
    (folder / "results.json").write_text(json.dumps(data))
    shutil.rmtree(folder / "recurrent")
    assert row()["units"] == f"1 done, {n - 1} left"  # its checkpoint is gone: not under way
    (folder / "recurrent" / "checkpoint").mkdir(parents=True)
    assert row()["units"] == f"1 done, {n - 1} left (1 under way)"
    shutil.rmtree(folder / "baseline")  # the finished training's model goes too
    assert row()["units"] == f"0 done, {n} left (1 under way; 1 again, its model gone)"


@pytest.mark.parametrize("name", ["recurrence-lm", "nar-tasks"])
def test_the_trained_experiments_name_the_model_every_later_unit_reads(name):
    exp = get_experiment(name)
    keys = exp.units(exp.settings_for("cpu"))
    kept = exp.kept(exp.settings_for("cpu"))
    assert sorted(kept) == sorted(k for k in keys if k.startswith("train "))
    readers = sorted(r for keep in kept.values() for r in keep.readers)
    assert readers == sorted(k for k in keys if not k.startswith("train "))
