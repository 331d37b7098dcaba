"""Fresh held-out memory traces: a third generator, for grading the leak detector (#14).

Written from a description of what a soak's memory looks like, without reading
soakd/analysis/corpus.py, bench/leak/heldout_traces.py (beyond its ``Held`` dataclass and the
``generate`` signature) or the detector, and not tuned on the detector's results.

A trace is a process's memory in bytes sampled every ``interval`` seconds, the sum of parts:

- level: 300 MiB - 4 GiB (log-uniform), the model and runtime once loaded;
- jitter: request-driven, Student-t (nu 3-30, heavy tails), 0.2-3 MiB standard deviation;
- wander (2, 5 or 10 MiB standard deviation, time scale 20-120 min), one of: a critically
  damped AR(2) process (smoother than a first-order one), a random walk reflected inside a
  band (a bounded cache filling and emptying), or 3-6 random-phase slow sinusoids;
- diurnal: a load cycle of period 1-24 h and amplitude 3-20 MiB, with a second harmonic;
- plateaus: a caching allocator that reserves, rounded up to 2 or 20 MiB, the running
  maximum of an i.i.d. lognormal per-sample demand, so steps come at records, ever more rarely;
- late step: one step of 10-100 MiB, spread over 10-60 s, at 10-90 % of the trace;
- sawtooth: GC / arena cycles of gamma-distributed length (mean 2-30 min) that fill in
  irregular increments to a lognormal peak (median 3-30 MiB) and drop to a small residual;
- warm-up: a rise of 20-400 MiB that saturates (99 %) in 5-40 min, 1-exp or logistic;
- spikes: 0.5-6 an hour, lognormal height (median 5-80 MiB), held 10-120 s, released
  with a 10-30 s tail, gone entirely;
- leak: linear, slightly accelerating (end slope 1.4-3x the start's) or square-root
  decelerating but unbounded (end slope 0.2-0.6x), or modulated by the diurnal load; or a
  staircase (steps of lognormal size, mean 1-20 MiB, at gamma-distributed gaps).

Leaks start at 0 (a third of them) or at any time in the first 4.5 h (at most 3/4 of the
trace); ``leak_late`` starts in 2-4.5 h. ``leak_rate`` is the leak part's growth from
``leak_start`` to the last sample, per hour of that span (for a staircase the realised mean,
not the drawn one, and ``leak_start`` is its first step). The sum is rounded to 4 KiB pages.
``components`` gives the parts, so a test can check the leak alone. Draws are keyed by
``fresh/{shape}/{seed}/{what}``, the parameters in a stream of their own, so a longer trace
keeps its shape's draws (times drawn as fractions of the trace scale with it).

    from bench.leak.fresh_traces import generate, SHAPES
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.signal import lfilter

from bench.leak.heldout_traces import Array, Held

MIB = float(1 << 20)
H = 3600.0
M = 60.0
PAGE = 4096.0

LINEAR, ACCELERATING, SQRT, LOAD = 0.0, 1.0, 2.0, 3.0  # info["leak_kind"]
AR2, REFLECTED, PHASES = 0.0, 1.0, 2.0  # info["wander_kind"]


def _rng(shape: str, seed: int, what: str) -> np.random.Generator:
    key = hashlib.sha256(f"fresh/{shape}/{seed}/{what}".encode()).digest()
    return np.random.default_rng(int.from_bytes(key[:8], "little"))


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


@dataclass
class Draw:
    """One trace under construction: parameter draws, noise streams, parts and info."""

    shape: str
    seed: int
    t: Array
    p: np.random.Generator  # parameters: drawn in a fixed order, independent of the length
    parts: dict[str, Array] = field(default_factory=dict)
    info: dict[str, float] = field(default_factory=dict)
    leak_start: float | None = None

    def noise(self, what: str) -> np.random.Generator:
        return _rng(self.shape, self.seed, what)

    @property
    def dt(self) -> float:
        return float(self.t[1] - self.t[0])

    @property
    def end(self) -> float:
        return float(self.t[-1])

    def add(self, name: str, part: Array) -> None:
        self.parts[name] = part


# ---------------------------------------------------------------- leak-free building blocks


def level(d: Draw) -> None:
    base = _loguniform(d.p, 300 * MIB, 4096 * MIB)
    d.info["base"] = base
    d.add("level", np.full(d.t.size, base))


def jitter(d: Draw, lo: float = 0.2 * MIB, hi: float = 3 * MIB) -> None:
    sigma = _loguniform(d.p, lo, hi)
    nu = _loguniform(d.p, 3.0, 30.0)
    z = d.noise("jitter").standard_t(nu, d.t.size) / np.sqrt(nu / (nu - 2.0))
    d.info |= {"jitter_sigma": sigma, "jitter_nu": nu}
    d.add("jitter", sigma * z)


def _ar2(rng: np.random.Generator, n: int, dt: float, tau: float) -> Array:
    """Critically damped AR(2) (a double pole at exp(-dt/tau)), unit stationary variance."""
    a = np.exp(-dt / tau)
    burn = int(10 * tau / dt)
    e = rng.standard_normal(n + burn)
    x = lfilter([1.0], [1.0, -2.0 * a, a * a], e)[burn:]
    var = (1 + a * a) / (1 - a * a) ** 3
    return np.asarray(x / np.sqrt(var), dtype=np.float64)


def _reflected(rng: np.random.Generator, n: int, dt: float, tau: float) -> Array:
    """A random walk folded into [-w, w] (uniform stationary law), crossing it in about tau."""
    w = np.sqrt(3.0)  # unit standard deviation of the uniform law on [-w, w]
    x = rng.uniform(-w, w) + np.cumsum(rng.standard_normal(n) * 2 * w * np.sqrt(dt / tau))
    u = np.mod(x + w, 4 * w)
    return np.asarray(np.where(u < 2 * w, u - w, 3 * w - u), dtype=np.float64)


def _phases(rng: np.random.Generator, t: Array, tau: float) -> Array:
    """3-6 sinusoids with periods 1-6x tau, random phases, unit variance on average."""
    k = int(rng.integers(3, 7))
    periods = tau * np.exp(rng.uniform(0.0, np.log(6.0), k))
    amps = rng.rayleigh(1.0, k) * np.sqrt(periods / tau)
    phase = rng.uniform(0, 2 * np.pi, k)
    x = (amps[:, None] * np.sin(2 * np.pi * t[None, :] / periods[:, None] + phase[:, None])).sum(axis=0)
    return np.asarray(x / np.sqrt(np.sum(amps**2) / 2), dtype=np.float64)


def wander(d: Draw, scale: float, name: str = "wander") -> None:
    tau = _loguniform(d.p, 20 * M, 120 * M)
    kind = float(d.p.integers(0, 3))
    rng = d.noise(name)
    if kind == AR2:
        x = _ar2(rng, d.t.size, d.dt, tau)
    elif kind == REFLECTED:
        x = _reflected(rng, d.t.size, d.dt, tau)
    else:
        x = _phases(rng, d.t, tau)
    d.info |= {f"{name}_scale": scale, f"{name}_tau": tau, f"{name}_kind": kind}
    d.add(name, scale * x)


def diurnal(d: Draw) -> Array:
    """Adds a load cycle; returns the load (0 at the trough, 1 at the peak) for leaks that follow it."""
    period = _loguniform(d.p, 1 * H, 24 * H)
    amp = d.p.uniform(3 * MIB, 20 * MIB)
    h2 = d.p.uniform(0.0, 0.4)
    ph1, ph2 = d.p.uniform(0, 2 * np.pi, 2)
    grid = np.linspace(0, 2 * np.pi, 721)

    def cycle(x: Array) -> Array:
        return np.asarray(np.sin(x + ph1) + h2 * np.sin(2 * x + ph2), dtype=np.float64)

    lo, hi = float(cycle(grid).min()), float(cycle(grid).max())
    load = (cycle(2 * np.pi * d.t / period) - lo) / (hi - lo)
    d.info |= {"diurnal_period": period, "diurnal_amp": amp, "diurnal_h2": h2}
    d.add("diurnal", amp * (2 * load - 1))
    return load


def plateaus(d: Draw) -> None:
    demand = _loguniform(d.p, 4 * MIB, 40 * MIB)
    sigma = d.p.uniform(0.2, 0.6)
    granule = (2 * MIB, 20 * MIB)[int(d.p.integers(0, 2))]
    need = demand * d.noise("plateaus").lognormal(0.0, sigma, d.t.size)
    reserved = granule * np.ceil(np.maximum.accumulate(need) / granule)
    late = int(np.count_nonzero(np.diff(reserved)[d.t[1:] > 1 * H]))
    d.info |= {"plateau_demand": demand, "plateau_sigma": sigma, "plateau_granule": granule}
    d.info["plateau_steps_after_1h"] = float(late)
    d.add("plateaus", reserved)


def late_step(d: Draw) -> None:
    height = _loguniform(d.p, 10 * MIB, 100 * MIB)
    at = d.p.uniform(0.1, 0.9) * d.end
    ramp = d.p.uniform(10.0, 60.0)
    d.info |= {"step_height": height, "step_at": at, "step_ramp": ramp}
    d.add("step", height * np.clip((d.t - at) / ramp, 0.0, 1.0))


def sawtooth(d: Draw) -> None:
    period = _loguniform(d.p, 2 * M, 30 * M)
    amp = _loguniform(d.p, 3 * MIB, 30 * MIB)
    k = d.p.uniform(2.0, 8.0)  # gamma shape of the cycle lengths: CV 0.35-0.7
    rng = d.noise("sawtooth")
    n_cycles = int(d.end / period * 3) + 8
    lengths = rng.gamma(k, period / k, n_cycles)
    starts = np.concatenate([[0.0], np.cumsum(lengths)]) - rng.uniform(0, 1) * lengths[0]
    peaks = amp * rng.lognormal(0.0, 0.4, n_cycles)
    resid = peaks * rng.uniform(0.0, 0.15, n_cycles)  # what a collection leaves, not kept
    # Fill within a cycle in irregular increments (allocations), from the residual to the peak.
    c = np.searchsorted(starts, d.t, side="right") - 1
    e = rng.exponential(1.0, d.t.size)
    cs = np.cumsum(e)
    first = np.searchsorted(c, c, side="left")  # each sample's cycle's first and last samples
    last = np.searchsorted(c, c, side="right") - 1
    before = cs[first] - e[first]
    covered = (d.t[last] - starts[c]) / lengths[c]  # the collection falls after the last sample
    frac = (cs - before) / (cs[last] - before) * covered
    d.info |= {"saw_period": period, "saw_amp": amp, "saw_gamma_k": k}
    d.add("sawtooth", resid[c] + (peaks[c] - resid[c]) * frac)


def warmup(d: Draw) -> float:
    """Adds a saturating rise; returns the time it reaches 99 %."""
    height = _loguniform(d.p, 20 * MIB, 400 * MIB)
    sat = d.p.uniform(5 * M, 40 * M)
    logistic = float(d.p.integers(0, 2))
    if logistic:
        s = sat / (2 * 4.6)
        raw = 1 / (1 + np.exp(-(d.t - sat / 2) / s))
        w0 = 1 / (1 + np.exp(sat / 2 / s))
        shape = (raw - w0) / (1 - w0)
    else:
        shape = 1 - np.exp(-d.t / (sat / 4.6))
    d.info |= {"warmup_height": height, "warmup_sat": sat, "warmup_logistic": logistic}
    d.add("warmup", height * shape)
    return sat


def spikes(d: Draw) -> None:
    rate = _loguniform(d.p, 0.5, 6.0)  # an hour
    median = _loguniform(d.p, 5 * MIB, 80 * MIB)
    hold = _loguniform(d.p, 10.0, 120.0)
    tail = d.p.uniform(10.0, 30.0)
    rng = d.noise("spikes")
    at = np.sort(rng.uniform(0, d.end, rng.poisson(rate * d.end / H)))
    out = np.zeros(d.t.size)
    heights, holds = rng.lognormal(np.log(median), 0.7, at.size), rng.exponential(hold, at.size)
    for t0, hgt, held in zip(at, heights, holds, strict=True):
        s = d.t - t0
        out += hgt * np.where(s < 0, 0.0, np.where(s < held, 1.0, np.exp(-np.maximum(s - held, 0.0) / tail)))
    d.info |= {"spike_rate": rate, "spike_median": median, "spike_hold": hold, "spike_tail": tail}
    d.info["spike_count"] = float(at.size)
    d.add("spikes", out)


# ---------------------------------------------------------------- leaks


def _start(d: Draw, lo: float = 0.0, hi: float = 4.5 * H) -> float:
    hi = min(hi, 0.75 * d.end)
    at_zero = d.p.uniform() < 1 / 3 and lo == 0.0
    start = 0.0 if at_zero else d.p.uniform(min(lo, hi), hi)
    d.leak_start = start
    d.info["leak_start"] = start
    return start


def leak(
    d: Draw, lo: float = 1 * MIB, hi: float = 200 * MIB, start: float | None = None, load: Array | None = None
) -> None:
    """A smooth leak of average rate lo-hi bytes/hour from ``start`` to the end."""
    rate = _loguniform(d.p, lo, hi)
    kind = LOAD if load is not None else float(d.p.integers(0, 3))
    bend = d.p.uniform(0.2, 1.0) if kind == ACCELERATING else d.p.uniform(0.05, 0.5)
    depth = d.p.uniform(0.3, 0.9)
    if start is None:
        start = _start(d)
    span = d.end - start
    s = np.clip(d.t - start, 0.0, None)
    if kind == LINEAR:
        g = s
    elif kind == ACCELERATING:
        g = s + bend * s * s / span
    elif kind == SQRT:
        g = np.sqrt(s + bend * span) - np.sqrt(bend * span)
    else:  # per-request leak: grows with the load, the integral of (1 - depth) + depth * load
        assert load is not None
        r = (1 - depth) + depth * load
        acc = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(d.t))])
        g = np.where(d.t > start, acc - np.interp(start, d.t, acc), 0.0)
    d.info |= {"leak_rate": rate, "leak_kind": kind}
    if kind in (ACCELERATING, SQRT):
        d.info["leak_bend"] = bend
    if kind == LOAD:
        d.info["leak_load_depth"] = depth
    d.add("leak", rate / H * span * g / g[-1])


def staircase(d: Draw) -> None:
    rate = _loguniform(d.p, 5 * MIB, 100 * MIB)
    size = _loguniform(d.p, 1 * MIB, 20 * MIB)
    kappa = _loguniform(d.p, 0.7, 4.0)  # gamma shape of the gaps: below 1, steps cluster
    start = _start(d)  # the first step, at the leak's start
    span = d.end - start
    size = min(size, rate * span / H / 4)  # at least about 4 steps in the trace
    n = max(3, round(rate * span / H / size))
    rng = d.noise("staircase")
    gaps = rng.gamma(kappa, 1.0, n)  # n - 1 between steps, and one after the last
    at = start + np.concatenate([[0.0], np.cumsum(gaps[:-1]) / gaps.sum() * span])
    sizes = size * rng.lognormal(-0.18, 0.6, n)  # exp(-0.18 + 0.6**2 / 2) = 1: size is the mean
    # A sample sees the steps made before it (one at t=0 shows from the second sample on).
    steps = np.bincount(np.searchsorted(d.t, at, side="right"), sizes, d.t.size + 1)
    part = np.asarray(np.cumsum(steps)[: d.t.size], dtype=np.float64)
    d.info |= {"leak_rate_drawn": rate, "step_mean": size, "gap_gamma_k": kappa, "steps": float(n)}
    d.info["leak_rate"] = float(sizes.sum()) / span * H
    d.add("leak", part)


# ---------------------------------------------------------------- shapes


def _white(d: Draw) -> None:
    level(d)
    jitter(d, 0.3 * MIB, 3 * MIB)


def _wanderer(scale: float) -> Callable[[Draw], None]:
    def build(d: Draw) -> None:
        level(d)
        jitter(d, 0.2 * MIB, 1.5 * MIB)
        wander(d, scale)

    return build


def _quiet(d: Draw) -> None:
    """Level, jitter and a faint wander (0.5-2 MiB): the background of the other shapes."""
    level(d)
    jitter(d, 0.2 * MIB, 1.5 * MIB)
    wander(d, d.p.uniform(0.5 * MIB, 2 * MIB))


def _with(*blocks: Callable[[Draw], object]) -> Callable[[Draw], None]:
    def build(d: Draw) -> None:
        _quiet(d)
        for b in blocks:
            b(d)

    return build


def _leak_white(d: Draw) -> None:
    _white(d)
    leak(d)


def _leak_faint(d: Draw) -> None:
    level(d)
    jitter(d, 0.2 * MIB, 1.5 * MIB)
    wander(d, d.p.uniform(2 * MIB, 5 * MIB))
    leak(d, 3 * MIB, 8 * MIB)


def _leak_wander(scale: float) -> Callable[[Draw], None]:
    base = _wanderer(scale)

    def build(d: Draw) -> None:
        base(d)
        leak(d)

    return build


def _leak_late(d: Draw) -> None:
    _quiet(d)
    leak(d, start=_start(d, 2 * H, 4.5 * H))


def _leak_warmup(d: Draw) -> None:
    _quiet(d)
    sat = warmup(d)
    # A per-request leak runs from the start, under the warm-up, or begins once traffic settles.
    start = 0.0 if d.p.uniform() < 0.5 else d.p.uniform(0.0, min(sat + 30 * M, 0.75 * d.end))
    d.leak_start = start
    d.info["leak_start"] = start
    leak(d, start=start)


def _leak_diurnal(d: Draw) -> None:
    _quiet(d)
    leak(d, load=diurnal(d))


Shape = Callable[[Draw], None]

LEAK_FREE: dict[str, Shape] = {
    "white": _white,
    "wander_2": _wanderer(2 * MIB),
    "wander_5": _wanderer(5 * MIB),
    "wander_10": _wanderer(10 * MIB),
    "diurnal": _with(diurnal),
    "plateaus": _with(plateaus),
    "late_step": _with(late_step),
    "sawtooth": _with(sawtooth),
    "warmup": _with(warmup),
    "spikes": _with(spikes),
}
LEAKING: dict[str, Shape] = {
    "leak_white": _leak_white,
    "leak_wander_2": _leak_wander(2 * MIB),
    "leak_wander_5": _leak_wander(5 * MIB),
    "leak_wander_10": _leak_wander(10 * MIB),
    "leak_faint": _leak_faint,
    "leak_sawtooth": _with(sawtooth, leak),
    "staircase": _with(staircase),
    "leak_late": _leak_late,
    "leak_warmup": _leak_warmup,
    "leak_diurnal": _leak_diurnal,
}
SHAPES: dict[str, Shape] = {**LEAK_FREE, **LEAKING}


def to_pages(v: Array) -> Array:
    """Bytes rounded to whole 4 KiB pages, as a process's memory is."""
    return np.asarray(np.round(v / PAGE) * PAGE, dtype=np.float64)


