"""The steps of bench/gpu/check.py, one per process: ``python -m bench.gpu.steps STEP --out OUT
--work DIR --result FILE``. Each writes ``{"figures", "checks", "details"}`` to FILE.

soakd itself always runs as ``python -m soakd`` in a child process (sweep, run), the offline
loop and the seed article's harness in processes of their own (``offline``, ``seed``): the
harness is measured against the limit in separate processes (DESIGN.md).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.gpu import record as gpu_record

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
# bench/gpu_rehearse.sh sets SOAKD_GPU_REHEARSE=1: the same steps start the same soakd commands
# on the CPU, at a small shape and for seconds, so what they import and call is proven before
# the one device call; claims only a GPU can bear out are reported, not gated, there.
REHEARSE = os.environ.get("SOAKD_GPU_REHEARSE") == "1"
BATCHES = (1, 4) if REHEARSE else (1, 4, 8, 16, 32)
SHAPE = "3x32x32" if REHEARSE else "3x224x224"
DEVICE = "cpu" if REHEARSE else "cuda"
# The rehearsal proves what runs, not how fast: on a shared CPU host four soakd children starting
# torch at once take several times a GPU host's seconds, so its waits are this much longer.
SLACK = 3.0 if REHEARSE else 1.0
Figures = dict[str, Any]


@dataclass
class Result:
    figures: Figures = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)  # claims that hold on the CPU rehearsal too
    device_checks: dict[str, bool] = field(default_factory=dict)  # claims only a GPU can bear out
    details: dict[str, Any] = field(default_factory=dict)

    def payload(self, rehearse: bool) -> dict[str, Any]:
        """What the step writes: on a GPU every check gates; in the rehearsal the device's are details."""
        if rehearse:
            details = {**self.details, "device_checks_not_gated": self.device_checks}
            return {"figures": self.figures, "checks": self.checks, "details": details}
        return {"figures": self.figures, "checks": {**self.checks, **self.device_checks}, "details": self.details}


def child_env() -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH (soakd and bench.* for children)."""
    path = os.environ.get("PYTHONPATH", "")
    parts = [str(REPO), *[p for p in path.split(os.pathsep) if p and p != str(REPO)]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts), "PYTHONUNBUFFERED": "1"}


def soakd(*args: str) -> list[str]:
    return [sys.executable, "-m", "soakd", *args]


def run_cmd(cfg: Path, port: int, state: Path, summary: Path | None = None) -> list[str]:
    """``soakd run`` on a config file, /metrics on 127.0.0.1:port, its own state folder."""
    extra = ["--summary-json", str(summary)] if summary is not None else []
    return soakd("run", "--config", str(cfg), "--metrics-addr", f"127.0.0.1:{port}", "--state-dir", str(state), *extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def say(text: str) -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------- Prometheus text

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def metric(samples: Sequence[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    """The sample ``name`` whose labels include ``labels`` (the first, or the sum if several)."""
    hits = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]
    return sum(hits) if hits else None


# --------------------------------------------------------------------------- 1. environment

SMI_KEYS = (
    "Driver Version",
    "CUDA Version",
    "Product Name",
    "Product Architecture",
    "Persistence Mode",
    "Addressing Mode",
    "Current",
    "Pending",
    "Total",
    "Reserved",
    "Used",
    "Free",
    "Power Draw",
    "Current Power Limit",
    "Graphics",
    "SM",
    "Memory",
    "GPU Current Temp",
    "Compute Mode",
)


def nvidia_smi_excerpt(text: str) -> list[str]:
    """The lines of ``nvidia-smi -q`` soakd's figures depend on (names, versions, memory, clocks, power)."""
    return [
        line.rstrip() for line in text.splitlines() if line.strip().split(":")[0].strip() in SMI_KEYS and ":" in line
    ]


