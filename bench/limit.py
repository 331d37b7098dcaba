"""Throughput at the model's own limit (issue #13): soakd against each model's offline loop, every
measurement in its own process, rounds alternating offline / soakd, medians of the rounds.

Model kinds: the builtin convnet, an eager ``python:`` factory, a TorchScript file and a
``torch.export`` program (the last three: bench/models.py's transformer encoder, built into a
temp dir). Load configurations:

  batch 1   soakd --concurrency 2 --max-batch-size 1, ``[batcher] instances = 2``
  batch 8   soakd --concurrency 16 --max-batch-size 8 --max-queue-delay-ms 5
  b8 copy   the same with ``[input] pool = 9``: the default pool of 8 fills a batch of 8 with the
            tensors its rows already hold, so no row is copied (soakd/targets/staging.py); with 9
            every row of every batch is copied, as with inputs read from sample files
  b1 one input  batch 1 with ``[input] pool = 1``: one input reused, on both sides

The offline loop is the model alone: one thread (not the main one: see ``on_thread``), warmed up
on that thread, called on the inputs soakd hands the model (``Load.offline_inputs``): at batch 1
the pool's tensors in turn (8 by default: 4.8 MB at 3x224x224, past L2), at larger batches one
tensor (soakd's batch of pooled rows, or its staging buffer). The two batch-1 rows' offline
figures, one input against eight, show what input variety costs the model itself, with soakd
absent (on the encoders here: nothing the rounds can tell apart). soakd's figure is
``throughput_rps`` from ``python -m soakd run --summary-json``.
The seed article's harness (bench/seed_harness.py, 2 threads on one pre-made tensor) is the
baseline row. Then the driver's own limits on ``builtin:noop``: the closed-loop ceiling at batch
1024, and open-loop Poisson arrivals at each ``--rates`` value (achieved / offered, schedule lag
p99), with the highest rate that holds within 1% at lag p99 < 1 ms. CUDA when present.

This replaces sections 1-3 of bench/core_throughput.py, which measured soakd and the offline
loop in one process (where a model warmed on one thread and run on another, and thread pools
left over from the other side, could not be told apart from soakd's own cost).

    PYTHONPATH=. .venv/bin/python bench/limit.py --quick       # minutes on an idle 2-core box
    PYTHONPATH=. .venv/bin/python bench/limit.py [--seconds 5] [--rounds 3] [--models convnet,torchscript]
    PYTHONPATH=. .venv/bin/python bench/limit.py --side-by-side [--steady-malloc] --loads "batch 1" --rates ""
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from soakd.allocator import FAULT_WARN_BYTES, GLIBC_KEEP_BLOCKS, PAGE_BYTES  # torch-free: no torch in the parent

REPO = Path(__file__).resolve().parent.parent
KINDS = ("convnet", "python", "torchscript", "export")
SEED_THREADS = 2
T = TypeVar("T")


DEFAULT_POOL = 8  # soakd's input.pool


@dataclass(frozen=True)
class Load:
    name: str
    batch: int
    concurrency: int
    instances: int
    delay_ms: float
    pool: int = DEFAULT_POOL

    @property
    def offline_inputs(self) -> int:
        """Distinct batch tensors soakd hands the model, which the offline loop cycles through as
        well: at batch 1 each pooled tensor (a view of it), at larger batches one tensor (a batch
        of the pooled rows, which already hold it, or the staging buffer the rows are copied to)."""
        return self.pool if self.batch == 1 else 1


LOADS = (
    Load("batch 1", 1, 2, 2, 1.0),
    Load("batch 8", 8, 16, 1, 5.0),
    Load("b8 copy", 8, 16, 1, 5.0, pool=9),
    Load("b1 one input", 1, 2, 2, 1.0, pool=1),
)


EXTRA_ENV: dict[str, str] = {}  # --threads, --steady-malloc: for every child, both sides alike


def env(**extra: str) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO), **EXTRA_ENV, **extra}


def pinned(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the child (and every thread it starts) to ``cpus``; None: no pinning."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


# ---------------------------------------------------------------------------------- children


def child_build(out_dir: str, device: str, shape: tuple[int, ...]) -> dict[str, Any]:
    """Build the model files (in a child, so the parent never starts torch's thread pools)."""
    import torch

    from bench.models import save_export, save_torchscript

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    d = Path(out_dir)
    specs = {
        "convnet": "builtin:convnet",
        "python": "python:bench.models:make_encoder",
        "torchscript": f"torchscript:{save_torchscript(d / 'enc.pt')}",
        "export": f"export:{save_export(d / 'enc.pt2', dev, shape)}",
    }
    return {
        "device": dev,
        "specs": specs,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda_name": torch.cuda.get_device_name() if dev.startswith("cuda") else None,
    }


def on_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a new thread, warm-up included, as soakd calls a model (on its model threads).

    Not the main thread, because glibc serves the two differently: the main thread allocates from
    the main arena (sbrk, trimmed back to the kernel as blocks are freed), other threads from
    arenas of their own. A model whose activations are megabytes per call (the builtin convnet at
    batch 1: 12.8 MB out of its first conv) then page-faults on every call in the main thread and
    runs at about half the speed it gets on any other thread (36 against 68 req/s on one CPU)."""
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    t = threading.Thread(target=run, name="offline")
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return box[0]


def input_cycle(device: Any, shape: tuple[int, ...], batch: int, inputs: int) -> Any:
    """The offline loop's inputs: ``inputs`` random batch tensors, in an endless cycle (made here,
    on the main thread, as soakd makes its pool)."""
    import torch

    return itertools.cycle([torch.randn(batch, *shape, device=device) for _ in range(inputs)])


def child_offline(
    spec: str, device: str, shape: tuple[int, ...], batch: int, warmup: int, seconds: float, inputs: int
) -> dict[str, Any]:
    """The model alone: warmed up and run on one thread, on ``inputs`` inputs in turn, synchronised
    per call."""
    import torch

    from soakd.models.loader import load_model

    model = load_model(spec, device)
    cuda = model.device.type == "cuda"
    xs = input_cycle(model.device, shape, batch, inputs)

    def loop() -> dict[str, Any]:
        with torch.inference_mode():
            for _ in range(warmup):
                model.fn(next(xs))
            if cuda:
                torch.cuda.synchronize(model.device)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                model.fn(next(xs))
                if cuda:
                    torch.cuda.synchronize(model.device)
                n += batch
            return {"rps": n / (time.perf_counter() - t0)}

    return on_thread(loop)


def child_offline_trace(
    spec: str, device: str, shape: tuple[int, ...], batch: int, warmup: int, trace: str, seconds: float, inputs: int
) -> dict[str, Any]:
    """The offline loop for --side-by-side: as child_offline, but appending ``time.time() requests
    minor-faults`` to ``trace`` every 50 ms for up to ``seconds`` (or until killed), so the parent can
    count its requests, and the pages its allocator faulted in, over exactly the window soakd
    measured in the other process."""
    import resource

    import torch

    from soakd.models.loader import load_model

    model = load_model(spec, device)
    xs = input_cycle(model.device, shape, batch, inputs)

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def loop() -> dict[str, Any]:
        with torch.inference_mode(), open(trace, "w", buffering=1) as out:
            for _ in range(warmup):
                model.fn(next(xs))
            n, t0 = 0, time.time()
            last = t0
            out.write(f"{t0:.6f} 0 {faults()}\n")
            while last - t0 < seconds:
                model.fn(next(xs))
                n += batch
                now = time.time()
                if now - last >= 0.05:
                    out.write(f"{now:.6f} {n} {faults()}\n")
                    last = now
        return {"requests": n}

    return on_thread(loop)


def child_seed(
    spec: str, device: str, shape: tuple[int, ...], batch: int, warmup: int, seconds: float, rate_hint: float
) -> dict[str, Any]:
    """The seed article's harness on the same model: SEED_THREADS threads, one pre-made tensor."""
    from bench.seed_harness import LocalInferenceBenchmarker
    from soakd.models.loader import load_model

    model = load_model(spec, device)
    bench = LocalInferenceBenchmarker(model.fn, (batch, *shape), warmup_runs=warmup, device=str(model.device))
    per_thread = max(10, int(rate_hint * seconds / batch / SEED_THREADS))
    res = bench.run_stress_test([SEED_THREADS], requests_per_thread=per_thread)[SEED_THREADS]
    return {"rps": res["qps"] * batch}  # the seed counts calls; each call is `batch` requests


