"""The order nar-tasks runs its units in: each curve model's curve right after its test (while
its model is on disk), and a training that runs again only because its model is gone after
the models that are new, so that a resumed run on a new checkout spends its time on new
models first. The report keeps the variants' order whatever the run order."""

from __future__ import annotations

import json
import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.studies.nar import VARIANTS, run_order
from gencraft.studies.runner import get_experiment, reproduce


@settings(max_examples=80, deadline=None)
@given(
    variants=st.lists(st.sampled_from(sorted(VARIANTS)), unique=True, max_size=5),
    again=st.sets(st.sampled_from(sorted(VARIANTS))),
    other=st.dictionaries(st.sampled_from(["tune rum-sundae", "test mask-predict"]), st.just(1)),
)
def test_run_order_puts_trainings_that_run_again_last_and_keeps_the_rest_in_order(
    variants, again, other
):
    earlier = {**other, **{f"train {v}": {"steps": 3} for v in again}}
    want = [v for v in variants if v not in again] + [v for v in variants if v in again]
    assert run_order(tuple(variants), earlier) == want


def _keys(folder) -> list[str]:
    return list(json.loads((folder / "results.json").read_text())["units"])


def test_a_resumed_run_trains_new_models_before_one_that_runs_again(shared_data, tmp_path):
    over = {"data_dir": str(shared_data), "variants": ("rum-sundae", "mask-predict")}
    reproduce("nar-tasks", scale="tiny", output=tmp_path, overrides=over)
    curve = {m: [f"curve {m} 1", f"curve {m} 2", f"curve {m} tau=0.5"] for m in VARIANTS}
    sundae = ["train rum-sundae", "tune rum-sundae", "test rum-sundae", *curve["rum-sundae"]]
    predict = ["train mask-predict", "test mask-predict", *curve["mask-predict"]]
    assert _keys(tmp_path) == sundae + predict  # each curve right after its model's test
    exp = get_experiment("nar-tasks")
    assert exp.units(exp.settings_for("tiny", over)) == sundae + predict
    # a new checkout: rum-sundae's model is gone with its curve left; mask-predict never ran
    data = json.loads((tmp_path / "results.json").read_text())
    for key in [*curve["rum-sundae"], *predict]:
        del data["units"][key]
    (tmp_path / "results.json").write_text(json.dumps(data))
    for name in ("rum-sundae", "mask-predict"):
        shutil.rmtree(tmp_path / name)
    report = reproduce("nar-tasks", scale="tiny", output=tmp_path, overrides=over)
    again = ["train rum-sundae", *curve["rum-sundae"]]
    assert _keys(tmp_path) == ["tune rum-sundae", "test rum-sundae", *predict, *again]
    text = report.read_text()
    assert text.index("| rum-sundae | MLM |") < text.index("| mask-predict | MLM |")
    table = text.split("| model | max steps | threshold |")[1]
    assert table.index("| rum-sundae | 1 |") < table.index("| mask-predict | 1 |")
