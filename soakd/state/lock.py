"""One writer per run: :func:`claim_run` takes an exclusive ``flock`` on ``<state-dir>/<run-id>/.lock``
(the run's folder, beside its summary and report) for the process's life; the kernel drops it
when the process dies, even by ``kill -9``. A second soakd on the same run refuses, naming the
holder's pid; :func:`live_holders` tells the database's opener whether anyone is recording.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

from soakd.config import check_run_id
from soakd.errors import ConfigError, StateError
from soakd.state.schema import CURRENT_RUN

log = logging.getLogger("soakd.store")

LOCK_NAME = ".lock"
_HELD: dict[Path, int] = {}  # lock file -> its descriptor, open (and locked) until the process exits


def run_lock_path(state_dir: Path, run_id: str) -> Path:
    return state_dir / run_id / LOCK_NAME


def _lock_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def claim_run(state_dir: Path, run_id: str) -> Path:
    """Take the run's lock for the rest of this process's life (again: a no-op); StateError when
    another process holds it, naming its pid. The lock file holds the holder's pid."""
    path = run_lock_path(state_dir, run_id)
    key = path.resolve()
    if key in _HELD:
        return path
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)  # the run's folder: its summary and report go here too
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateError(f"{path}: cannot create the run's lock file: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _lock_pid(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateError(f"{path}: cannot lock: {exc.strerror}") from None
        raise StateError(
            f"run {run_id!r} in {state_dir} is being recorded by another soakd (pid {pid}, lock {path}); "
            "stop that one first, or give this one another --run-id"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd
    return path


def live_holders(state_dir: Path) -> list[tuple[str, str]]:
    """(pid, run id) of every other process holding a run lock in ``state_dir``."""
    out: list[tuple[str, str]] = []
    for path in sorted(state_dir.glob(f"*/{LOCK_NAME}")):
        if path.resolve() in _HELD:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            out.append((_lock_pid(fd), path.parent.name))
        finally:
            os.close(fd)  # closing drops the probe's own shared lock, if it got one
    return out


def resolve_run_id(state_dir: Path, requested: str | None, resume: bool, new_id: Callable[[], str]) -> str:
    """The run to record into, claimed (:func:`claim_run`) for this process: ``--run-id``, else
    (when resuming) the state dir's unfinished run named in ``current-run``, else a new id.
    StateError when another soakd is recording that run."""
    run_id = requested or (_current_run(state_dir) if resume else "") or new_id()
    claim_run(state_dir, run_id)
    return run_id


def _current_run(state_dir: Path) -> str:
    try:
        current = (state_dir / CURRENT_RUN).read_text().strip()
    except OSError:
        return ""
    try:
        return check_run_id(current, f"{state_dir / CURRENT_RUN}")
    except ConfigError:  # an edited marker is not a path to write reports to
        log.warning("%s: ignoring %r: not a run id", state_dir / CURRENT_RUN, current)
        return ""
