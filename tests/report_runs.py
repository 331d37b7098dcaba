"""Real ``soakd run`` subprocesses shared by the report, SLO and compare tests.

Each named run happens once per test session (the first test that asks starts every run it
needs at once, in parallel: builtin:sleep barely uses the CPU), in its own state dir.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO, soakd_cmd

# Short status ticks and state windows, so a few seconds give several windows to resample.
_COMMON = """
[model]
spec = "builtin:sleep"
warmup = 5
[metrics]
status_interval = "1s"
[state]
flush_interval = "1s"
window = "1s"
[memory]
interval = "0.5s"
"""

CONFIGS = {
    # Lenient SLOs a 2 ms model meets on any machine.
    "fast": (
        """
[model.options]
batch_ms = 2.0
[slo]
p99_ms = 5000
max_error_ratio = 0.01
min_throughput_rps = 1
no_leak = ["host_rss"]
[slo.stage_p99_ms]
inference = 5000
""",
        "6s",
    ),
    # The same model made four times slower per batch.
    "slow": (
        """
[model.options]
batch_ms = 8.0
""",
        "6s",
    ),
    # An unmeetable p99.
    "strict": (
        """
[model.options]
batch_ms = 2.0
[slo]
p99_ms = 0.001
""",
        "3s",
    ),
}


@dataclass
class Run:
    name: str
    rc: int
    stdout: str
    stderr: str
    state_dir: Path
    summary_path: Path
    config_path: Path

    @property
    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.summary_path.read_text())
        return data

    @property
    def run_id(self) -> str:
        return str(self.summary["run"]["run_id"])

    @property
    def report_path(self) -> Path:
        m = re.search(r"^report: (.+)$", self.stdout, re.MULTILINE)
        assert m, f"no report path printed:\n{self.stdout}\n{self.stderr}"
        path = Path(m.group(1))
        return path if path.is_absolute() else REPO / path

    def describe(self) -> str:
        return f"soakd run ({self.name}) exited {self.rc}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-4000:]}"


_RUNS: dict[str, Run] = {}
_BASE: list[Path] = []


def runs(*names: str) -> dict[str, Run]:
    """The named runs. The first call starts every run at once (they overlap well), so a
    session pays for them once, whichever test asks first."""
    if not _BASE:
        _BASE.append(Path(tempfile.mkdtemp(prefix="soakd-report-runs-")))
    base = _BASE[0]
    todo = [n for n in CONFIGS if n not in _RUNS]
    procs = []
    for name in todo:
        extra, duration = CONFIGS[name]
        folder = base / name
        folder.mkdir()
        cfg = folder / "soak.toml"
        cfg.write_text(_COMMON + extra)
        state, summary = folder / "state", folder / "summary.json"
        cmd = soakd_cmd(
            "run",
            "--config",
            str(cfg),
            "--duration",
            duration,
            "--state-dir",
            str(state),
            "--summary-json",
            str(summary),
            "--metrics-addr",
            "127.0.0.1:0",
        )
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append((name, proc, state, summary, cfg))
    for name, proc, state, summary, cfg in procs:
        out, err = proc.communicate(timeout=300)
        _RUNS[name] = Run(name, proc.returncode, out, err, state, summary, cfg)
    return {n: _RUNS[n] for n in names}


def soakd(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(soakd_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=300)
