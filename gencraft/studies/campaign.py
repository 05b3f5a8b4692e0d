"""``gencraft reproduce campaign``: the trained methods' claims, run in the order of their value
per minute within a time budget, and resumed across invocations: a 15-minute GPU slot, an
afternoon of CPU, or several of either.

Each claim is one registered experiment at sizes chosen per campaign scale (``tiny``: every
unit on tiny models, for tests; ``cpu``: sizes a 2-core CPU can reach in about two hours per
claim, resumed across invocations; ``slot``: a GPU, minutes at a time). A claim may take
several runs of its experiment (FAME's seeds). Every run is an ordinary
``gencraft reproduce`` folder under the campaign's, so its finished units survive an
interrupted invocation; the time budget (``--minutes``) lets a unit start only if its
estimate (the longest finished unit of its kind, else the claim's estimate) fits in what is
left, so a slot ends between units, with every finished one saved.

The report gives each claim: what ran, at what size, the minutes spent, and its verdict with
the 95% interval (:func:`gencraft.metrics.stats.decide`), computed by the experiment's own
``verdict`` function from its finished units.

    gencraft reproduce campaign --scale slot --plan
    gencraft reproduce campaign --scale slot --minutes 12 --output outputs/campaign-slot
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gencraft.errors import GencraftError
from gencraft.metrics.stats import verdict_cells
from gencraft.studies.runner import (
    Clock,
    ExperimentRun,
    OutOfTime,
    estimate_left,
    get_experiment,
    lost_work,
    register,
    reproduce,
    settings_field,
    time_budget,
    units_left,
)
from gencraft.studies.timing import running_clock
from gencraft.training.folder_lock import FolderInUse, read_holder

#: the claims in the order of their value per minute
CLAIM_ORDER = ("hso-fewshot", "recurrence", "fame", "rum-sundae", "dasp")
#: the experiments' own scale each campaign scale starts from
BASE_SCALE = {"tiny": "tiny", "cpu": "cpu", "slot": "gpu"}
E2E_TRAIN_PAIRS = 42061  # one epoch of E2E is this many pairs


@dataclass(frozen=True)
class Claim:
    """A claim: its experiment, and per campaign scale the runs (a folder name and the
    experiment's overrides) and the minutes a unit is expected to take."""

    name: str
    experiment: str
    statement: str
    runs: dict[str, list[tuple[str, dict[str, Any]]]]
    unit_minutes: dict[str, float]
    paper: str = ""
    data: tuple[str, ...] = ()  # the dataset folders its runs read (what `gencraft pack` carries)


def _epoch_steps(batch: int) -> int:
    return -(-E2E_TRAIN_PAIRS // batch)


#: FAME's slot units: the quality table alone (no focus-sampling sweep, no Table 2 samples)
_FAME_SLOT = {"focus_top": (), "sample_docs": 0}


def _lm_claims() -> list[Claim]:
    """The claims on the causal LM: HSO few-shot and recurrence."""
    few = {"seeds": (0, 1, 2), "shots": (2, 4, 8)}
    rec_slot = {"epochs": 1, "overlaps": (0, 5, 10)}
    return [
        Claim(
            "hso-fewshot",
            "hso-fewshot",
            "HSO and HSO-2 raise few-shot accuracy over the plain model (thesis Table 3.4)",
            {
                "tiny": [("run", {})],
                "cpu": [("run", {**few, "examples": 200, "de_examples": 20})],
                "slot": [
                    (
                        "run",
                        {
                            **few,
                            "examples": 400,
                            "de_examples": 100,
                            "batch_size": 32,
                            "de_batch_size": 25,
                        },
                    )
                ],
            },
            {"tiny": 0.05, "cpu": 12.0, "slot": 1.5},
            "thesis: every test example of each task, 5 prompt seeds",
            ("e2e",),
        ),
        Claim(
            "recurrence",
            "recurrence-lm",
            "recurrence between windows lowers perplexity at equal training (thesis Table 2.1)",
            {
                "tiny": [(f"seed{k}", {"seed": k, "verdict_words": 400}) for k in (0, 1)],
                # cpu: 5 overlaps on 8,000 words of each split, then the verdict's pairs on the
                # whole test split at overlap 0 (~280 blocks; ~33 min a model on one thread)
                "cpu": [
                    (f"seed{k}", {"max_steps": 1000, "seed": k, "verdict_words": None})
                    for k in (0, 1)
                ],
                "slot": [(f"overlap0-seed{k}", {**rec_slot, "seed": k}) for k in (0, 1, 2)]
                + [(f"overlap{o}-seed0", {**rec_slot, "train_overlap": o}) for o in (5, 10)],
            },
            # cpu: the mean of a run's 6 units, 2 trainings of 1,000 steps (11.4 s a step on
            # one thread, measured: ~190 min) and 4 evaluations (guessed: ~2 min)
            {"tiny": 0.05, "cpu": 65.0, "slot": 4.0},
            "thesis: GPT-2 fine-tuned on WikiText-103, T = 300, 20 windows of BPTT",
            ("wikitext-2",),
        ),
    ]


def _trained_claims() -> list[Claim]:
    """The claims that train a method on a task: FAME, RUM-SUNDAE and DASP."""
    nar_cpu = {"steps": _epoch_steps(16), "scratch_steps": _epoch_steps(16), "test_limit": None}
    nar_slot = {"steps": _epoch_steps(64), "scratch_steps": _epoch_steps(64), "curve_inputs": 630}
    return [
        Claim(
            "fame",
            "focus-quality",
            "FAME raises ROUGE-L and ROUGE-1 precision against the document (Aralikatte et al.)",
            {
                "tiny": [("seed0", {}), ("seed1", {"seed": 1})],
                "cpu": [],
                "slot": [(f"seed{k}", {**_FAME_SLOT, "seed": k}) for k in range(10)],
            },
            {"tiny": 0.05, "cpu": 90.0, "slot": 7.0},
            "paper: BART-large / PEGASUS on all of XSum (204K training documents)",
            ("xsum",),
        ),
        Claim(
            "rum-sundae",
            "nar-tasks",
            "RUM-SUNDAE beats SUNDAE from scratch at equal training (thesis ch. 4)",
            {
                "tiny": [
                    ("run", {"variants": ("rum-sundae", "rum-sundae-copy", "sundae-scratch")})
                ],
                "cpu": [("run", nar_cpu)],
                "slot": [("run", nar_slot)],
            },
            {"tiny": 0.05, "cpu": 30.0, "slot": 3.0},
            "thesis: 20K (pretrained) to 60K (scratch) steps of batch 64",
            ("e2e",),
        ),
        Claim(
            "dasp",
            "prefix-tasks",
            "structured prefixes (UniBlock, HierBlock) match or beat dense prefixes on E2E (DASP)",
            {
                "tiny": [("run", {"variants": "dense,hierblock", "metrics": ("BLEU",)})],
                "cpu": [],
                "slot": [
                    (
                        "run",
                        {
                            "variants": "dense,uniblock,hierblock",
                            "steps": 2000,
                            "seeds": "0,1,2",
                            "test_limit": None,
                        },
                    )
                ],
            },
            {"tiny": 0.05, "cpu": 60.0, "slot": 5.0},
            "paper: BART-large, 5 epochs of E2E",
            ("e2e",),
        ),
    ]


def _claims() -> dict[str, Claim]:
    """The claims in the campaign's order (its priority: value per minute)."""
    return {c.name: c for c in [*_lm_claims(), *_trained_claims()]}


CLAIMS = _claims()


@dataclass
class CampaignSettings:
    minutes: float | None = settings_field(None, "this invocation's time budget (none: no limit)")
    plan: bool = settings_field(
        False, "print what would run and its estimated minutes; run nothing"
    )
    claims: tuple[str, ...] = settings_field(CLAIM_ORDER, "the claims run, in this order")
    data_dir: str | None = settings_field(None, "datasets directory")


@dataclass
class RunState:
    """One run of a claim: where it lives, its settings and what it has finished."""

    claim: Claim
    name: str
    folder: Path
    settings: Any
    overrides: dict[str, Any]
    units: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)  # every claim's experiment lists its units
    # unfinished units' saved work: items of units in parts, steps of resumable units
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    progress: dict[str, list[int]] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)  # unfinished units' seconds so far
    # finished units to compute again, their model gone from the folder (lost_work)
    lost: dict[str, Any] = field(default_factory=dict)

    @property
    def left(self) -> list[str]:
        """The expected units not finished (a unit saved whole, before an experiment split it,
        covers the keys it prefixes)."""
        return units_left(self.expected, self.units)


