"""Limits with reasons: every number a user can type has a bound, and a config that breaks one
(or is not a config at all) is exit 2 with one line naming the key or file, the value and the
bound, from `check-config` and from `run` alike, before anything is loaded or allocated."""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from apscheduler.triggers.cron import CronTrigger

from soakd.config import MAX_RATE, ConfigError, format_bytes, load_config, parse_duration
from soakd.specs import check_crontab
from tests.conftest import soakd_cmd

HALF_RAM = format_bytes(psutil.virtual_memory().total // 2)


def check(tmp_path: Path, text: str | bytes, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "soak.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return subprocess.run(soakd_cmd("check-config", *flags, str(path)), capture_output=True, text=True, timeout=60)


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        soakd_cmd("run", "--model", "builtin:noop", "--duration", "1s", "--metrics-addr", "127.0.0.1:0", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The process exited 2 with one error line holding every needle, and no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in line, line
    return line


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (("--rate", "1e12"), ("load.rate", "1e+12", f"{MAX_RATE:g}")),
        (("--rate", "inf"), ("load.rate", "finite")),
        (("--rate", "nan"), ("load.rate", "finite")),
        (("--rate", "100", "--arrival", "gamma", "--burstiness", "1e300"), ("load.burstiness", "1e+300", "100")),
        (("--concurrency", "1000000000"), ("load.concurrency", "1000000000", HALF_RAM)),
        (("--duration", "999999999999d"), ("load.duration", "999999999999d", "10 years")),
        (("--duration", "inf"), ("load.duration",)),
        (("--max-queue-delay-ms", "inf"), ("batcher.max_queue_delay_ms", "finite")),
        (("--max-queue-delay-ms", "1e9"), ("batcher.max_queue_delay_ms", "daemon.stall_timeout")),
        (("--input-shapes", "0"), ("input.shapes", "positive", "'0'")),
        (("--input-shapes", "0x5"), ("input.shapes", "'0x5'")),
        (("--input-shapes", "100000x100000x100000"), ("input.shapes", "100000x100000x100000", HALF_RAM)),
        (("--input-shapes", "3xabc"), ("input.shapes", "3xabc")),
        (("--input-shapes", "seq:fixed(n=1e300)"), ("input.shapes", HALF_RAM)),
        (("--warmup", "9" * 30), ("model.warmup", "64-bit")),
        (("--memory-interval", "1us"), ("memory.interval", "1ms")),
        (("--memory-interval", "50ms"), ("memory.interval", "0.1s")),
    ],
)
def test_run_refuses_a_number_past_its_bound(flags: tuple[str, ...], needles: tuple[str, ...]) -> None:
    """`soakd run` with an out-of-bound flag exits 2 at once, naming the key, the value and the bound."""
    refused(run(*flags), *needles)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[batcher]\nmax_queue_delay_ms = inf\n", ("batcher.max_queue_delay_ms", "finite")),
        ("[load]\nduration = 1979-05-27T07:32:00Z\n", ("load.duration", "TOML date/time")),
        ("[load]\nduration = 07:32:00\n", ("load.duration", "TOML date/time")),
        ("[state]\nretention = '999999999999d'\n", ("state.retention", "10 years")),
        ("[load]\nseed = -1\n", ("load.seed",)),
        ("[compare]\nresamples = 1000000000000\n", ("compare.resamples", "1e+06")),
        ("[phases]\nprobe_schedule = '61 * * * *'\n", ("phases.probe_schedule", "minute")),
        ("[slo]\np99_ms = nan\n", ("slo.p99_ms", "finite")),
        (
            "[load]\nrate = 900000\n[phases]\nprobe_factor = 4\nprobe_schedule = '0 * * * *'\n",
            ("phases.probe_factor", f"{MAX_RATE:g}"),
        ),
    ],
)
def test_check_config_refuses_a_number_past_its_bound(tmp_path: Path, text: str, needles: tuple[str, ...]) -> None:
    """`soakd check-config` refuses what `run` would, with the same one line naming key, value and bound."""
    refused(check(tmp_path, text), *needles)


HOST_BOUND = [
    ("[input]\npool = 100000000\n", ("input.pool", "100000000", HALF_RAM)),
    ("[batcher]\ninstances = 40000\n", ("batcher.instances", "40000", f"{max(8, 4 * (os.cpu_count() or 1))}")),
    (
        "[batcher]\nmax_batch_size = 100000000000\n[input]\nshapes = '3x224x224'\n",
        ("batcher.max_batch_size", HALF_RAM),
    ),
    ("[load]\nrate = 100\nmax_inflight = 100000000000\n", ("load.max_inflight", HALF_RAM)),
    ("[memory]\nring_size = 1000000000000\n", ("memory.ring_size", HALF_RAM)),
]


