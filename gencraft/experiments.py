"""Named experiments behind the tables of docs/results/, and ``gencraft reproduce``.

Each method registers its experiments in its own ``experiments.py`` (:func:`register`): a
name (the one docs/results/ gives beside the table), a settings dataclass whose defaults are
the documented CPU run, overrides per scale (``tiny``: random tiny models, seconds, for tests;
``cpu``: the documented CPU run; ``gpu``: the documented GPU run), an estimate of its CPU
time, and a function that fills an :class:`ExperimentRun`.

An :class:`ExperimentRun` is one output folder: ``results.json`` keeps every finished unit
of work (a prompt, a model, a depth...) as it completes, so a re-run of the same command goes
on where it stopped; ``report.md`` holds the tables and the PNG plots written beside it.

    gencraft reproduce --list
    gencraft reproduce search-memory --scale cpu --output outputs/search-memory
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gencraft.config import option
from gencraft.errors import GencraftError
from gencraft.training.state import write_json

#: modules whose import registers experiments (one per method; new methods add theirs)
EXPERIMENT_MODULES = (
    "gencraft.search.experiments",
    "gencraft.pointer.experiments",
    "gencraft.focus.experiments",
    "gencraft.prefix.experiments",
    "gencraft.hso.experiments",
    "gencraft.recurrence.experiments",
    "gencraft.nar.experiments",
    "gencraft.throughput",  # every decoder batched against its loop and its peer
)
SCALES = ("tiny", "cpu", "gpu")


@dataclass
class Experiment:
    """A registered experiment (see the module docstring)."""

    name: str
    title: str
    settings: type
    run: Callable[[Any, ExperimentRun], None]
    scales: dict[str, dict[str, Any]]
    cpu_minutes: float
    description: str = ""

    def settings_for(self, scale: str, overrides: dict[str, Any] | None = None) -> Any:
        if scale not in self.scales:
            raise GencraftError(
                f"experiment {self.name!r} has no {scale!r} scale; it has {', '.join(self.scales)}"
            )
        return self.settings(**{**self.scales[scale], **(overrides or {})})


_REGISTRY: dict[str, Experiment] = {}


def register(
    name: str,
    *,
    title: str,
    settings: type,
    scales: dict[str, dict[str, Any]],
    cpu_minutes: float,
) -> Callable[[Callable], Callable]:
    """Decorator: ``@register("search-speed", ...)`` on ``def run(settings, out)``."""

    def wrap(fn: Callable) -> Callable:
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = Experiment(
            name, title, settings, fn, scales, cpu_minutes, doc[0] if doc else ""
        )
        return fn

    return wrap


def experiments() -> dict[str, Experiment]:
    """Every registered experiment, by name."""
    for mod in EXPERIMENT_MODULES:
        importlib.import_module(mod)
    return dict(sorted(_REGISTRY.items()))


def get_experiment(name: str) -> Experiment:
    known = experiments()
    if name not in known:
        raise GencraftError(
            f"unknown experiment {name!r}; `gencraft reproduce --list` shows them: "
            f"{', '.join(known)}"
        )
    return known[name]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    dev = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else (platform.processor() or platform.machine())
    )
    return {"device": dev, "threads": torch.get_num_threads(), "torch": torch.__version__}


class ExperimentRun:
    """One experiment's output folder: resumable units, tables, plots and the report."""

    def __init__(
        self, directory: str | Path, experiment: Experiment, settings: Any, scale: str
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.experiment, self.settings, self.scale = experiment, settings, scale
        self.results_path = self.directory / "results.json"
        self._settings = json.loads(json.dumps(dataclasses.asdict(settings), default=str))
        self.units: dict[str, Any] = {}
        if self.results_path.is_file():
            saved = json.loads(self.results_path.read_text())
            if saved.get("settings") != self._settings:
                diff = sorted(
                    k
                    for k in set(saved.get("settings", {})) | set(self._settings)
                    if saved.get("settings", {}).get(k) != self._settings.get(k)
                )
                raise GencraftError(
                    f"{self.directory} holds results of {experiment.name} with other settings "
                    f"({', '.join(diff)}); use another --output or --restart"
                )
            self.units = saved.get("units", {})
        self.blocks: list[str] = []
        self.resumed = bool(self.units)

    def unit(self, key: str, compute: Callable[[], Any]) -> Any:
        """The result of unit ``key``: from an earlier run if it finished there, else computed
        now and saved at once (JSON-able values)."""
        if key not in self.units:
            self.units[key] = json.loads(json.dumps(compute(), default=float))
            self._save()
        return self.units[key]

    def _save(self) -> None:
        write_json(
            self.results_path,
            {
                "experiment": self.experiment.name,
                "scale": self.scale,
                "settings": self._settings,
                "machine": machine(),
                "units": self.units,
            },
        )

    # ---- the report
    def text(self, markdown: str) -> None:
        self.blocks.append(markdown.strip())

    def table(self, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
        """A Markdown table of ``rows`` (floats with 4 significant digits)."""
        if not rows:
            self.blocks.append("(no rows)")
            return
        # every row's columns, in order of first appearance (rows may differ)
        cols = list(columns or dict.fromkeys(k for r in rows for k in r))

        def fmt(v: Any) -> str:
            if isinstance(v, float):
                return f"{v:.4g}"
            return str(v)

        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
        self.blocks.append("\n".join(lines))

    def plot_path(self, name: str, caption: str = "") -> Path:
        """Where to save a PNG of the report (linked from report.md)."""
        path = self.directory / name
        self.blocks.append(f"![{caption or name}]({name})")
        return path

    def write_report(self, seconds: float) -> Path:
        s = dataclasses.asdict(self.settings)
        head = [
            f"# {self.experiment.name}: {self.experiment.title}",
            "",
            f"Scale `{self.scale}`; settings: "
            + ", ".join(f"`{k}={v}`" for k, v in s.items())
            + ".",
            f"Machine: {machine()['device']}, {machine()['threads']} threads, torch "
            f"{machine()['torch']}; {seconds:.0f} s this run"
            + (" (resumed)" if self.resumed else "")
            + ".",
            f"Rerun: `gencraft reproduce {self.experiment.name} --scale {self.scale} "
            f"--output {self.directory}`.",
        ]
        path = self.directory / "report.md"
        path.write_text("\n".join(head) + "\n\n" + "\n\n".join(self.blocks) + "\n")
        return path


def reproduce(
    name: str,
    *,
    scale: str = "cpu",
    output: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    restart: bool = False,
) -> Path:
    """Run experiment ``name`` at ``scale`` into ``output`` (default
    ``outputs/reproduce/NAME-SCALE``), resuming what an earlier run there finished; returns
    the path of ``report.md``."""
    import shutil

    exp = get_experiment(name)
    settings = exp.settings_for(scale, overrides)
    out = Path(output or f"outputs/reproduce/{name}-{scale}")
    if out.exists() and not out.is_dir():
        raise GencraftError(f"--output {out} is a file; an experiment writes a directory there")
    if restart and out.exists():
        shutil.rmtree(out)
    run = ExperimentRun(out, exp, settings, scale)
    t0 = time.perf_counter()
    exp.run(settings, run)
    return run.write_report(time.perf_counter() - t0)


#: a settings-dataclass field with its help text (the CLI flag's)
settings_field = option
