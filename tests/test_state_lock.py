"""One writer per run: a second soakd on a run that is being recorded refuses (exit 2, naming the
holder's pid), a live soak's locked database is never moved aside, and `soakd report` on state it
cannot read is exit 2 naming the file, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from soakd.state import DB_NAME
from tests.conftest import soakd_cmd

NOOP = ("--model", "builtin:noop", "--warmup", "1", "--concurrency", "2")


def soakd_run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        soakd_cmd("run", *NOOP, "--metrics-addr", "127.0.0.1:0", *args), capture_output=True, text=True, timeout=timeout
    )


def segments(state: Path, run_id: str) -> list[tuple[int, int]]:
    with sqlite3.connect(f"file:{state / DB_NAME}?mode=ro", uri=True) as conn:
        return [
            (int(a), int(b))
            for a, b in conn.execute("SELECT id, pid FROM segments WHERE run_id = ? ORDER BY id", (run_id,))
        ]


def test_a_second_soakd_on_a_live_run_refuses_naming_the_holder(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Same --run-id while the first still runs: exit 2 naming its pid; the first keeps its one segment."""
    state = tmp_path / "state"
    first = daemon_factory(*NOOP, "--state-dir", str(state), "--run-id", "r1", "--duration", "60s")
    first.wait_ready()
    second = soakd_run("--state-dir", str(state), "--run-id", "r1", "--duration", "5s")
    assert second.returncode == 2, second.stderr
    assert "Traceback" not in second.stderr
    assert f"pid {first.proc.pid}" in second.stderr and "r1" in second.stderr
    assert first.proc.poll() is None  # untouched
    assert first.stop() == 0, first.output()
    assert [pid for _, pid in segments(state, "r1")] == [first.proc.pid]