def child_main(kind: str, rest: list[str]) -> dict[str, Any]:
    """``--child KIND ARGS``: the arguments ``run_child`` and ``side_by_side_round`` pass."""
    if kind == "build":
        return child_build(rest[0], rest[1], tuple(int(d) for d in rest[2].split("x")))
    spec, device, shape, batch, warmup, *tail = rest
    dims = tuple(int(d) for d in shape.split("x"))
    if kind == "offline-trace":
        trace, seconds, inputs = tail
        return child_offline_trace(spec, device, dims, int(batch), int(warmup), trace, float(seconds), int(inputs))
    if kind == "offline":
        seconds, inputs = tail
        return child_offline(spec, device, dims, int(batch), int(warmup), float(seconds), int(inputs))
    seconds, hint = tail
    return child_seed(spec, device, dims, int(batch), int(warmup), float(seconds), float(hint))


def run_child(*args: str, timeout: float = 600) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env(), timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------- soakd runs


@dataclass(frozen=True)
class SoakdRun:
    summary: dict[str, Any]
    log: str

    def window(self) -> tuple[float, float]:
        """The measured window in epoch seconds: from the "ready" log line (logged as the engine
        starts) for the summary's ``duration_seconds``. The log's asctime is local time to the
        millisecond, in the same time zone as this process."""
        m = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO soakd\.daemon: ready", self.log, re.M)
        if m is None:
            raise RuntimeError(f"no 'ready' line in soakd's log: {self.log[-2000:]}")
        start = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3
        return start, start + float(self.summary["duration_seconds"])