@pytest.mark.parametrize(("text", "needles"), HOST_BOUND)
def test_host_bounds_are_checked_on_the_host_not_in_the_file(
    tmp_path: Path, text: str, needles: tuple[str, ...]
) -> None:
    """A file is judged the same on every machine: `check-config` accepts settings that no RAM or
    core count of a host could refuse by themselves; `check-config --host` (and `run`'s preflight)
    refuse what this host cannot hold, naming key, value and this host's bound."""
    ok = check(tmp_path, text)
    assert ok.returncode == 0 and "ok" in ok.stdout, ok.stderr
    refused(check(tmp_path, text, "--host"), *needles)


def test_a_shape_too_large_for_memory_is_refused_before_allocation(tmp_path: Path) -> None:
    """A tensor that cannot fit is refused in well under a second: nothing was allocated first."""
    proc = run("--input-shapes", "100000x100000x100000", timeout=30)
    line = refused(proc, "input.shapes")
    assert "PiB" in line  # 4e15 bytes: the size is computed, not attempted


def test_the_largest_allowed_settings_still_pass(tmp_path: Path) -> None:
    """The bounds are bounds, not new defaults: settings at the limit are accepted."""
    proc = check(
        tmp_path,
        f"[load]\nrate = {MAX_RATE:g}\nburstiness = 100.0\narrival = 'gamma'\n"
        "duration = '3650d'\n[batcher]\nmax_queue_delay_ms = 59000\n",
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- files that are not configs


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (bytes(range(256)) * 40, "not a text file"),
        (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
        (b"[load\n", "not valid TOML"),
    ],
    ids=["binary", "deep-array", "broken-toml"],
)
def test_a_file_that_is_no_config_is_one_line_naming_it(tmp_path: Path, content: bytes, needle: str) -> None:
    """Binary garbage, a 5000-deep array and broken TOML: exit 2, one line with the file and why."""
    line = refused(check(tmp_path, content), "soak.toml", needle)
    assert len(line) < 300
    proc = subprocess.run(
        soakd_cmd("run", "--config", str(tmp_path / "soak.toml")), capture_output=True, text=True, timeout=60
    )
    refused(proc, "soak.toml", needle)


def test_a_huge_file_is_not_read_whole(tmp_path: Path) -> None:
    """A config larger than 4 MiB (a wrong path to a data file, say) is refused without parsing it."""
    big = tmp_path / "soak.toml"
    big.write_bytes(b"# " + b"x" * (5 * 1024 * 1024) + b"\n")
    proc = subprocess.run(soakd_cmd("check-config", str(big)), capture_output=True, text=True, timeout=60)
    refused(proc, "soak.toml", "4 MiB")


