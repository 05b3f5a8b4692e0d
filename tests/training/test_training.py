"""The shared training loop: interrupt and resume give the same weights as one run, budgets,
refusals, and real multi-process sharding under ``accelerate launch``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from gencraft.errors import ConfigError, GencraftError
from gencraft.training import (
    FitConfig,
    Interrupted,
    Steps,
    TrainerCallback,
    fit,
    load_run,
    model_directory,
    save_run,
    warmup_schedule,
)

REPO = Path(__file__).resolve().parents[2]


class Tiny(nn.Module):
    """A regression model with dropout, so that resumption must restore the RNG too."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def _data(n: int = 24) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return list(zip(x, y, strict=True))


def _loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    """The seeded Tiny model and its AdamW optimizer, as every run here starts."""
    torch.manual_seed(0)
    model = Tiny()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _run(
    tmp: Path, *, stop_at: int | None = None, sleep: float = 0.0, **over
) -> tuple[nn.Module, object]:
    model, opt = _tiny()
    cfg = FitConfig(
        **{"epochs": 3, "batch_size": 4, "grad_accum": 2, "warmup": 0.2, "eval_every": 2, **over}
    )

    def on_step(step: int, batch) -> None:
        time.sleep(sleep)  # wall time that the summary must count
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, handled between steps

    result = fit(
        model,
        opt,
        _data(),
        loss_fn=_loss,
        config=cfg,
        output_dir=tmp,
        valid=_data(8),
        save_fn=lambda m, d: torch.save(m.state_dict(), d / "model.pt"),
        progress=False,
        on_step=on_step,
    )
    return model, result


def test_interrupt_then_resume_equals_an_uninterrupted_run(tmp_path):
    ref, ref_result = _run(tmp_path / "ref")
    assert ref_result.steps == 9 and ref_result.stopped == "epochs"  # 3 epochs x 6 batches / 2
    with pytest.raises(Interrupted, match=r"interrupted: saved .*checkpoint"):
        _run(tmp_path / "run", stop_at=4)
    state = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=False)
    assert state["state"]["step"] == 4 and state["state"]["batch_in_epoch"] == 2
    resumed, result = _run(tmp_path / "run")
    assert result.resumed and result.steps == 9
    for a, b in zip(ref.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    # the history is the uninterrupted one
    h_ref = json.loads((tmp_path / "ref" / "history.json").read_text())
    h_run = json.loads((tmp_path / "run" / "history.json").read_text())
    strip = [{k: v for k, v in r.items() if k != "train_time"} for r in h_ref]
    assert strip == [{k: v for k, v in r.items() if k != "train_time"} for r in h_run]
    assert (tmp_path / "run" / "best" / "model.pt").is_file()
    assert (tmp_path / "run" / "last" / "model.pt").is_file()


def test_patience_stops_after_validations_without_a_new_best(tmp_path):
    # a learning rate of 0 never improves: the first validation is the best, two more end it
    torch.manual_seed(0)
    model = Tiny().eval()  # no dropout, so every validation is the same
    result = fit(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        _data(),
        loss_fn=_loss,
        config=FitConfig(epochs=5, batch_size=4, eval_every=1, patience=2),
        output_dir=tmp_path,
        valid=_data(8),
        progress=False,
    )
    assert result.stopped == "patience" and result.steps == 3
    assert [r["best"] for r in result.history] == [True, False, False]


def test_a_finished_run_says_so_and_a_larger_budget_continues(tmp_path, capsys):
    _, first = _run(tmp_path, max_steps=3)
    assert first.steps == 3 and first.stopped == "max_steps"
    before = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)["model"]
    _, again = _run(tmp_path, max_steps=3)
    assert again.steps == 3 and "already finished" in capsys.readouterr().out
    after = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing trained
    _, more = _run(tmp_path, max_steps=5)
    assert more.resumed and more.steps == 5 and more.stopped == "max_steps"
    history = json.loads((tmp_path / "history.json").read_text())
    assert [r["step"] for r in history] == [2, 3, 4, 5]


def test_run_summary_and_settings_files(tmp_path):
    _, result = _run(tmp_path, max_steps=3)
    summary = result.write_summary(tmp_path, started=0.0, pairs=24)
    on_disk = json.loads((tmp_path / "train_summary.json").read_text())
    assert on_disk == summary and summary["steps"] == 3 and summary["pairs"] == 24
    assert summary["history"][-1]["step"] == 3 and summary["stopped"] == "max_steps"


def test_save_run_and_load_run_one_format_for_every_method(tmp_path):
    from gencraft.models import build_tiny_model, build_tiny_tokenizer
    from gencraft.pointer import PointerSentinelHead

    base = build_tiny_model("tiny-llama", seed=2)
    head = PointerSentinelHead(base, window=4, base_name_or_path="tiny-llama")
    tok = build_tiny_tokenizer()
    settings = {"train": {"model": "tiny-llama", "lr": 0.1}}
    for which in ("best", "last"):
        save_run(tmp_path / "run" / which, head, tok, settings, save_base=True)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = head(ids, return_log_probs=True).log_probs
    for where in (tmp_path / "run", tmp_path / "run" / "best", tmp_path / "run" / "last"):
        model, tok2, got_settings = load_run(where)
        assert type(model) is PointerSentinelHead and not model.training
        assert got_settings == settings and tok2("ab")["input_ids"] == tok("ab")["input_ids"]
        with torch.no_grad():
            assert torch.equal(model(ids, return_log_probs=True).log_probs, want)
    assert model_directory(tmp_path / "run", "last") == tmp_path / "run" / "last"
    # a transformers model in a run (a fine-tuned baseline) loads with its tokenizer
    save_run(tmp_path / "plain", base, tok, {"train": {}})
    model, _, _ = load_run(tmp_path / "plain")
    assert type(model) is type(base)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"empty is not a trained run"):
        load_run(tmp_path / "empty")
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_run(tmp_path / "nowhere")
    (tmp_path / "run" / "best" / "run_settings.json").write_text("{")
    with pytest.raises(ConfigError, match=r"run_settings\.json is damaged or truncated"):
        load_run(tmp_path / "run")


