"""Samplers read their backends into the catalogue's metrics and the leak series.

Backends are fakes answering with recorded data: a device's answers where bench/gpu_check.sh
recorded them (tests/fixtures/recorded/<gpu>/), else the synthetic ones in tests/fixtures/, which
also hold the cases no device showed (an older GPU and driver, no driver, counters reset); a
procfs tree copied from a real process.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import generate_latest

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.gc_stats import GcSampler
from soakd.telemetry.host import HostSampler, MallInfo2, MallocSampler, ProcFS, UssSampler, glibc_mallinfo2
from soakd.telemetry.nvml import NvmlSampler, clock_event_reasons
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore
from soakd.telemetry.torch_cuda import TorchCudaSampler, TorchCudaSnapshotSampler
from tests.telemetry_fakes import FakeCuda, FakeNvml, clk_tck, fake_proc, fixture_json, load_json, rollup_kb

MiB = 1 << 20


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# --------------------------------------------------------------------------- host / procfs


def test_host_reads_rss_uss_cpu_threads_fds_from_proc_tree(tmp_path: Path) -> None:
    """RSS from statm, USS from smaps_rollup, CPU and threads from stat, fds from fd/, available
    from meminfo (files recorded from one real process at one moment)."""
    m, series = Metrics(), SeriesStore(100)
    proc = ProcFS(fake_proc(tmp_path, open_fds=7))
    sampler = HostSampler(m, series, proc, clock=lambda: 1000.0)
    uss_sampler = UssSampler(m, series, proc, clock=lambda: 1000.0)
    for s in (sampler, uss_sampler):
        s.open()
        s.sample()
    # statm's resident pages and smaps_rollup's Rss were recorded together and agree.
    assert value(m, "soakd_process_resident_memory_bytes") == rollup_kb("Rss") * 1024
    uss = (rollup_kb("Private_Clean") + rollup_kb("Private_Dirty") + rollup_kb("Private_Hugetlb")) * 1024
    assert value(m, "soakd_process_unique_memory_bytes") == uss
    # The recorded stat line: utime 194 + stime 28 ticks, 2 threads.
    assert value(m, "soakd_process_cpu_seconds_total") == pytest.approx((194 + 28) / clk_tck())
    assert value(m, "soakd_process_threads") == 2
    assert value(m, "soakd_process_open_fds") == 7
    assert value(m, "soakd_host_memory_available_bytes") == 23859136 * 1024
    t, v = series.read("host_rss")
    assert list(t) == [1000.0] and list(v) == [rollup_kb("Rss") * 1024]
    assert list(series.read("host_uss")[1]) == [uss]


def test_host_without_smaps_rollup_has_rss_and_no_uss_source(tmp_path: Path) -> None:
    """An old kernel without smaps_rollup still gives RSS (statm); the USS source is unavailable."""
    m, series = Metrics(), SeriesStore(100)
    proc = ProcFS(fake_proc(tmp_path, rollup=False))
    HostSampler(m, series, proc).sample()
    resident_pages = int((tmp_path / "self" / "statm").read_text().split()[1])
    assert value(m, "soakd_process_resident_memory_bytes") == resident_pages * os.sysconf("SC_PAGE_SIZE")
    with pytest.raises(SourceUnavailable, match="smaps_rollup"):
        UssSampler(m, series, proc).open()
    assert series.read("host_uss")[0].size == 0


def test_host_on_real_proc_is_plausible() -> None:
    """Against this process's real /proc the numbers agree with psutil."""
    import psutil

    m = Metrics()
    HostSampler(m, None).sample()
    UssSampler(m, None).sample()
    rss = value(m, "soakd_process_resident_memory_bytes")
    uss = value(m, "soakd_process_unique_memory_bytes")
    assert rss is not None and uss is not None
    assert 0 < uss <= rss
    assert abs(rss - psutil.Process().memory_info().rss) < 0.2 * rss
    assert value(m, "soakd_process_threads") == pytest.approx(psutil.Process().num_threads(), abs=2)


# --------------------------------------------------------------------------- malloc