def soakd_run(
    work: Path, flags: list[str], config: str = "", timeout: float = 600, cpus: frozenset[int] | None = None
) -> SoakdRun:
    """``python -m soakd run ... --summary-json`` (pinned to ``cpus`` when given); its summary and
    log. Once the summary is written the figures are final, so the process is stopped there rather
    than left drawing its HTML report (seconds per run on a busy 2-core box)."""
    run = tempfile.mkdtemp(dir=work)
    summary = Path(run) / "summary.json"
    log_path = Path(run) / "soakd.log"
    cmd = [
        sys.executable,
        "-m",
        "soakd",
        "run",
        "--metrics-addr",
        "127.0.0.1:0",
        "--state-dir",
        str(Path(run) / "state"),
        "--summary-json",
        str(summary),
        *flags,
    ]
    if config:
        (Path(run) / "soak.toml").write_text(config)
        cmd += ["--config", str(Path(run) / "soak.toml")]
    extra = {"OMP_NUM_THREADS": str(len(cpus))} if cpus else {}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env(**extra), cwd=run, preexec_fn=pinned(cpus)
        )
        deadline = time.monotonic() + timeout
        try:
            while not summary.exists():  # written atomically: present means complete
                if proc.poll() is not None:
                    if summary.exists():
                        break
                    raise RuntimeError(f"soakd exited {proc.returncode}: {log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"soakd did not finish within {timeout:.0f} s")
                time.sleep(0.05)
            return SoakdRun(json.loads(summary.read_text()), log_path.read_text())
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Case:
    """One row's measurement: a model at a load, the same for every round and both sides."""

    work: Path
    spec: str
    device: str
    shape: str
    load: Load
    warmup: int
    seconds: float

    def child_args(self) -> list[str]:
        """What every model child takes first (``child_main`` reads them in this order)."""
        return [self.spec, self.device, self.shape, str(self.load.batch), str(self.warmup)]


def soakd_model(case: Case, cpus: frozenset[int] | None = None) -> SoakdRun:
    config = textwrap.dedent(f"""
        [batcher]
        instances = {case.load.instances}
        [input]
        pool = {case.load.pool}
    """)
    return soakd_run(
        case.work,
        [
            "--model",
            case.spec,
            "--device",
            case.device,
            "--input-shapes",
            case.shape,
            "--warmup",
            str(case.warmup),
            "--concurrency",
            str(case.load.concurrency),
            "--max-batch-size",
            str(case.load.batch),
            "--max-queue-delay-ms",
            str(case.load.delay_ms),
            "--duration",
            f"{case.seconds}s",
        ],
        config,
        cpus=cpus,
    )


def trace_window(trace: Path, start: float, end: float, column: int = 1) -> float:
    """How much an offline trace's cumulative ``column`` (1: requests, 2: minor faults) grew between
    two epoch times, interpolated linearly between its 50 ms marks."""
    points = [(float(f[0]), int(f[column])) for f in (line.split() for line in trace.read_text().splitlines() if line)]
    if not points or points[0][0] > start or points[-1][0] < end:
        raise RuntimeError(f"the offline loop's trace {trace} does not cover soakd's window {start:.3f}-{end:.3f}")

    def count(at: float) -> float:
        for (t0, n0), (t1, n1) in itertools.pairwise(points):
            if t0 <= at <= t1:
                return n0 + (n1 - n0) * (at - t0) / (t1 - t0) if t1 > t0 else float(n1)
        raise AssertionError("unreachable: the window is inside the trace")

    return count(end) - count(start)


def trace_rate(trace: Path, start: float, end: float) -> float:
    """Requests per second of an offline trace between two epoch times."""
    return trace_window(trace, start, end) / (end - start)


def last_mark(trace: Path) -> float:
    lines = trace.read_text().splitlines()
    return float(lines[-1].split()[0]) if lines else 0.0


def side_by_side_round(case: Case, cpus: tuple[frozenset[int], frozenset[int]]) -> tuple[float, float, SoakdRun]:
    """One round of --side-by-side: the offline loop pinned to ``cpus[0]`` and soakd to ``cpus[1]``,
    running at the same time, each with OMP_NUM_THREADS = its share; the offline req/s and page
    faults per batch over soakd's measured window, and soakd's run. Both sides see the same
    neighbours at the same moment, which the alternating rounds cannot give on a shared host whose
    speed moves by 20-40% within seconds."""
    off_cpus, soak_cpus = cpus
    trace = Path(tempfile.mkstemp(dir=case.work, suffix=".trace")[1])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "offline-trace", *case.child_args()]
    cmd += [str(trace), "600", str(case.load.offline_inputs)]
    errors = trace.with_suffix(".log")
    with errors.open("w") as err:
        off = subprocess.Popen(
            cmd,
            env=env(OMP_NUM_THREADS=str(len(off_cpus))),
            preexec_fn=pinned(off_cpus),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 300
        while not trace.read_text():  # warmed up and timing before soakd starts
            if off.poll() is not None:
                raise RuntimeError(f"the offline loop exited {off.returncode}: {errors.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the offline loop did not start within 300 s")
            time.sleep(0.05)
        run = soakd_model(case, soak_cpus)
        start, end = run.window()
        deadline = time.monotonic() + 120
        while last_mark(trace) < end:  # the offline call in flight at soakd's end must finish first
            if off.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the offline loop stopped before soakd's window ended: {errors.read_text()[-2000:]}"
                )
            time.sleep(0.05)
        batches = trace_window(trace, start, end) / case.load.batch
        return trace_rate(trace, start, end), trace_window(trace, start, end, 2) / max(1.0, batches), run
    finally:
        off.kill()
        off.wait()