def run_states(claim: Claim, scale: str, root: Path, data_dir: str | None) -> list[RunState]:
    """Every run of ``claim`` at campaign ``scale`` under ``root``, with its finished units."""
    exp = get_experiment(claim.experiment)
    out = []
    for name, overrides in claim.runs[scale]:
        folder = root / claim.name / name
        over = {**overrides, **_placed(exp.settings, folder, data_dir)}
        settings = exp.settings_for(BASE_SCALE[scale], over)
        state = RunState(claim, name, folder, settings, over)
        saved = folder / "results.json"
        if saved.is_file():
            data = json.loads(saved.read_text())
            state.units, state.seconds = data.get("units", {}), data.get("unit_seconds", {})
            state.parts, state.progress = data.get("unit_parts", {}), data.get("unit_progress", {})
            state.spent = data.get("unit_partial_seconds", {})
            _forget_lost(state, exp, data.get("units_earlier", {}))
        state.expected = exp.units(settings)
        out.append(state)
    return out


def _forget_lost(state: RunState, exp: Any, earlier: dict[str, Any]) -> None:
    """What the run will find gone when it starts (:meth:`ExperimentRun._forget_lost`): a unit
    whose model is gone counts as left (estimated by its own seconds), as does one an earlier
    invocation found so (``earlier``, saved) and has not finished again; a training whose
    checkpoint is gone counts as not started."""
    state.lost = dict(earlier)  # finished again, a unit leaves it (ExperimentRun.unit)
    if exp.kept is None:
        return
    redo, restart = lost_work(exp.kept(state.settings), state.folder, state.units, state.progress)
    state.lost |= {k: state.units.pop(k) for k in redo}
    for k in restart:  # its seconds so far stay in spent, unread without its progress
        del state.progress[k]


