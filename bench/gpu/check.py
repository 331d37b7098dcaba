"""GPU truth (issue #18): soakd's GPU half run on a real device, in one command of at most 8 minutes.

    bash bench/gpu_check.sh OUT_DIR            # what to run; it finds or prepares a Python
    python -m bench.gpu.check OUT_DIR [--steps env,soaks] [--budget 480]

Each step runs in its own process (``python -m bench.gpu.steps STEP``) under its own timeout,
and its process group is killed when that passes, so a wedged CUDA call cannot eat the budget;
a failing step is recorded and the next one runs. Without CUDA every step prints
``STEP: skipped: no CUDA`` and the check exits 0 (CI runs that dry mode so the script cannot rot).
With SOAKD_GPU_REHEARSE=1 (bench/gpu_rehearse.sh) every step runs its soakd commands on the CPU
instead, and only the claims that hold there gate (CI runs that too).

OUT_DIR receives at most 8 files, which is what the device tool brings back:
gpu_check.json (every figure and check), gpu_check.md (the same as tables), gpu_check.log (each
step's output, one section per step) and fixtures/<gpu>/ (recorded answers for the CPU fakes).

Exit status: 0 every step passed (or no CUDA: all skipped), 1 a step failed or timed out,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUDGET_S = 480.0  # the 8 minutes on one GPU, all steps together
PROBE_TIMEOUT_S = 60.0  # CUDA's first initialisation can take tens of seconds on a cold host
KILL_GRACE_S = 5.0
# Set by bench/gpu_rehearse.sh: every step runs its soakd commands on the CPU instead of skipping.
REHEARSE_ENV = "SOAKD_GPU_REHEARSE"
REHEARSAL_SLACK = 3.0  # its steps' timeouts and budget: a shared CPU host is slower, not wrong


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    timeout_s: float


# Timeouts sum to BUDGET_S less the CUDA probe's usual few seconds; typical times in docs/gpu.md.
STEPS: tuple[Step, ...] = (
    Step("env", "1. environment: GPU, driver, CUDA, torch, NVML", 30),
    Step("pytest", "2. pytest -m gpu", 135),
    Step("fixtures", "3. recorded fixtures: memory_stats, memory_snapshot, NVML answers", 45),
    Step("table", "4. the seed article's batch table, measured", 120),
    Step("soaks", "5. accelerated soaks: leak_cuda, fragment_cuda, planted OOM", 100),
    Step("costs", "6. costs on the device: sampler calls, CUDA sync per batch", 40),
)


# --------------------------------------------------------------------------- running one step


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the step's whole process group (soakd children included), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(
    name: str, argv: Sequence[str], timeout_s: float, log: Path, result: Path, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run one step's process with its output in ``log``; its figures come from ``result``.

    status: passed (exit 0 and every check true), failed (non-zero exit, unreadable result
    or a false check), timeout (killed after ``timeout_s``)."""
    t0 = time.monotonic()
    record: dict[str, Any] = {"name": name, "timeout_seconds": round(timeout_s, 1)}
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        else:
            _kill_group(proc)  # anything the step left running in its group
    record["seconds"] = round(time.monotonic() - t0, 2)
    record["rc"] = rc
    try:
        got = json.loads(result.read_text())
    except (OSError, ValueError):
        got = {}
    record["figures"] = got.get("figures", {})
    record["checks"] = got.get("checks", {})
    record["details"] = got.get("details", {})
    if rc is None:
        record["status"], record["reason"] = "timeout", f"killed after {timeout_s:.0f} s"
    elif rc != 0:
        record["status"], record["reason"] = "failed", f"exit {rc}" + (f": {got['error']}" if "error" in got else "")
    elif not got:
        record["status"], record["reason"] = "failed", "wrote no result"
    elif not all(record["checks"].values()):
        failed = [k for k, v in record["checks"].items() if not v]
        record["status"], record["reason"] = "failed", "check failed: " + ", ".join(failed)
    else:
        record["status"], record["reason"] = "passed", None
    return record