def test_refusals_and_validation(tmp_path):
    _run(tmp_path, max_steps=2)
    with pytest.raises(GencraftError, match=r"other settings.*batch_size 4 -> 2"):
        _run(tmp_path, max_steps=2, batch_size=2)
    (tmp_path / "checkpoint" / "state.pt").write_bytes(b"truncated")
    with pytest.raises(GencraftError, match=r"checkpoint file .*state\.pt cannot be read"):
        _run(tmp_path, max_steps=2)
    (tmp_path / "checkpoint" / "state.pt").unlink()
    with pytest.raises(GencraftError, match="already holds best, last"):
        _run(tmp_path, max_steps=2)
    for bad, match in (
        (dict(max_time=0), "max_time must be > 0"),
        (dict(max_steps=0), "max_steps must be >= 1"),
        (dict(epochs=0), "epochs must be >= 1"),
    ):
        with pytest.raises(GencraftError, match=match):
            FitConfig(**bad)


def test_warmup_schedule_matches_transformers():
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    for ours, theirs in (
        ("linear", get_linear_schedule_with_warmup),
        ("cosine", get_cosine_schedule_with_warmup),
    ):
        p = nn.Parameter(torch.zeros(1))
        a = torch.optim.SGD([p], lr=1.0)
        b = torch.optim.SGD([p], lr=1.0)
        s1, s2 = warmup_schedule(a, 20, 0.25, ours), theirs(b, 5, 20)
        for _ in range(21):  # up to the end of the schedule
            assert abs(a.param_groups[0]["lr"] - b.param_groups[0]["lr"]) < 1e-9
            a.step(), b.step(), s1.step(), s2.step()


def test_focus_trainer_resumes_after_an_interrupt(tmp_path, monkeypatch):
    from gencraft.data.summarization import SummarizationExample
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.models import load_model

    data = [
        SummarizationExample(f"d{i}", f"doc {i} about rivers and rain {i}", f"rain {i}")
        for i in range(8)
    ]

    def run(out: Path, stop: bool):
        base, tok = load_model("tiny-bart", seed=0)
        fit_cfg = FitConfig(epochs=2, batch_size=2, warmup=0.1)
        cfg = FocusTrainConfig(fit=fit_cfg, frequent_size=3, lr=3e-3, max_source=32)
        trainer = FocusTrainer(base, tok, data, data[:2], cfg, out, progress=False)
        if stop:  # Ctrl-C during the third batch (of four per epoch)
            loss, calls = trainer._loss, []

            def interrupting(model, batch):
                calls.append(1)
                if len(calls) == 3:
                    os.kill(os.getpid(), signal.SIGINT)
                return loss(model, batch)

            trainer._loss = interrupting
        trainer.train()
        return trainer.model

    ref = run(tmp_path / "ref", False)
    with pytest.raises(Interrupted):
        run(tmp_path / "run", True)
    resumed = run(tmp_path / "run", False)
    for (n, a), b in zip(ref.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), n


MULTI = """
import json, os, sys, torch
from torch import nn
from gencraft.training import FitConfig, fit
from gencraft.training import make_accelerator

acc = make_accelerator()  # what every gencraft trainer uses
torch.manual_seed(0)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.tensor([float(i), 1.0, -1.0]), torch.tensor(float(i % 3)), i) for i in range(16)]
seen = []

def collate(items):
    return (torch.stack([a for a, _, _ in items]), torch.stack([b for _, b, _ in items]),
            torch.tensor([i for _, _, i in items]))

def loss_fn(m, batch):
    x, y, idx = batch
    seen.append(idx.tolist())
    return ((m(x).squeeze(-1) - y) ** 2).mean()

fit(model, opt, data, loss_fn=loss_fn, config=FitConfig(epochs=1, batch_size=2, clip=None),
    collate_fn=collate, accelerator=acc, progress=False)
out = {"seen": seen, "weights": [p.tolist() for p in acc.unwrap_model(model).parameters()]}
with open(os.path.join(sys.argv[1], f"rank{acc.process_index}.json"), "w") as f:
    json.dump(out, f)
"""