def _other_runs(claim: Claim, scale: str, root: Path, name: str) -> dict[str, float]:
    """Unit seconds of ``claim``'s runs other than ``name`` (each unit's longest), read now:
    a run's units are estimated by the same units of the claim's other seeds and overlaps."""
    known: dict[str, float] = {}
    for other, _ in claim.runs[scale]:
        saved = root / claim.name / other / "results.json"
        if other != name and saved.is_file():
            for k, t in json.loads(saved.read_text()).get("unit_seconds", {}).items():
                known[k] = max(t, known.get(k, 0.0))
    return known


def _placed(settings: type, folder: Path, data_dir: str | None) -> dict[str, Any]:
    """The location settings a run inside ``folder`` takes (those its settings have)."""
    names = set(settings.__dataclass_fields__)
    where = {"data_dir": data_dir, "runs_dir": str(folder / "runs"), "work_dir": str(folder)}
    return {k: v for k, v in where.items() if k in names}


def plan_rows(s: CampaignSettings, scale: str, root: Path) -> list[dict[str, Any]]:
    """One row per run: units done and left, and the minutes left by the estimates
    (:func:`~gencraft.studies.runner.estimate_left` over the run and the claim's other runs, else
    the claim's per-unit estimate, at the share of a unit's work not yet saved), cumulated in
    order, and whether the run would start within ``s.minutes``."""
    rows, total = [], 0.0
    for name in s.claims:
        claim = CLAIMS[name]
        if not claim.runs[scale]:
            rows.append({"claim": name, "run": "-", "units": "not at this scale"})
            continue
        for state in run_states(claim, scale, root, s.data_dir):
            default = 60 * claim.unit_minutes[scale]
            known = _other_runs(claim, scale, root, state.name)
            need = sum(
                estimate_left(
                    state.seconds, k, default, known, state.parts, state.progress, state.spent
                )
                for k in state.left
            )
            rows.append(
                {
                    "claim": name,
                    "run": state.name,
                    "units": f"{len(state.units)} done" + _left_note(state),
                    "minutes left (est.)": round(need / 60, 1),
                    "starts by minute": round(total / 60, 1),
                    "in budget": "-"
                    if s.minutes is None
                    else ("yes" if total < 60 * s.minutes else "no"),
                    **_held_by(state.folder),
                }
            )
            total += need
    return rows


def _left_note(state: RunState) -> str:
    """The plan's count of a run's units left, and of those under way (work saved)."""
    left = state.left
    going = sum(k in state.parts or k in state.progress for k in left)
    notes = [f"{going} under way"] if going else []
    notes += [f"{len(state.lost)} again, its model gone"] if state.lost else []
    return f", {len(left)} left" + (f" ({'; '.join(notes)})" if notes else "")


def _held_by(folder: Path) -> dict[str, str]:
    """The plan's note on a run another process is working on now (none if it is free)."""
    holder = read_holder(folder)
    if holder is None or holder.alive() is False:
        return {}
    return {"in use by": holder.describe()}


