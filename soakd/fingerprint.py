"""The run fingerprint: what a result is bound to (model, inputs, software, hardware, config)."""

from __future__ import annotations

import os
import platform
import socket
import time
from importlib import metadata
from typing import TYPE_CHECKING, Any

import soakd
from soakd.config import Config

if TYPE_CHECKING:
    import torch

ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "MALLOC_ARENA_MAX")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver_version() -> str | None:
    try:
        import pynvml  # optional at run time: a CPU host may lack the NVIDIA library

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: the fingerprint says so with null
        return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        import torch  # loaded already: a model is on this device

        return torch.cuda.get_device_name(device)
    return cpu_model()


def model_identity(model_spec: str) -> str:
    """What ``model_sha256`` is a hash of: the file for a model that has one; for a builtin, which
    has none, its spec and options, the soakd version and its (seeded) state_dict."""
    kind = model_spec.partition(":")[0]
    if kind == "builtin":
        return (
            f"{model_spec} (no file): sha256 of the spec, model.options, soakd {soakd.__version__} "
            "and the state_dict (weights seeded, the same every run)"
        )
    if kind == "python":
        return f"{model_spec}: sha256 of the Python file that defines the factory"
    return f"{model_spec}: sha256 of the model file"


def fingerprint(
    cfg: Config,
    *,
    run_id: str,
    model_spec: str,
    model_sha256: str | None,
    device: torch.device | None,
    input_desc: str,
    target: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``device`` None and ``target`` given: a served model, known by its URL and API (its weights
    and device are the server's; no sha256 here)."""
    out: dict[str, Any] = {
        "run_id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model_spec,
        "model_sha256": model_sha256,
        "model_identity": model_identity(model_spec)
        if target is None
        else f"served at {target['url']} ({target['api']}): no sha256, the server holds the weights",
        "input": input_desc,
        "device": str(device) if device is not None else "remote",
        "device_name": device_name(device) if device is not None else None,
        "cpu_model": cpu_model(),
        "host": socket.gethostname(),
        "soakd_version": soakd.__version__,
        **_torch_build(device),
        "driver_version": nvidia_driver_version() if device is not None and device.type == "cuda" else None,
        "python_version": platform.python_version(),
        "allocator_env": {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ},
        "config": cfg.redacted(),  # credential-like values (model.options.api_token...) never leave
    }
    if target is not None:
        out["target"] = target
    return out


def _torch_build(device: torch.device | None) -> dict[str, Any]:
    """The torch, CUDA and cuDNN a model in this process runs on. A served model runs on the
    server's: the driver records its installed torch (read without importing it) and no CUDA."""
    if device is None:
        return {"torch_version": metadata.version("torch"), "cuda_version": None, "cudnn_version": None}
    import torch  # loaded already: a model is on this device

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None  # type: ignore[no-untyped-call]
    return {"torch_version": torch.__version__, "cuda_version": torch.version.cuda, "cudnn_version": cudnn}