def test_two_runs_share_a_state_dir(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Different run ids in one state dir both record: the lock is per run, not per folder."""
    state = tmp_path / "state"
    first = daemon_factory(*NOOP, "--state-dir", str(state), "--run-id", "a", "--duration", "60s")
    first.wait_ready()
    second = soakd_run("--state-dir", str(state), "--run-id", "b", "--duration", "1s")
    assert second.returncode == 0, second.stderr
    assert first.stop() == 0
    assert len(segments(state, "a")) == 1 and len(segments(state, "b")) == 1


def test_a_live_soaks_locked_database_is_not_moved_aside(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A database locked past the wait while another soakd records in the dir: the newcomer exits 2
    and leaves the file where it is; the live soak keeps its history and writes its report."""
    state = tmp_path / "state"
    live = daemon_factory(*NOOP, "--state-dir", str(state), "--run-id", "live", "--duration", "60s")
    live.wait_ready()
    holder = sqlite3.connect(state / DB_NAME, isolation_level=None, timeout=30)
    holder.execute("BEGIN EXCLUSIVE")  # a long transaction, as a slow disk or a 10-minute upkeep makes
    try:
        newcomer = soakd_run("--state-dir", str(state), "--run-id", "other", "--duration", "2s")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert newcomer.returncode == 2, newcomer.stderr
    assert f"pid {live.proc.pid}" in newcomer.stderr and "not moving" in newcomer.stderr
    assert not list(state.glob(f"{DB_NAME}.*-*"))  # nothing moved aside
    assert live.stop() == 0, live.output()
    report = json.loads(
        subprocess.run(
            soakd_cmd("report", "--state-dir", str(state), "--run-id", "live"),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert report["requests"]["ok"] > 0 and len(report["segments"]) == 1
    assert (state / "live" / "report.html").is_file()


def test_kill_9_releases_the_run_for_a_restart(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The lock dies with its process: after kill -9 the same run id resumes as a second segment."""
    state = tmp_path / "state"
    first = daemon_factory(*NOOP, "--state-dir", str(state), "--run-id", "r1", "--duration", "60s")
    first.wait_ready()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    again = soakd_run("--state-dir", str(state), "--run-id", "r1", "--duration", "1s")
    assert again.returncode == 0, again.stderr
    assert len(segments(state, "r1")) == 2


def test_a_corrupt_database_with_no_live_soak_is_still_moved_aside(tmp_path: Path) -> None:
    """What held: a truly corrupt file (no soakd holds the dir) is moved aside and the run goes on."""
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_NAME).write_bytes(os.urandom(8192))
    proc = soakd_run("--state-dir", str(state), "--run-id", "r1", "--duration", "1s")
    assert proc.returncode == 0, proc.stderr
    assert "is corrupt" in proc.stderr and list(state.glob(f"{DB_NAME}.corrupt-*"))


# --------------------------------------------------------------------------- soakd report on bad state


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir holding one short finished run, r1."""
    state = tmp_path_factory.mktemp("recorded") / "state"
    proc = soakd_run("--state-dir", str(state), "--run-id", "r1", "--duration", "1s")
    assert proc.returncode == 0, proc.stderr
    return state


def report(state: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, *soakd_cmd("report", "--state-dir", str(state), *args)], capture_output=True, text=True, timeout=60
    )


def damaged_copy(recorded: Path, tmp_path: Path, damage: str) -> Path:
    state = tmp_path / "copy"
    shutil.copytree(recorded, state)
    db = state / DB_NAME
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    return state


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("fmt", ["json", "html", "md"])
def test_report_on_a_damaged_database_names_it(recorded: Path, tmp_path: Path, damage: str, fmt: str) -> None:
    """A truncated or garbage soakd.db: exit 2, one line naming the file, in every format."""
    state = damaged_copy(recorded, tmp_path, damage)
    proc = report(state, "--format", fmt)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(state / DB_NAME) in proc.stderr.strip().splitlines()[-1]


def test_report_on_a_read_only_mount_names_the_file(recorded: Path, tmp_path: Path) -> None:
    """A state dir on a read-only mount (SQLite cannot make its -shm file): exit 2 naming the database."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a private read-only bind mount")
    state = tmp_path / "ro"
    shutil.copytree(recorded, state)
    for extra in state.glob(f"{DB_NAME}-*"):
        extra.unlink()
    mount = ("unshare", "-m", "sh", "-c", f"mount --bind -o ro '{state}' '{state}' && exec \"$@\"", "sh")
    probe = subprocess.run([*mount, "true"], capture_output=True, timeout=30)
    if probe.returncode:
        pytest.skip(f"cannot bind-mount read-only here: {probe.stderr.decode().strip()}")
    proc = report(state, prefix=mount)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(state / DB_NAME) in proc.stderr
    out = report(recorded, "--output", str(state / "r.json"), prefix=mount)
    assert out.returncode == 2 and "--output" in out.stderr and "Traceback" not in out.stderr


def test_report_on_an_unreadable_state_dir_names_the_file(recorded: Path, tmp_path: Path) -> None:
    """A state dir this user cannot read (mode 000; root runs without its file-permission override)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        pytest.skip("root without setpriv: permissions do not apply")
    prefix = (setpriv, "--bounding-set=-dac_override,-dac_read_search") if os.geteuid() == 0 and setpriv else ()
    state = tmp_path / "locked"
    shutil.copytree(recorded, state)
    (state / DB_NAME).chmod(0)
    try:
        proc = report(state, prefix=prefix)
    finally:
        (state / DB_NAME).chmod(0o600)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(state / DB_NAME) in proc.stderr


def test_report_writes_its_output_private(recorded: Path, tmp_path: Path) -> None:
    """`report --output` files are 0600, like the summary: they hold the run's config and host."""
    for fmt in ("json", "html", "md"):
        out = tmp_path / f"r.{fmt}"
        proc = report(recorded, "--format", fmt, "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        assert out.stat().st_mode & 0o777 == 0o600
    assert (recorded / "r1" / "report.html").stat().st_mode & 0o777 == 0o600
