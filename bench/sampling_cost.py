"""What soakd's memory and device samplers cost (issue: memory and device telemetry).

1. Per source, per sample: median and p99 wall time of one sample() call, in this process
   (torch imported and a model loaded, so /proc and malloc have a realistic number of
   mappings and arenas).
2. The same through the scheduler's bounded path (hand-off to the source's worker thread).
3. Share of one core the samplers take at the default interval (goal: under 1% of a core on a
   CPU host): process CPU time over a run with every default source on APScheduler at a fast
   interval, minus an idle run of the same length, scaled to memory.interval = 10 s.
4. Where CUDA/NVML exist: torch.cuda.memory_stats(), memory_snapshot() and NVML call costs.

    .venv/bin/python bench/sampling_cost.py [--samples 2000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from soakd.config import MemoryConfig
from soakd.models.loader import load_model
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.gc_stats import GcSampler
from soakd.telemetry.host import HostSampler, MallocSampler, TracemallocSampler, UssSampler
from soakd.telemetry.nvml import NvmlSampler
from soakd.telemetry.scheduler import Sampler, SamplerScheduler, SourceUnavailable
from soakd.telemetry.series import SeriesStore
from soakd.telemetry.torch_cuda import TorchCuda, TorchCudaSampler, TorchCudaSnapshotSampler


def timings(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """(median, p99) seconds of ``fn()`` over ``n`` calls after a short warm-up."""
    for _ in range(min(20, n)):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    out.sort()
    return statistics.median(out), out[min(len(out) - 1, int(0.99 * len(out)))]


def us(v: float) -> str:
    return f"{v * 1e6:10.1f} µs"


def default_samplers(metrics: Metrics, series: SeriesStore, devices: list[int]) -> list[Sampler]:
    return [
        HostSampler(metrics, series),
        UssSampler(metrics, series),
        MallocSampler(metrics, series),
        GcSampler(metrics),
        TorchCudaSampler(metrics, series, devices),
        NvmlSampler(metrics, series),
    ]


def usable(samplers: list[Sampler]) -> list[Sampler]:
    ok = []
    for s in samplers:
        try:
            s.open()
            ok.append(s)
        except SourceUnavailable as exc:
            print(f"  {s.name:<20} absent here: {exc}")
    return ok


def core_share(devices: list[int], seconds: float, interval: float) -> tuple[float, int]:
    """CPU seconds per scheduler tick (all default sources), measured against an idle baseline."""
    idle0 = time.process_time()
    time.sleep(seconds)
    idle = time.process_time() - idle0
    metrics, series = Metrics(), SeriesStore(100_000)
    sched = SamplerScheduler(metrics)
    samplers = default_samplers(metrics, series, devices)
    for s in samplers:
        sched.add(s, interval)
    sched.start()
    time.sleep(0.5)  # past the opens
    c0, n0 = time.process_time(), sum(src.samples for src in sched._sources.values())
    time.sleep(seconds)
    busy = time.process_time() - c0
    ticks = sum(src.samples for src in sched._sources.values()) - n0
    sched.shutdown()
    live = sum(1 for state in sched.states().values() if state == "up")
    per_tick = max(0.0, busy - idle) / max(1, ticks / max(1, live))
    return per_tick, live


def gpu_call_costs(dev: int, samples: int) -> dict[str, dict[str, Any]]:
    """Median and p99 µs of each GPU call soakd's samplers make (torch allocator, snapshot job,
    each NVML query); ``{"error": ...}`` for a call this GPU or driver does not answer."""
    out: dict[str, dict[str, Any]] = {}

    def timed(label: str, fn: Callable[[], object]) -> None:
        med, p99 = timings(fn, samples)
        out[label] = {"median": round(med * 1e6, 2), "p99": round(p99 * 1e6, 2)}

    backend = TorchCuda()
    timed("torch.cuda.memory_stats()", lambda: backend.memory_stats(dev))
    timed("torch.cuda.mem_get_info()", lambda: backend.mem_get_info(dev))
    timed("torch.cuda.memory_snapshot()", backend.memory_snapshot)
    snap = TorchCudaSnapshotSampler(Metrics(), [dev])
    snap.open()
    timed("snapshot sampler (largest free)", snap.sample)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # NVML absent: say so, the bench goes on
        out["nvml"] = {"error": str(exc)}
        return out
    h = pynvml.nvmlDeviceGetHandleByIndex(dev)
    nv_calls: list[tuple[str, Callable[[], object]]] = [
        ("nvmlDeviceGetMemoryInfo v2", lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)),
        ("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h)),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        ("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetClockInfo SM", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
        ("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("nvmlDeviceGetTemperature", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
    ]
    try:
        for label, nv_fn in nv_calls:
            try:
                timed(label, nv_fn)
            except pynvml.NVMLError as exc:
                out[label] = {"error": str(exc)}
    finally:
        pynvml.nvmlShutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    model = load_model("builtin:convnet", "cuda" if cuda else "cpu")
    devices = [model.device.index or 0] if cuda else []
    print(f"soakd sampling cost (torch {torch.__version__}, device {model.device}, {args.samples} samples each)")

    metrics, series = Metrics(), SeriesStore(1_000_000)
    samplers = usable([*default_samplers(metrics, series, devices), TracemallocSampler(metrics)])
    print(f"\n1. sample() per source{'':<10}{'median':>13}{'p99':>13}")
    for s in samplers:
        med, p99 = timings(s.sample, args.samples)
        note = "  (optional; tracing slows every allocation)" if s.name == "tracemalloc" else ""
        print(f"  {s.name:<30}{us(med)}   {us(p99)}{note}")
    for s in samplers:
        s.close()

    print("\n2. through the scheduler's bounded path (worker hand-off + collector metrics)")
    sched_metrics = Metrics()
    sched = SamplerScheduler(sched_metrics)
    for s in default_samplers(sched_metrics, SeriesStore(1_000_000), devices):
        sched.add(s, 3600)
    for name in list(sched.states()):
        sched.run_once(name)
    for name, state in sched.states().items():
        if state != "up":
            continue
        med, p99 = timings(lambda name=name: sched.run_once(name), args.samples)  # type: ignore[misc]
        print(f"  {name:<30}{us(med)}   {us(p99)}")
    sched.shutdown()

    interval = MemoryConfig().interval
    per_tick, live = core_share(devices, args.seconds, 0.05)
    share = per_tick / interval
    print(
        f"\n3. share of one core at memory.interval = {interval:.0f}s: {share * 100:.4f}% "
        f"({per_tick * 1e3:.2f} ms CPU per tick of {live} live sources, APScheduler included; goal < 1%)"
    )

    if cuda:
        xs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in [1 << 16, 3 << 20, 12 << 20] * 50]
        print("\n4. GPU call costs")
        for label, got in gpu_call_costs(devices[0], min(args.samples, 500)).items():
            if "error" in got:
                print(f"  {label:<40} not supported: {got['error']}")
            else:
                print(f"  {label:<40}{us(got['median'] / 1e6)}   {us(got['p99'] / 1e6)}")
        del xs


if __name__ == "__main__":
    main()
