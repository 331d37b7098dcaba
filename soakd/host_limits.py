"""What this host can hold: the bounds that depend on its RAM and CPU cores.

Kept apart from :func:`soakd.config.validate`, which judges a file the same way on every machine
(`soakd check-config FILE` on a laptop and on the GPU box agree). These checks run where the soak
runs: in preflight before anything loads, and on request with `soakd check-config --host FILE`.
Each failure is a ConfigError naming the key, the value and the bound, exit 2.
"""

from __future__ import annotations

import math
import os

import psutil

from soakd.config import (
    DTYPE_BYTES,
    MODEL_THREADS_PER_CPU,
    REQUEST_BYTES,
    RING_SAMPLE_BYTES,
    RING_SERIES,
    TENSOR_OVERHEAD_BYTES,
    TOKEN_BYTES,
    Config,
    ConfigError,
    format_bytes,
)
from soakd.specs import BUILTIN_DEFAULT_SHAPES, is_seq_spec, parse_model_spec, parse_seq_spec, parse_shape_mix


def check_host(cfg: Config) -> None:
    """Every bound of this host: model threads for its cores, buffers for its RAM."""
    check_threads(cfg)
    check_memory(cfg)


def host_memory_bytes() -> int:
    """This host's RAM (psutil): what every in-memory bound is measured against."""
    return int(psutil.virtual_memory().total)


def max_model_threads() -> int:
    return max(8, MODEL_THREADS_PER_CPU * (os.cpu_count() or 1))


def check_threads(cfg: Config) -> None:
    """More model instances than a few per core only queue for the cores and the GIL."""
    threads = max_model_threads()
    n = cfg.batcher.instances
    if n > threads:
        raise ConfigError(
            f"batcher.instances: {n} is over the bound of {threads} ({MODEL_THREADS_PER_CPU} model "
            f"threads per CPU core of this host's {os.cpu_count()}; more only queue for the cores)"
        )


def _shape_spec(cfg: Config) -> str:
    """The input shape spec in force: ``input.shapes``, else a builtin model's default."""
    if cfg.input.shapes:
        return cfg.input.shapes
    try:
        spec = parse_model_spec(cfg.model.spec)
    except ValueError:
        return ""
    return BUILTIN_DEFAULT_SHAPES.get(spec.target, "") if spec.kind == "builtin" else ""


def check_memory(cfg: Config) -> None:
    """Refuse, before anything is allocated, settings whose tensors and buffers would not fit in
    half this host's RAM (the rest is the model's, the allocator's and the OS's)."""
    host = host_memory_bytes()
    budget = host // 2
    inp, b = cfg.input, cfg.batcher
    inflight = cfg.load.concurrency if cfg.load.concurrency is not None else cfg.load.max_inflight
    inflight_key = "load.concurrency" if cfg.load.concurrency is not None else "load.max_inflight"
    # (key, value, bytes, what): the parts soakd itself holds for these settings.
    parts: list[tuple[str, object, int, str]] = []
    spec = _shape_spec(cfg)
    one = 0  # bytes of the largest single request tensor
    if spec and is_seq_spec(spec):
        seq = parse_seq_spec(spec)
        one = seq.high * TOKEN_BYTES
        parts.append(("input.shapes", spec, one, f"one {seq.high}-token sequence"))
        parts.append(
            (
                "batcher.max_batch_size",
                b.max_batch_size,
                b.instances * b.max_batch_size * one,
                f"batches of {b.max_batch_size} x {seq.high} tokens on {b.instances} model thread(s)",
            )
        )
    elif spec:
        itemsize = DTYPE_BYTES.get(cfg.model.dtype, 4)
        sizes = [(shape, math.prod(shape) * itemsize) for shape, _ in parse_shape_mix(spec)]
        one = max(n for _, n in sizes)
        names = "+".join("x".join(map(str, shape)) for shape, _ in sizes)
        if cfg.input.samples is None:
            pooled = sum(inp.pool * (n + TENSOR_OVERHEAD_BYTES) for _, n in sizes)
            parts.append(("input.pool", inp.pool, pooled, f"{inp.pool} pooled {names} {cfg.model.dtype} tensors"))
        else:  # decoded samples: each request in flight holds its own tensor
            parts.append((inflight_key, inflight, inflight * one, f"a decoded {names} sample per request in flight"))
        parts.append(
            (
                "batcher.max_batch_size",
                b.max_batch_size,
                b.instances * b.max_batch_size * one,
                f"batches of {b.max_batch_size} on {b.instances} model thread(s)",
            )
        )
    parts.append((inflight_key, inflight, inflight * REQUEST_BYTES, f"{inflight} requests in flight"))
    if inp.samples is not None:  # each preprocess worker may hold one whole sample (bytes, then decoded)
        parts.append(
            (
                "input.max_sample_bytes",
                inp.max_sample_bytes,
                2 * inp.preprocess_workers * inp.max_sample_bytes,
                f"{inp.preprocess_workers} preprocess workers reading samples of up to "
                f"{format_bytes(inp.max_sample_bytes)}",
            )
        )
    ring = cfg.memory.ring_size
    parts.append(
        (
            "memory.ring_size",
            ring,
            ring * RING_SAMPLE_BYTES * RING_SERIES,
            f"{RING_SERIES} memory rings of {ring} samples",
        )
    )
    total = sum(n for _, _, n, _ in parts)
    if total <= budget:
        return
    key, value, _, _ = max(parts, key=lambda p: p[2])
    if one > budget:  # one request's tensor alone is too large: the shape is the setting at fault
        key, value = "input.shapes", spec
    detail = ", ".join(f"{what} {format_bytes(n)}" for _, _, n, what in parts if n)
    raise ConfigError(
        f"{key}: {value!r} needs {format_bytes(total)} of host memory ({detail}): over the bound of half "
        f"this host's RAM, {format_bytes(budget)} of {format_bytes(host)}"
    )
