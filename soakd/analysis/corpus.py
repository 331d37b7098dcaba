"""Synthetic memory traces for judging leak detectors: what inference servers' memory does.

Leak-free patterns are the things that fool naive trend tests (warm-up then plateau, a single
step when a new input shape appears, GC / allocator sawtooth, slow load swings, autocorrelated
noise, slow wander of the level, a 24 h load cycle, allocator pools that grow ever more rarely);
leak patterns are what leaks look like (slow creep under noise, creep under a sawtooth,
staircases of steps that never come back, rare large steps, a leak that starts hours in or at
any time, a faint leak under slow wander). Every trace is drawn
from its own seed, so a (pattern, seed) pair names one trace for tests and the benchmark.

Defaults: 6 h at 10 s sampling, leak rates log-uniform from 5 MiB/h to 200 MiB/h, noise with
a stationary standard deviation from 0.25 to 8 MiB and lag-1 autocorrelation 0.5 to 0.98,
sawtooth periods from 1 to 20 min (jittered by 20%).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from soakd.analysis.params import MIB

HOUR = 3600.0
MINUTE = 60.0

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Trace:
    pattern: str
    seed: int
    leaking: bool
    t: Array  # seconds from the start of the run
    v: Array  # bytes
    leak_start: float | None = None  # seconds; None for leak-free traces
    leak_rate: float = 0.0  # bytes per hour
    params: dict[str, float] = field(default_factory=dict)


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def ar1_noise(rng: np.random.Generator, n: int, sd: float, phi: float) -> Array:
    """AR(1) noise with stationary standard deviation ``sd`` and lag-1 correlation ``phi``."""
    e = rng.normal(0.0, sd * np.sqrt(1.0 - phi * phi), n)
    out = np.empty(n)
    x = rng.normal(0.0, sd)
    for i in range(n):
        x = phi * x + e[i]
        out[i] = x
    return out


def sawtooth(rng: np.random.Generator, t: Array, amplitude: float, period: float) -> Array:
    """Linear rise by ``amplitude`` then an instant drop (a collection), with jittered periods."""
    out = np.empty_like(t)
    start, length = 0.0, period * rng.uniform(0.8, 1.2)
    phase0 = rng.uniform(0.0, 1.0) * length
    start -= phase0
    for i, ti in enumerate(t):
        while ti >= start + length:
            start += length
            length = period * rng.uniform(0.8, 1.2)
        out[i] = amplitude * (ti - start) / length
    return out


def warmup_growth(rng: np.random.Generator, t: Array, *, big: bool = False) -> tuple[Array, dict[str, float]]:
    """Caches and caching allocators filling, then a plateau: exponential or linear fill."""
    amp = _loguniform(rng, 50 * MIB, 1024 * MIB) if big else _loguniform(rng, 20 * MIB, 400 * MIB)
    if rng.uniform() < 0.5:
        tau = rng.uniform(2, 20) * MINUTE if big else rng.uniform(2, 10) * MINUTE
        return amp * (1.0 - np.exp(-t / tau)), {"warmup_amp": amp, "warmup_tau": tau}
    fill = rng.uniform(10, 60) * MINUTE if big else rng.uniform(5, 25) * MINUTE
    return amp * np.clip(t / fill, 0.0, 1.0), {"warmup_amp": amp, "warmup_fill": fill}


def _noise(rng: np.random.Generator, n: int) -> tuple[Array, dict[str, float]]:
    sd = _loguniform(rng, 0.25 * MIB, 8 * MIB)
    phi = rng.uniform(0.5, 0.98)
    return ar1_noise(rng, n, sd, phi), {"noise_sd": sd, "noise_phi": phi}


def _leak_rate(rng: np.random.Generator) -> float:
    return _loguniform(rng, 5 * MIB, 200 * MIB)  # bytes per hour


# A pattern draws its shape (without base level and noise) and returns
# (values, leak start or None, leak rate bytes/hour, params).
PatternOut = tuple[Array, float | None, float, dict[str, float]]
PatternFn = Callable[[np.random.Generator, Array], PatternOut]


def _p_noise(rng: np.random.Generator, t: Array) -> PatternOut:
    return np.zeros_like(t), None, 0.0, {}


def _p_warmup(rng: np.random.Generator, t: Array) -> PatternOut:
    v, p = warmup_growth(rng, t, big=True)
    return v, None, 0.0, p


def _p_step(rng: np.random.Generator, t: Array) -> PatternOut:
    at = rng.uniform(1.0, 5.5) * HOUR
    size = _loguniform(rng, 16 * MIB, 512 * MIB)
    # A new shape: the allocator grows over a few minutes, then holds.
    settle = rng.uniform(0.0, 5.0) * MINUTE + 1.0
    v = size * np.clip((t - at) / settle, 0.0, 1.0)
    return v, None, 0.0, {"step_at": at, "step_size": size}


def _p_sawtooth(rng: np.random.Generator, t: Array) -> PatternOut:
    amp = _loguniform(rng, 8 * MIB, 256 * MIB)
    period = rng.uniform(1.0, 20.0) * MINUTE
    return sawtooth(rng, t, amp, period), None, 0.0, {"saw_amp": amp, "saw_period": period}


def _p_periodic(rng: np.random.Generator, t: Array) -> PatternOut:
    amp = _loguniform(rng, 4 * MIB, 32 * MIB)
    period = rng.uniform(30.0, 120.0) * MINUTE
    phase = rng.uniform(0, 2 * np.pi)
    return amp * np.sin(2 * np.pi * t / period + phase), None, 0.0, {"swing_amp": amp, "swing_period": period}


def _p_creep(rng: np.random.Generator, t: Array) -> PatternOut:
    rate = _leak_rate(rng)
    return rate * t / HOUR, 0.0, rate, {}


def _p_sawtooth_creep(rng: np.random.Generator, t: Array) -> PatternOut:
    saw, _, _, p = _p_sawtooth(rng, t)
    rate = _leak_rate(rng)
    return saw + rate * t / HOUR, 0.0, rate, p


def _p_staircase(rng: np.random.Generator, t: Array) -> PatternOut:
    rate = _leak_rate(rng)
    every = rng.uniform(10.0, 60.0) * MINUTE
    size = rate * every / HOUR
    v = np.zeros_like(t)
    at = rng.uniform(0.2, 1.0) * every
    while at < t[-1]:
        v[t >= at] += size
        at += every * rng.uniform(0.7, 1.3)
    return v, 0.0, rate, {"stair_every": every, "stair_size": size}


def _p_late_leak(rng: np.random.Generator, t: Array) -> PatternOut:
    start = rng.uniform(1.5, 3.5) * HOUR
    rate = _leak_rate(rng)
    v = rate * np.clip(t - start, 0.0, None) / HOUR
    p: dict[str, float] = {}
    if rng.uniform() < 0.5:
        saw, _, _, p = _p_sawtooth(rng, t)
        v = v + saw
    return v, start, rate, p


def wander(rng: np.random.Generator, n: int, interval: float, sd: float, corr_time: float) -> Array:
    """A slowly varying level: AR(1) at ``interval`` with correlation time ``corr_time``
    (seconds) and stationary standard deviation ``sd`` (the load mix drifting, no sawtooth)."""
    return ar1_noise(rng, n, sd, float(np.exp(-interval / corr_time)))


def _p_wander(rng: np.random.Generator, t: Array) -> PatternOut:
    sd = _loguniform(rng, 1.5 * MIB, 8 * MIB)
    tau = _loguniform(rng, 15 * MINUTE, 90 * MINUTE)
    return wander(rng, t.size, float(t[1] - t[0]), sd, tau), None, 0.0, {"wander_sd": sd, "wander_tau": tau}


def _p_diurnal(rng: np.random.Generator, t: Array) -> PatternOut:
    # Load that follows the day: a 24 h swing (6 h of it is a slow rise or fall) and its
    # second harmonic, with a little wander on top.
    amp = _loguniform(rng, 4 * MIB, 24 * MIB)
    phase = rng.uniform(0, 2 * np.pi)
    day = 2 * np.pi * t / (24 * HOUR)
    v = amp * (np.sin(day + phase) + 0.3 * np.sin(2 * day + 2 * phase))
    v = v + wander(rng, t.size, float(t[1] - t[0]), 0.3 * amp, 30 * MINUTE)
    return v, None, 0.0, {"diurnal_amp": amp}


def _p_alloc_plateaus(rng: np.random.Generator, t: Array) -> PatternOut:
    # A caching allocator reserving segments: each growth comes later than the one before and
    # is no bigger (the pool converges on the working set), so the level settles.
    v = np.zeros_like(t)
    at = rng.uniform(5.0, 30.0) * MINUTE
    size = _loguniform(rng, 8 * MIB, 128 * MIB)
    gap = rng.uniform(15.0, 40.0) * MINUTE
    while at < t[-1]:
        v[t >= at] += size
        gap *= rng.uniform(1.6, 2.6)
        at += gap
        size *= rng.uniform(0.4, 1.0)
    return v, None, 0.0, {}


def _p_faint_wander(rng: np.random.Generator, t: Array) -> PatternOut:
    sd = _loguniform(rng, 2 * MIB, 6 * MIB)
    tau = _loguniform(rng, 10 * MINUTE, 45 * MINUTE)
    rate = rng.uniform(3.0, 8.0) * MIB
    v = wander(rng, t.size, float(t[1] - t[0]), sd, tau) + rate * t / HOUR
    return v, 0.0, rate, {"wander_sd": sd, "wander_tau": tau}


def _p_rare_staircase(rng: np.random.Generator, t: Array) -> PatternOut:
    # A leak in chunks: a few large steps of random size at random gaps, none given back.
    gap = rng.uniform(40.0, 100.0) * MINUTE
    mean_size = _loguniform(rng, 8 * MIB, 160 * MIB)
    v = np.zeros_like(t)
    at = rng.uniform(0.3, 1.0) * gap
    while at < t[-1]:
        v[t >= at] += mean_size * rng.uniform(0.4, 1.6)
        at += gap * rng.exponential(1.0) + 5 * MINUTE
    return v, 0.0, mean_size * HOUR / (gap + 5 * MINUTE), {"stair_gap": gap}


def _p_leak_anytime(rng: np.random.Generator, t: Array) -> PatternOut:
    start = rng.uniform(0.0, 4.5) * HOUR
    rate = _loguniform(rng, 10 * MIB, 200 * MIB)
    v = rate * np.clip(t - start, 0.0, None) / HOUR
    v = v + wander(rng, t.size, float(t[1] - t[0]), _loguniform(rng, 0.5 * MIB, 3 * MIB), 20 * MINUTE)
    return v, start, rate, {}


LEAK_FREE: dict[str, PatternFn] = {
    "noise": _p_noise,
    "wander": _p_wander,
    "diurnal": _p_diurnal,
    "alloc_plateaus": _p_alloc_plateaus,
    "warmup_plateau": _p_warmup,
    "step": _p_step,
    "sawtooth": _p_sawtooth,
    "periodic": _p_periodic,
}
LEAKING: dict[str, PatternFn] = {
    "creep": _p_creep,
    "sawtooth_creep": _p_sawtooth_creep,
    "staircase": _p_staircase,
    "late_leak": _p_late_leak,
    "faint_wander": _p_faint_wander,
    "rare_staircase": _p_rare_staircase,
    "leak_anytime": _p_leak_anytime,
}
PATTERNS: dict[str, PatternFn] = {**LEAK_FREE, **LEAKING}


def generate(pattern: str, seed: int, *, duration: float = 6 * HOUR, interval: float = 10.0) -> Trace:
    """One trace of ``pattern`` (a key of PATTERNS) drawn from ``seed``."""
    fn = PATTERNS[pattern]
    # Seed per (pattern, seed) so patterns do not share draws.
    rng = np.random.default_rng([zlib.crc32(pattern.encode()), seed])
    t = np.arange(0.0, duration, interval)
    shape, leak_start, rate, params = fn(rng, t)
    noise, np_ = _noise(rng, t.size)
    v = rng.uniform(0.5, 4.0) * 1024 * MIB + shape + noise
    if pattern != "warmup_plateau" and rng.uniform() < 0.5:  # most runs warm up before they settle
        w, wp = warmup_growth(rng, t)
        v += w
        params = {**params, **wp}
    return Trace(pattern, seed, pattern in LEAKING, t, v, leak_start, rate, {**params, **np_})


def corpus(seeds: Sequence[int] | range, patterns: Sequence[str] | None = None) -> Iterator[Trace]:
    for pattern in patterns or PATTERNS:
        for seed in seeds:
            yield generate(pattern, seed)
