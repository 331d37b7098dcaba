"""A fourth held-out trace set ("week"), written for #39 from the issue's description of the
team's unseen corpora only, without reading the detector's tuning corpus or the other sets'
generators, and never tuned against: grade on it.

Leak-free shapes (what pages falsely today):
  arena     allocator/arena growth that settles ever more slowly: chunks of 0.5-4 MiB arrive
            at a rate a / (tau + t), 2.5-10 MiB/h at 1 h, under 2 MiB/h by 6 h;
  cycle     a load schedule repeating every 4-8 h (memory follows load: 20-80 MiB swing,
            a trapezoid with random ramp fractions);
  warmup    an exponential warm-up of 100-300 MiB, time constant 10-40 min;
  sawtooth  GC sawtooth of 20-120 MiB, period 40-90 min (jittered), linear refill;
  wander    bounded slow wander: a random walk reflected in +-4-12 MiB, crossing in 1-3 h;
  jitter    heavy-tailed jitter: Student-t (2.5-4 dof), 0.5-2 MiB scale, with rare spikes up;
  ar1       short-memory noise: AR(1), correlation 3-8 min, 4-8 MiB sd (the faint leak's null);
  mixed     warm-up, GC sawtooth and heavy-tailed jitter together.
Leaking shapes (leak rate in MiB/h):
  leak_ar1_faint   2.5-5 under the ar1 noise, from the start;
  leak_steps       rare big steps: 20-80 MiB every 40-120 min (Poisson), over mild jitter;
  leak_cycle       5-30 under a 4-8 h load cycle;
  leak_warmup      10-100 after an exponential warm-up;
  leak_sawtooth    5-50 under the GC sawtooth;
  leak_late        20-200 starting at 1/6-2/3 of the run, under jitter;
  leak_wander      5-20 under bounded wander;
  leak_strong      100-250 under heavy-tailed jitter.

Every trace: a 10 s sample, a base level of 300-3000 MiB, 0.1-0.8 MiB white jitter, rounded
to 4 KiB pages. Parameters come from a stream keyed (shape, seed); noise from streams keyed
(shape, seed, part, replica), so :func:`noise` gives the oracle replicas with the same
parameters and other noise, and the leak part is the same in every replica.

    from bench.leak.week_traces import generate, SHAPES, LEAK_FREE
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MIB = float(1 << 20)
H = 3600.0
M = 60.0
Array = npt.NDArray[np.float64]

LEAK_FREE = ("arena", "cycle", "warmup", "sawtooth", "wander", "jitter", "ar1", "mixed")
LEAKING = (
    "leak_ar1_faint",
    "leak_steps",
    "leak_cycle",
    "leak_warmup",
    "leak_sawtooth",
    "leak_late",
    "leak_wander",
    "leak_strong",
)
SHAPES = {name: name for name in (*LEAK_FREE, *LEAKING)}


@dataclass(frozen=True)
class Trace:
    shape: str
    seed: int
    leaking: bool
    t: Array
    v: Array
    leak_start: float | None
    leak_rate: float  # bytes/hour (the steps' mean rate for leak_steps)
    cycle_seconds: float | None = None  # the load schedule's period (cycle, leak_cycle): a run would know it


def _stream(shape: str, seed: int, part: str, replica: int | None = None) -> np.random.Generator:
    tag = f"week/{shape}/{seed}/{part}" + ("" if replica is None else f"/r{replica}")
    return np.random.default_rng(int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "big"))


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _ar1(rng: np.random.Generator, n: int, dt: float, sd: float, tau: float) -> Array:
    a = float(np.exp(-dt / tau))
    e = rng.standard_normal(n) * sd * np.sqrt(1 - a * a)
    out = np.empty(n)
    x = rng.standard_normal() * sd
    for i in range(n):  # plain loop: no scipy needed, a 24 h trace is 8640 points
        x = a * x + e[i]
        out[i] = x
    return out


def _reflected_walk(rng: np.random.Generator, n: int, dt: float, bound: float, cross: float) -> Array:
    # a free walk crosses the band (2 * bound) in about `cross` seconds: step sd from that
    step = 2 * bound / np.sqrt(cross / dt)
    x = np.cumsum(rng.standard_normal(n) * step) + rng.uniform(-bound, bound)
    period = 4 * bound  # fold the free walk into [-bound, bound] (reflection)
    y = np.mod(x + bound, period)
    return np.where(y > 2 * bound, period - y, y) - bound


def _heavy(rng: np.random.Generator, n: int, scale: float, dof: float) -> Array:
    out = rng.standard_t(dof, n) * scale
    spikes = rng.uniform(size=n) < 1.0 / 720  # about one an hour at 10 s
    out[spikes] += rng.uniform(5, 40, spikes.sum()) * MIB
    return out


def _sawtooth(rng: np.random.Generator, t: Array, amp: float, period: float) -> Array:
    edges = [-float(rng.uniform(0, period))]
    while edges[-1] <= t[-1]:
        edges.append(edges[-1] + period * float(rng.uniform(0.8, 1.2)))
    e = np.asarray(edges)
    i = np.searchsorted(e, t, side="right") - 1
    out: Array = amp * (t - e[i]) / (e[i + 1] - e[i])
    return out


def _cycle(p: np.random.Generator, t: Array) -> tuple[Array, float]:
    """A load cycle's memory swing, and its period."""
    period = float(p.uniform(4, 8) * H)
    amp = p.uniform(20, 80) * MIB
    up, high = p.uniform(0.1, 0.3), p.uniform(0.2, 0.5)
    phase = (t / period + p.uniform()) % 1.0
    down = min(0.95, up + high + p.uniform(0.1, 0.3))
    shape = np.interp(phase, [0.0, up, up + high, down, 1.0], [0.0, 1.0, 1.0, 0.0, 0.0])
    return amp * shape, period