def test_two_processes_see_disjoint_batches_and_end_with_identical_weights(tmp_path):
    script = tmp_path / "multi.py"
    script.write_text(MULTI)
    launcher = Path(sys.executable).with_name("accelerate")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the README's multi-process command; on a machine without CUDA, gencraft's accelerator runs
    # the processes on the CPU (gloo)
    cmd = [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    s0 = {i for b in r0["seen"] for i in b}
    s1 = {i for b in r1["seen"] for i in b}
    assert s0.isdisjoint(s1) and s0 | s1 == set(range(16))
    assert len(r0["seen"]) == len(r1["seen"]) == 4
    assert r0["weights"] == r1["weights"]


def test_mixed_precision_bf16_runs_the_loss_under_autocast_on_the_cpu(tmp_path):
    """--mixed-precision bf16: the forward and loss run in bfloat16 (accelerate's autocast), the
    weights stay float32 and train; fp16 without a GPU is refused with one line."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gencraft.errors import ConfigError
    from gencraft.training import FitConfig, fit

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    before = [p.detach().clone() for p in model.parameters()]
    seen = []  # what a layer inside computes in (accelerate hands back float32 outputs)
    model.lm_head.register_forward_hook(lambda m, args, out: seen.append(out.dtype))

    def loss_fn(m, batch):
        return m(input_ids=batch[0], labels=batch[0]).loss

    batches = [torch.randint(0, 16, (1, 6)) for _ in range(4)]
    fit(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        batches,
        loss_fn=loss_fn,
        config=FitConfig(epochs=1, batch_size=1, mixed_precision="bf16"),
        collate_fn=lambda items: items,
        output_dir=None,
        progress=False,
    )
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
            FitConfig(mixed_precision="fp16")
    with pytest.raises(ConfigError, match="no, bf16 or fp16"):
        FitConfig(mixed_precision="fp8")


def test_the_schedule_ends_after_the_optimizer_steps_not_the_batches(tmp_path):
    """With gradient accumulation the schedule spans len(loader) / grad_accum steps per
    epoch: linear decay reaches 0 exactly at the last step (3 epochs x 6 batches / 2 = 9)."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lrs = []
    result = fit(
        model,
        opt,
        _data(),
        loss_fn=_loss,
        config=FitConfig(epochs=3, batch_size=4, grad_accum=2),
        progress=False,
        on_step=lambda step, batch: lrs.append(opt.param_groups[0]["lr"]),
    )
    assert result.steps == 9
    assert lrs[-1] == 0.0 and lrs[-2] == pytest.approx(0.1 / 9)


def test_a_resumed_run_reports_the_whole_interval_and_the_whole_wall_time(tmp_path):
    """Interrupted between two validations, the resumed run's train_loss averages every batch
    since the last validation (the uninterrupted run's number), and wall_seconds counts the
    invocation before the interrupt too."""
    _, ref = _run(tmp_path / "ref", eval_every=4)
    with pytest.raises(Interrupted):
        _run(tmp_path / "run", eval_every=4, stop_at=3, sleep=0.3)
    _, resumed = _run(tmp_path / "run", eval_every=4)
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in ref.history]
    assert 0.9 <= resumed.earlier_wall < 60  # three steps of 0.3 s before the interrupt
    summary = resumed.write_summary(tmp_path / "run", started=time.perf_counter())
    assert summary["wall_seconds"] >= 0.9


def test_the_plateau_rule_halves_only_after_a_worse_validation():
    """Merity et al.: the rate falls when validation got worse than the previous validation,
    not whenever it is not a new best; patience counts validations without a new best."""
    from gencraft.training import PlateauSchedule

    schedule = PlateauSchedule(decay=0.5, patience=3)
    steps = [schedule.step(v) for v in (10.0, 8.0, 9.0, 8.5, 8.7)]
    assert [decay for _, decay, _ in steps] == [False, False, True, False, True]
    assert [improved for improved, _, _ in steps] == [True, True, False, False, False]
    assert [stop for _, _, stop in steps] == [False, False, False, False, True]


def test_train_loss_is_the_mean_over_the_batches_since_the_last_validation(tmp_path):
    """Each history row's train_loss averages exactly the training batches after the
    previous row (the running sum restarts at every validation)."""
    torch.manual_seed(0)
    model = Tiny()
    seen: list[float] = []

    def loss(m, batch):
        value = _loss(m, batch)
        if m.training:  # validation batches run in eval mode
            seen.append(float(value))
        return value

    result = fit(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _data(),
        loss_fn=loss,
        config=FitConfig(epochs=1, batch_size=4, eval_every=2),
        valid=_data(8),
        progress=False,
    )
    rows = [r["train_loss"] for r in result.history]
    want = [sum(seen[i : i + 2]) / 2 for i in range(0, 6, 2)]  # 6 batches, a row every 2
    assert rows == pytest.approx(want)


def test_the_summary_holds_each_field_under_its_name_and_the_whole_runs_wall_time(
    tmp_path, monkeypatch
):
    """write_summary: every field of the result under its documented name, ``extra`` before
    the history, the wall time of this call since ``started`` plus the earlier invocations',
    the same dict on disk; a start that is no perf_counter reading is refused word for word,
    while one equal to the clock's reading is accepted."""
    import importlib

    from gencraft.training import FitResult

    fit_module = importlib.import_module("gencraft.training.fit")  # the module, not fit

    result = FitResult(
        steps=7,
        epochs_done=1.5,
        train_time=3.25,
        best=0.5,
        stopped="max_steps",
        history=[{"step": 7}],
        trained_examples=56,
        earlier_wall=10.0,
        processes=2,
        global_batch=8,
    )
    monkeypatch.setattr(fit_module, "_now", lambda: 100.0)
    summary = result.write_summary(tmp_path, 40.0, pairs=3)
    assert list(summary.items()) == [
        ("steps", 7),
        ("epochs_done", 1.5),
        ("best_valid_loss", 0.5),
        ("stopped", "max_steps"),
        ("wall_seconds", 70.0),
        ("train_seconds", 3.25),
        ("processes", 2),
        ("global_batch", 8),
        ("trained_examples", 56),
        ("pairs", 3),
        ("history", [{"step": 7}]),
    ]
    assert json.loads((tmp_path / "train_summary.json").read_text()) == summary
    monkeypatch.setattr(fit_module.time, "perf_counter", lambda: 50.0)
    assert result.write_summary(tmp_path, 50.0)["wall_seconds"] == 60.0
    with pytest.raises(GencraftError) as e:
        result.write_summary(tmp_path, 50.5)
    assert str(e.value) == "started=50.5 is not a time.perf_counter() reading"