def step_env(out: Path, work: Path) -> Result:
    import pynvml
    import torch

    r = Result()
    f = r.figures
    f["torch"] = torch.__version__
    f["cuda_runtime"] = torch.version.cuda
    f["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call,unused-ignore]
    f["python"] = sys.version.split()[0]
    for dist in ("nvidia-ml-py", "prometheus-client", "apscheduler", "numpy"):
        try:
            f[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            f[dist] = None
    from soakd import __version__

    f["soakd"] = __version__
    # Unread so far on the device: gVisor (kernel "4.4.0") may lack smaps_rollup, the USS sampler's source.
    f["kernel"] = os.uname().release
    f["proc_self_smaps_rollup"] = Path("/proc/self/smaps_rollup").exists()
    f["gpu_count"] = torch.cuda.device_count()
    r.checks["torch, pynvml and soakd import"] = True
    r.device_checks["torch sees a CUDA device"] = f["gpu_count"] >= 1
    if f["gpu_count"] == 0 and REHEARSE:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:  # what the samplers will say on this host
            f["nvml_error"] = str(exc)
        return r
    props = torch.cuda.get_device_properties(0)
    f["gpu_name"] = props.name
    f["compute_capability"] = f"{props.major}.{props.minor}"
    f["multiprocessors"] = props.multi_processor_count
    f["gpu_memory_total_mib"] = round(props.total_memory / MiB)
    pynvml.nvmlInit()
    try:
        f["driver"] = gpu_record._text(pynvml.nvmlSystemGetDriverVersion())
        f["nvml_version"] = gpu_record._text(pynvml.nvmlSystemGetNVMLVersion())
        f["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    smi = shutil.which("nvidia-smi")
    if smi:
        text = subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=20).stdout
        r.details["nvidia_smi_q_excerpt"] = nvidia_smi_excerpt(text)
        say(text)
    r.device_checks["NVML answers"] = bool(f["driver"])
    return r


# --------------------------------------------------------------------------- 2. pytest -m gpu


def gpu_test_files() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.gpu" in p.read_text())


def junit_outcomes(path: Path) -> dict[str, str]:
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        out[name] = kinds[0] if kinds else "passed"
    return out


def step_pytest(out: Path, work: Path) -> Result:
    r = Result()
    files = gpu_test_files()
    junit = work / "junit.xml"
    # Only the files with GPU tests: collecting the rest would import tools this host may lack.
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rA",
        f"--junitxml={junit}",
        *files,
    ]
    say(" ".join(cmd))
    rc = subprocess.run(cmd, cwd=REPO, env=child_env(), timeout=130 * SLACK).returncode
    outcomes = junit_outcomes(junit) if junit.exists() else {}
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failure", "error", "skipped")}
    r.figures.update({"files": files, "exit": rc, **counts})
    r.details["tests"] = outcomes
    r.checks["the GPU test files collect and run without error"] = (
        rc == 0 and bool(outcomes) and not counts["failure"] and not counts["error"]
    )
    r.device_checks["every GPU test passed"] = rc == 0 and counts["passed"] > 0 and not counts["failure"]
    r.device_checks["no GPU test skipped"] = counts["skipped"] == 0
    return r


# --------------------------------------------------------------------------- 3. recorded fixtures


def fixtures_config(rec: Path, warmup: int = 10) -> str:
    """A soakd config: builtin ConvNet inside the recorder, 8 s of load at 3x224x224 batches <= 8
    (3 s on the CPU rehearsal, where the recorder records nothing)."""
    duration = "3s" if REHEARSE else "8s"
    return (
        f'[model]\nspec = "python:bench.gpu.models:fixture_recorder"\ndevice = "{DEVICE}"\nwarmup = {warmup}\n'
        f"[model.options]\nout = {json.dumps(str(rec))}\nwarmup = {warmup}\nload_after_s = 3.0\n"
        f'[input]\nshapes = "{SHAPE}"\n[load]\nconcurrency = 16\nduration = "{duration}"\n'
        "[batcher]\nmax_batch_size = 8\n"
    )


def step_fixtures(out: Path, work: Path) -> Result:
    """A real ``soakd run`` of the recorder model writes the fixtures; we check and place them."""
    r = Result()
    rec = work / "recorded"
    cfg = work / "fixtures.toml"
    cfg.write_text(fixtures_config(rec))
    cmd = run_cmd(cfg, free_port(), work / "state")
    say(" ".join(cmd))
    rc = subprocess.run(cmd, cwd=work, env=child_env(), timeout=40 * SLACK).returncode
    r.figures["soakd_run_exit"] = rc
    r.checks["soakd run exit 0"] = rc == 0
    files = [*gpu_record.STATS_AT.values(), gpu_record.SNAPSHOT, gpu_record.NVML]
    missing = [n for n in files if not (rec / n).exists()]
    r.device_checks["all five fixtures recorded"] = not missing
    if missing:
        r.figures["missing"] = missing
        return r
    nvml = json.loads((rec / gpu_record.NVML).read_text())
    name = nvml["_recorded"]["torch_device_name"]
    dest = out / "fixtures" / gpu_record.slug(name)
    dest.mkdir(parents=True, exist_ok=True)
    for n in files:
        shutil.copy(rec / n, dest / n)
    r.figures["folder"] = str(dest.relative_to(out))
    stats = {m: json.loads((rec / n).read_text()) for m, n in gpu_record.STATS_AT.items()}
    for moment, s in stats.items():
        r.figures[f"{moment}.allocated_mib"] = round(s.get("allocated_bytes.all.current", 0) / MiB, 2)
        r.figures[f"{moment}.reserved_mib"] = round(s.get("reserved_bytes.all.current", 0) / MiB, 2)
        r.figures[f"{moment}.inactive_split_mib"] = round(s.get("inactive_split_bytes.all.current", 0) / MiB, 2)
        r.figures[f"{moment}.segments"] = s.get("segment.all.current", 0)
    synthetic = set(json.loads((REPO / "tests" / "fixtures" / gpu_record.STATS).read_text()))
    missing_keys = sorted(synthetic - set(stats["load"]))
    r.figures["synthetic_keys_missing_on_device"] = missing_keys
    # As tests/test_telemetry_gpu.py: keys newer than torch 2.2 may be absent on an older torch.
    missing_core = [k for k in missing_keys if not k.startswith(("num_device", "num_sync", "oversize", "max_split"))]
    r.figures["device_keys_not_in_synthetic"] = sorted(set(stats["load"]) - synthetic)
    snap = json.loads((rec / gpu_record.SNAPSHOT).read_text())
    r.figures["snapshot_segments"] = len(snap)
    r.figures["snapshot_bytes"] = (rec / gpu_record.SNAPSHOT).stat().st_size
    g0 = nvml["gpus"][0]
    r.figures["nvml.gpus"] = len(nvml["gpus"])
    r.figures["nvml.unsupported"] = g0.get("unsupported", [])
    r.figures["nvml.errors"] = g0.get("errors", {})
    r.figures["nvml.self_listed"] = any(p["pid"] == "SELF" for p in g0.get("processes", []))
    r.device_checks["memory_stats keys as the synthetic fixture has them"] = not missing_core
    r.device_checks["reserved >= allocated at every moment"] = all(
        s.get("reserved_bytes.all.current", 0) >= s.get("allocated_bytes.all.current", 0) for s in stats.values()
    )
    r.device_checks["allocated grows from idle to under load"] = (
        stats["load"]["allocated_bytes.all.current"] > stats["idle"]["allocated_bytes.all.current"]
    )
    return r


# --------------------------------------------------------------------------- 4. batch table


class NvmlPoller:
    """Peak NVML memory of one pid (and of the device) between marks, polled every 20 ms."""

    def __init__(self, pid: int) -> None:
        import pynvml

        self.nv = pynvml
        self.pid = pid
        self.listed = self.up = False
        self.proc_peak = self.used_peak = self.baseline = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        try:
            pynvml.nvmlInit()
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.baseline = int(pynvml.nvmlDeviceGetMemoryInfo(self.h).used)
        except pynvml.NVMLError as exc:  # no NVML figures, the sweep's own still count
            say(f"NVML poller: {exc}")
            return
        self.up = True
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                used = int(self.nv.nvmlDeviceGetMemoryInfo(self.h).used)
            except self.nv.NVMLError:
                continue
            try:  # a container may not answer this, or list host pids: then no per-process figure
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.h)
            except self.nv.NVMLError:
                procs = []
            mine = [int(p.usedGpuMemory or 0) for p in procs if p.pid == self.pid]
            with self._lock:
                self.listed = self.listed or bool(mine)
                self.proc_peak = max(self.proc_peak, sum(mine))
                self.used_peak = max(self.used_peak, used)

    def mark(self) -> tuple[int | None, int | None]:
        """(this pid's peak or None when NVML does not list it, device used peak - baseline); resets."""
        with self._lock:
            got = (self.proc_peak if self.listed else None, max(0, self.used_peak - self.baseline) if self.up else None)
            self.proc_peak = self.used_peak = 0
        return got

    def close(self) -> None:
        if self.up:
            self._stop.set()
            self._thread.join(2)
            self.nv.nvmlShutdown()