# ---------------------------------------------------------------------------------- main


def on_half(load: Load, half: int, cpus: int) -> Load:
    """The load as --side-by-side gives it to soakd on ``half`` of ``cpus``: the same model
    instances per CPU. ``instances = 2`` on a 2-core machine is one instance per core; on one CPU
    of it two instances would time-share that core and the row would measure the oversubscription
    (soakd/offline 0.79-0.92 at batch 1 against 0.98-0.99 with one instance, 2026-12-03)."""
    return replace(load, instances=max(1, load.instances * half // cpus))


def paired(row: dict[str, Any]) -> float:
    """Median over rounds of soakd / offline within a round: the two ran back to back, so a
    machine that drifts between rounds (a neighbour's load) moves both sides of each ratio."""
    return float(statistics.median(s / o for s, o in zip(row["soakd"], row["offline"], strict=True) if o > 0))


def allocator_note(row: dict[str, Any]) -> str:
    """A row where either side faults in a megabyte a batch or more is paced by the allocator: its
    ratio compares two allocation histories, not soakd with the model (bench/malloc_lottery.py)."""
    sides = [row["soak_faults_per_call"], row.get("offline_faults_per_call") or []]
    worst = max((statistics.median(v) for v in sides if v), default=0.0)
    if worst * PAGE_BYTES < FAULT_WARN_BYTES:
        return ""
    return f"  allocator-bound: {worst:,.0f} page faults a batch (bench/malloc_lottery.py)"


def fmt_rounds(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short rows (about 3-4 minutes in all)")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per model row and round (5; quick 1)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating offline / soakd rounds (>= 3)")
    ap.add_argument("--models", default=",".join(KINDS), help=f"subset of {','.join(KINDS)}")
    ap.add_argument("--loads", default=",".join(x.name for x in LOADS), help="subset of the load rows, by name")
    ap.add_argument("--seed-models", default="convnet", help="models that get the seed-harness row ('' for none)")
    ap.add_argument("--shape", default="3x224x224")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls, both sides (20; quick 5)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for every process (default: torch's own); 1 takes OpenMP out of the "
        "comparison, e.g. on a machine shared with other load",
    )
    ap.add_argument(
        "--steady-malloc",
        action="store_true",
        help="every process with glibc keeping freed blocks (soakd.allocator.GLIBC_KEEP_BLOCKS): takes "
        "the allocator's page faults, which differ from process to process, out of the comparison",
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="CPU: run each round's offline loop and soakd at the same time, each pinned to half of "
        "the CPUs with OMP_NUM_THREADS set to its half (halves swapped every round), the offline "
        "rate counted over soakd's measured window: both sides see the same neighbours",
    )
    ap.add_argument("--noop-seconds", type=float, default=None, help="seconds per builtin:noop run (5; quick 2)")
    ap.add_argument("--rates", default="20000,50000,100000", help="open-loop Poisson rates, req/s ('' to skip)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the builtin:noop closed-loop ceiling")
    ap.add_argument("--json", help="also write every round's figures here")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        kind, *rest = args.child
        out = child_main(kind, rest)
        print(json.dumps(out))
        return 0

    if args.rounds < 3:
        ap.error("--rounds: at least 3 (the figures are medians)")
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    if args.warmup is None:
        args.warmup = 5 if args.quick else 20
    if args.threads is not None and args.side_by_side:
        ap.error("--threads and --side-by-side: the side-by-side rounds set each side's threads to its half")
    if args.threads is not None:
        EXTRA_ENV["OMP_NUM_THREADS"] = str(args.threads)
    if args.steady_malloc:
        EXTRA_ENV.update(GLIBC_KEEP_BLOCKS)
    noop_s = args.noop_seconds or (2.0 if args.quick else 5.0)
    kinds = [k for k in args.models.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"--models: unknown {bad} (known: {', '.join(KINDS)})")
    loads = [x for x in LOADS if x.name in args.loads.split(",")]
    if not loads:
        ap.error(f"--loads: none of {args.loads!r} (known: {', '.join(x.name for x in LOADS)})")
    seeded = {k for k in args.seed_models.split(",") if k}
    record: dict[str, Any] = {"rows": [], "ceiling": None, "open_loop": []}
    t_start = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="soakd-limit-") as tmp:
        work = Path(tmp)
        built = run_child("build", tmp, args.device, args.shape)
        dev = built["device"]
        halves: tuple[frozenset[int], frozenset[int]] | None = None
        if args.side_by_side:
            if dev != "cpu":
                ap.error("--side-by-side: CPU only (one device cannot be shared out without the sides meeting)")
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                ap.error("--side-by-side: needs at least 2 CPUs")
            half = len(cpus) // 2
            halves = (frozenset(cpus[:half]), frozenset(cpus[half : 2 * half]))
        where = built["cuda_name"] or f"cpu, {os.cpu_count()} cores, torch threads {built['threads']}"
        print(
            f"device {dev} ({where}), torch {built['torch']}; {seconds:g} s per model row, {args.rounds} rounds, "
            f"warm-up {args.warmup}, each figure its own process; shape {args.shape}",
            flush=True,
        )
        if halves:
            print(
                f"side by side: offline and soakd at the same time on CPUs {sorted(halves[0])} / {sorted(halves[1])}"
                f" (swapped every round), OMP_NUM_THREADS={len(halves[0])} each; soakd's model instances scaled"
                " to its half (the same instances per CPU as on the whole machine)",
                flush=True,
            )
        if args.steady_malloc:
            print(
                f"steady malloc: {' '.join(f'{k}={v}' for k, v in GLIBC_KEEP_BLOCKS.items())} in every process",
                flush=True,
            )

        # 1. soakd against each model's offline loop.
        rows = []
        for kind in kinds:
            spec = built["specs"][kind]
            for load in loads:
                offline: list[float] = []
                soak: list[float] = []
                seed: list[float] = []
                inproc: list[float] = []  # soakd's own achieved / its in-process probe of the model alone
                harness: list[float] = []  # soakd's per-batch work / the model's time, on its model threads
                faults: list[float] = []  # page faults per batch over the soak (the allocator's share)
                probe_faults: list[float] = []  # the same in soakd's offline probe
                off_faults: list[float] = []  # the same in the offline loop (side by side only)
                here = on_half(load, len(halves[0]), 2 * len(halves[0])) if halves else load
                case = Case(work, spec, dev, args.shape, here, args.warmup, seconds)
                for r in range(args.rounds):
                    if halves:  # both at once; the halves swap every round
                        pair = halves if r % 2 == 0 else (halves[1], halves[0])
                        off_rps, off_fault, run = side_by_side_round(case, pair)
                        off_faults.append(off_fault)
                    else:
                        off_rps = run_child("offline", *case.child_args(), str(seconds), str(load.offline_inputs))[
                            "rps"
                        ]
                        run = soakd_model(case)
                    offline.append(off_rps)
                    soak.append(float(run.summary["throughput_rps"]))
                    probe = run.summary.get("model_offline") or {}
                    inproc.append(float(probe.get("achieved_ratio") or 0.0))
                    harness.append(float(probe.get("harness_overhead_ratio") or 0.0))
                    faults.append(float(probe.get("soak_page_faults_per_call") or 0.0))
                    probe_faults.append(float(probe.get("page_faults_per_call") or 0.0))
                    if kind in seeded and load.pool == DEFAULT_POOL and not halves:  # the seed harness has no pool
                        seed.append(run_child("seed", *case.child_args(), str(seconds), str(off_rps))["rps"])
                row = {"model": kind, "spec": spec, "load": load.name, "offline": offline, "soakd": soak, "seed": seed}
                row.update(
                    in_process=inproc,
                    harness_overhead=harness,
                    soak_faults_per_call=faults,
                    probe_faults_per_call=probe_faults,
                    offline_faults_per_call=off_faults,
                )
                rows.append(row)
                record["rows"].append(row)
                off_m, soak_m = statistics.median(offline), statistics.median(soak)
                line = (
                    f"  {kind:<12} {load.name:<12} offline ({load.offline_inputs} input"
                    f"{'s' if load.offline_inputs > 1 else ''}) {off_m:9.1f}  soakd {soak_m:9.1f}  "
                    f"soakd/offline {soak_m / off_m:6.3f}   rounds offline [{fmt_rounds(offline)}] "
                    f"soakd [{fmt_rounds(soak)}] in-process [{', '.join(f'{v:.2f}' for v in inproc)}]"
                    f"  soakd's work {100 * statistics.median(harness):.1f}% of the model's"
                    f"  faults/batch {statistics.median(faults):,.0f} (probe {statistics.median(probe_faults):,.0f}"
                    + (f", offline loop {statistics.median(off_faults):,.0f})" if off_faults else ")")
                )
                if seed:
                    line += f" seed [{fmt_rounds(seed)}]"
                print(line, flush=True)

        # 2. The driver's ceiling: builtin:noop, closed loop, batch 1024.
        ceiling: list[float] = []
        if not args.no_ceiling:
            for _ in range(args.rounds):
                s = soakd_run(
                    work,
                    [
                        "--model",
                        "builtin:noop",
                        "--device",
                        dev,
                        "--input-shapes",
                        "16",
                        "--warmup",
                        "10",
                        "--concurrency",
                        "4096",
                        "--max-batch-size",
                        "1024",
                        "--max-queue-delay-ms",
                        "1",
                        "--duration",
                        f"{noop_s}s",
                    ],
                ).summary
                ceiling.append(float(s["throughput_rps"]))
            record["ceiling"] = ceiling

        # 3. Open loop: builtin:noop under Poisson arrivals.
        opens = []
        for rate in [float(r) for r in args.rates.split(",") if r]:
            s = soakd_run(
                work,
                [
                    "--model",
                    "builtin:noop",
                    "--device",
                    dev,
                    "--input-shapes",
                    "16",
                    "--warmup",
                    "10",
                    "--rate",
                    f"{rate:g}",
                    "--arrival",
                    "poisson",
                    "--max-batch-size",
                    "1024",
                    "--max-queue-delay-ms",
                    "1",
                    "--duration",
                    f"{noop_s}s",
                ],
            ).summary
            req = s["requests"]
            item = {
                "rate": rate,
                "achieved": float(s["throughput_rps"]),
                "offered": float(s.get("offered_rps", 0.0)),
                "lag_p99_ms": float(s["schedule_lag_ms"]["p99"]),
                "lag_max_ms": float(s["schedule_lag_ms"]["max"]),
                "dropped": int(req.get("dropped", 0)),
                "ok": int(req.get("ok", 0)),
            }
            opens.append(item)
            record["open_loop"].append(item)

    # The table of ratios.
    print(f"\nsoakd vs the model's own offline loop (medians of {args.rounds}; goal soakd/offline >= 0.95)")
    print("  (soakd/off: ratio of the medians; paired: median of each round's soakd / offline)")
    print(
        f"  {'model':<12} {'load':<12} {'offline':>9} {'soakd':>9} {'soakd/off':>9} {'paired':>7}"
        f" {'seed':>9} {'seed/off':>9}"
    )
    for row in rows:
        off_m, soak_m = statistics.median(row["offline"]), statistics.median(row["soakd"])
        seed_cols = f"{'-':>9} {'-':>9}"
        if row["seed"]:
            seed_m = statistics.median(row["seed"])
            seed_cols = f"{seed_m:9.1f} {seed_m / off_m:9.3f}"
        print(
            f"  {row['model']:<12} {row['load']:<12} {off_m:9.1f} {soak_m:9.1f} {soak_m / off_m:9.3f}"
            f" {paired(row):7.3f} {seed_cols}{allocator_note(row)}"
        )
    if ceiling:
        med = statistics.median(ceiling)
        print(
            f"\nbuiltin:noop ceiling, concurrency 4096, batch 1024: {med:,.0f} req/s "
            f"(rounds {fmt_rounds(ceiling)}); ratio to goal 300,000: {med / 300_000:.3f}"
        )
    if opens:
        print(f"\nopen loop, builtin:noop, Poisson, {noop_s:g} s each (goal: achieved within 1%, lag p99 < 1 ms)")
        print(
            f"  {'rate':>9} {'achieved':>10} {'ach/rate':>9} {'offered/rate':>12} {'lag p99 ms':>11}"
            f" {'lag max ms':>11} {'dropped':>8}  holds"
        )
        held = 0.0
        for o in opens:
            ok = o["achieved"] / o["rate"] >= 0.99 and o["lag_p99_ms"] < 1.0
            if ok:
                held = max(held, o["rate"])
            print(
                f"  {o['rate']:9.0f} {o['achieved']:10.1f} {o['achieved'] / o['rate']:9.4f}"
                f" {o['offered'] / o['rate']:12.4f} {o['lag_p99_ms']:11.3f} {o['lag_max_ms']:11.3f}"
                f" {o['dropped']:8d}  {'yes' if ok else 'no'}"
            )
        print(f"  highest rate that holds: {held:,.0f} req/s" if held else "  no rate tried holds")
    print(f"\n(bench ran {time.monotonic() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