def test_the_hooks_defaults_let_the_run_go_on():
    """A TrainerCallback and a Steps plug-in that override nothing never stop a run."""
    from gencraft.training import Steps, StepState, TrainerCallback
    from gencraft.training.fit import Validated

    state = StepState(step=3, total=10, first_step=0, seconds=1.5, checkpointed=True)
    assert TrainerCallback().on_step_end(state) is False
    assert TrainerCallback().on_save(3, 10) is None
    assert Steps().after_validation(Validated(None, None, 0.5, True, {})) is False
    assert state.seconds_per_step == 0.5


@pytest.mark.parametrize(
    "was, now, batch_in_epoch, plug_in",
    [(2, 1, 3, False), (1, 4, 9, False), (3, 2, 5, False), (2, 2, 7, False), (2, 1, 3, True)],
)
def test_a_run_resumed_on_other_processes_keeps_its_place_in_the_epoch(
    was, now, batch_in_epoch, plug_in, capsys
):
    """The examples seen this epoch stay seen: the place in the epoch is counted again in this
    run's batches, with one line on the main process; a Steps plug-in's place does not move.
    (The two-process run that resumes on one is in tests/cli/test_your_data_and_machines.py.)"""
    from types import SimpleNamespace

    from gencraft.training.fit import _Loop

    st = SimpleNamespace(processes=was, batch_in_epoch=batch_in_epoch)
    loop = SimpleNamespace(
        st=st,
        acc=SimpleNamespace(num_processes=now, is_main_process=True),
        steps=object() if plug_in else None,
        cfg=SimpleNamespace(batch_size=4, grad_accum=3),
        out="runs/x",
        global_batch=4 * 3 * now,
    )
    _Loop.rescale_to_processes(loop)
    seen = batch_in_epoch * 4 * was
    moved = was != now and not plug_in
    assert st.processes == now
    assert st.batch_in_epoch == (seen // (4 * now) if moved else batch_in_epoch)
    err = capsys.readouterr().err
    want = (
        f"gencraft: warning: runs/x was trained on {was} process(es) and resumes on {now}: "
        f"the global batch is now {12 * now} (was {12 * was})\n"
    )
    assert err == (want if moved else "")
    loop.acc.is_main_process, st.processes = False, was
    _Loop.rescale_to_processes(loop)
    assert capsys.readouterr().err == ""  # the other processes say nothing


class _StopAt(TrainerCallback):
    """A callback that stops the run after step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, state) -> bool:
        return state.step == self.at


def _clocked(
    tmp: Path,
    clock: list[float],
    evaluate=None,
    tick: float = 1.0,
    progress=False,
    callbacks=(),
    **over,
):
    """``_run``'s training on a clock that a training batch moves by ``tick`` s and a
    validation by 100 s (the loop's ``_now`` reads ``clock``)."""

    def loss(model, batch):
        clock[0] += tick
        return _loss(model, batch)

    def validate(model, loader):
        clock[0] += 100.0
        return {"loss": sum(float(_loss(model, b)) for b in loader)}

    torch.manual_seed(0)
    model = Tiny()
    cfg = FitConfig(**{"epochs": 1, "batch_size": 4, "grad_accum": 2, "eval_every": 1, **over})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return fit(
        model,
        opt,
        _data(),
        loss_fn=loss,
        config=cfg,
        output_dir=tmp,
        valid=_data(8),
        evaluate_fn=evaluate or validate,
        progress=progress,
        callbacks=callbacks,
    )


def test_the_result_reports_the_run_and_the_time_budget_counts_validation(tmp_path, monkeypatch):
    """FitResult: the steps, epochs, training seconds (the batches' own), the best validation
    value, the examples trained on, one process and the global batch. The time budget counts
    training and validation seconds together; a validation without the metric is refused."""
    import importlib

    fit_module = importlib.import_module("gencraft.training.fit")
    clock = [0.0]
    monkeypatch.setattr(fit_module, "_now", lambda: clock[0])
    result = _clocked(tmp_path / "a", clock)
    assert (result.steps, result.epochs_done, result.train_time) == (3, 1.0, 6.0)
    assert result.best == min(r["valid_loss"] for r in result.history)
    assert (result.trained_examples, result.processes, result.global_batch) == (24, 1, 8)
    assert (result.stopped, result.resumed, result.earlier_wall) == ("epochs", False, 0.0)
    # each step: 2 s of training and 100 s of validation; the budget ends after the third
    timed = _clocked(tmp_path / "b", clock, epochs=3, max_time=250)
    assert (timed.stopped, timed.steps) == ("max_time", 3)
    with pytest.raises(GencraftError) as e:
        _clocked(tmp_path / "c", clock, evaluate=lambda m, loader: {"acc": 1.0})
    assert str(e.value) == "validation gave ['acc'], not the metric 'loss'"


class _Processes:
    """An accelerator stand-in: ``n`` processes, whose sum over processes adds ``others``."""

    def __init__(self, n: int, others: list[float]) -> None:
        self.num_processes, self.device, self.others = n, "cpu", others

    def autocast(self):
        import contextlib

        return contextlib.nullcontext()

    def reduce(self, t: torch.Tensor, reduction: str) -> torch.Tensor:
        assert reduction == "sum"
        return t + torch.tensor(self.others, dtype=t.dtype)


def test_mean_loss_is_the_mean_over_every_process_batches_of_the_loss_and_its_parts():
    from gencraft.training import mean_loss

    def loss_fn(model, batch):
        return torch.tensor(batch * 2.0), {"a": batch, "b": -batch}

    one = mean_loss(loss_fn, _Processes(1, []))(None, [1.0, 2.0, 6.0])
    assert one == {"a": 3.0, "b": -3.0, "loss": 6.0}
    # a second process: sums of a 5, b -5, loss 10 over 2 batches; 5 batches in all
    two = mean_loss(loss_fn, _Processes(2, [5.0, -5.0, 10.0, 2.0]))(None, [1.0, 2.0, 6.0])
    assert two == {"a": 14.0 / 5, "b": -14.0 / 5, "loss": 28.0 / 5}
    plain = mean_loss(lambda m, b: torch.tensor(b), _Processes(1, []))(None, [1.0, 4.0])
    assert plain == {"loss": 2.5}
    assert mean_loss(loss_fn, _Processes(1, []))(None, []) == {}
    assert mean_loss(loss_fn, _Processes(1, []))(None, [3.0]) == {"a": 3.0, "b": -3.0, "loss": 6.0}


@pytest.mark.parametrize(
    "mode, values, best",
    [
        ("max", [1.0, 3.0, 2.0, 3.0, 5.0, 4.0], [True, True, False, False, True, False]),
        ("min", [5.0, 3.0, 4.0, 3.0, 1.0, 2.0], [True, True, False, False, True, False]),
        ("min", [float("nan"), 2.0, 3.0, 1.0, 1.0, 0.5], [True, True, False, True, False, True]),
    ],
)
def test_each_history_row_records_the_step_and_marks_a_strictly_better_value(
    tmp_path, monkeypatch, mode, values, best
):
    """A row: the step, the epoch to four places, the training seconds to three, the processes
    and global batch, the validation values; ``best`` only where the metric is strictly better
    in the configured direction (a tie is not; any value beats a NaN best)."""
    import importlib

    fit_module = importlib.import_module("gencraft.training.fit")
    clock = [0.0]
    monkeypatch.setattr(fit_module, "_now", lambda: clock[0])
    given = iter(values)
    result = _clocked(
        tmp_path,
        clock,
        evaluate=lambda m, loader: {"loss": next(given)},
        tick=0.123456,
        epochs=2,
        mode=mode,
    )
    rows = result.history
    assert [r["best"] for r in rows] == best
    first = {k: v for k, v in rows[0].items() if k not in ("train_loss", "valid_loss", "best")}
    assert first == {
        "step": 1,
        "epoch": 0.3333,
        "train_time": 0.247,
        "processes": 1,
        "global_batch": 8,
    }
    assert [r["epoch"] for r in rows] == [0.3333, 0.6667, 1.0, 1.3333, 1.6667, 2.0]


def test_each_validation_is_printed_once_with_floats_to_four_places(tmp_path, capsys):
    clock = [0.0]
    quiet = _clocked(tmp_path / "quiet", clock)
    assert "eval:" not in capsys.readouterr().out
    shown = _clocked(tmp_path / "shown", clock, progress=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("eval: ")]
    rounded = [
        {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in shown.history
    ]
    assert lines == [f"eval: {r}" for r in rounded] and len(lines) == len(quiet.history) == 3
    assert any(len(repr(v)) > 8 for r in shown.history for v in r.values())  # rounding shows


class _Plugin(Steps):
    """A Steps plug-in of ``n`` steps an epoch that records each validation it is told of,
    extends its row, and asks to stop after the ``stop``-th."""

    global_batch = 3

    def __init__(self, n: int, stop: int) -> None:
        self.n, self.stop, self.events = n, stop, []

    def __len__(self) -> int:
        return self.n

    def loss(self, model, index):
        return (model(torch.full((2, 4), float(index))) ** 2).mean()

    def after_validation(self, event) -> bool:
        self.events.append(event)
        event.row["mine"] = len(self.events)
        return len(self.events) == self.stop


def test_a_steps_plug_in_is_told_of_each_validation_and_may_stop_the_run(tmp_path):
    """after_validation gets the model, the optimizer, the value, whether it is a new best and
    the history row (which it may extend); True ends the run as ``early_stop``, and the
    examples trained on are the plug-in's global batch a step."""
    model, opt = _tiny()
    values = iter([3.0, 2.0, 4.0, 1.0])
    plugin = _Plugin(4, stop=3)
    result = fit(
        model,
        opt,
        plugin,
        config=FitConfig(epochs=2, eval_every=1),
        output_dir=tmp_path,
        valid=_data(8),
        evaluate_fn=lambda m, loader: {"loss": next(values)},
        progress=False,
    )
    assert (result.stopped, result.steps, result.trained_examples) == ("early_stop", 3, 9)
    events = plugin.events
    assert [(e.value, e.better) for e in events] == [(3.0, True), (2.0, True), (4.0, False)]
    assert all(e.model is model for e in events)
    assert all(getattr(e.optimizer, "optimizer", e.optimizer) is opt for e in events)
    assert [e.row for e in events] == result.history
    assert [r["mine"] for r in result.history] == [1, 2, 3]


def test_one_process_may_switch_precision_and_a_distributed_one_may_not(monkeypatch):
    """accelerate keeps one state per process: a second training in one process with another
    precision starts afresh; under several processes it is refused word for word."""
    import accelerate.state

    from gencraft.training import make_accelerator

    assert make_accelerator("no").mixed_precision == "no"
    assert make_accelerator("bf16").mixed_precision == "bf16"

    class TwoProcesses:
        num_processes = 2

    with monkeypatch.context() as m:
        m.setattr(accelerate.state, "PartialState", TwoProcesses)
        with pytest.raises(ConfigError) as e:
            make_accelerator("no")
    assert str(e.value) == (
        "this process already trains with mixed_precision 'bf16'; a distributed run cannot "
        "switch to 'no'"
    )
    assert make_accelerator("no").mixed_precision == "no"


@pytest.mark.parametrize("seed", [0, 3])
def test_the_epoch_sampler_is_the_seed_and_epochs_permutation(seed):
    from gencraft.training.fit import EpochSampler

    assert list(EpochSampler(7, seed, shuffle=False)) == list(range(7))
    sampler = EpochSampler(7, seed)
    orders = []
    for epoch in range(3):
        if epoch:
            sampler.set_epoch(epoch)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        orders.append(list(sampler))
        assert orders[-1] == torch.randperm(7, generator=g).tolist()
        assert list(sampler) == orders[-1] and len(sampler) == 7
    assert len({tuple(o) for o in orders}) == 3


def test_the_examples_counted_are_the_batch_dimension_of_any_batch_shape():
    from gencraft.training.fit import _batch_size

    t = torch.zeros(5, 3)
    assert _batch_size(t) == 5
    assert _batch_size((t, torch.zeros(2))) == 5 and _batch_size([t]) == 5
    assert _batch_size({"ids": t, "other": torch.zeros(2)}) == 5
    assert _batch_size([{"ids": torch.zeros(4, 1)}]) == 4
    assert _batch_size(["a", "b", "c"]) == 3 and _batch_size((1, 2)) == 2
    assert _batch_size([]) == 1 and _batch_size("text") == 1 and _batch_size(None) == 1


def test_fit_refuses_what_it_cannot_train_and_trains_a_single_example(tmp_path):
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = FitConfig(epochs=1, batch_size=4)
    with pytest.raises(GencraftError) as e:
        fit(model, opt, [], loss_fn=_loss, config=cfg, progress=False)
    assert str(e.value) == "no training examples"
    with pytest.raises(GencraftError) as e:
        fit(model, opt, _data(4), config=cfg, progress=False)
    assert str(e.value) == "fit needs a loss_fn for a dataset (or a Steps plug-in as train)"
    one = fit(model, opt, _data(1), loss_fn=_loss, config=cfg, progress=False)
    assert (one.steps, one.trained_examples) == (1, 1)


def test_training_reads_the_samplers_order_and_validation_its_batch_size(tmp_path):
    """Each epoch's batches are EpochSampler's order in ``batch_size`` slices; validation reads
    ``eval_batch_size`` (else ``batch_size``) slices in order; an epoch of one batch is whole
    at its validation."""
    from gencraft.training.fit import EpochSampler

    data = [(torch.full((4,), float(i)), torch.tensor(float(i))) for i in range(10)]
    seen, sizes = [], []

    def loss(model, batch):
        seen.append(batch[1].tolist())
        return _loss(model, batch)

    def evaluate(model, loader):
        sizes.append([len(b[1]) for b in loader])
        return {"loss": 1.0}

    model, opt = _tiny()
    cfg = FitConfig(epochs=2, batch_size=4, eval_every=3, eval_batch_size=3, seed=5)
    kw = dict(loss_fn=loss, config=cfg, valid=data[:7], evaluate_fn=evaluate, progress=False)
    fit(model, opt, data, output_dir=tmp_path / "a", **kw)
    sampler = EpochSampler(10, 5)
    want = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = [float(i) for i in sampler]
        want += [order[:4], order[4:8], order[8:]]
    assert seen == want and sizes and all(s == [3, 3, 1] for s in sizes)
    sizes.clear()
    cfg = FitConfig(epochs=2, batch_size=4, eval_every=1)
    single = fit(model, opt, data[:4], output_dir=tmp_path / "b", **{**kw, "config": cfg})
    assert [r["epoch"] for r in single.history] == [1.0, 2.0] and sizes == [[4, 3]] * 2


def test_a_restart_or_no_resume_starts_over_and_a_resume_checks_the_settings(tmp_path):
    """A restart (or ``resume=False``) trains from step 0 and removes the earlier run's saved
    models at once (a restart stopped before its first validation leaves no best/); a resume
    continues and checks the settings."""

    def go(steps: int, task: str = "a", valid=None, save_every=600.0, **kw):
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        cfg = FitConfig(epochs=3, batch_size=4, max_steps=steps, save_every=save_every)
        return fit(
            model,
            opt,
            _data(),
            loss_fn=_loss,
            config=cfg,
            output_dir=tmp_path,
            settings={"task": task},
            valid=valid,
            save_fn=lambda m, d: torch.save(m.state_dict(), d / "model.pt"),
            progress=False,
            **kw,
        )

    assert go(3, valid=_data(4)).steps == 3 and (tmp_path / "best").is_dir()
    with pytest.raises(Interrupted):
        go(5, restart=True, callbacks=[_StopAt(1)])
    assert not (tmp_path / "best").exists()
    again = go(5, restart=True)
    assert (again.resumed, again.steps) == (False, 5)
    assert (tmp_path / "best").is_dir()
    with pytest.raises(Interrupted):
        go(4, resume=False, callbacks=[_StopAt(1)])
    assert not (tmp_path / "best").exists()
    fresh = go(4, resume=False)
    assert (fresh.resumed, fresh.steps) == (False, 4)
    with pytest.raises(GencraftError, match="task"):
        go(6, task="b")
    resumed = go(6, save_every=30.0)  # how often it saves is no setting of the run
    assert (resumed.resumed, resumed.steps) == (True, 6)


class _Stateful(_Plugin):
    """A plug-in whose state (the steps it has run) travels in the checkpoint."""

    def __init__(self, n: int, owns: bool) -> None:
        super().__init__(n, stop=0)
        self.owns_learning_rate, self.ran = owns, 0

    def loss(self, model, index):
        self.ran += 1
        return super().loss(model, index)

    def state_dict(self):
        return {"ran": self.ran}

    def load_state_dict(self, state):
        self.ran = state["ran"]


@pytest.mark.parametrize("owns", [False, True])
def test_a_plug_ins_state_resumes_and_its_learning_rate_is_its_own_when_it_says_so(tmp_path, owns):
    """A Steps plug-in's state_dict is saved in each checkpoint and given back on resume; a
    plug-in that owns the learning rate keeps it, otherwise fit's schedule (decay to 0 at the
    end, cosine here) sets it."""
    lrs = {}

    def go(plugin, **kw):
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cfg = FitConfig(epochs=2, decay="cosine", warmup=0)

        def on_step(step, batch):
            lrs[step] = opt.param_groups[0]["lr"]

        result = fit(
            model,
            opt,
            plugin,
            config=cfg,
            output_dir=tmp_path,
            progress=False,
            on_step=on_step,
            **kw,
        )
        return result, opt

    with pytest.raises(Interrupted):
        go(_Stateful(4, owns), callbacks=[_StopAt(3)])
    resumed = _Stateful(4, owns)
    result, opt = go(resumed)
    assert result.resumed and result.steps == 8 and resumed.ran == 8  # 3 restored + 5 run
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 if owns else 0.0, abs=1e-9)
    import math

    want = {k: 0.1 if owns else 0.05 * (1 + math.cos(math.pi * k / 8)) for k in range(1, 9)}
    assert lrs == pytest.approx(want, abs=1e-9)


def test_the_training_bar_counts_steps_from_where_the_run_resumes_to_its_budget(tmp_path, capsys):
    """One ``train`` bar of steps on the main process: from 0 (or the resumed step) to the
    budget's total, ending with the running training loss to four places; none without
    progress."""
    clock = [0.0]
    _clocked(tmp_path / "quiet", clock, epochs=2)
    assert "train:" not in capsys.readouterr().err
    with pytest.raises(Interrupted):
        _clocked(tmp_path / "run", clock, progress=True, epochs=2, callbacks=[_StopAt(2)])
    capsys.readouterr()
    result = _clocked(tmp_path / "run", clock, progress=True, epochs=2)
    bars = [x for x in capsys.readouterr().err.replace("\r", "\n").splitlines() if "train:" in x]
    assert bars[0].startswith("train:  33%|") and "| 2/6 [" in bars[0]
    assert bars[-1].startswith("train: 100%|") and "| 6/6 [" in bars[-1]
    assert "step/s" in bars[-1]
    assert bars[-1].endswith(f", loss={result.history[-1]['train_loss']:.4f}]")


def test_a_finished_run_says_how_to_go_on_and_a_cut_epoch_counts_its_share(tmp_path, capsys):
    """A run stopped by its step budget mid-epoch has done that share of the epoch; run again,
    it says in one line that it finished, with the flags that continue it, and reports the
    same result."""
    clock = [0.0]
    cut = _clocked(tmp_path, clock, epochs=2, max_steps=2)
    assert (cut.stopped, cut.steps, cut.epochs_done) == ("max_steps", 2, pytest.approx(4 / 6))
    capsys.readouterr()
    again = _clocked(tmp_path, clock, epochs=2, max_steps=2)
    out = capsys.readouterr().out
    assert f"{tmp_path} already finished (max_steps: step 2, " in out
    assert " s, epoch 0); raise " in out
    assert "raise --max-steps/--max-time/--epochs to continue, or pass --restart\n" in out
    assert (again.stopped, again.steps, again.epochs_done) == ("max_steps", 2, 0)


def test_fit_equals_a_hand_written_loop_that_clips_each_accumulated_gradient():
    """Two batches a step (each loss divided by two, as accelerate does), the sum of their
    gradients clipped to the global norm once, then one SGD step: fit's weights equal this loop's
    in the sampler's order."""
    from gencraft.training.fit import EpochSampler

    def linear() -> nn.Module:
        torch.manual_seed(3)
        return nn.Linear(4, 1)

    def loss(model, batch):
        x, y = batch
        return ((model(x).squeeze(-1) - y) ** 2).mean()

    data = _data()
    cfg = FitConfig(batch_size=4, grad_accum=2, clip=0.5, decay="constant")
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fit(model, opt, data, loss_fn=loss, config=cfg, progress=False)

    ref = linear()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    order = list(EpochSampler(len(data), 0))
    norms = []
    for step in range(3):
        for half in range(2):
            rows = [data[i] for i in order[(2 * step + half) * 4 :][:4]]
            batch = (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]))
            (loss(ref, batch) / 2).backward()
        norms.append(float(nn.utils.clip_grad_norm_(ref.parameters(), 0.5)))
        ref_opt.step()
        ref_opt.zero_grad()
    assert min(norms) > 0.5  # every step was clipped
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, want)


