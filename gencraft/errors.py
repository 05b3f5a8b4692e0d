"""Errors with messages meant for the user, raised instead of deep library traces."""

from __future__ import annotations

from pathlib import Path


class GencraftError(Exception):
    """Base class: the message says what is wrong and what to do about it."""


class ModelLoadError(GencraftError, OSError):
    """A model name or path cannot be resolved or loaded."""


class DataError(GencraftError, OSError):
    """A dataset cannot be found, downloaded or parsed."""


class ConfigError(GencraftError, ValueError):
    """A configuration value is invalid (also a ``ValueError``, as configs raised before)."""


class Interrupted(GencraftError):
    """Training stopped after saving a checkpoint, by Ctrl-C or by a callback (``why``); its
    first ``step`` of ``total`` steps are saved, and the message says where and how to
    resume. ``checkpoint=None``: a run with no output folder, which saved nothing."""

    def __init__(
        self,
        checkpoint: Path | None,
        command: str | None,
        step: int = 0,
        total: int = 0,
        why: str = "interrupted",
    ) -> None:
        self.checkpoint = checkpoint
        self.command = command
        self.step, self.total, self.why = step, total, why
        if checkpoint is None:
            super().__init__(f"{why} at step {step} of {total}; nothing saved (no output folder)")
            return
        how = f"; resume with: {command}" if command else "; run the same call again to resume"
        super().__init__(f"{why}: saved {checkpoint}{how}")
