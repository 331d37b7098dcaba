"""NVML (nvidia-ml-py's ``pynvml``): per GPU memory, this process's memory, utilization, SM clock,
power, energy, temperature and clock-event (throttle) reasons.

The backend is the ``pynvml`` module itself or anything with the same functions; tests pass a
fake that answers with recorded values and raises pynvml's own ``NVMLError`` subclasses. A
field a GPU does not support (power on some boards, memory info v2 on old drivers) is
dropped for that GPU after the first NOT_SUPPORTED answer instead of failing the source.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore

log = logging.getLogger("soakd.telemetry")

# Bit -> name, from NVML's nvmlClocksEventReason* constants (stable across driver versions).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# Answers that mean "this GPU/driver cannot tell", not "the source is broken".
# NOT_SUPPORTED, NO_PERMISSION (a MIG parent's handle), FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH,
# DEPRECATED. pynvml also raises NVMLLibraryMismatchError, not an NVMLError, where an old driver
# lacks a versioned call (the process list's _v3 before R510): that too is "cannot tell".
_UNSUPPORTED = (3, 4, 13, 25, 26)


def unsupported_errors(nv: Any) -> tuple[type[BaseException], ...]:
    """The exception types of ``nv`` (pynvml or a fake) that may mean a call is unsupported."""
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    return (nv.NVMLError, mismatch) if isinstance(mismatch, type) else (nv.NVMLError,)


def known_usage(procs: Any) -> int | None:
    """The summed ``usedGpuMemory`` of NVML process entries; None when NVML gave no figure for
    any of them (pynvml turns NVML_VALUE_NOT_AVAILABLE into None): a made-up 0 would be a
    flat line in a leak series."""
    known = [int(p.usedGpuMemory) for p in procs if p.usedGpuMemory is not None]
    return sum(known) if known else None


_MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2
_CLOCK_SM = 1  # NVML_CLOCK_SM
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU


def clock_event_reasons(mask: int) -> dict[str, bool]:
    """Every known reason with whether its bit is set in ``mask``."""
    return {name: bool(mask & bit) for bit, name in CLOCK_EVENT_REASONS.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml(nvml: Any = None) -> tuple[Any, list[Any]]:
    """``nvml`` (None: the ``pynvml`` module) initialised, and a handle per GPU in index order.
    Raises SourceUnavailable when there is no driver or no GPU."""
    if nvml is None:
        import pynvml  # loaded on first open: hosts without the NVIDIA library never import it

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # No driver here: NVMLError_LibraryNotFound (12) without libnvidia-ml,
        # NVMLError_DriverNotLoaded (9) with the library but no kernel module.
        raise SourceUnavailable(f"NVML: {exc}") from None
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if not handles:
        nvml.nvmlShutdown()
        raise SourceUnavailable("NVML sees no GPU")
    return nvml, handles


def visible_gpus(nv: Any, handles: Sequence[Any], env: Mapping[str, str] | None = None) -> list[tuple[int, Any]]:
    """(NVML index, handle) of each GPU this process's CUDA may use. NVML ignores
    CUDA_VISIBLE_DEVICES and lists every GPU, so each ``soakd@N`` would sample them all: the
    variable is read here as CUDA reads it, indices or UUID prefixes (``GPU-...``; a ``MIG-...``
    entry picks the board that holds it), up to the first entry that names no GPU. Indices are
    NVML's PCI bus order, which is CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID (and, on a host of
    one kind of GPU, its default order too). Unset: every GPU."""
    spec = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    every = list(enumerate(handles))
    if spec is None:
        return every
    uuids: list[set[str]] = []
    out: list[tuple[int, Any]] = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.isdigit() and int(entry) < len(every):
            pick = every[int(entry)]
        elif entry.startswith(("GPU-", "MIG-")):
            uuids = uuids or [{_text(nv.nvmlDeviceGetUUID(h)), *(u for u, _ in mig_devices(nv, h))} for h in handles]
            hits = [g for g, names in zip(every, uuids, strict=True) if any(u.startswith(entry) for u in names)]
            if len(hits) != 1:
                break
            pick = hits[0]
        else:  # CUDA stops at the first entry that is not a device ("", "-1", a typo)
            break
        if pick not in out:
            out.append(pick)
    return out


def mig_devices(nv: Any, handle: Any) -> list[tuple[str, Any]]:
    """(``MIG-...`` UUID, handle) of each MIG instance on a board in MIG mode; [] otherwise or when
    the driver cannot tell (pynvml raises NOT_FOUND for an empty slot)."""
    if not hasattr(nv, "nvmlDeviceGetMigMode"):
        return []
    try:
        if not nv.nvmlDeviceGetMigMode(handle)[0]:
            return []
        slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    except unsupported_errors(nv):
        return []
    out = []
    for j in range(slots):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            out.append((_text(nv.nvmlDeviceGetUUID(mig)), mig))
        except nv.NVMLError:
            continue
    return out


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    name: str
    unsupported: set[str] = field(default_factory=set)
    # The MIG instance the model runs on, when it is one of this board's: the leak series reads
    # its memory, not the whole board's.
    mig: Any = None

    @property
    def labels(self) -> tuple[str, str]:
        return str(self.index), self.uuid


class NvmlSampler:
    name = "nvml"

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        nvml: Any = None,
        *,
        pid: int | None = None,
        uuids: Sequence[str] | None = None,
        clock: Callable[[], float] = time.time,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``uuids``: the GPUs the model uses, for the leak series (None: every GPU); NVML names
        a MIG instance ``MIG-...``. ``env``: where CUDA_VISIBLE_DEVICES is read (os.environ)."""
        self.metrics = metrics
        self.series = series
        self.nvml: Any = nvml  # the backend; None: pynvml, imported by open()
        self.pid = os.getpid() if pid is None else pid
        self.uuids = set(uuids) if uuids is not None else None
        self.clock = clock
        self.env = env
        self.gpus: list[_Gpu] = []
        self.driver_version = ""
        self._unlisted = 0  # samples where the model's GPU listed processes, never this pid

    def open(self) -> None:
        nv, handles = open_nvml(self.nvml)
        self.nvml = nv
        try:
            self.driver_version = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            self.driver_version = ""
        visible = visible_gpus(nv, handles, self.env)
        if not visible:
            nv.nvmlShutdown()
            spec = (os.environ if self.env is None else self.env).get("CUDA_VISIBLE_DEVICES")
            raise SourceUnavailable(f"NVML: CUDA_VISIBLE_DEVICES={spec!r} names none of its {len(handles)} GPU(s)")
        self.gpus = [_Gpu(i, h, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))) for i, h in visible]
        if self.uuids is not None:
            for gpu in self.gpus:
                gpu.mig = next((m for u, m in mig_devices(nv, gpu.handle) if u in self.uuids), None)
        if self.uuids is not None and not any(g.uuid in self.uuids or g.mig is not None for g in self.gpus):
            # A model GPU NVML does not name: rather every GPU than a series stuck at 0.
            log.info(
                "NVML names none of the model's GPUs %s: the GPU memory series covers every GPU", sorted(self.uuids)
            )
            self.uuids = None

    def _field(self, gpu: _Gpu, key: str, call: Callable[[], Any]) -> Any:
        """``call()``, or None once the GPU has said it cannot answer ``key``."""
        if key in gpu.unsupported:
            return None
        try:
            return call()
        except unsupported_errors(self.nvml) as exc:
            if not isinstance(exc, self.nvml.NVMLError) or getattr(exc, "value", None) in _UNSUPPORTED:
                gpu.unsupported.add(key)
                return None
            raise

    def sample(self) -> None:
        nv, m = self.nvml, self.metrics
        used_ours = 0
        process_ours: int | None = None
        for gpu in self.gpus:
            h, lab = gpu.handle, gpu.labels
            mem = self._field(gpu, "memory_v2", partial(nv.nvmlDeviceGetMemoryInfo, h, version=_MEMORY_V2))
            if mem is not None:
                m.gpu_memory_reserved.labels(*lab).set(mem.reserved)
            else:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            m.gpu_memory_used.labels(*lab).set(mem.used)
            m.gpu_memory_total.labels(*lab).set(mem.total)
            if gpu.mig is not None:  # the model's MIG instance: its memory, not the board's
                used_ours += int(nv.nvmlDeviceGetMemoryInfo(gpu.mig).used)
            elif self.uuids is None or gpu.uuid in self.uuids:
                used_ours += int(mem.used)
            procs = self._field(gpu, "processes", partial(nv.nvmlDeviceGetComputeRunningProcesses, h))
            mine = [p for p in procs or () if p.pid == self.pid]
            self._note_unlisted(gpu, bool(procs), bool(mine))
            # Not listed: no context on this GPU, or (in a container without the host's pid
            # namespace) NVML lists host pids. Either way there is no number to report, and a
            # made-up 0 would hide a leak from the trend test.
            used = known_usage(mine)
            if used is not None:
                m.gpu_process_memory.labels(*lab, str(self.pid)).set(used)
                process_ours = (process_ours or 0) + used
            util = self._field(gpu, "utilization", partial(nv.nvmlDeviceGetUtilizationRates, h))
            if util is not None:
                m.gpu_utilization.labels(*lab).set(util.gpu / 100.0)
            sm = self._field(gpu, "sm_clock", partial(nv.nvmlDeviceGetClockInfo, h, _CLOCK_SM))
            if sm is not None:
                m.gpu_sm_clock.labels(*lab).set(sm * 1e6)  # MHz
            power = self._field(gpu, "power", partial(nv.nvmlDeviceGetPowerUsage, h))
            if power is not None:
                m.gpu_power.labels(*lab).set(power / 1e3)  # mW
            energy = self._field(gpu, "energy", partial(nv.nvmlDeviceGetTotalEnergyConsumption, h))
            if energy is not None:
                m.gpu_energy.set(lab, energy / 1e3)  # mJ
            temp = self._field(gpu, "temperature", partial(nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU))
            if temp is not None:
                m.gpu_temperature.labels(*lab).set(temp)
            mask = self._clock_events(gpu)
            if mask is not None:
                for reason, active in clock_event_reasons(mask).items():
                    m.gpu_clock_event.labels(*lab, reason).set(1 if active else 0)
        if self.series is not None:
            now = self.clock()
            self.series.append("gpu_memory_used", now, used_ours)
            if process_ours is not None:
                self.series.append("gpu_process_memory", now, process_ours)

    def _note_unlisted(self, gpu: _Gpu, listed: bool, mine: bool) -> None:
        """Say once when the model's GPU keeps listing processes but never this one: NVML lists
        host pids in a container without the host's pid namespace (the per-process series is then
        absent all run, which should not go unsaid)."""
        if self.uuids is None or (gpu.uuid not in self.uuids and gpu.mig is None) or self._unlisted < 0:
            return
        if mine:
            self._unlisted = -1  # listed once: nothing to say
        elif listed:
            self._unlisted += 1
            if self._unlisted == 3:
                self._unlisted = -1
                log.warning(
                    "NVML lists processes on GPU %s but never this one (pid %d): in a container NVML "
                    "reports host pids, so soakd_gpu_process_memory_bytes and its leak series are absent "
                    "this run. Share the host's pid namespace (Kubernetes hostPID: true, docker --pid=host).",
                    gpu.index,
                    self.pid,
                )

    def _clock_events(self, gpu: _Gpu) -> int | None:
        nv, h = self.nvml, gpu.handle
        if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):  # driver >= 535 name
            mask = self._field(gpu, "clock_events", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
            if mask is not None:
                return int(mask)
        mask = self._field(gpu, "throttle", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return None if mask is None else int(mask)

    def close(self) -> None:
        if self.gpus:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.gpus = []
