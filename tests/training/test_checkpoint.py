"""The checkpoint rules every trainer shares (``gencraft.training.checkpoint``), each checked
directly against a reference written here: the resume line a user retypes, which budget ran
out, the settings a continuation may change, the refusals word for word, the first Ctrl-C
as a flag and the second as a stop, and a save directory that is always whole."""

from __future__ import annotations

import shlex
import signal
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import gencraft
from gencraft.errors import GencraftError
from gencraft.training.checkpoint import (
    CHECKPOINT_DIR,
    RESUMABLE,
    STATE_FILE,
    InterruptGuard,
    RunCheckpoint,
    _differences,
    budget_reason,
    load_trainable_state,
    resume_command,
    save_directory,
    trainable_state,
)
from gencraft.training.state import rng_state, set_rng_state

ROOT = Path(gencraft.__file__).resolve().parent
WORDS = st.text(alphabet="ab -'\"$=.", min_size=1, max_size=6)


# -- the resume line -----------------------------------------------------------------------


@given(
    args=st.lists(st.one_of(WORDS, st.just("--restart")), max_size=5),
    entry=st.sampled_from(["/x/bin/gencraft", "main", "dunder", "train.py"]),
    world=st.integers(1, 4),
)
def test_the_resume_line_splits_back_into_the_command_without_restart(args, entry, world):
    """shlex-splitting the line gives the program, then every argument but ``--restart``, in
    order; gencraft's three entry points read ``gencraft`` (``-m gencraft`` under a launch)."""
    argv0 = {"main": str(ROOT / "cli" / "main.py"), "dunder": str(ROOT / "__main__.py")}
    argv0 = argv0.get(entry, entry)
    kept = [a for a in args if a != "--restart"]
    ours = entry != "train.py"
    if world > 1:
        launch = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(world)]
        head = [*launch, "-m", "gencraft"] if ours else [*launch, argv0]
    else:
        head = ["gencraft" if ours else "train.py"]
    line = resume_command([argv0, *args], world)
    assert shlex.split(line) == [*head, *kept]


@pytest.mark.parametrize(
    "argv", [[], [""], ["-c", "x"], ["pytest"], ["/usr/bin/pytest-3"], ["/a/__main__.py"]]
)
def test_no_resume_line_outside_a_cli(argv):
    assert resume_command(argv, 1) is None