def test_fit_shows_its_bar_by_default_and_trains_with_the_accelerator_it_is_given(capsys):
    """progress is on unless turned off; a given accelerator prepares the model, optimizer and
    loader (fit makes none of its own)."""
    from gencraft.training import make_accelerator

    acc = make_accelerator()
    prepared = []
    own_prepare = acc.prepare
    acc.prepare = lambda *objs: (prepared.append(len(objs)), own_prepare(*objs))[1]
    model, opt = _tiny()
    cfg = FitConfig(batch_size=4)
    fit(model, opt, _data(8), loss_fn=_loss, config=cfg, accelerator=acc)
    assert prepared == [3]
    assert "train: 100%|" in capsys.readouterr().err.replace("\r", "\n")


def test_an_interrupt_names_the_checkpoint_and_the_resume_line_or_says_nothing_was_saved(
    tmp_path, monkeypatch
):
    """Stopped with an output folder: the checkpoint folder and this process's command line;
    with none: one line saying that nothing was saved."""
    model, opt = _tiny()
    cfg = FitConfig(batch_size=4, epochs=2)
    go = dict(loss_fn=_loss, config=cfg, progress=False, callbacks=[_StopAt(2)])
    with pytest.raises(Interrupted) as stop:
        fit(model, opt, _data(12), **go)
    assert stop.value.checkpoint is None
    assert (
        str(stop.value) == "stopped by a callback at step 2 of 6; nothing saved (no output folder)"
    )
    monkeypatch.setattr("sys.argv", ["/x/bin/gencraft", "focus", "train"])
    with pytest.raises(Interrupted) as stop:
        fit(model, opt, _data(12), output_dir=tmp_path, **go)
    assert (stop.value.checkpoint, stop.value.command) == (
        tmp_path / "checkpoint",
        "gencraft focus train",
    )
    assert str(stop.value).endswith("; resume with: gencraft focus train")


