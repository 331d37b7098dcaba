"""Fake telemetry backends answering with recorded data: from a real device where
bench/gpu_check.sh recorded one (tests/fixtures/recorded/<gpu>/), else from the synthetic
answers in tests/fixtures/ (kept for the cases no device showed: an old driver, no driver)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDED = FIXTURES / "recorded"  # one folder per device, as bench/gpu_check.sh writes them


def load_json(name: str) -> Any:
    """The synthetic fixture tests/fixtures/NAME."""
    return json.loads((FIXTURES / name).read_text())


def recorded_dir(root: Path | None = None) -> Path | None:
    """The device folder the fakes answer from: $SOAKD_FIXTURES names one under ``root``
    ("synthetic": none), else the first folder by name; None when no device was recorded."""
    root = RECORDED if root is None else root
    choice = os.environ.get("SOAKD_FIXTURES")
    if choice == "synthetic":
        return None
    if choice:
        if not (root / choice).is_dir():
            raise FileNotFoundError(f"SOAKD_FIXTURES={choice}: no folder {root / choice}")
        return root / choice
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return folders[0] if folders else None


def fixture_json(name: str, root: Path | None = None) -> Any:
    """The answer NAME as a device recorded it, else the synthetic one. NVML answers a device
    cannot give (``no_driver``) are taken from the synthetic file."""
    folder = recorded_dir(root)
    if folder is None or not (folder / name).exists():
        return load_json(name)
    got = json.loads((folder / name).read_text())
    if name == "nvml_answers.json":
        synthetic = {k: v for k, v in load_json(name).items() if k != "_comment"}
        return {**synthetic, **got}
    return got


class FakeCuda:
    """torch.cuda's allocator readers, answering with a recorded memory_stats() dict."""

    def __init__(
        self,
        stats: dict[str, int] | None = None,
        free_total: tuple[int, int] = (60 << 30, 80 << 30),
        snapshot: list[dict[str, Any]] | None = None,
        available: bool = True,
        root: Path | None = None,
    ) -> None:
        """``root``: where recorded device folders live (default tests/fixtures/recorded)."""
        self.stats = dict(stats if stats is not None else fixture_json("torch_memory_stats.json", root))
        self.free_total = free_total
        self.snapshot = snapshot if snapshot is not None else fixture_json("torch_memory_snapshot.json", root)
        self.available = available
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return self.available

    def memory_stats(self, device: int) -> dict[str, int]:
        self.calls.append(f"memory_stats({device})")
        return self.stats

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return self.free_total

    def memory_snapshot(self) -> list[dict[str, Any]]:
        return self.snapshot


class FakeNvml:
    """The pynvml functions NvmlSampler calls, answering from nvml_answers.json and raising
    pynvml's real NVMLError subclasses (NOT_SUPPORTED for a key in a GPU's "unsupported")."""

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError  # not an NVMLError, as in pynvml

    def __init__(
        self,
        pid: int,
        answers: dict[str, Any] | None = None,
        init_error: int | None = None,
        block: threading.Event | None = None,
        root: Path | None = None,
    ) -> None:
        self.answers = answers if answers is not None else fixture_json("nvml_answers.json", root)
        self.pid = pid
        self.init_error = init_error
        self.block = block  # when set: nvmlDeviceGetMemoryInfo waits on it (a hung driver)
        self.shutdown_calls = 0

    def _gpu(self, handle: int) -> dict[str, Any]:
        return dict(self.answers["gpus"][handle])

    def _check(self, handle: int, key: str, code: int = pynvml.NVML_ERROR_NOT_SUPPORTED) -> dict[str, Any]:
        g = self._gpu(handle)
        if key in g["unsupported"]:
            raise pynvml.NVMLError(code)
        return g

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.answers["driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.answers["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if isinstance(h, tuple):  # a MIG instance's handle
            return str(self._gpu(h[0])["mig_devices"][h[1]]["uuid"])
        return str(self._gpu(h)["uuid"])

    # MIG, as nvidia-ml-py 13.615 answers: [current, pending] mode, a slot count, and NOT_FOUND
    # for an empty slot. A GPU's optional "mig_devices" list (null for an empty slot) drives it.
    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        on = int("mig_devices" in self._gpu(h))
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return len(self._gpu(h).get("mig_devices", []))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:
        if self._gpu(h)["mig_devices"][j] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (h, j)

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._gpu(h)["name"])

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> SimpleNamespace:
        if self.block is not None:
            self.block.wait()
        if isinstance(h, tuple):
            return SimpleNamespace(**self._gpu(h[0])["mig_devices"][h[1]]["memory"])
        if version:
            g = self._check(h, "memory_v2", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return SimpleNamespace(**g["memory_v2"])
        return SimpleNamespace(**self._gpu(h)["memory"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        if "processes" in self._gpu(h).get("library_mismatch", ()):  # an R470-era driver: no _v3 call
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        return [
            SimpleNamespace(pid=self.pid if p["pid"] == "SELF" else p["pid"], usedGpuMemory=p["usedGpuMemory"])
            for p in self._check(h, "processes")["processes"]
        ]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(**self._check(h, "utilization")["utilization"])

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return int(self._check(h, "sm_clock_mhz")["sm_clock_mhz"])

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._check(h, "power")["power_mw"])

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return int(self._check(h, "energy_mj")["energy_mj"])

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(self._check(h, "temperature_c")["temperature_c"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        g = self._check(h, "clock_event_reasons", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return int(g["clock_event_reasons"])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return int(self._gpu(h)["clock_event_reasons"])


def fake_proc(root: Path, open_fds: int = 5, rollup: bool = True) -> Path:
    """A procfs tree from the recorded files in fixtures/proc, with ``open_fds`` entries in fd/."""
    pid = root / "self"
    (pid / "fd").mkdir(parents=True)
    for name in ("stat", "statm"):
        shutil.copy(FIXTURES / "proc" / name, pid / name)
    if rollup:
        shutil.copy(FIXTURES / "proc" / "smaps_rollup", pid / "smaps_rollup")
    shutil.copy(FIXTURES / "proc" / "meminfo", root / "meminfo")
    for i in range(open_fds):
        (pid / "fd" / str(i)).touch()
    return root


def rollup_kb(field: str) -> int:
    for line in (FIXTURES / "proc" / "smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def clk_tck() -> int:
    return os.sysconf("SC_CLK_TCK")