def sweep_cmd(work: Path, batches: Sequence[int], step_s: float) -> list[str]:
    """The seed article's table through soakd sweep: closed loop at twice each max batch size."""
    return soakd(
        "sweep",
        "--model",
        "builtin:convnet",
        "--device",
        DEVICE,
        "--input-shapes",
        SHAPE,
        "--max-batch-size",
        ",".join(map(str, batches)),
        "--concurrency",
        "2x",
        "--step-duration",
        f"{step_s:g}s",
        "--warmup",
        "50",
        "--json",
        str(work / "sweep.json"),
        "--state-dir",
        str(work / "sweep-state"),
    )


def sweep_marker(line: str) -> str | None:
    """ "start" for soakd sweep's log line before its first step, "step" for the line that ends a step."""
    if "soakd.sweep: sweep:" in line:
        return "start"
    if re.search(r"soakd\.sweep: step \d+ ", line):
        return "step"
    return None


def run_sweep(
    work: Path, batches: Sequence[int], step_s: float
) -> tuple[dict[str, Any], list[tuple[int | None, int | None]]]:
    """``soakd sweep`` in a child; NVML's peak for the child between its step log lines."""
    out = work / "sweep.json"
    cmd = sweep_cmd(work, batches, step_s)
    say(" ".join(cmd))
    proc = subprocess.Popen(cmd, cwd=work, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    poller = NvmlPoller(proc.pid)
    peaks: list[tuple[int | None, int | None]] = []
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            marker = sweep_marker(line)
            if marker == "start":
                poller.mark()  # warm-up (at the biggest batch) is not step 0's memory
            elif marker == "step":
                peaks.append(poller.mark())
        rc = proc.wait(30 * SLACK)
    finally:
        poller.close()
        if proc.poll() is None:
            proc.kill()
    if rc != 0:
        raise RuntimeError(f"soakd sweep exited {rc}")
    return json.loads(out.read_text()), peaks


def helper(name: str, work: Path, batches: Sequence[int], seconds: float) -> dict[str, Any]:
    """The offline loop or the seed harness, in a process of its own."""
    out = work / f"{name}.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.gpu.steps",
        name,
        "--batches",
        ",".join(map(str, batches)),
        "--seconds",
        str(seconds),
        "--json",
        str(out),
        "--device",
        DEVICE,
        "--shape",
        SHAPE,
    ]
    say(" ".join(cmd))
    subprocess.run(cmd, cwd=REPO, env=child_env(), timeout=60 * SLACK, check=True)
    return dict(json.loads(out.read_text()))