def test_a_loss_that_is_not_finite_stops_the_run_and_each_step_reports_its_batch():
    """on_step gets the step's own (last) batch; a NaN loss ends the run in one line naming
    the step."""
    seen, told = [], []

    def loss(model, batch):
        seen.append(batch)
        out = _loss(model, batch)
        return out * float("nan") if len(seen) == 3 else out

    model, opt = _tiny()
    cfg = FitConfig(batch_size=4, epochs=2)
    with pytest.raises(GencraftError) as e:
        fit(
            model,
            opt,
            _data(12),
            loss_fn=loss,
            config=cfg,
            progress=False,
            on_step=lambda step, batch: told.append((step, batch)),
        )
    assert str(e.value) == "training loss became nan at step 3; lower the learning rate"
    assert [s for s, _ in told] == [1, 2] and all(b is seen[s - 1] for s, b in told)


def test_the_bar_shows_the_mean_loss_and_each_part_from_the_first_step(tmp_path, capsys):
    """After one step the bar's loss is that step's loss, and each part the loss function
    returns is shown beside it to three places."""
    parts = []

    def loss(model, batch):
        out = _loss(model, batch)
        parts.append(float(out) / 7)
        return out, {"mse": parts[-1]}

    model, opt = _tiny()
    cfg = FitConfig(batch_size=4, max_steps=1)
    result = fit(model, opt, _data(8), loss_fn=loss, config=cfg, valid=_data(4))
    bars = [x for x in capsys.readouterr().err.replace("\r", "\n").splitlines() if "train:" in x]
    step_loss = parts[0] * 7
    assert bars[-1].endswith(f", loss={step_loss:.4f}, mse={parts[0]:.3f}]")
    assert result.history[0]["train_loss"] == pytest.approx(step_loss)