def cuda_probe(python: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Whether torch sees a CUDA device, asked in a child process so this one holds no context."""
    if os.environ.get("SOAKD_GPU_CHECK_NO_CUDA"):
        return False, "no CUDA (SOAKD_GPU_CHECK_NO_CUDA is set)"
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        rc = subprocess.run([python, "-c", code], timeout=timeout_s, capture_output=True).returncode
    except subprocess.TimeoutExpired:
        return False, f"no CUDA (torch.cuda.is_available() did not answer in {timeout_s:.0f} s)"
    if rc == 0:
        return True, ""
    return False, "no CUDA" if rc == 3 else f"no CUDA (torch failed to import: exit {rc})"


# --------------------------------------------------------------------------- report


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.4e}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def flatten(figures: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested figures as (dotted.key, value) rows; lists of scalars joined, lists of dicts indexed."""
    rows: list[tuple[str, Any]] = []
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(flatten(value, name + "."))
        elif isinstance(value, list) and any(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                rows.extend(flatten(item, f"{name}[{i}].") if isinstance(item, Mapping) else [(f"{name}[{i}]", item)])
        elif isinstance(value, list):
            rows.append((name, ", ".join(_fmt(v) for v in value)))
        else:
            rows.append((name, value))
    return rows


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return out


# The seed article's own table (BS, QPS, P99 ms, GPU memory GB) for the convnet at 3x224x224.
SEED_ARTICLE = {1: (65, 15.2, 1.2), 4: (180, 22.1, 2.1), 8: (240, 33.5, 3.8), 32: (260, 123.0, 11.5)}
BATCH_COLUMNS = (
    ("max batch", "max_batch_size"),
    ("concurrency", "concurrency"),
    ("soakd req/s", "soakd_rps"),
    ("soakd p50 ms", "soakd_p50_ms"),
    ("soakd p99 ms", "soakd_p99_ms"),
    ("mean batch", "mean_batch"),
    ("torch reserved peak MiB", "torch_reserved_peak_mib"),
    ("NVML process peak MiB", "nvml_process_peak_mib"),
    ("NVML device used peak MiB", "nvml_device_used_peak_mib"),
    ("bottleneck", "bottleneck"),
    ("stable", "stable"),
    ("offline loop img/s", "offline_img_per_s"),
    ("seed harness img/s", "seed_img_per_s"),
    ("seed p99 ms/call", "seed_p99_ms"),
    ("soakd / offline", "soakd_over_offline"),
)
ARTICLE_COLUMN = "article QPS / p99 ms / GB"


def batch_rows(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Every figure of each batch row, and the seed article's own where it gave that batch size."""
    out = []
    for r in rows:
        article = SEED_ARTICLE.get(int(r.get("max_batch_size", 0)))
        out.append(
            [*(r.get(key) for _, key in BATCH_COLUMNS), " / ".join(str(v) for v in article) if article else None]
        )
    return out


def render_markdown(report: Mapping[str, Any]) -> str:
    """gpu_check.json as Markdown: status per step, every check, the batch table, every figure."""
    gpu = report.get("gpu") or {}
    where = gpu.get("name") or "no GPU"
    cuda = "yes" if report.get("cuda") else report.get("reason") or "no"
    lines = [
        f"# soakd GPU check: {where}",
        "",
        f"Started {report.get('started_at')}, {report.get('wall_seconds')} s of a "
        f"{report.get('budget_seconds')} s budget. CUDA: {cuda}.",
        "",
    ]
    if report.get("rehearsal"):
        lines += [
            "A rehearsal on the CPU (bench/gpu_rehearse.sh): every step ran its soakd commands at a small",
            "shape; the claims only a GPU can bear out are in each step's details, not gated.",
            "",
        ]
    steps = report.get("steps", [])
    lines += _table(
        ("step", "status", "seconds", "timeout s", "why"),
        ([s["name"], s["status"], s.get("seconds"), s.get("timeout_seconds"), s.get("reason")] for s in steps),
    )
    checks = [(s["name"], claim, ok) for s in steps for claim, ok in s.get("checks", {}).items()]
    if checks:
        lines += ["", "## Checks", "", *_table(("step", "claim", "holds"), checks)]
    for s in steps:
        rows = s.get("figures", {}).get("batch_table")
        if rows:
            lines += [
                "",
                f"## The seed article's table, measured (builtin:convnet {s['figures'].get('shape', '3x224x224')})",
                "",
                *_table([*(h for h, _ in BATCH_COLUMNS), ARTICLE_COLUMN], batch_rows(rows)),
            ]
    figures = [
        (s["name"], key, value)
        for s in steps
        for key, value in flatten(s.get("figures", {}))
        if not key.startswith("batch_table")
    ]
    if figures:
        lines += ["", "## Every figure", "", *_table(("step", "figure", "value"), figures)]
    return "\n".join(lines) + "\n"


def merge_logs(logs: Sequence[tuple[str, Path]], dest: Path) -> None:
    """One log file, a section per step (the device tool brings back 8 files at most)."""
    with dest.open("w", encoding="utf-8", errors="replace") as out:
        for name, path in logs:
            out.write(f"===== {name} =====\n")
            if path.exists():
                out.write(path.read_text(encoding="utf-8", errors="replace"))
            out.write("\n")


# --------------------------------------------------------------------------- main


def select(names: str | None) -> list[Step]:
    if not names:
        return list(STEPS)
    known = {s.name: s for s in STEPS}
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise ValueError(f"--steps: unknown step {unknown[0]!r} (known: {', '.join(known)})")
    return [known[n] for n in known if n in chosen]


def step_argv(step: Step, out: Path, work: Path, result: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.gpu.steps",
        step.name,
        "--out",
        str(out),
        "--work",
        str(work / step.name),
        "--result",
        str(result),
    ]


ArgvFor = Callable[[Step, Path, Path, Path], list[str]]


def write_report(report: dict[str, Any], out: Path, logs: Sequence[tuple[str, Path]], t0: float) -> None:
    """gpu_check.json, .md and .log as they stand: written after every step, so a call killed
    at its limit still brings back every step that finished."""
    report["wall_seconds"] = round(time.monotonic() - t0, 1)
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text(render_markdown(report))
    if logs:
        merge_logs(logs, out / "gpu_check.log")


def run_steps(
    steps: Sequence[Step],
    out: Path,
    budget: float,
    cuda: bool,
    reason: str,
    argv_for: ArgvFor = step_argv,
    started: float | None = None,
    rehearse: bool = False,
) -> int:
    """Every step in turn (or 'skipped: no CUDA'), writing gpu_check.json, .md and .log in
    ``out`` after each.

    A step's timeout is its own or what is left of ``budget``, whichever is less, the budget
    counted from ``started`` (the CUDA probe's start: it spends the same call's time); a step that
    fails or times out is recorded and the next one runs. With ``rehearse`` and no CUDA every
    step runs on the CPU (SOAKD_GPU_REHEARSE=1 in its environment: bench/gpu_rehearse.sh).
    Returns the exit status."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic() if started is None else started
    report: dict[str, Any] = {
        "schema": 1,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget_seconds": budget,
        "cuda": cuda,
        "reason": reason or None,
        "rehearsal": rehearse,
        "python": sys.executable,
        "steps": [],
    }
    work = Path(tempfile.mkdtemp(prefix="soakd-gpu-check-"))
    logs: list[tuple[str, Path]] = []
    try:
        for step in steps:
            left = budget - (time.monotonic() - t0)
            why = reason if not (cuda or rehearse) else "budget spent" if left < 5 else None
            if why:
                print(f"{step.name}: skipped: {'no CUDA' if not cuda else why}", flush=True)
                report["steps"].append(
                    {
                        "name": step.name,
                        "title": step.title,
                        "status": "skipped",
                        "reason": why,
                        "timeout_seconds": step.timeout_s,
                    }
                )
                continue
            log, result = work / f"{step.name}.log", work / f"{step.name}.json"
            timeout = min(step.timeout_s * (REHEARSAL_SLACK if rehearse else 1.0), left)
            print(f"{step.name}: running (timeout {timeout:.0f} s)", flush=True)
            env = {**os.environ, REHEARSE_ENV: "1"} if rehearse else None
            rec = run_step(step.name, argv_for(step, out, work, result), timeout, log, result, env)
            rec["title"] = step.title
            report["steps"].append(rec)
            logs.append((step.title, log))
            if step.name == "env" and rec["figures"].get("gpu_name"):
                report["gpu"] = {"name": rec["figures"]["gpu_name"], "driver": rec["figures"].get("driver")}
            print(
                f"{step.name}: {rec['status']} in {rec['seconds']} s"
                + (f" ({rec['reason']})" if rec.get("reason") else ""),
                flush=True,
            )
            write_report(report, out, logs, t0)
    finally:
        write_report(report, out, logs, t0)
        shutil.rmtree(work, ignore_errors=True)
    bad = [s["name"] for s in report["steps"] if s["status"] in ("failed", "timeout")]
    verdict = f"failed: {', '.join(bad)}" if bad else "passed"
    if not cuda:
        verdict = f"rehearsal on the CPU, {verdict}" if rehearse else "dry run, nothing measured"
    print(f"report: gpu_check.json and gpu_check.md written to {out} ({verdict})", flush=True)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out", type=Path, help="folder for gpu_check.json, gpu_check.md, gpu_check.log, fixtures/")
    ap.add_argument(
        "--steps", default=None, help="comma list of steps to run (default: all): " + ",".join(s.name for s in STEPS)
    )
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for every step together (480)")
    args = ap.parse_args(argv)
    try:
        steps = select(args.steps)
    except ValueError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    if args.budget <= 0:
        print(f"gpu_check: error: --budget: must be > 0, got {args.budget}", file=sys.stderr)
        return 2
    started = time.monotonic()  # the probe spends the budget too
    if os.environ.get(REHEARSE_ENV) == "1":
        budget = args.budget * REHEARSAL_SLACK
        return run_steps(steps, args.out, budget, False, "rehearsal on the CPU", started=started, rehearse=True)
    cuda, reason = cuda_probe(sys.executable)
    return run_steps(steps, args.out, args.budget, cuda, reason, started=started)


if __name__ == "__main__":
    sys.exit(main())