def step_table(out: Path, work: Path) -> Result:
    r = Result()
    sweep, peaks = run_sweep(work, BATCHES, 1.0 if REHEARSE else 5.0)
    offline = helper("offline", work, BATCHES, 0.3 if REHEARSE else 2.0)
    seed = helper("seed", work, BATCHES, 0.3 if REHEARSE else 2.0)
    rows = []
    for i, s in enumerate(sweep["steps"]):
        b = str(s["max_batch_size"])
        proc_peak, used_peak = peaks[i] if i < len(peaks) else (None, None)
        off = offline.get(b, {}).get("img_per_s")
        rows.append(
            {
                "max_batch_size": s["max_batch_size"],
                "concurrency": s["concurrency"],
                "soakd_rps": s["throughput_rps"],
                "soakd_p50_ms": s["p50_ms"],
                "soakd_p99_ms": s["p99_ms"],
                "mean_batch": s["mean_batch_size"],
                "torch_reserved_peak_mib": None
                if s["peak_gpu_memory_bytes"] is None
                else round(s["peak_gpu_memory_bytes"] / MiB, 1),
                "nvml_process_peak_mib": None if proc_peak is None else round(proc_peak / MiB, 1),
                "nvml_device_used_peak_mib": None if used_peak is None else round(used_peak / MiB, 1),
                "bottleneck": s["bottleneck"],
                "stable": s["stable"],
                "offline_img_per_s": off,
                "seed_img_per_s": seed.get(b, {}).get("img_per_s"),
                "seed_p99_ms": seed.get(b, {}).get("p99_ms"),
                "soakd_over_offline": round(s["throughput_rps"] / off, 3) if off else None,
            }
        )
    r.figures["batch_table"] = rows
    r.figures["shape"] = SHAPE
    r.figures["knee"] = (sweep.get("knee") or {}).get("max_batch_size")
    r.figures["recommendation"] = (sweep.get("recommendation") or {}).get("max_batch_size")
    r.details["sweep"] = sweep
    r.checks["every batch size measured"] = len(rows) == len(BATCHES)
    r.device_checks["torch reserved peak reported per step"] = all(x["torch_reserved_peak_mib"] for x in rows)
    return r


