"""A stand-in for ``gencraft.progress.tqdm`` that records how a bar was made and moved:
monkeypatch it over a module's ``tqdm`` and read ``RecordingBar.made``."""

from __future__ import annotations

from typing import Any, ClassVar


class RecordingBar:
    made: ClassVar[list[RecordingBar]] = []  # every bar made since the last reset()

    def __init__(self, **kw: Any) -> None:
        self.kw, self.updates, self.closed = kw, 0, False
        RecordingBar.made.append(self)

    @classmethod
    def reset(cls) -> type[RecordingBar]:
        cls.made = []
        return cls

    def update(self, k: int) -> None:
        self.updates += k

    def close(self) -> None:
        self.closed = True
