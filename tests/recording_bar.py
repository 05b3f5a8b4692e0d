"""A stand-in for ``gencraft.progress.tqdm`` that records how a bar was made and moved:
monkeypatch it over a module's ``tqdm`` and read ``RecordingBar.made``. Given an iterable, it
yields it and counts each item as an update."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar


class RecordingBar:
    made: ClassVar[list[RecordingBar]] = []  # every bar made since the last reset()

    def __init__(self, iterable: Iterable | None = None, **kw: Any) -> None:
        self.iterable, self.kw, self.updates, self.closed = iterable, kw, 0, False
        RecordingBar.made.append(self)

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.updates += 1

    @classmethod
    def reset(cls) -> type[RecordingBar]:
        cls.made = []
        return cls

    def update(self, k: int) -> None:
        self.updates += k

    def close(self) -> None:
        self.closed = True