def test_the_resume_line_reads_the_world_size_and_argv_of_this_process(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/x/bin/gencraft", "focus", "train"])
    monkeypatch.setenv("WORLD_SIZE", "3")
    want = "accelerate launch --multi_gpu --num_processes 3 -m gencraft focus train"
    assert resume_command() == want
    monkeypatch.delenv("WORLD_SIZE")
    assert resume_command() == "gencraft focus train"


# -- budgets -------------------------------------------------------------------------------

OPTIONAL = st.one_of(st.none(), st.integers(0, 5))


@given(
    step=st.integers(0, 5),
    seconds=st.integers(0, 5),
    epoch=st.integers(0, 5),
    max_steps=OPTIONAL,
    max_time=OPTIONAL,
    max_epochs=st.integers(0, 5),
)
def test_the_first_budget_that_ran_out_is_named(
    step, seconds, epoch, max_steps, max_time, max_epochs
):
    """Steps, then time, then passes over the data, each out when reached (not only passed)."""
    want = None
    if max_epochs <= epoch:
        want = "laps"
    if max_time is not None and max_time <= seconds:
        want = "max_time"
    if max_steps is not None and max_steps <= step:
        want = "max_steps"
    got = budget_reason(
        step=step,
        seconds=float(seconds),
        epoch=epoch,
        max_steps=max_steps,
        max_time=None if max_time is None else float(max_time),
        max_epochs=max_epochs,
        epochs_name="laps",
    )
    assert got == want


def test_passes_over_the_data_are_called_epochs_unless_named():
    reason = budget_reason(
        step=0, seconds=0.0, epoch=1, max_steps=None, max_time=None, max_epochs=1
    )
    assert reason == "epochs"


# -- trainable weights ---------------------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    return model


def test_only_the_trainable_weights_are_kept_as_detached_copies():
    model = _model()
    state = trainable_state(model)
    assert sorted(state) == ["0.bias", "1.bias", "1.weight"]
    for name, value in state.items():
        assert not value.requires_grad and value.device.type == "cpu"
        assert torch.equal(value, model.get_parameter(name))
    with torch.no_grad():
        model[1].weight.add_(1.0)
    assert not torch.equal(state["1.weight"], model[1].weight)  # a copy, not a view


def test_loading_trainable_weights_copies_each_and_leaves_the_rest():
    source, target = _model(), nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    frozen = target[0].weight.detach().clone()
    load_trainable_state(target, trainable_state(source), Path("ck/state.pt"))
    for name in ("0.bias", "1.bias", "1.weight"):
        assert torch.equal(target.get_parameter(name), source.get_parameter(name))
    assert torch.equal(target[0].weight, frozen)


def test_weights_the_model_lacks_are_refused_naming_three_and_the_file():
    state = {f"extra.{i}": torch.zeros(1) for i in range(5)}
    with pytest.raises(GencraftError) as err:
        load_trainable_state(_model(), state, Path("ck/state.pt"))
    want = (
        "ck/state.pt holds weights this model does not have (extra.0, extra.1, extra.2...); "
        "use --restart or another --output"
    )
    assert str(err.value) == want


# -- the settings a continuation may change ------------------------------------------------

LEAF = st.one_of(st.integers(-3, 3), st.text("xy", max_size=2), st.none(), st.just({}))
KEYS = st.sampled_from(["lr", "seed", "max_steps", "save_every", "model", "train", "device"])
SETTINGS = st.recursive(
    LEAF, lambda inner: st.dictionaries(KEYS, inner, min_size=1, max_size=3), max_leaves=8
)


def _leaves(tree, prefix=""):
    """``{"a.b": leaf}``: the reference flattening (an empty dict is a leaf)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix[:-1]: tree}
    out = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}{key}."))
    return out


@given(
    saved=st.dictionaries(KEYS, SETTINGS, max_size=4),
    now=st.dictionaries(KEYS, SETTINGS, max_size=4),
)
def test_each_changed_setting_is_named_once_with_its_two_values(saved, now):
    """Every leaf that differs, at any depth, sorted by its dotted name; a leaf whose last
    name is a budget (or where it runs) may change."""
    a, b = _leaves(saved), _leaves(now)
    names = sorted(
        k for k in set(a) | set(b) if k.split(".")[-1] not in RESUMABLE and a.get(k) != b.get(k)
    )
    want = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in names]
    assert _differences(saved, now, set(RESUMABLE)) == want


def test_the_settings_a_continuation_may_change():
    assert set(RESUMABLE) == {
        "max_steps",
        "max_time",
        "epochs",
        "max_epochs",
        "save_every",
        "device",
    }
    assert _differences({"lr": 1}, {"lr": 2}, set()) == ["lr 1 -> 2"]


# -- the checkpoint file -------------------------------------------------------------------

SETTINGS_NOW = {"train": {"lr": 0.1, "max_steps": 5}, "model": "tiny"}


def test_a_saved_checkpoint_loads_with_its_settings_and_a_raised_budget(tmp_path):
    ckpt = RunCheckpoint(tmp_path / "run", SETTINGS_NOW)
    assert ckpt.path == tmp_path / "run" / CHECKPOINT_DIR / STATE_FILE
    assert not ckpt.exists()
    weights = {"w": torch.arange(3.0)}
    ckpt.save({"step": 3, "model": weights, "rng": rng_state()})
    assert ckpt.exists() and sorted(p.name for p in ckpt.directory.iterdir()) == [STATE_FILE]
    again = RunCheckpoint(tmp_path / "run", {**SETTINGS_NOW, "train": {"lr": 0.1, "max_steps": 9}})
    payload = again.load()  # numpy's RNG state too: not a weights-only file
    assert payload["step"] == 3 and payload["settings"] == SETTINGS_NOW
    assert torch.equal(payload["model"]["w"], weights["w"])
    assert payload["model"]["w"].device.type == "cpu"
    set_rng_state(payload["rng"])


def test_a_checkpoint_of_other_settings_is_refused_naming_each(tmp_path):
    RunCheckpoint(tmp_path, SETTINGS_NOW).save({"step": 3})
    other = RunCheckpoint(tmp_path, {"train": {"lr": 0.2, "max_steps": 5}, "model": "big"})
    with pytest.raises(GencraftError) as err:
        other.load()
    want = (
        f"{tmp_path} holds a run with other settings (model 'tiny' -> 'big'; "
        "train.lr 0.1 -> 0.2); re-run with the same settings to resume, or pass --restart "
        "or another --output"
    )
    assert str(err.value) == want


def test_only_the_named_budget_keys_may_change(tmp_path):
    RunCheckpoint(tmp_path, {"max_steps": 5, "lr": 1}).save({})
    assert RunCheckpoint(tmp_path, {"max_steps": 5, "lr": 2}, ("lr",)).load()["settings"]
    with pytest.raises(GencraftError, match=r"max_steps 5 -> 6\)"):
        RunCheckpoint(tmp_path, {"max_steps": 6, "lr": 1}, ("lr",)).load()


@pytest.mark.parametrize("payload", [[1, 2], {"step": 3}])
def test_a_file_that_is_not_a_gencraft_checkpoint_is_refused(tmp_path, payload):
    ckpt = RunCheckpoint(tmp_path, {})
    ckpt.directory.mkdir()
    torch.save(payload, ckpt.path)
    with pytest.raises(GencraftError) as err:
        ckpt.load()
    assert str(err.value) == f"{ckpt.path} is not a gencraft checkpoint; pass --restart"


def test_a_damaged_file_is_named_with_its_error(tmp_path):
    ckpt = RunCheckpoint(tmp_path, {})
    ckpt.directory.mkdir()
    ckpt.path.write_bytes(b"cut")
    with pytest.raises(GencraftError) as err:
        ckpt.load()
    try:  # the reference: what torch says of the file
        torch.load(ckpt.path, weights_only=False)
    except Exception as raw:
        said = f"{type(raw).__name__}: {raw}"
    assert str(err.value) == (
        f"checkpoint file {ckpt.path} cannot be read ({said}); delete it or pass --restart"
    )
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_results_without_a_checkpoint_are_never_trained_over(tmp_path):
    ckpt = RunCheckpoint(tmp_path, {})
    ckpt.check_fresh_output()  # an empty folder
    (tmp_path / "last").mkdir()
    (tmp_path / "best").mkdir()
    with pytest.raises(GencraftError) as err:
        ckpt.check_fresh_output()
    want = (
        f"{tmp_path} already holds best, last/ but no checkpoint/ to resume from; pass "
        "--restart to overwrite it, or another --output"
    )
    assert str(err.value) == want
    with pytest.raises(GencraftError, match=r"holds last/ but"):
        ckpt.check_fresh_output(("last", "other"))
    ckpt.check_fresh_output(("other",))
    ckpt.save({})
    ckpt.check_fresh_output()  # a checkpoint to resume from


def test_restart_removes_the_checkpoint_results_and_history_only(tmp_path):
    ckpt = RunCheckpoint(tmp_path, {})
    ckpt.save({})
    for name in ("best", "last", "mine"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "w").write_text("x")
    (tmp_path / "history.json").write_text("[]")
    (tmp_path / "notes.txt").write_text("keep")
    ckpt.clear(("best", "last"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "notes.txt"]
    ckpt.clear(("mine",))
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


# -- a whole save, always ------------------------------------------------------------------


def _writer(text: str):
    def save(folder: Path) -> None:
        (folder / "a").write_text(text)

    return save


def test_a_save_directory_replaces_the_last_one_whole(tmp_path):
    target = tmp_path / "deep" / "best"
    assert save_directory(_writer("1"), target) == target
    (target / "stale").write_text("old")
    save_directory(_writer("2"), str(target))
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    assert (target / "a").read_text() == "2"
    assert sorted(p.name for p in target.parent.iterdir()) == ["best"]


def test_a_failed_save_leaves_the_last_one_and_a_leftover_is_cleared(tmp_path):
    target = tmp_path / "best"
    save_directory(_writer("1"), target)

    def broken(folder: Path) -> None:
        (folder / "a").write_text("half")
        (folder / "b").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        save_directory(broken, target)
    assert (target / "a").read_text() == "1"
    assert (tmp_path / "best.tmp" / "a").read_text() == "half"  # what the next save clears
    (tmp_path / "best.old").mkdir()  # left by a save killed between its renames
    (tmp_path / "best.old" / "a").write_text("0")
    save_directory(_writer("3"), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    assert (target / "a").read_text() == "3"


# -- Ctrl-C --------------------------------------------------------------------------------


def _deliver(guard: InterruptGuard, sig: int) -> None:
    """What the signal would run: the handler installed for ``sig``, which must be the
    guard's (called directly, so that a broken guard fails this test and does not stop
    pytest itself)."""
    handler = signal.getsignal(sig)
    assert getattr(handler, "__self__", None) is guard, f"{sig!r} is not handled by the guard"
    handler(sig, None)


def test_the_first_ctrl_c_is_a_flag_and_the_second_stops(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    before = signal.getsignal(signal.SIGINT)
    term = signal.getsignal(signal.SIGTERM)
    assert InterruptGuard().requested is False
    with InterruptGuard() as guard:
        assert signal.getsignal(signal.SIGTERM) is term  # one process: SIGTERM untouched
        try:
            _deliver(guard, signal.SIGINT)
        except KeyboardInterrupt:
            pytest.fail("the first Ctrl-C stopped at once")
        assert guard.requested
        err = capsys.readouterr().err
        assert err == "\ngencraft: stopping after this step (Ctrl-C again to stop now)\n"
        with pytest.raises(KeyboardInterrupt):
            _deliver(guard, signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_under_a_launcher_sigterm_is_the_same_request_and_one_press_counts_once(
    capsys, monkeypatch
):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    term = signal.getsignal(signal.SIGTERM)
    with InterruptGuard() as guard:
        _deliver(guard, signal.SIGTERM)
        assert guard.requested
        try:
            guard._handle(signal.SIGINT, None)  # the same press, after the launcher's SIGTERM
        except KeyboardInterrupt:
            pytest.fail("the SIGINT of the press the launcher forwarded as SIGTERM stopped at once")
        guard._first -= 2.5  # a second press, 2.5 s later
        with pytest.raises(KeyboardInterrupt):
            guard._handle(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGTERM) is term

    with InterruptGuard() as guard:
        guard._handle(signal.SIGINT, None)
        guard._handle(signal.SIGINT, None)  # within 2 s: the same press
        assert guard.requested
    assert capsys.readouterr().err == ""  # only rank 0 prints
    monkeypatch.setenv("WORLD_SIZE", "1")
    with InterruptGuard() as guard:
        guard._handle(signal.SIGINT, None)
        with pytest.raises(KeyboardInterrupt):
            guard._handle(signal.SIGINT, None)  # one process: a second press stops at once


def test_outside_the_main_thread_the_guard_touches_no_handler():
    before = signal.getsignal(signal.SIGINT)
    seen = []

    def enter() -> None:
        with InterruptGuard() as guard:
            seen.append((guard._previous, signal.getsignal(signal.SIGINT)))

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [(None, before)]


def test_a_guard_is_reused_and_exited_twice_without_touching_other_handlers(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    guard = InterruptGuard()
    for _ in range(2):
        with guard:
            assert signal.getsignal(signal.SIGINT) == guard._handle
        guard.__exit__(None, None, None)  # a second exit restores nothing more
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
