"""One process at a time in an output folder.

A run resumes from what its folder holds (``results.json``, checkpoints), and saves by reading
that state, adding a unit and writing it back. Two processes in one folder would each
overwrite the other's units, so the process that works in a folder holds
``FOLDER/.gencraft.lock``, a file naming it (pid, host, the pid's start time, when). Another
process is refused with one line naming the holder; the campaign skips such a run and goes
on with the next, so two campaign processes share a campaign run by run.

A lock whose process is gone (same host; its pid not running, or running since another time,
so a reused pid is not mistaken for the holder) is stale, and the next process takes it over.
A lock from another host cannot be checked from here: it is refused, and the message says
which file to remove once that process is known to be gone.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from gencraft.errors import GencraftError

LOCK_NAME = ".gencraft.lock"
_BREAK_STALE_AFTER = 60.0  # seconds: a breaker that died leaves its mark no longer than this
_RETRY_WAIT = 0.002  # seconds between tries while another process breaks a stale lock
_TAKE_WITHIN = _BREAK_STALE_AFTER + 10.0  # seconds: longer than any breaker's mark can last


@dataclass(frozen=True)
class Holder:
    """The process working in a folder."""

    pid: int
    host: str
    pid_start: str | None  # the pid's start time (Linux /proc), None where unknown
    since: str  # when it took the folder, local time

    def alive(self) -> bool | None:
        """Whether the holder still runs: None when it cannot be told (another host)."""
        if self.host != socket.gethostname():
            return None
        if not _pid_running(self.pid):
            return False
        start = _pid_start(self.pid)
        return self.pid_start is None or start is None or start == self.pid_start

    def same_process(self, other: Holder) -> bool:
        return (self.pid, self.host, self.pid_start) == (other.pid, other.host, other.pid_start)

    def describe(self) -> str:
        return f"process {self.pid} on {self.host} (since {self.since})"


class FolderInUse(GencraftError):
    """Another live process works in the folder."""

    def __init__(self, folder: Path, holder: Holder, checkable: bool) -> None:
        self.folder, self.holder = folder, holder
        how = (
            "wait for it to finish or stop it"
            if checkable
            else f"if that process is gone, remove {folder / LOCK_NAME}"
        )
        super().__init__(f"{folder} is in use by {holder.describe()}; {how}")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _pid_start(pid: int) -> str | None:
    """The pid's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # the fields after the command's name


def this_process() -> Holder:
    return Holder(
        os.getpid(),
        socket.gethostname(),
        _pid_start(os.getpid()),
        time.strftime("%Y-%m-%d %H:%M:%S"),
    )


def read_holder(folder: str | Path) -> Holder | None:
    """The holder named by ``folder``'s lock, or None when there is none (or it is unreadable:
    a lock is written whole before it appears, so that is only a damaged file)."""
    try:
        return Holder(**json.loads((Path(folder) / LOCK_NAME).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _try_create(path: Path, me: Holder) -> bool:
    """Create ``path`` naming ``me``, whole, unless it exists (a link is atomic)."""
    tmp = path.with_name(f"{path.name}.{me.pid}.{os.urandom(4).hex()}.tmp")  # per caller
    tmp.write_text(json.dumps(asdict(me)))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _break_stale(path: Path, stale: Holder | None) -> bool:
    """Remove the lock at ``path`` if it still names ``stale``; one breaker at a time, so two
    processes that found the same stale lock do not remove each other's new one. False when
    another process was breaking it (the caller waits a moment and tries again)."""
    mark = path.with_name(path.name + ".break")
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            age = time.time() - mark.stat().st_mtime
        except FileNotFoundError:  # the other breaker finished between open and stat
            return False
        if age > _BREAK_STALE_AFTER:
            mark.unlink(missing_ok=True)
        return False
    os.close(fd)
    try:
        if read_holder(path.parent) == stale:
            path.unlink(missing_ok=True)
    finally:
        mark.unlink(missing_ok=True)
    return True


def acquire(folder: str | Path) -> Holder | None:
    """Take ``folder`` (created if absent) for this process, or raise :class:`FolderInUse`
    naming the live holder. None when this process holds it already (an experiment that
    trains into a folder it holds): the outer holder gives it back."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path, me = folder / LOCK_NAME, this_process()
    # A breaker on a loaded machine can be descheduled for a while: wait for it (or for its
    # mark to go stale), not for a count of tries.
    deadline = time.monotonic() + _TAKE_WITHIN
    while time.monotonic() < deadline:
        if _try_create(path, me):
            return me
        holder = read_holder(folder)
        if holder is not None and holder.same_process(me):
            return None
        alive = None if holder is None else holder.alive()
        if holder is not None and alive is not False:
            raise FolderInUse(folder, holder, checkable=alive is True)
        if not _break_stale(path, holder):
            time.sleep(_RETRY_WAIT)
    raise GencraftError(f"could not take {path}: it kept changing hands")


def release(folder: str | Path, me: Holder | None) -> None:
    """Give ``folder`` back if the lock still names ``me`` (None: re-entered, nothing to do)."""
    if me is not None and read_holder(folder) == me:
        (Path(folder) / LOCK_NAME).unlink(missing_ok=True)


@contextmanager
def folder_lock(folder: str | Path) -> Iterator[Holder | None]:
    """Hold ``folder`` while the block runs (:func:`acquire`), and give it back after."""
    me = acquire(folder)
    try:
        yield me
    finally:
        release(folder, me)
