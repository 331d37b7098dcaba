"""Held-out memory traces: a second generator, written apart from soakd/analysis/corpus.py.

The detector is tuned on corpus.py only; these traces are for checking it. They use other
building blocks (Ornstein-Uhlenbeck wander with correlation times of minutes to an hour,
white jitter, GC sawtooth with exponential refill, allocator segments that grow at ever
longer gaps, a diurnal swing, late single steps, staircases with random step sizes, and leaks
of 5-200 MiB/h that start at any time). Draws are keyed by (shape, seed).

    from bench.leak.heldout_traces import generate, SHAPES
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.signal import lfilter

MIB = float(1 << 20)
H = 3600.0
M = 60.0
Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Held:
    shape: str
    seed: int
    leaking: bool
    t: Array
    v: Array
    leak_start: float | None
    leak_rate: float  # bytes/hour
    info: dict[str, float]


def _rng(shape: str, seed: int) -> np.random.Generator:
    key = int.from_bytes(hashlib.blake2b(f"heldout/{shape}/{seed}".encode(), digest_size=8).digest(), "big")
    return np.random.default_rng(key)


def ou(rng: np.random.Generator, n: int, dt: float, sd: float, tau: float) -> Array:
    """Ornstein-Uhlenbeck (exact discretisation) with stationary sd and correlation time tau."""
    a = float(np.exp(-dt / tau))
    e = rng.standard_normal(n) * sd * np.sqrt(1 - a * a)
    e[0] = rng.standard_normal() * sd
    return np.asarray(lfilter([1.0], [1.0, -a], e), dtype=np.float64)


def gc_sawtooth(rng: np.random.Generator, t: Array, amp: float, period: float) -> Array:
    """Refills that slow as they near the top (1 - exp), then a collection drops to the floor."""
    edges = [float(-rng.uniform(0, period))]
    while edges[-1] < t[-1]:
        edges.append(edges[-1] + period * rng.lognormal(0, 0.25))
    e = np.asarray(edges)
    i = np.searchsorted(e, t, side="right") - 1
    frac = (t - e[i]) / (e[i + 1] - e[i])
    out: Array = amp * (1 - np.exp(-3 * frac)) / (1 - np.exp(-3))
    return out


def saturating(rng: np.random.Generator, t: Array) -> Array:
    """Warm-up: caches and pools fill (logistic or exponential, done within ~25 min)."""
    amp = float(np.exp(rng.uniform(np.log(20 * MIB), np.log(2048 * MIB))))
    tau = rng.uniform(1, 6) * M
    if rng.uniform() < 0.5:
        return amp * (1 - np.exp(-t / tau))
    mid = rng.uniform(2, 12) * M
    return amp / (1 + np.exp(-(t - mid) / (tau / 3)))


def _rate(rng: np.random.Generator, lo: float = 5.0, hi: float = 200.0) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi)))) * MIB


def _background(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, dict[str, float]]:
    """Jitter every series has: white plus a little fast correlated noise."""
    white = float(np.exp(rng.uniform(np.log(0.05), np.log(2.0)))) * MIB
    fast = ou(rng, t.size, dt, float(rng.uniform(0.1, 2.0)) * MIB, rng.uniform(20, 300))
    return rng.standard_normal(t.size) * white + fast, {"white_mib": white / MIB}


Shape = Callable[[np.random.Generator, Array, float], tuple[Array, float | None, float, dict[str, float]]]


def _white(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    return np.zeros_like(t), None, 0.0, {}


def _wander(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    sd, tau = rng.uniform(2, 10) * MIB, rng.uniform(10, 60) * M
    return ou(rng, t.size, dt, sd, tau), None, 0.0, {"wander_mib": sd / MIB, "tau_min": tau / M}


def _diurnal(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    amp = rng.uniform(2, 8) * MIB
    phase = rng.uniform(0, 2 * np.pi)
    load = amp * np.sin(2 * np.pi * t / (24 * H) + phase)
    return load + ou(rng, t.size, dt, 2 * MIB, 15 * M), None, 0.0, {"diurnal_mib": amp / MIB}


def _plateaus(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    """The allocator grows its pool in a few steps at ever longer gaps, then holds."""
    v = np.zeros_like(t)
    at = rng.uniform(2, 10) * M
    ratio = rng.uniform(2.5, 4.0)
    steps = int(rng.integers(2, 5))
    for _ in range(steps):
        v += rng.uniform(8, 128) * MIB * (t >= at)
        at *= ratio
    return v, None, 0.0, {"steps": float(steps), "ratio": ratio}


def _late_step(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    at = rng.uniform(0.3, 0.95) * t[-1]
    size = float(np.exp(rng.uniform(np.log(8), np.log(512)))) * MIB
    settle = rng.uniform(0.1, 10) * M
    return size * np.clip((t - at) / settle, 0, 1), None, 0.0, {"step_at_h": at / H, "step_mib": size / MIB}


def _sawtooth(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    amp, period = float(np.exp(rng.uniform(np.log(4), np.log(200)))) * MIB, rng.uniform(2, 25) * M
    return gc_sawtooth(rng, t, amp, period), None, 0.0, {"saw_mib": amp / MIB, "period_min": period / M}


def _warmup(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    return saturating(rng, t), None, 0.0, {}


def _leak(rng: np.random.Generator, t: Array, start: float, rate: float) -> Array:
    return rate * np.clip(t - start, 0, None) / H


def _creep_white(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    r = _rate(rng)
    return _leak(rng, t, 0.0, r), 0.0, r, {}


def _creep_wander(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    r = _rate(rng)
    w, _, _, info = _wander(rng, t, dt)
    return _leak(rng, t, 0.0, r) + w, 0.0, r, info


def _faint_under_wander(
    rng: np.random.Generator, t: Array, dt: float
) -> tuple[Array, float | None, float, dict[str, float]]:
    """The hard case the issue names: about 5 MiB/h under several MiB of slow wander."""
    r = rng.uniform(4, 6) * MIB
    sd, tau = rng.uniform(3, 6) * MIB, rng.uniform(10, 40) * M
    return _leak(rng, t, 0.0, r) + ou(rng, t.size, dt, sd, tau), 0.0, r, {"wander_mib": sd / MIB, "tau_min": tau / M}


def _creep_sawtooth(
    rng: np.random.Generator, t: Array, dt: float
) -> tuple[Array, float | None, float, dict[str, float]]:
    r = _rate(rng)
    s, _, _, info = _sawtooth(rng, t, dt)
    return _leak(rng, t, 0.0, r) + s, 0.0, r, info


def _staircase(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    r = _rate(rng)
    gap = rng.uniform(5, 90) * M
    at = rng.exponential(gap)
    v = np.zeros_like(t)
    while at < t[-1]:
        v += r * gap / H * rng.exponential(1.0) * (t >= at)
        at += rng.exponential(gap)
    return v, 0.0, r, {"gap_min": gap / M}


def _late_leak(rng: np.random.Generator, t: Array, dt: float) -> tuple[Array, float | None, float, dict[str, float]]:
    r = _rate(rng)
    start = rng.uniform(0.1, 0.8) * t[-1]
    extra = (
        ou(rng, t.size, dt, rng.uniform(1, 5) * MIB, rng.uniform(5, 30) * M)
        if rng.uniform() < 0.5
        else gc_sawtooth(rng, t, rng.uniform(4, 100) * MIB, rng.uniform(2, 20) * M)
    )
    return _leak(rng, t, start, r) + extra, start, r, {"start_h": start / H}


def _leak_after_warmup(
    rng: np.random.Generator, t: Array, dt: float
) -> tuple[Array, float | None, float, dict[str, float]]:
    r = _rate(rng)
    return saturating(rng, t) + _leak(rng, t, 0.0, r), 0.0, r, {}


LEAK_FREE: dict[str, Shape] = {
    "white": _white,
    "wander": _wander,
    "diurnal": _diurnal,
    "allocator_plateaus": _plateaus,
    "late_step": _late_step,
    "gc_sawtooth": _sawtooth,
    "warmup": _warmup,
}
LEAKING: dict[str, Shape] = {
    "creep_white": _creep_white,
    "creep_wander": _creep_wander,
    "faint_under_wander": _faint_under_wander,
    "creep_sawtooth": _creep_sawtooth,
    "staircase": _staircase,
    "late_leak": _late_leak,
    "leak_after_warmup": _leak_after_warmup,
}
SHAPES: dict[str, Shape] = {**LEAK_FREE, **LEAKING}


def generate(shape: str, seed: int, *, duration: float = 6 * H, interval: float = 10.0) -> Held:
    rng = _rng(shape, seed)
    t = np.arange(0.0, duration, interval)
    body, start, rate, info = SHAPES[shape](rng, t, interval)
    noise, ninfo = _background(rng, t, interval)
    base = rng.uniform(0.3, 6.0) * 1024 * MIB
    v = base + body + noise
    if shape not in ("warmup", "leak_after_warmup") and rng.uniform() < 0.4:
        v = v + saturating(rng, t)
    return Held(shape, seed, shape in LEAKING, t, v, start, rate, {**info, **ninfo})
