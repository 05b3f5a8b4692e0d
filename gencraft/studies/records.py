"""The records of the claims registry (:mod:`gencraft.studies.claims`): what a paper reports,
the scale gencraft measured at, a confirmatory run's plan, and the claim that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reported:
    """What the paper reports: where, the effect in words, the effect in the endpoint's units
    (None where it cannot be put in them), and the model, data and training behind it."""

    table: str
    effect: str
    value: float | None
    model: str
    data: str
    training: str


@dataclass(frozen=True)
class Scale:
    """gencraft's measurement against the paper's: fractions of its training examples and of
    its model's parameters (None: not applicable), whether this scale can decide the claim,
    and why."""

    examples: float | None
    model: float | None
    deciding: bool
    why: str

    def text(self) -> str:
        parts = [
            f"{_frac(self.examples)} of the training" if self.examples is not None else "",
            f"{_frac(self.model)} of the model" if self.model is not None else "",
        ]
        got = ", ".join(p for p in parts if p) or "no training"
        return f"{got}; {'decides' if self.deciding else 'does not decide'}: {self.why}"


def _frac(x: float) -> str:
    if x >= 0.95:
        return f"{x:.2g}×"
    return f"1/{round(1 / x):,}" if x < 0.1 else f"{x:.2f}"


@dataclass(frozen=True)
class Plan:
    """A confirmatory run's pre-registration: primary endpoint, unit, test, α, size and
    stopping rule, the command, and the date it was committed. The report lists these
    analyses first; any other is exploratory. An interim look never changes them; a change
    made before any result was seen is listed in ``amended``, with its reason."""

    endpoint: str
    unit: str
    test: str
    alpha: float
    size: str
    stopping: str
    command: str
    registered: str
    secondary: tuple[str, ...] = ()
    cost: str = ""
    #: changes made before any result was seen, each with its date and reason
    amended: tuple[str, ...] = ()


@dataclass(frozen=True)
class Claim:
    """One claim of one work (see the module docstring)."""

    id: str
    paper: str
    claim: str
    reported: Reported
    endpoint: str
    unit: str
    test: str
    direction: int = 1
    margin: float | None = None
    alpha: float = 0.05
    study: str | None = None
    run: str | None = None
    scale: Scale | None = None
    decide: str = ""
    not_attempted: str | None = None
    plan: Plan | None = None
    notes: tuple[str, ...] = field(default=())