def test_malloc_maps_mallinfo2_fields() -> None:
    """arena = arena + hblkhd, in use = uordblks + hblkhd, free = fordblks; in-use goes to the series."""
    m, series = Metrics(), SeriesStore(100)
    mi = MallInfo2(arena=64 * MiB, hblkhd=10 * MiB, uordblks=50 * MiB, fordblks=14 * MiB)
    sampler = MallocSampler(m, series, lambda: mi, clock=lambda: 5.0)
    sampler.open()
    sampler.sample()
    assert value(m, "soakd_malloc_arena_bytes") == 74 * MiB
    assert value(m, "soakd_malloc_in_use_bytes") == 60 * MiB
    assert value(m, "soakd_malloc_free_bytes") == 14 * MiB
    assert list(series.read("malloc_in_use")[1]) == [60 * MiB]


def test_real_glibc_mallinfo2_sees_a_large_allocation() -> None:
    """On glibc, a 64 MiB buffer shows up in malloc_in_use (mmapped: hblkhd)."""
    fn = glibc_mallinfo2()
    m = Metrics()
    sampler = MallocSampler(m, None, fn)
    sampler.sample()
    before = value(m, "soakd_malloc_in_use_bytes")
    buf = bytearray(64 * MiB)
    sampler.sample()
    after = value(m, "soakd_malloc_in_use_bytes")
    del buf
    assert before is not None and after is not None
    assert after - before >= 60 * MiB


def test_malloc_without_mallinfo2_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off glibc (no mallinfo2 symbol) the malloc source reports itself unavailable, not an error."""
    import ctypes

    class NoMallinfo:
        def __init__(self, name: str | None) -> None:
            pass

        def __getattr__(self, name: str) -> object:
            raise AttributeError(name)

    monkeypatch.setattr(ctypes, "CDLL", NoMallinfo)
    with pytest.raises(SourceUnavailable, match="mallinfo2"):
        MallocSampler(Metrics(), None).open()


# --------------------------------------------------------------------------- gc


def test_gc_counts_collections_and_times_pauses() -> None:
    """A forced full collection is counted for generation 2 and its pause lands in the histogram."""
    m = Metrics()
    sampler = GcSampler(m)
    sampler.open()
    try:
        sampler.sample()
        before = value(m, "soakd_python_gc_collections_total", generation="2") or 0.0
        gc.collect()
        sampler.sample()
        assert value(m, "soakd_python_gc_collections_total", generation="2") == before + 1
        assert value(m, "soakd_python_gc_pause_seconds_count", generation="2") == 1
        total = value(m, "soakd_python_gc_pause_seconds_sum", generation="2")
        assert total is not None and 0 < total < 5
    finally:
        sampler.close()
    assert sampler._on_gc not in gc.callbacks


# --------------------------------------------------------------------------- torch CUDA allocator


def test_torch_cuda_reads_every_pool_and_counter() -> None:
    """Bytes per pool, segments, the event counters and both fragmentation ratios from memory_stats()."""
    stats = fixture_json("torch_memory_stats.json")
    m, series = Metrics(), SeriesStore(100)
    cuda = FakeCuda(stats, free_total=(50 * MiB, 80 * MiB))
    sampler = TorchCudaSampler(m, series, [0], cuda, clock=lambda: 7.0)
    sampler.open()
    sampler.sample()
    for name, key in [
        ("allocated", "allocated_bytes"),
        ("reserved", "reserved_bytes"),
        ("active", "active_bytes"),
        ("inactive_split", "inactive_split_bytes"),
        ("requested", "requested_bytes"),
    ]:
        for pool, tpool in [("all", "all"), ("large", "large_pool"), ("small", "small_pool")]:
            got = value(m, f"soakd_torch_cuda_{name}_bytes", device="cuda:0", pool=pool)
            assert got == stats[f"{key}.{tpool}.current"], (name, pool)
    assert value(m, "soakd_torch_cuda_segments", device="cuda:0", pool="large") == stats["segment.large_pool.current"]
    assert value(m, "soakd_torch_cuda_alloc_retries_total", device="cuda:0") == stats["num_alloc_retries"]
    assert value(m, "soakd_torch_cuda_ooms_total", device="cuda:0") == stats["num_ooms"]
    assert value(m, "soakd_torch_cuda_device_allocs_total", device="cuda:0") == stats["num_device_alloc"]
    assert value(m, "soakd_torch_cuda_device_frees_total", device="cuda:0") == stats["num_device_free"]
    allocated, reserved = stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"]
    assert value(
        m, "soakd_torch_cuda_fragmentation_ratio", device="cuda:0", kind="reserved_unallocated"
    ) == pytest.approx(1 - allocated / reserved)
    assert value(m, "soakd_torch_cuda_fragmentation_ratio", device="cuda:0", kind="inactive_split") == pytest.approx(
        stats["inactive_split_bytes.all.current"] / reserved
    )
    assert value(m, "soakd_torch_cuda_device_free_bytes", device="cuda:0") == 50 * MiB
    assert list(series.read("torch_cuda_allocated")[1]) == [allocated]
    assert list(series.read("torch_cuda_reserved")[1]) == [reserved]


def test_torch_cuda_older_torch_without_num_device_alloc_uses_segment_totals() -> None:
    """Before num_device_alloc existed, cudaMalloc/cudaFree counts are the segment totals."""
    stats = {k: v for k, v in fixture_json("torch_memory_stats.json").items() if not k.startswith("num_device")}
    m = Metrics()
    TorchCudaSampler(m, None, [0], FakeCuda(stats)).sample()
    assert value(m, "soakd_torch_cuda_device_allocs_total", device="cuda:0") == stats["segment.all.allocated"]
    assert value(m, "soakd_torch_cuda_device_frees_total", device="cuda:0") == stats["segment.all.freed"]


def test_torch_cuda_nothing_reserved_means_no_fragmentation() -> None:
    """A fresh allocator (empty memory_stats) exports zeros, not a division error."""
    m = Metrics()
    TorchCudaSampler(m, None, [0], FakeCuda({})).sample()
    assert value(m, "soakd_torch_cuda_fragmentation_ratio", device="cuda:0", kind="reserved_unallocated") == 0


def test_torch_cuda_counters_never_go_down() -> None:
    """The exported retry count keeps its maximum if the source's counter is reset by someone else."""
    stats = load_json("torch_memory_stats.json")
    cuda = FakeCuda(stats)
    m = Metrics()
    sampler = TorchCudaSampler(m, None, [0], cuda)
    sampler.sample()
    cuda.stats = {**stats, "num_alloc_retries": 0}
    sampler.sample()
    assert value(m, "soakd_torch_cuda_alloc_retries_total", device="cuda:0") == 2