def draw(shape: str, seed: int, duration: float, interval: float, make: Callable[..., Draw] = Draw) -> Draw:
    """The parts of (shape, seed) on a grid of ``interval`` over ``duration``; ``make`` builds the
    Draw from (shape, seed, t, params stream), e.g. one whose noise streams are keyed otherwise."""
    if shape not in SHAPES:
        raise KeyError(f"unknown fresh trace shape {shape!r}; known: {', '.join(SHAPES)}")
    n = round(duration / interval) + 1
    t = np.arange(n, dtype=np.float64) * interval
    d = make(shape, seed, t, _rng(shape, seed, "params"))
    SHAPES[shape](d)
    return d


def _build(shape: str, seed: int, duration: float, interval: float) -> tuple[Held, dict[str, Array]]:
    d = draw(shape, seed, duration, interval)
    t = d.t
    v = to_pages(np.sum(list(d.parts.values()), axis=0))
    leaking = shape in LEAKING
    rate = d.info.get("leak_rate", 0.0) if leaking else 0.0
    held = Held(shape, seed, leaking, t, v, d.leak_start if leaking else None, rate, dict(d.info))
    return held, d.parts


def generate(shape: str, seed: int, *, duration: float = 6 * H, interval: float = 10.0) -> Held:
    return _build(shape, seed, duration, interval)[0]


def components(shape: str, seed: int, *, duration: float = 6 * H, interval: float = 10.0) -> dict[str, Array]:
    """The parts of ``generate``'s trace (bytes each, "leak" among them for a leaking shape);
    their sum is the trace before rounding to pages."""
    return _build(shape, seed, duration, interval)[1]