def offline_main(batches: Sequence[int], seconds: float, out: Path, device: str, shape_text: str) -> None:
    from bench.core_throughput import offline_loop

    shape = tuple(int(v) for v in shape_text.split("x"))
    res = {str(b): {"img_per_s": round(offline_loop("builtin:convnet", device, shape, b, seconds), 1)} for b in batches}
    out.write_text(json.dumps(res))


def seed_main(batches: Sequence[int], seconds: float, out: Path, device: str, shape_text: str) -> None:
    """The seed article's harness as written, one thread, on a batch of ``b`` images."""
    import torch

    from bench.seed_harness import LocalInferenceBenchmarker
    from soakd.models.loader import load_model

    model = load_model("builtin:convnet", device)
    shape = tuple(int(v) for v in shape_text.split("x"))

    def sync() -> None:
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    res = {}
    for b in batches:
        x = torch.randn(b, *shape, device=model.device)
        with torch.inference_mode():
            for _ in range(10):
                model.fn(x)
            sync()
            t0 = time.perf_counter()
            for _ in range(10):
                model.fn(x)
            sync()
        per_call = (time.perf_counter() - t0) / 10
        bench = LocalInferenceBenchmarker(model.fn, (b, *shape), warmup_runs=50, device=str(model.device))
        got = bench.run_stress_test([1], requests_per_thread=max(20, int(seconds / per_call)))[1]
        res[str(b)] = {"img_per_s": round(got["qps"] * b, 1), "calls_per_s": got["qps"], "p99_ms": got["p99_ms"]}
    out.write_text(json.dumps(res))


# --------------------------------------------------------------------------- 5. accelerated soaks

FAST_LEAK = """
[leak]
warmup = "2s"
window = "60s"
min_span = "6s"
bin = "1s"
trough_span = "2s"
persistence = "3s"
evaluate_interval = "1s"
[leak.min_slope_bytes_per_hour]
default = 2e9
"""


def soak_configs() -> dict[str, str]:
    """The four soaks of step 5 as soakd configs (seconds instead of hours, as tests/test_leak_live.py;
    5 s each and 5 MiB/s of leak on the CPU rehearsal)."""
    long, short, leak = ("5s", "5s", 5.0) if REHEARSE else ("40s", "25s", 50.0)
    oom = (
        f'[model]\nspec = "python:bench.gpu.models:planted_oom"\ndevice = "{DEVICE}"\nwarmup = 10\n'
        '[model.options]\nevery = 25\nafter = 20\n[input]\nshapes = "' + SHAPE + '"\n'
        f'[load]\nconcurrency = 8\nduration = "{short}"\n[memory]\ninterval = "0.5s"\n'
        "[batcher]\nmax_batch_size = 4\nempty_cache_on_oom = {on}\n"
    )
    return {
        "leak_cuda": (
            f'[model]\nspec = "builtin:leak_cuda"\ndevice = "{DEVICE}"\nwarmup = 2\n'
            f"[model.options]\nmib_per_s = {leak}\nmax_mib = 4000\n"
            f'[load]\nconcurrency = 2\nduration = "{long}"\n[memory]\ninterval = "0.2s"\n' + FAST_LEAK
        ),
        "fragment_cuda": (
            f'[model]\nspec = "builtin:fragment_cuda"\ndevice = "{DEVICE}"\nwarmup = 2\n'
            "[model.options]\nkeep = 64\n"
            f'[load]\nconcurrency = 2\nduration = "{long}"\n'
            '[memory]\ninterval = "0.5s"\nsnapshot_interval = "2s"\n' + FAST_LEAK
        ),
        "oom_empty_cache_off": oom.format(on="false"),
        "oom_empty_cache_on": oom.format(on="true"),
    }