def test_torch_cuda_absent_on_cpu_model_and_without_cuda() -> None:
    """A CPU model or a host without CUDA makes the source unavailable (reported once, not an error)."""
    with pytest.raises(SourceUnavailable, match="CUDA device"):
        TorchCudaSampler(Metrics(), None, []).open()
    with pytest.raises(SourceUnavailable, match="not available"):
        TorchCudaSampler(Metrics(), None, [0], FakeCuda(available=False)).open()


def test_snapshot_gives_largest_free_block() -> None:
    """The largest inactive block across the device's segments (a fully free 20 MiB segment in
    the synthetic snapshot, made for this case)."""
    m = Metrics()
    sampler = TorchCudaSnapshotSampler(m, [0], FakeCuda(snapshot=load_json("torch_memory_snapshot.json")))
    sampler.open()
    sampler.sample()
    assert value(m, "soakd_torch_cuda_largest_free_block_bytes", device="cuda:0") == 20 * MiB


# --------------------------------------------------------------------------- NVML


def test_nvml_reads_every_field_per_gpu() -> None:
    """Memory (v2 with reserved), our process's memory, utilization, clock, power, energy, temperature."""
    nv = FakeNvml(pid=os.getpid())
    g = nv.answers["gpus"][0]
    m, series = Metrics(), SeriesStore(100)
    sampler = NvmlSampler(m, series, nv, uuids=[g["uuid"]], clock=lambda: 3.0)
    sampler.open()
    sampler.sample()
    lab = {"gpu": "0", "uuid": g["uuid"]}
    mem = g["memory_v2"] if "memory_v2" not in g["unsupported"] else g["memory"]
    assert value(m, "soakd_gpu_memory_used_bytes", **lab) == mem["used"]
    assert value(m, "soakd_gpu_memory_total_bytes", **lab) == mem["total"]
    assert value(m, "soakd_gpu_memory_reserved_bytes", **lab) == mem.get("reserved")
    # Only our pid's entries; another process's memory is not ours.
    ours = [p["usedGpuMemory"] for p in g["processes"] if p["pid"] == "SELF"]
    assert value(m, "soakd_gpu_process_memory_bytes", **lab, pid=str(os.getpid())) == (sum(ours) if ours else None)
    assert value(m, "soakd_gpu_utilization_ratio", **lab) == pytest.approx(g["utilization"]["gpu"] / 100)
    assert value(m, "soakd_gpu_sm_clock_hertz", **lab) == g["sm_clock_mhz"] * 1e6
    if "power" not in g["unsupported"]:
        assert value(m, "soakd_gpu_power_watts", **lab) == pytest.approx(g["power_mw"] / 1e3)
    assert value(m, "soakd_gpu_energy_joules_total", **lab) == pytest.approx(g["energy_mj"] / 1e3)
    assert value(m, "soakd_gpu_temperature_celsius", **lab) == g["temperature_c"]
    for reason, active in clock_event_reasons(g["clock_event_reasons"]).items():
        assert value(m, "soakd_gpu_clock_event_reason_active", **lab, reason=reason) == int(active), reason
    # The leak series follow the model's GPU only.
    assert list(series.read("gpu_memory_used")[1]) == [mem["used"]]
    assert list(series.read("gpu_process_memory")[1]) == ([sum(ours)] if ours else [])
    sampler.close()
    assert nv.shutdown_calls == 1


