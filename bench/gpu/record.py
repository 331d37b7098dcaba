"""Recording a device's answers in the layout of tests/fixtures/ (issue #18, step 3).

``record_nvml`` asks NVML what ``soakd.telemetry.nvml.NvmlSampler`` asks, and writes the answers
the way ``tests/telemetry_fakes.FakeNvml`` reads them (nvml_answers.json): one entry per GPU,
this process's pid written as "SELF", and a key in ``unsupported`` for each call the GPU or
driver could not answer. ``snapshot_segments`` keeps a memory_snapshot() small enough to commit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

# The calls a GPU may decline (NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH,
# DEPRECATED), as soakd/telemetry/nvml.py treats them.
UNSUPPORTED_CODES = (3, 13, 25, 26)
MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2
CLOCK_SM = 1  # NVML_CLOCK_SM
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
MAX_SEGMENTS = 64  # a recorded snapshot stays a few hundred KiB at most

# Fixture file names, as tests/fixtures/ and tests/fixtures/recorded/<gpu>/ hold them.
STATS = "torch_memory_stats.json"  # under load: what the fakes serve by default
STATS_AT = {"idle": "torch_memory_stats.idle.json", "warm": "torch_memory_stats.warm.json", "load": STATS}
SNAPSHOT = "torch_memory_snapshot.json"
NVML = "nvml_answers.json"


def slug(name: str) -> str:
    """A GPU name as a folder name: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(obj: Any, names: Sequence[str]) -> dict[str, int]:
    return {n: int(getattr(obj, n)) for n in names}


def _ask(nv: Any, gpu: dict[str, Any], key: str, call: Callable[[], Any]) -> Any:
    """``gpu[key] = call()``; an unsupported answer lists ``key`` in gpu["unsupported"], any
    other NVML error goes to gpu["errors"]. Returns the value or None."""
    try:
        value = call()
    except nv.NVMLError as exc:
        if getattr(exc, "value", None) in UNSUPPORTED_CODES:
            gpu["unsupported"].append(key)
        else:
            gpu.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
        return None
    gpu[key] = value
    return value


def _processes(nv: Any, h: Any, pid: int) -> list[dict[str, Any]]:
    return [
        {
            "pid": "SELF" if p.pid == pid else int(p.pid),
            "usedGpuMemory": None if p.usedGpuMemory is None else int(p.usedGpuMemory),
        }
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
    ]


def _record_gpu(nv: Any, h: Any, pid: int) -> dict[str, Any]:
    v2 = getattr(nv, "nvmlMemory_v2", MEMORY_V2)
    clock_sm = getattr(nv, "NVML_CLOCK_SM", CLOCK_SM)
    sensor = getattr(nv, "NVML_TEMPERATURE_GPU", TEMPERATURE_GPU)
    gpu: dict[str, Any] = {
        "uuid": _text(nv.nvmlDeviceGetUUID(h)),
        "name": _text(nv.nvmlDeviceGetName(h)),
        "unsupported": [],
    }
    calls: list[tuple[str, Callable[[], Any]]] = [
        (
            "memory_v2",
            lambda: _fields(nv.nvmlDeviceGetMemoryInfo(h, version=v2), ("total", "reserved", "free", "used")),
        ),
        ("memory", lambda: _fields(nv.nvmlDeviceGetMemoryInfo(h), ("total", "free", "used"))),
        ("processes", partial(_processes, nv, h, pid)),
        ("utilization", lambda: _fields(nv.nvmlDeviceGetUtilizationRates(h), ("gpu", "memory"))),
        ("sm_clock_mhz", lambda: int(nv.nvmlDeviceGetClockInfo(h, clock_sm))),
        ("power", lambda: int(nv.nvmlDeviceGetPowerUsage(h))),
        ("energy_mj", lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(h))),
        ("temperature_c", lambda: int(nv.nvmlDeviceGetTemperature(h, sensor))),
    ]
    for key, call in calls:
        _ask(nv, gpu, key, call)
    if "power" in gpu:
        gpu["power_mw"] = gpu.pop("power")  # the fake's answer key; "power" names it in unsupported
    # Drivers >= 535 name it ClocksEventReasons; the fake's "clock_event_reasons" unsupported
    # entry means only the older ClocksThrottleReasons name answers, with the same mask.
    events = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if events is None or _ask(nv, gpu, "clock_event_reasons", partial(events, h)) is None:
        if "clock_event_reasons" not in gpu["unsupported"]:
            gpu["unsupported"].append("clock_event_reasons")
        if _ask(nv, gpu, "throttle", partial(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)) is not None:
            gpu["clock_event_reasons"] = int(gpu.pop("throttle"))
    return gpu


def record_nvml(nv: Any, pid: int) -> dict[str, Any]:
    """Every GPU's answers to the sampler's calls; ``nv`` is pynvml or anything shaped like it
    (already initialised). ``pid`` (this process) is written as "SELF"."""
    out: dict[str, Any] = {"driver_version": _text(nv.nvmlSystemGetDriverVersion()), "gpus": []}
    nvml_version = getattr(nv, "nvmlSystemGetNVMLVersion", None)
    if nvml_version is not None:
        out["nvml_version"] = _text(nvml_version())
    for i in range(nv.nvmlDeviceGetCount()):
        out["gpus"].append(_record_gpu(nv, nv.nvmlDeviceGetHandleByIndex(i), pid))
    return out


def snapshot_segments(segments: Sequence[Mapping[str, Any]], limit: int = MAX_SEGMENTS) -> list[dict[str, Any]]:
    """The first ``limit`` segments of a memory_snapshot(), as plain JSON values."""
    return [json.loads(json.dumps(dict(s), default=list)) for s in list(segments)[:limit]]


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=isinstance(value, Mapping)) + "\n")
    tmp.replace(path)