@dataclass
class Soak:
    name: str
    work: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    history: list[tuple[float, list[tuple[str, dict[str, str], float]]]] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.work / f"{self.name}-state"

    @property
    def summary(self) -> Path:
        return self.work / f"{self.name}-summary.json"

    @property
    def log(self) -> Path:
        return self.work / f"{self.name}.log"

    def start(self, config: str) -> None:
        cfg = self.work / f"{self.name}.toml"
        cfg.write_text(config)
        self.port = free_port()
        cmd = run_cmd(cfg, self.port, self.state, self.summary)
        say(f"{self.name}: {' '.join(cmd)}")
        self.started = time.monotonic()
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(cmd, cwd=self.work, env=child_env(), stdout=fh, stderr=subprocess.STDOUT)

    def poll(self) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return
        self.history.append((time.monotonic() - self.started, parse_metrics(text)))

    def series(self, name: str, **labels: str) -> list[tuple[float, float]]:
        return [(t, v) for t, s in self.history if (v := metric(s, name, **labels)) is not None]

    def last(self, name: str, **labels: str) -> float | None:
        got = self.series(name, **labels)
        return got[-1][1] if got else None


def _first(points: Sequence[tuple[float, float]], pred: Callable[[float], bool]) -> float | None:
    return next((round(t, 1) for t, v in points if pred(v)), None)


def leak_figures(s: Soak, r: Result) -> None:
    flagged = s.series("soakd_leak_suspected", series="torch_cuda_allocated")
    r.figures["leak_cuda.seconds_to_flag"] = _first(flagged, lambda v: v == 1)
    r.figures["leak_cuda.slope_gib_per_hour"] = (
        None
        if (v := s.last("soakd_leak_slope_bytes_per_hour", series="torch_cuda_allocated")) is None
        else round(v / 2**30, 2)
    )
    r.device_checks["leak_cuda: torch_cuda_allocated flagged"] = r.figures["leak_cuda.seconds_to_flag"] is not None
    snaps = sorted(s.state.glob("leak-torch_cuda_allocated-*.pickle"))
    r.figures["leak_cuda.snapshots"] = len(snaps)
    ok = False
    if snaps:
        r.figures["leak_cuda.snapshot_mib"] = round(snaps[0].stat().st_size / MiB, 2)
        with snaps[0].open("rb") as fh:
            snap = pickle.load(fh)
        traces = snap.get("device_traces", [[]])
        r.figures["leak_cuda.snapshot_segments"] = len(snap.get("segments", []))
        r.figures["leak_cuda.snapshot_trace_entries"] = sum(len(t) for t in traces)
        ok = bool(snap.get("segments")) and any(e.get("frames") for t in traces for e in t)
    r.device_checks["leak_cuda: memory snapshot with allocation history written"] = ok