def test_nvml_synthetic_h100_answers_map_to_these_values() -> None:
    """The hand-made H100 answers, checked against numbers worked out by hand (36 = 0x24: software
    power cap and software thermal slowdown)."""
    m = Metrics()
    sampler = NvmlSampler(m, None, FakeNvml(pid=os.getpid(), answers=load_json("nvml_answers.json")))
    sampler.open()
    sampler.sample()
    h100 = {"gpu": "0", "uuid": "GPU-6f2c5bd3-9a1e-4c1e-8f0a-2b7d0c9e4a11"}
    assert value(m, "soakd_gpu_memory_used_bytes", **h100) == 24932458496
    assert value(m, "soakd_gpu_memory_reserved_bytes", **h100) == 571277312
    assert value(m, "soakd_gpu_process_memory_bytes", **h100, pid=str(os.getpid())) == 24360517632
    assert value(m, "soakd_gpu_power_watts", **h100) == pytest.approx(412.345)
    assert value(m, "soakd_gpu_clock_event_reason_active", **h100, reason="sw_power_cap") == 1
    assert value(m, "soakd_gpu_clock_event_reason_active", **h100, reason="sw_thermal_slowdown") == 1
    assert value(m, "soakd_gpu_clock_event_reason_active", **h100, reason="gpu_idle") == 0


def test_nvml_older_gpu_drops_unsupported_fields_and_keeps_the_rest() -> None:
    """No memory v2, no power, old throttle-reason call: v1 memory, no power series, reasons still mapped."""
    m = Metrics()
    sampler = NvmlSampler(m, None, FakeNvml(pid=os.getpid(), answers=load_json("nvml_answers.json")))
    sampler.open()
    sampler.sample()
    sampler.sample()  # the second pass does not ask again what the GPU said it cannot answer
    t4 = {"gpu": "1", "uuid": "GPU-0b1d7e55-1c4f-43a2-9d6e-5e8f7a6b3c22"}
    assert value(m, "soakd_gpu_memory_used_bytes", **t4) == 382533632
    assert value(m, "soakd_gpu_memory_reserved_bytes", **t4) is None
    assert value(m, "soakd_gpu_power_watts", **t4) is None
    assert value(m, "soakd_gpu_temperature_celsius", **t4) == 34
    assert value(m, "soakd_gpu_clock_event_reason_active", **t4, reason="gpu_idle") == 1
    # Our pid has no context on the T4: no process figure rather than a made-up 0.
    assert value(m, "soakd_gpu_process_memory_bytes", **t4, pid=str(os.getpid())) is None
    assert sampler.gpus[1].unsupported == {"memory_v2", "power", "clock_events"}


