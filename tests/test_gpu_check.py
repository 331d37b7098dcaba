"""bench/gpu_check.sh: its dry mode on this CPU machine (what CI runs, so the script cannot rot),
its per-step timeouts and report, and the soakd commands and configs its GPU steps would run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest

from bench.gpu import check as gpu_check
from bench.gpu import steps as gpu_steps
from soakd.config import load_config
from soakd.models.loader import load_model
from soakd.telemetry.catalogue import Metrics
from tests.conftest import REPO

STEP_NAMES = [s.name for s in gpu_check.STEPS]


def test_dry_run_skips_every_step_and_writes_its_report(tmp_path: Path) -> None:
    """Without CUDA: exit 0, one 'STEP: skipped: no CUDA' line per step, JSON and Markdown saying so."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    if torch.cuda.is_available():  # a GPU host: still the dry mode, not the 8-minute check
        env["SOAKD_GPU_CHECK_NO_CUDA"] = "1"
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    skipped = [line for line in lines if "skipped: no CUDA" in line]
    assert skipped == [f"{name}: skipped: no CUDA" for name in STEP_NAMES]
    assert len(STEP_NAMES) == 6  # steps 1-6 of the issue; step 7 is the report itself
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["cuda"] is False
    assert [(s["name"], s["status"]) for s in report["steps"]] == [(n, "skipped") for n in STEP_NAMES]
    assert all(s["reason"].startswith("no CUDA") for s in report["steps"])
    md = (out / "gpu_check.md").read_text()
    for name in STEP_NAMES:
        assert re.search(rf"^\| {name} \| skipped \|.*\| no CUDA", md, re.M), name
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]


def test_the_script_refuses_a_missing_out_folder() -> None:
    """No OUT argument: usage on stderr, exit 2."""
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh")], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage: bash bench/gpu_check.sh OUT_DIR" in proc.stderr


def test_an_unknown_step_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([str(tmp_path), "--steps", "env,bogus"]) == 2
    assert "--steps: unknown step 'bogus'" in capsys.readouterr().err