class _Counted(_Plugin):
    """A plug-in that counts the epochs it is told have ended, with its own epochs flag."""

    epochs_flag = "--passes"

    def __init__(self, n: int) -> None:
        super().__init__(n, stop=0)
        self.ended = 0

    def end_epoch(self) -> None:
        self.ended += 1


def test_an_epoch_of_one_step_and_a_budget_met_at_an_epoch_s_end(tmp_path, capsys):
    """An epoch of one optimizer step is one step of the schedule's total; a step budget met on
    an epoch's last step ends that epoch first (the plug-in is told, the epoch counts), and the
    finished run names the plug-in's own epochs flag."""

    def go(plugin, folder, **over):
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cfg = FitConfig(**over)
        opts.append(opt)
        return fit(model, opt, plugin, config=cfg, output_dir=folder, progress=False)

    opts = []
    one = _Counted(1)
    result = go(one, tmp_path / "one", epochs=3)
    assert (result.steps, result.epochs_done, one.ended) == (3, 3, 3)
    assert opts[0].param_groups[0]["lr"] == 0.0  # the linear decay's end: its total was the 3 steps
    two = _Counted(2)
    result = go(two, tmp_path / "two", epochs=3, max_steps=2)
    assert (result.stopped, result.epochs_done, two.ended) == ("max_steps", 1, 1)
    capsys.readouterr()
    go(_Counted(2), tmp_path / "two", epochs=3, max_steps=2)
    out = capsys.readouterr().out
    assert " s, epoch 1); raise --max-steps/--max-time/--passes to continue" in out


def test_a_resume_into_another_model_or_another_method_s_run_is_refused_by_name(tmp_path):
    """Weights the model lacks name the checkpoint file; a run whose settings share none of this
    trainer's own keys is another method's, refused as such, not as changed settings."""
    model, opt = _tiny()
    cfg = FitConfig(batch_size=4, epochs=2)
    go = dict(loss_fn=_loss, config=cfg, output_dir=tmp_path, progress=False)
    with pytest.raises(Interrupted):
        fit(model, opt, _data(12), settings={"task": "a"}, callbacks=[_StopAt(1)], **go)
    other = nn.Linear(4, 1)
    with pytest.raises(GencraftError) as e:
        fit(
            other,
            torch.optim.SGD(other.parameters(), lr=0.1),
            _data(12),
            settings={"task": "a"},
            **go,
        )
    assert str(e.value).startswith(f"{tmp_path / 'checkpoint' / 'state.pt'} holds weights")
    with pytest.raises(GencraftError) as e:
        fit(model, opt, _data(12), settings={"lm": "b"}, **go)
    assert str(e.value).startswith(f"{tmp_path} holds a run of another kind (another method's)")
