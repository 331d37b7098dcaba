"""The import check of bench/gpu_check.sh (issue #36): does this Python import what the GPU
check's steps run? ``python -m bench.gpu.imports`` imports each of MODULES in turn and, on the
first that fails, names it and the missing package on stderr and exits 1 (0 when all import).

``--absent PKG,...`` makes those top-level packages unimportable first, so a richer venv (the
developers', CI's) can stand in for the device image, which lacks them: a module-level import
of one fails here exactly as it would there. ``--absent image`` names IMAGE_LACKS; the
environment's SOAKD_GPU_ABSENT is the default (so gpu_check.sh's own call can be tested).

Standard library only: it must run before anything else is known to import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# What the steps and their soakd children import: the CLI, the run session and sweep, the
# samplers and the leak monitor, the bench modules a step or `soakd run --model python:...`
# loads, and the third-party packages the steps call directly.
MODULES: tuple[str, ...] = (
    "soakd.cli",
    "soakd.run.session",
    "soakd.run.sweep",
    "soakd.telemetry.pipeline",
    "soakd.analysis.monitor",
    "bench.gpu.steps",
    "bench.gpu.models",
    "bench.core_throughput",
    "bench.seed_harness",
    "bench.sampling_cost",
    "torch",
    "pynvml",
    "apscheduler",
    "prometheus_client",
    "pytest",
)

# soakd dependencies that the device image lacks and bench/gpu_wheels.sh does not carry, with
# their import names: the kserve-v2 target's client (imported when that target is chosen) and
# the OpenTelemetry SDK (imported when OTLP is on). tests/test_gpu_rehearse.py holds this list to
# pyproject.toml, the image list and the wheels.
IMAGE_LACKS: dict[str, str] = {
    "tritonclient": "tritonclient",
    "python-rapidjson": "rapidjson",
    "opentelemetry-sdk": "opentelemetry",
    "opentelemetry-exporter-otlp-proto-http": "opentelemetry",
    "httptools": "httptools",  # only --api http's client (soakd/targets/http1.py); no GPU step drives one
}


class _Absent(importlib.abc.MetaPathFinder):
    """Refuses the named top-level packages as a missing install would."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (absent from the device image)", name=fullname)
        return None


def block(names: set[str]) -> None:
    """Make ``names`` unimportable in this interpreter (and drop any already imported)."""
    for mod in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[mod]
    sys.meta_path.insert(0, _Absent(names))


def first_failure(modules: Sequence[str]) -> str | None:
    """``None`` when every module imports, else 'MODULE: ErrorType: message' for the first that does not."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import-time error stops the steps the same way
            return f"{name}: {type(exc).__name__}: {exc}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_imports", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--absent",
        default=os.environ.get("SOAKD_GPU_ABSENT", ""),
        help="comma list of packages to treat as not installed ('image': IMAGE_LACKS)",
    )
    ap.add_argument("--also", default="", help="comma list of further modules to import after MODULES")
    args = ap.parse_args(argv)
    absent = {n for n in args.absent.split(",") if n}
    if "image" in absent:
        absent = (absent - {"image"}) | set(IMAGE_LACKS.values())
    if absent:
        block(absent)
    failed = first_failure([*MODULES, *(m for m in args.also.split(",") if m)])
    if failed:
        print(f"gpu_check: this Python cannot import what the steps run: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
