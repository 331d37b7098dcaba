"""Real torch CUDA allocator and NVML (skipped where torch.cuda.is_available() is false)."""

from __future__ import annotations

import pytest
import torch

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.nvml import NvmlSampler
from soakd.telemetry.pipeline import gpu_uuids
from soakd.telemetry.series import SeriesStore
from soakd.telemetry.torch_cuda import TorchCuda, TorchCudaSampler, TorchCudaSnapshotSampler
from tests.telemetry_fakes import load_json

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def value(metrics: Metrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    assert v is not None, (name, labels)
    return v


def test_real_memory_stats_has_the_fixture_keys() -> None:
    """The recorded fixture's key structure is what this torch's memory_stats() returns."""
    torch.ones(1, device="cuda")
    real = set(torch.cuda.memory_stats(0))
    recorded = set(load_json("torch_memory_stats.json"))
    core = {k for k in recorded if not k.startswith(("num_device", "num_sync", "oversize", "max_split"))}
    assert core <= real, sorted(core - real)


def test_allocator_metrics_follow_mixed_allocations() -> None:
    """Allocating mixed sizes raises allocated and reserved; freeing every other tensor leaves
    reserved in place and raises the reserved_unallocated fragmentation ratio."""
    dev = torch.cuda.current_device()
    torch.cuda.empty_cache()
    m, series = Metrics(), SeriesStore(100)
    sampler = TorchCudaSampler(m, series, [dev], TorchCuda())
    sampler.open()
    sampler.sample()
    label = f"cuda:{dev}"
    alloc0 = value(m, "soakd_torch_cuda_allocated_bytes", device=label, pool="all")

    sizes = [256 * 1024, 3 * MiB, 64 * 1024, 12 * MiB, 700 * 1024, 5 * MiB] * 8
    tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda.synchronize()
    sampler.sample()
    alloc1 = value(m, "soakd_torch_cuda_allocated_bytes", device=label, pool="all")
    reserved1 = value(m, "soakd_torch_cuda_reserved_bytes", device=label, pool="all")
    assert alloc1 - alloc0 >= sum(sizes)
    assert reserved1 >= alloc1
    assert value(m, "soakd_torch_cuda_allocated_bytes", device=label, pool="small") > 0
    assert value(m, "soakd_torch_cuda_allocated_bytes", device=label, pool="large") > 0
    frag1 = value(m, "soakd_torch_cuda_fragmentation_ratio", device=label, kind="reserved_unallocated")

    del tensors[::2]
    torch.cuda.synchronize()
    sampler.sample()
    alloc2 = value(m, "soakd_torch_cuda_allocated_bytes", device=label, pool="all")
    reserved2 = value(m, "soakd_torch_cuda_reserved_bytes", device=label, pool="all")
    assert alloc2 < alloc1
    assert reserved2 == reserved1  # the caching allocator keeps the segments
    assert value(m, "soakd_torch_cuda_fragmentation_ratio", device=label, kind="reserved_unallocated") > frag1
    assert value(m, "soakd_torch_cuda_device_allocs_total", device=label) >= 1

    snap = TorchCudaSnapshotSampler(m, [dev], TorchCuda())
    snap.open()
    snap.sample()
    assert value(m, "soakd_torch_cuda_largest_free_block_bytes", device=label) >= 64 * 1024
    assert len(series.read("torch_cuda_allocated")[1]) == 3
    del tensors
    torch.cuda.empty_cache()


def test_real_nvml_sees_this_process() -> None:
    """NVML reports memory and our own process's usage once we hold GPU memory."""
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    m, series = Metrics(), SeriesStore(100)
    sampler = NvmlSampler(m, series)
    sampler.open()
    try:
        sampler.sample()
        gpu = sampler.gpus[0]
        used = value(m, "soakd_gpu_memory_used_bytes", gpu="0", uuid=gpu.uuid)
        total = value(m, "soakd_gpu_memory_total_bytes", gpu="0", uuid=gpu.uuid)
        assert 256 * MiB <= used <= total
        assert 0 <= value(m, "soakd_gpu_temperature_celsius", gpu="0", uuid=gpu.uuid) < 120
        procs = series.read("gpu_process_memory")[1]
        # In a container NVML may list host pids; then our pid is not found and there is no sample.
        if procs.size:
            assert procs[-1] >= 256 * MiB
        # torch's device UUID names the same GPU NVML does, so the leak series follow the model's GPU.
        uuids = gpu_uuids([torch.cuda.current_device()])
        assert uuids is not None and uuids[0] in {g.uuid for g in sampler.gpus}
    finally:
        sampler.close()
        del x