def run_claims(s: CampaignSettings, scale: str, root: Path) -> list[dict[str, Any]]:
    """Run the claims in order until done or out of time; one row per run saying how it
    ended (``done``; ``stopped`` before a unit, or inside a unit in parts, that would not
    fit; ``skipped`` while another process holds its folder; or ``not started``)."""
    deadline = time.monotonic() + (60 * s.minutes if s.minutes is not None else float("inf"))
    rows, out_of_time = [], False
    for name in s.claims:
        claim = CLAIMS[name]
        for state in run_states(claim, scale, root, s.data_dir):
            if out_of_time:
                rows.append({"claim": name, "run": state.name, "ended": "not started"})
                continue
            known = _other_runs(claim, scale, root, state.name)
            clock = Clock(deadline, 60 * claim.unit_minutes[scale], known=known)
            t0 = running_clock()  # the work's minutes: a stopped process's pause left out
            try:
                with time_budget(clock):
                    reproduce(
                        claim.experiment,
                        scale=BASE_SCALE[scale],
                        output=state.folder,
                        overrides=state.overrides,
                    )
                ended = "done"
            except OutOfTime as stop:
                out_of_time, ended = (
                    True,
                    f"stopped {stop.where()} (needs ~{stop.estimate / 60:.1f} min)",
                )
            except FolderInUse as busy:  # another campaign process runs it: go on to the next
                ended = f"skipped: in use by {busy.holder.describe()}"
            rows.append(
                {
                    "claim": name,
                    "run": state.name,
                    "ended": ended,
                    "units this call": len(clock.started),
                    "minutes this call": round((running_clock() - t0) / 60, 2),
                }
            )
    return rows


def verdict_rows(s: CampaignSettings, scale: str, root: Path) -> list[dict[str, Any]]:
    """Each claim's size reached and its verdicts, from the runs' finished units. Until every
    run of a claim is whole, the verdict is computed on the units finished so far and marked
    interim (the experiments' verdicts pool what is finished and skip what is not)."""
    rows = []
    for name in s.claims:
        claim = CLAIMS[name]
        exp = get_experiment(claim.experiment)
        states = run_states(claim, scale, root, s.data_dir)  # none where it has no runs
        done = [st for st in states if not st.left]
        size = {
            "claim": name,
            "runs done": f"{len(done)} of {len(states)}",
            "units": sum(len(st.units) for st in states),
            "minutes": round(sum(sum(st.seconds.values()) for st in states) / 60, 1),
        }
        if not claim.runs[scale]:
            rows.append({**size, "verdict": "not run at this scale"})
            continue
        started = [st for st in states if st.units]
        if not started:  # (every claim's experiment gives a verdict)
            rows.append({**size, "verdict": "no unit finished yet"})
            continue
        verdicts = exp.verdict([(st.settings, st.units) for st in started])
        interim = "" if len(done) == len(states) else _interim(states)
        if not verdicts:
            rows.append({**size, "verdict": f"{interim}no comparison finished yet"})
        for v in verdicts:
            cells = verdict_cells(v)
            rows.append({**size, **cells, "verdict": interim + cells["verdict"]})
    return rows


def _interim(states: list[RunState]) -> str:
    """The mark of a verdict on unfinished runs: how many of their units it rests on."""
    expected = sum(len(st.expected) for st in states)
    done = sum(len(st.expected) - len(st.left) for st in states)
    return f"interim ({done} of {expected} units): "


@register(
    "campaign",
    title="the trained methods' claims in a time budget, resumed across invocations",
    settings=CampaignSettings,
    scales={"tiny": {}, "cpu": {}, "slot": {}},
    cpu_minutes=600,
    volatile=("minutes", "plan", "claims"),
    exclusive=False,  # each run holds its own folder: two campaign processes share the runs
)
def campaign(s: CampaignSettings, run: ExperimentRun) -> None:
    """Run (or with ``plan``, only plan) the claims in order within ``minutes``."""
    unknown = [c for c in s.claims if c not in CLAIMS]
    if unknown:
        raise GencraftError(f"unknown claims {unknown}; the campaign has {', '.join(CLAIMS)}")
    if s.minutes is not None and not s.minutes >= 0:
        raise GencraftError(f"--minutes must be >= 0, got {s.minutes:g}")
    root = run.directory
    if s.plan:
        run.text(
            f"Plan at scale `{run.scale}`"
            + ("" if s.minutes is None else f" within {s.minutes:g} minutes")
            + " (estimates: the same unit under another seed, in its run or the claim's other"
            " runs, else the longest of its kind, else the claim's estimate):"
        )
        run.table(plan_rows(s, run.scale, root))
        run.text("Verdicts on what is finished (95% intervals; p two-sided):")
        run.table(verdict_rows(s, run.scale, root))
        return
    ended = run_claims(s, run.scale, root)
    run.text("This invocation:")
    run.table(ended)
    run.text("Claims, sizes reached and verdicts (95% intervals; p two-sided):")
    run.table(verdict_rows(s, run.scale, root))
    run.text(
        "\n".join(
            f"- **{c.name}** ({c.experiment}): {c.statement}. Size of the original: {c.paper}."
            for c in (CLAIMS[n] for n in s.claims)
        )
    )