def settled_median(points: Sequence[tuple[float, float]]) -> float | None:
    """The median of the second half of a series: the level it settles at, past the warm-up."""
    values = sorted(v for _, v in points[len(points) // 2 :])
    return values[len(values) // 2] if values else None


def fragment_figures(s: Soak, baseline: Soak | None, r: Result) -> None:
    ratio = s.series("soakd_torch_cuda_fragmentation_ratio", kind="inactive_split")
    peak = max((v for _, v in ratio), default=None)
    r.figures["fragment_cuda.inactive_split_ratio_first"] = round(ratio[0][1], 4) if ratio else None
    r.figures["fragment_cuda.inactive_split_ratio_peak"] = None if peak is None else round(peak, 4)
    r.figures["fragment_cuda.inactive_split_ratio_last"] = round(ratio[-1][1], 4) if ratio else None
    for key, name in (
        ("reserved_mib", "soakd_torch_cuda_reserved_bytes"),
        ("allocated_mib", "soakd_torch_cuda_allocated_bytes"),
    ):
        v = s.last(name, pool="all")
        r.figures[f"fragment_cuda.{key}"] = None if v is None else round(v / MiB, 1)
    v = s.last("soakd_torch_cuda_largest_free_block_bytes")
    r.figures["fragment_cuda.largest_free_block_mib"] = None if v is None else round(v / MiB, 2)
    # Held levels, not peaks: one scrape of the ConvNet caught mid-batch (or just after its planted
    # OOM) can show a higher split ratio than the churn model's peak, and the comparison flaked.
    held = settled_median(ratio)
    r.figures["fragment_cuda.inactive_split_ratio_median"] = None if held is None else round(held, 4)
    base = None
    if baseline is not None:
        base_series = baseline.series("soakd_torch_cuda_fragmentation_ratio", kind="inactive_split")
        base = settled_median(base_series)
        r.figures["convnet_baseline.inactive_split_ratio_peak"] = (
            round(max(v for _, v in base_series), 4) if base_series else None
        )
        r.figures["convnet_baseline.inactive_split_ratio_median"] = None if base is None else round(base, 4)
    # 5% of reserved memory in split, free blocks: well above what a steady model leaves.
    r.device_checks["fragment_cuda: inactive_split ratio raised"] = (
        held is not None and held >= 0.05 and (base is None or held > base)
    )


def oom_figures(s: Soak, r: Result) -> None:
    n = s.name
    try:
        summary = json.loads(s.summary.read_text())
    except (OSError, ValueError):
        summary = {}
    req = summary.get("requests", {})
    r.figures[f"{n}.requests_ok"] = req.get("ok")
    r.figures[f"{n}.requests_oom"] = req.get("oom")
    r.figures[f"{n}.allocator_ooms"] = s.last("soakd_torch_cuda_ooms_total")
    r.figures[f"{n}.allocator_alloc_retries"] = s.last("soakd_torch_cuda_alloc_retries_total")
    v = s.last("soakd_torch_cuda_reserved_bytes", pool="all")
    r.figures[f"{n}.reserved_mib_last"] = None if v is None else round(v / MiB, 1)
    ok = s.series("soakd_requests_total", outcome="ok")
    oom = s.series("soakd_requests_total", outcome="oom")
    t_oom = _first(oom, lambda v: v > 0)
    ok_at_oom = next((v for t, v in ok if t_oom is not None and t >= t_oom), None)
    r.figures[f"{n}.ok_after_first_oom"] = None if ok_at_oom is None or not ok else ok[-1][1] - ok_at_oom
    r.device_checks[f"{n}: outcome=oom counted"] = bool(req.get("oom")) and bool(r.figures[f"{n}.allocator_ooms"])
    r.device_checks[f"{n}: the run recovers (requests ok after the first OOM, exit 0)"] = (
        (r.figures[f"{n}.ok_after_first_oom"] or 0) > 0 and s.proc is not None and s.proc.returncode == 0
    )


def step_soaks(out: Path, work: Path, deadline_s: float = 90.0) -> Result:
    """The four soaks side by side (their own processes, so one GPU's allocator each)."""
    r = Result()
    soaks = {name: Soak(name, work) for name in soak_configs()}
    for name, cfg in soak_configs().items():
        soaks[name].start(cfg)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < deadline_s * SLACK:
            live = [s for s in soaks.values() if s.proc is not None and s.proc.poll() is None]
            if not live:
                break
            for s in live:
                s.poll()
            time.sleep(0.5)
    finally:
        for s in soaks.values():
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
                try:
                    s.proc.wait(10)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()
    for s in soaks.values():
        rc = None if s.proc is None else s.proc.returncode
        r.figures[f"{s.name}.exit"] = rc
        r.checks[f"{s.name}: exit 0"] = rc == 0
        say(f"===== {s.name} (exit {rc}) =====\n{s.log.read_text(errors='replace') if s.log.exists() else ''}")
    leak_figures(soaks["leak_cuda"], r)
    fragment_figures(soaks["fragment_cuda"], soaks["oom_empty_cache_off"], r)
    for name in ("oom_empty_cache_off", "oom_empty_cache_on"):
        oom_figures(soaks[name], r)
    return r


# --------------------------------------------------------------------------- 6. costs on the device


def sync_costs(batches: Sequence[int] = (1, 8), seconds: float = 1.0) -> dict[str, Any]:
    """Per-batch cost of the engine's torch.cuda.synchronize(): a batch loop synchronising after
    every batch against the same loop synchronising once at the end."""
    import torch

    from bench.sampling_cost import timings
    from soakd.models.loader import load_model

    model = load_model("builtin:convnet", "cuda")
    shape = tuple(int(v) for v in SHAPE.split("x"))
    out: dict[str, Any] = {}
    med, p99 = timings(torch.cuda.synchronize, 2000)
    out["idle_synchronize_us"] = {"median": round(med * 1e6, 2), "p99": round(p99 * 1e6, 2)}
    with torch.inference_mode():
        for b in batches:
            x = torch.randn(b, *shape, device="cuda")
            for _ in range(20):
                model.fn(x)
            torch.cuda.synchronize()
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds / 4:
                model.fn(x)
                n += 1
            torch.cuda.synchronize()
            n = max(n, 20)
            figures: dict[str, float] = {}
            for _ in range(2):  # alternate twice, keep the faster of each: the GPU clocks settle
                for mode in ("sync_each", "sync_end"):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        model.fn(x)
                        if mode == "sync_each":
                            torch.cuda.synchronize()
                    torch.cuda.synchronize()
                    per = (time.perf_counter() - t0) / n
                    figures[mode] = min(figures.get(mode, per), per)
            out[f"batch_{b}"] = {
                "ms_per_batch_sync_each": round(figures["sync_each"] * 1e3, 4),
                "ms_per_batch_sync_end": round(figures["sync_end"] * 1e3, 4),
                "sync_cost_us_per_batch": round((figures["sync_each"] - figures["sync_end"]) * 1e6, 2),
                "batches": n,
            }
    return out


def step_costs(out: Path, work: Path) -> Result:
    import torch

    from bench.sampling_cost import gpu_call_costs, timings
    from soakd.telemetry.catalogue import Metrics
    from soakd.telemetry.nvml import NvmlSampler
    from soakd.telemetry.scheduler import SourceUnavailable
    from soakd.telemetry.series import SeriesStore
    from soakd.telemetry.torch_cuda import TorchCudaSampler

    r = Result()
    if REHEARSE and not torch.cuda.is_available():
        # Nothing to time: the samplers are built and opened as a run opens them, and each must
        # decline with a reason (SourceUnavailable) rather than fail some other way.
        declined = {}
        samplers: dict[str, Callable[[], TorchCudaSampler | NvmlSampler]] = {
            "TorchCudaSampler": lambda: TorchCudaSampler(Metrics(), SeriesStore(1000), [0]),
            "NvmlSampler": lambda: NvmlSampler(Metrics(), SeriesStore(1000)),
        }
        for label, make in samplers.items():
            try:
                make().open()
            except SourceUnavailable as exc:
                declined[label] = str(exc)
        r.figures["declined"] = declined
        r.checks["the GPU samplers decline cleanly without a GPU"] = len(declined) == 2
        return r
    r.figures["sync"] = sync_costs()
    xs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in [1 << 16, 3 << 20, 12 << 20] * 50]
    calls = gpu_call_costs(0, 500)
    r.figures["calls_us"] = calls
    m, series = Metrics(), SeriesStore(1_000_000)
    for label, sampler in (
        ("TorchCudaSampler.sample()", TorchCudaSampler(m, series, [0])),
        ("NvmlSampler.sample()", NvmlSampler(m, series)),
    ):
        sampler.open()
        med, p99 = timings(sampler.sample, 500)
        sampler.close()
        r.figures["calls_us"][label] = {"median": round(med * 1e6, 2), "p99": round(p99 * 1e6, 2)}
    del xs
    timed = all("median" in v for k, v in calls.items() if not k.startswith("nvml"))
    r.device_checks["every sampler call timed"] = timed
    return r


# --------------------------------------------------------------------------- main

STEP_FUNCS: dict[str, Callable[[Path, Path], Result]] = {
    "env": step_env,
    "pytest": step_pytest,
    "fixtures": step_fixtures,
    "table": step_table,
    "soaks": step_soaks,
    "costs": step_costs,
}


def _batches(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_steps")
    ap.add_argument("step", choices=[*STEP_FUNCS, "offline", "seed"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--result", type=Path)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default=DEVICE)
    ap.add_argument("--shape", default=SHAPE)
    args = ap.parse_args(argv)
    if args.step == "offline":
        offline_main(_batches(args.batches), args.seconds, args.json, args.device, args.shape)
        return 0
    if args.step == "seed":
        seed_main(_batches(args.batches), args.seconds, args.json, args.device, args.shape)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        res = STEP_FUNCS[args.step](args.out, args.work)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        args.result.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    payload: Mapping[str, Any] = res.payload(REHEARSE)
    args.result.write_text(json.dumps(payload, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