def _warmup(p: np.random.Generator, t: Array) -> Array:
    return p.uniform(100, 300) * MIB * (1 - np.exp(-t / (p.uniform(10, 40) * M)))


def _arena(p: np.random.Generator, n_rng: np.random.Generator, t: Array) -> Array:
    tau = p.uniform(0.1, 0.3) * H
    r1 = p.uniform(2.5, 10) * MIB  # bytes/hour at 1 h
    a = r1 * (1 + tau / H)  # rate(t) = a / (tau/H + t/H), bytes/hour
    chunk = p.uniform(0.5, 4) * MIB
    mean = a * np.log1p(t / tau) / chunk  # expected chunk count by t
    u = np.cumsum(n_rng.exponential(size=int(mean[-1] * 2) + 20))  # unit Poisson process, time-changed
    return chunk * np.searchsorted(u, mean, side="right").astype(np.float64)


def _noise(shape: str, seed: int, t: Array, p: np.random.Generator, replica: int | None) -> tuple[Array, float | None]:
    """The leak-free part of (shape, seed): parameters from ``p``, noise from replica streams; and
    the load cycle's period (None: no cycle), what a run with that phase schedule knows."""
    dt = float(t[1] - t[0])
    n = t.size

    def rng(part: str) -> np.random.Generator:
        return _stream(shape, seed, part, replica)

    period = None
    base = _loguniform(p, 300, 3000) * MIB
    v = base + rng("white").standard_normal(n) * p.uniform(0.1, 0.8) * MIB
    kind = shape.removeprefix("leak_").removesuffix("_faint")
    if kind == "arena":
        v += _arena(p, rng("arena"), t)
    elif kind == "cycle":
        swing, period = _cycle(p, t)
        v += swing + _ar1(rng("ar1"), n, dt, 1.5 * MIB, 10 * M)
    elif kind in ("warmup", "mixed"):
        v += _warmup(p, t)
    if kind in ("sawtooth", "mixed"):
        v += _sawtooth(rng("saw"), t, p.uniform(20, 120) * MIB, p.uniform(40, 90) * M)
    if kind in ("jitter", "mixed", "strong", "late", "steps"):
        v += _heavy(rng("heavy"), n, p.uniform(0.5, 2) * MIB, p.uniform(2.5, 4))
    if kind == "wander":
        v += _reflected_walk(rng("walk"), n, dt, p.uniform(4, 12) * MIB, p.uniform(1, 3) * H)
    if kind == "ar1":
        v += _ar1(rng("ar1"), n, dt, p.uniform(4, 8) * MIB, p.uniform(3, 8) * M)
    return v, period


_RATES = {
    "leak_ar1_faint": (2.5, 5),
    "leak_cycle": (5, 30),
    "leak_warmup": (10, 100),
    "leak_sawtooth": (5, 50),
    "leak_late": (20, 200),
    "leak_wander": (5, 20),
    "leak_strong": (100, 250),
}


def _leak(shape: str, seed: int, t: Array) -> tuple[Array, float | None, float]:
    """(leak part, start, rate): the same in every replica (its own parameter stream)."""
    if shape in LEAK_FREE:
        return np.zeros_like(t), None, 0.0
    p = _stream(shape, seed, "leak")
    if shape == "leak_steps":
        size, gap = p.uniform(20, 80) * MIB, p.uniform(40, 120) * M
        at = np.cumsum(p.exponential(gap, size=int(t[-1] / gap * 3) + 5))
        return size * np.searchsorted(at, t, side="right").astype(np.float64), 0.0, size * H / gap
    rate = _loguniform(p, *_RATES[shape]) * MIB
    start = p.uniform(1 / 6, 2 / 3) * float(t[-1]) if shape == "leak_late" else 0.0
    return rate * np.clip(t - start, 0, None) / H, start, rate


def times(duration: float, interval: float = 10.0) -> Array:
    return np.arange(0.0, duration, interval)


def noise(shape: str, seed: int, replica: int | None, *, duration: float = 6 * H, interval: float = 10.0) -> Array:
    """The leak-free part of (shape, seed) with replica ``replica``'s noise (None: the trace's own)."""
    return _noise(shape, seed, times(duration, interval), _stream(shape, seed, "params"), replica)[0]


def leak_part(
    shape: str, seed: int, *, duration: float = 6 * H, interval: float = 10.0
) -> tuple[Array, float | None, float]:
    return _leak(shape, seed, times(duration, interval))


def pages(v: Array) -> Array:
    return np.round(v / 4096.0) * 4096.0


def generate(shape: str, seed: int, *, duration: float = 6 * H, interval: float = 10.0) -> Trace:
    if shape not in SHAPES:
        raise ValueError(f"unknown week shape {shape!r}")
    t = times(duration, interval)
    leak, start, rate = _leak(shape, seed, t)
    swings, period = _noise(shape, seed, t, _stream(shape, seed, "params"), None)
    return Trace(shape, seed, shape in LEAKING, t, pages(swings + leak), start, rate, period)