def _script(tmp_path: Path, name: str, code: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    return [sys.executable, str(path)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state


@pytest.mark.e2e  # the code under test starts a process
def test_a_step_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    """The step and the process it started are both gone soon after the timeout; status timeout."""
    pidfile = tmp_path / "child.pid"
    argv = _script(
        tmp_path,
        "stuck",
        (
            "import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
            "print('started', flush=True)\n"
            "time.sleep(120)\n"
        ),
    )
    t0 = time.monotonic()
    rec = gpu_check.run_step("stuck", argv, 2.0, tmp_path / "stuck.log", tmp_path / "stuck.json")
    assert time.monotonic() - t0 < 2.0 + 2 * gpu_check.KILL_GRACE_S
    assert rec["status"] == "timeout" and rec["rc"] is None and "killed after 2 s" in rec["reason"]
    assert "started" in (tmp_path / "stuck.log").read_text()
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


@pytest.mark.e2e  # the code under test starts a process
def test_a_failing_and_a_stuck_step_are_recorded_and_the_next_steps_still_run(tmp_path: Path) -> None:
    """Statuses timeout, failed (exit 1), failed (a false check), passed; exit 1; one log section each."""
    steps = [
        gpu_check.Step("stuck", "a step that hangs", 1.5),
        gpu_check.Step("crash", "a step that exits 1", 10),
        gpu_check.Step("claim", "a step whose check fails", 10),
        gpu_check.Step("good", "a step that passes", 10),
    ]
    codes = {
        "stuck": "import time; time.sleep(60)",
        "crash": "import sys; print('boom'); sys.exit(1)",
        "claim": (
            "import json, sys; json.dump({'figures': {'x': 1}, 'checks': {'x is 2': False}}, open(sys.argv[1], 'w'))"
        ),
        "good": (
            "import json, sys; json.dump({'figures': {'rps': 12.5, 'nested': {'a': [1, 2]}}, "
            "'checks': {'fast enough': True}}, open(sys.argv[1], 'w'))"
        ),
    }

    def argv_for(step: gpu_check.Step, out: Path, work: Path, result: Path) -> list[str]:
        return [*_script(tmp_path, step.name, codes[step.name]), str(result)]

    out = tmp_path / "out"
    assert gpu_check.run_steps(steps, out, 60.0, True, "", argv_for) == 1
    report = json.loads((out / "gpu_check.json").read_text())
    got = {s["name"]: (s["status"], s["reason"]) for s in report["steps"]}
    assert got["stuck"][0] == "timeout"
    assert got["crash"] == ("failed", "exit 1")
    assert got["claim"] == ("failed", "check failed: x is 2")
    assert got["good"] == ("passed", None)
    good = report["steps"][3]
    assert good["figures"] == {"rps": 12.5, "nested": {"a": [1, 2]}}
    log = (out / "gpu_check.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("=====")] == [f"===== {s.title} =====" for s in steps]
    assert "boom" in log
    md = (out / "gpu_check.md").read_text()
    assert "| good | rps | 12.5 |" in md and "| good | nested.a | 1, 2 |" in md
    assert "| claim | x is 2 | no |" in md


@pytest.mark.e2e  # the code under test starts a process
def test_the_report_is_written_after_every_step(tmp_path: Path) -> None:
    """The second step reads gpu_check.json as the first left it: a call killed mid-way still
    brings back every finished step. Time spent before the steps (the probe) counts in the budget."""
    out = tmp_path / "out"
    steps = [gpu_check.Step("first", "passes", 10), gpu_check.Step("second", "reads the report", 10)]
    codes = {
        "first": "import json, sys; json.dump({'figures': {'x': 1}, 'checks': {}}, open(sys.argv[1], 'w'))",
        "second": (
            "import json, sys; r = json.load(open(sys.argv[2])); "
            "ok = [s['name'] for s in r['steps']] == ['first'] and r['steps'][0]['status'] == 'passed'; "
            "json.dump({'figures': {}, 'checks': {'first step on disk': ok}}, open(sys.argv[1], 'w'))"
        ),
    }

    def argv_for(step: gpu_check.Step, out_: Path, work: Path, result: Path) -> list[str]:
        return [*_script(tmp_path, step.name, codes[step.name]), str(result), str(out / "gpu_check.json")]

    assert gpu_check.run_steps(steps, out, 60.0, True, "", argv_for) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    assert [s["status"] for s in report["steps"]] == ["passed", "passed"]
    spent = gpu_check.run_steps(steps[:1], tmp_path / "late", 5.0, True, "", argv_for, started=time.monotonic() - 4.0)
    late = json.loads((tmp_path / "late" / "gpu_check.json").read_text())
    assert spent == 0 and late["steps"][0]["status"] == "skipped" and late["steps"][0]["reason"] == "budget spent"


@pytest.mark.e2e  # the code under test starts a process
def test_steps_past_the_budget_are_skipped_not_started(tmp_path: Path) -> None:
    """A budget spent by the first step: the next is skipped with that reason."""
    steps = [gpu_check.Step("slow", "sleeps", 30), gpu_check.Step("next", "never starts", 30)]

    def argv_for(step: gpu_check.Step, out: Path, work: Path, result: Path) -> list[str]:
        return _script(tmp_path, step.name, "import time; time.sleep(60)")

    t0 = time.monotonic()
    assert gpu_check.run_steps(steps, tmp_path / "out", 6.0, True, "", argv_for) == 1
    assert time.monotonic() - t0 < 6.0 + 2 * gpu_check.KILL_GRACE_S
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [(s["status"], s["reason"]) for s in report["steps"]][1] == ("skipped", "budget spent")
    assert report["steps"][0]["timeout_seconds"] == 6.0


def test_the_markdown_holds_the_batch_table_beside_the_article_and_every_figure() -> None:
    """Batch rows with the seed article's own figures where it gave them; every other figure flattened."""
    row = {
        "max_batch_size": 4,
        "concurrency": 8,
        "soakd_rps": 1800.5,
        "soakd_p50_ms": 1.1,
        "soakd_p99_ms": 3.2,
        "mean_batch": 3.9,
        "torch_reserved_peak_mib": 210.0,
        "nvml_process_peak_mib": None,
        "nvml_device_used_peak_mib": 230.0,
        "bottleneck": "model-bound",
        "stable": True,
        "offline_img_per_s": 1900.0,
        "seed_img_per_s": 1500.0,
        "seed_p99_ms": 2.5,
        "soakd_over_offline": 0.948,
    }
    report = {
        "cuda": True,
        "gpu": {"name": "NVIDIA H200"},
        "steps": [
            {
                "name": "table",
                "status": "passed",
                "checks": {"every batch size measured": True},
                "figures": {"batch_table": [row, {**row, "max_batch_size": 16}], "knee": 8},
            },
            {
                "name": "costs",
                "status": "passed",
                "figures": {"calls_us": {"torch.cuda.memory_stats()": {"median": 4.25}}, "note": "a|b"},
            },
        ],
    }
    md = gpu_check.render_markdown(report)
    assert md.startswith("# soakd GPU check: NVIDIA H200")
    same = "| 8 | 1800 | 1.1 | 3.2 | 3.9 | 210 | – | 230 | model-bound | yes | 1900 | 1500 | 2.5 | 0.948 |"
    assert f"| 4 {same} 180 / 22.1 / 2.1 |" in md  # the article's BS4 row beside ours
    assert f"| 16 {same} – |" in md  # the article gave no BS16
    assert "| table | knee | 8 |" in md
    assert "| costs | calls_us.torch.cuda.memory_stats().median | 4.25 |" in md
    assert "| costs | note | a\\|b |" in md
    assert "batch_table" not in md.split("## Every figure")[1]


def test_the_soak_and_fixture_configs_are_valid_soakd_configs(tmp_path: Path) -> None:
    """Every config the GPU steps hand to soakd run passes soakd's own validation."""
    configs = {**gpu_steps.soak_configs(), "fixtures": gpu_steps.fixtures_config(tmp_path / "rec")}
    for name, text in configs.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        cfg = load_config(path, {})
        assert cfg.model.device == "cuda", name
    assert load_config(tmp_path / "oom_empty_cache_on.toml", {}).batcher.empty_cache_on_oom is True
    assert load_config(tmp_path / "oom_empty_cache_off.toml", {}).batcher.empty_cache_on_oom is False


def test_the_sweep_and_run_commands_use_flags_soakd_has(tmp_path: Path) -> None:
    """Each --flag of the planned soakd sweep and soakd run commands is in that command's --help."""
    for cmd in (
        gpu_steps.sweep_cmd(tmp_path, gpu_steps.BATCHES, 5.0),
        gpu_steps.run_cmd(tmp_path / "c.toml", 9999, tmp_path / "state", tmp_path / "s.json"),
    ):
        sub = cmd[3]
        helptext = subprocess.run([*cmd[:4], "--help"], capture_output=True, text=True, timeout=60).stdout
        flags = [a for a in cmd if a.startswith("--")]
        assert flags and all(f in helptext for f in flags), (sub, [f for f in flags if f not in helptext])


def test_the_sweep_log_lines_that_mark_steps_are_the_ones_soakd_sweep_writes(tmp_path: Path) -> None:
    """A real two-step CPU sweep: one start line, then one line per step (NVML's per-step peaks hang on them)."""
    cmd = [a if a != "cuda" else "cpu" for a in gpu_steps.sweep_cmd(tmp_path, [1, 2], 1.0)]
    cmd = [a if a != gpu_steps.SHAPE else "3x8x8" for a in cmd]
    cmd += ["--warmup", "2", "--window", "0.5s"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    markers = [m for line in (proc.stdout + proc.stderr).splitlines() if (m := gpu_steps.sweep_marker(line))]
    assert markers == ["start", "step", "step"]
    steps = json.loads((tmp_path / "sweep.json").read_text())["steps"]
    assert [s["max_batch_size"] for s in steps] == [1, 2]
    read = {
        "max_batch_size",
        "concurrency",
        "throughput_rps",
        "p50_ms",
        "p99_ms",
        "mean_batch_size",
        "peak_gpu_memory_bytes",
        "bottleneck",
        "stable",
    }  # what step_table reads from each step
    assert read <= set(steps[0]), sorted(read - set(steps[0]))


def test_the_metrics_the_soaks_read_are_ones_soakd_exports() -> None:
    """Every soakd_* name the soaks read from /metrics (Soak.series/last) is in soakd's catalogue."""
    wanted = set(re.findall(r'(?:series|last)\(\s*"(soakd_[a-z_]+)"', Path(gpu_steps.__file__).read_text()))
    exported = set()
    for family in Metrics().registry.collect():
        exported |= {family.name, family.name + "_total"}
    assert wanted and wanted <= exported, sorted(wanted - exported)


def test_metrics_are_read_back_from_a_real_exposition() -> None:
    """parse_metrics/metric find a labelled gauge in prometheus_client's own text output."""
    m = Metrics()
    m.cuda_fragmentation.labels("cuda:0", "inactive_split").set(0.25)
    m.cuda_fragmentation.labels("cuda:0", "reserved_unallocated").set(0.5)
    samples = gpu_steps.parse_metrics(generate_latest(m.registry).decode())
    assert gpu_steps.metric(samples, "soakd_torch_cuda_fragmentation_ratio", kind="inactive_split") == 0.25
    assert gpu_steps.metric(samples, "soakd_torch_cuda_fragmentation_ratio", kind="reserved_unallocated") == 0.5
    assert gpu_steps.metric(samples, "soakd_torch_cuda_fragmentation_ratio", kind="other") is None


def test_the_planted_oom_model_loads_through_soakd_and_runs_on_cpu() -> None:
    """python:bench.gpu.models:planted_oom loads with its options; on a CPU it never plants an OOM."""
    model = load_model("python:bench.gpu.models:planted_oom", "cpu", options={"every": 2, "after": 0})
    import torch

    for _ in range(4):
        assert model.fn(torch.zeros(2, 3, 8, 8)).shape == (2, 10)


def test_the_nvidia_smi_excerpt_keeps_versions_and_memory() -> None:
    text = (
        "==============NVSMI LOG==============\nDriver Version                            : 580.159.03\n"
        "CUDA Version                              : 13.0\n"
        "    Product Name                          : NVIDIA H200\n"
        "    Serial Number                         : 1234\n    FB Memory Usage\n"
        "        Total                             : 143771 MiB\n"
    )
    got = gpu_steps.nvidia_smi_excerpt(text)
    assert [line.split(":")[0].strip() for line in got] == ["Driver Version", "CUDA Version", "Product Name", "Total"]