def test_nvml_without_driver_is_unavailable_with_the_reason() -> None:
    """nvmlInit()'s recorded no-driver errors (library not found, driver not loaded) mean 'absent'."""
    recorded = load_json("nvml_answers.json")["no_driver"]
    cases = [(recorded["value"], recorded["str"]), (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded")]
    for code, text in cases:
        with pytest.raises(SourceUnavailable, match=text):
            NvmlSampler(Metrics(), None, FakeNvml(os.getpid(), init_error=code)).open()


def test_real_pynvml_here_matches_the_recorded_no_driver_answer() -> None:
    """On a host without an NVIDIA driver the real nvidia-ml-py raises what the fixture recorded."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        recorded = load_json("nvml_answers.json")["no_driver"]
        if exc.value == recorded["value"]:
            assert type(exc).__name__ == recorded["exception"] and str(exc) == recorded["str"]
        with pytest.raises(SourceUnavailable):
            NvmlSampler(Metrics(), None).open()
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this host")


def test_a_real_nvml_failure_mid_run_is_raised() -> None:
    """A GPU that falls off the bus is an error of the source (collector down), not a silent skip."""
    nv = FakeNvml(pid=os.getpid())
    sampler = NvmlSampler(Metrics(), None, nv)
    sampler.open()

    def lost(h: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    nv.nvmlDeviceGetTemperature = lambda h, s: lost(h)  # type: ignore[method-assign,assignment]
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sampler.sample()


def test_clock_event_reason_names() -> None:
    """Each NVML clock-event bit maps to its reason name."""
    assert clock_event_reasons(pynvml.nvmlClocksEventReasonHwThermalSlowdown)["hw_thermal_slowdown"]
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonGpuIdle
    reasons = clock_event_reasons(mask)
    assert {k for k, v in reasons.items() if v} == {"sw_power_cap", "gpu_idle"}


def test_nvml_process_not_listed_adds_no_process_sample() -> None:
    """In a container NVML may list host pids: no gpu_process_memory sample instead of a flat 0."""
    m, series = Metrics(), SeriesStore(100)
    sampler = NvmlSampler(m, series, FakeNvml(pid=os.getpid()), pid=1)  # pid 1 is in no process list
    sampler.open()
    sampler.sample()
    assert series.read("gpu_process_memory")[0].size == 0
    assert series.read("gpu_memory_used")[0].size == 1


def test_nvml_process_memory_it_cannot_give_is_no_sample_not_zero() -> None:
    """pynvml's usedGpuMemory=None (NVML_VALUE_NOT_AVAILABLE, e.g. under some MIG or WDDM setups)
    is no figure for the process: no gauge and no leak-series sample, where a 0 once went in."""
    answers = load_json("nvml_answers.json")
    for g in answers["gpus"]:
        for p in g.get("processes", []):
            p["usedGpuMemory"] = None
    m, series = Metrics(), SeriesStore(100)
    sampler = NvmlSampler(m, series, FakeNvml(pid=os.getpid(), answers=answers))
    sampler.open()
    sampler.sample()
    assert series.read("gpu_process_memory")[0].size == 0
    assert series.read("gpu_memory_used")[0].size == 1
    assert "soakd_gpu_process_memory_bytes{" not in generate_latest(m.registry).decode()


def test_an_old_driver_or_a_mig_parent_drops_the_field_not_the_source() -> None:
    """NVMLLibraryMismatchError (no _v3 process call on an old driver; not an NVMLError) and
    NO_PERMISSION (a MIG parent handle) mean "cannot tell": that field is dropped, memory, clocks
    and power are still sampled on every pass."""
    answers = load_json("nvml_answers.json")
    answers["gpus"][0]["library_mismatch"] = ["processes"]
    nv = FakeNvml(pid=os.getpid(), answers=answers)
    m = Metrics()
    sampler = NvmlSampler(m, None, nv)
    sampler.open()

    def no_permission(h: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    nv.nvmlDeviceGetUtilizationRates = no_permission  # type: ignore[method-assign]
    sampler.sample()
    sampler.sample()
    assert {"processes", "utilization"} <= sampler.gpus[0].unsupported
    gpu0 = {"gpu": "0", "uuid": sampler.gpus[0].uuid}
    assert value(m, "soakd_gpu_memory_used_bytes", **gpu0) is not None
    assert value(m, "soakd_gpu_utilization_ratio", **gpu0) is None


def test_nvml_unknown_model_uuid_falls_back_to_every_gpu() -> None:
    """A model GPU NVML does not name the same way (MIG) makes the used series cover every GPU."""
    series = SeriesStore(100)
    two_gpus = load_json("nvml_answers.json")  # an H100 and a T4: every GPU means both
    sampler = NvmlSampler(Metrics(), series, FakeNvml(pid=os.getpid(), answers=two_gpus), uuids=["MIG-1234"])
    sampler.open()
    sampler.sample()
    assert list(series.read("gpu_memory_used")[1]) == [24932458496 + 382533632]