def test_parse_duration_refuses_what_timers_cannot_hold() -> None:
    """inf, nan, TOML dates and more than ten years are ValueErrors; ordinary durations parse."""
    assert parse_duration("1h30m") == 5400.0
    for bad in (float("inf"), float("nan"), "999999999999d", datetime.date(2020, 1, 1), [1]):
        with pytest.raises(ValueError):
            parse_duration(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- run ids


@pytest.mark.parametrize("run_id", ["..", "../escape", "/tmp/abs", "a/b", ".hidden", "-flag", "x" * 200, "a..b"])
def test_a_run_id_is_a_name_not_a_path(tmp_path: Path, run_id: str) -> None:
    """`--run-id` that could leave the state dir (or hide in it) is exit 2 before anything is written."""
    proc = run(f"--run-id={run_id}", "--state-dir", str(tmp_path / "state"))
    refused(proc, "state.run_id")
    assert not (tmp_path / "state").exists()


def test_a_run_id_with_dots_dashes_and_underscores_is_fine(tmp_path: Path) -> None:
    """Ordinary names pass: letters, digits, '-', '_', '.'."""
    assert load_config(None, {"state.run_id": "resnet-50_a100.v2"}).state.run_id == "resnet-50_a100.v2"


# --------------------------------------------------------------------------- flags checked at start


def test_metrics_addr_accepts_an_ipv6_address_in_brackets(tmp_path: Path) -> None:
    """`--metrics-addr '[::1]:0'` listens on IPv6 loopback and the run completes."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    proc = subprocess.run(
        soakd_cmd("run", "--model", "builtin:noop", "--duration", "1s", "--warmup", "1", "--metrics-addr", "[::1]:0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "http://[::1]:" in proc.stderr


@pytest.mark.parametrize(
    ("addr", "needles"),
    [
        ("::1:9464", ("metrics.addr", "brackets")),
        ("nosuch-host.invalid:9464", ("metrics.addr", "nosuch-host.invalid", "cannot resolve")),
        ("192.0.2.1:9464", ("metrics.addr", "192.0.2.1", "not an address of this host")),
        ("127.0.0.1:70000", ("metrics.addr", "port")),
    ],
)
def test_metrics_addr_that_cannot_be_listened_on_is_refused(addr: str, needles: tuple[str, ...]) -> None:
    """An ambiguous, unknown or foreign address (192.0.2.1 is TEST-NET) is exit 2 before loading."""
    refused(run("--metrics-addr", addr), *needles)


def test_a_wildcard_metrics_addr_is_allowed_with_a_warning(tmp_path: Path) -> None:
    """0.0.0.0 (a fleet's Prometheus scrapes from elsewhere) runs, and says it is reachable from other hosts."""
    proc = subprocess.run(
        soakd_cmd("run", "--model", "builtin:noop", "--duration", "1s", "--warmup", "1", "--metrics-addr", "0.0.0.0:0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "reachable from other hosts" in proc.stderr


def test_log_file_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    """`--log-file` under a folder that does not exist: exit 2 from check-config and run alike."""
    refused(run("--log-file", str(tmp_path / "nope" / "soakd.log")), "output.log_file", "does not exist")
    refused(check(tmp_path, f"[output]\nlog_file = '{tmp_path / 'nope' / 'x.log'}'\n"), "output.log_file")


def _read_only(path: Path) -> list[str] | None:
    """A command prefix that runs with ``path`` bind-mounted read-only (root in a private mount
    namespace), or None where that is not possible here."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return None
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", f"mount --bind -o ro '{path}' '{path}'"], capture_output=True, timeout=30
    )
    return (
        None
        if probe.returncode
        else [unshare, "-m", "sh", "-c", f"mount --bind -o ro '{path}' '{path}' && exec \"$@\"", "sh"]
    )


def test_an_unwritable_summary_path_is_found_at_start(tmp_path: Path) -> None:
    """`--summary-json` in a read-only folder is exit 2 before the run, not after a whole soak."""
    out = tmp_path / "out"
    out.mkdir()
    prefix = _read_only(out)
    if prefix is None and os.geteuid() == 0:
        pytest.skip("root without a private mount namespace: nothing here is unwritable")
    if prefix is None:
        out.chmod(0o500)
        prefix = []
    cmd = [
        *prefix,
        *soakd_cmd(
            "run",
            "--model",
            "builtin:noop",
            "--duration",
            "30s",
            "--metrics-addr",
            "127.0.0.1:0",
            "--summary-json",
            str(out / "s.json"),
            "--state-dir",
            str(tmp_path / "state"),
        ),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    line = refused(proc, "output.summary_json", str(out / "s.json"))
    assert "Read-only" in line or "Permission" in line
    assert not (tmp_path / "state").exists()  # refused before the state dir was even made


# --------------------------------------------------------------------------- crontab


@pytest.mark.parametrize(
    "expr",
    [
        "0 * * * *",
        "*/15 * * * *",
        "0 9-17 * * mon-fri",
        "30 2 1 jan,jul *",
        "0 0 1-31/2 * *",
        "5,10,15 0 * * sun",
        "0 0 * * 0-6",
        "59 23 31 12 6",
    ],
)
def test_crontab_lines_apscheduler_accepts_are_accepted(expr: str) -> None:
    """The config's own crontab check accepts what the probe scheduler (APScheduler) accepts."""
    CronTrigger.from_crontab(expr)
    check_crontab(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * * 13 *",
        "* * * * 7",
        "* * * *",
        "* * * * * *",
        "*/0 * * * *",
        "5-1 * * * *",
        "* * * foo *",
        "a * * * *",
    ],
)
def test_crontab_lines_apscheduler_refuses_are_refused(expr: str) -> None:
    """And refuses what APScheduler refuses, so a schedule check-config passed never fails at run time."""
    with pytest.raises(ValueError):
        CronTrigger.from_crontab(expr)
    with pytest.raises(ValueError):
        check_crontab(expr)


# --------------------------------------------------------------------------- layering


def test_config_imports_nothing_above_it() -> None:
    """Importing soakd.config pulls in only its own modules, errors, names and specs: no torch,
    numpy, scheduler or other soakd module, so `check-config` and `analyze` stay light and no
    import cycle can form."""
    code = (
        "import sys, soakd.config; print(sorted(m for m in sys.modules if m.startswith(('soakd', 'torch', "
        "'numpy', 'apscheduler', 'prometheus_client'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = eval(out.stdout)
    assert "soakd.config.schema" in loaded  # the package's own modules load with it ...
    outside = [m for m in loaded if not m.startswith("soakd.config.")]
    assert outside == ["soakd", "soakd.config", "soakd.errors", "soakd.names", "soakd.specs"]  # ... and nothing else


def test_config_error_is_still_importable_from_config() -> None:
    """`from soakd.config import ConfigError` keeps working: it is soakd.errors' type."""
    from soakd.errors import ConfigError as FromErrors

    assert ConfigError is FromErrors
