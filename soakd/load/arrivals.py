"""Open-loop arrival schedules: the intended send times of a constant, Poisson or gamma process.

Times are absolute offsets from the start, computed from the schedule alone, never from when
the previous request actually went out: falling behind shows up as schedule lag, not as a
quietly lower rate.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def gaps(rate: float, arrival: str, burstiness: float = 1.0, seed: int = 0, chunk: int = 4096) -> Iterator[float]:
    """Inter-arrival gaps in seconds with mean ``1/rate``.

    gamma: shape ``1/burstiness`` so the squared coefficient of variation of the gaps equals
    ``burstiness`` (1 is Poisson, above 1 is burstier, below 1 is smoother).
    """
    for block in _blocks(rate, arrival, burstiness, seed, chunk):
        yield from block.tolist()


def shard_gaps(
    index: int, count: int, arrival: str, burstiness: float = 1.0, seed: int = 0, chunk: int = 4096
) -> Iterator[float]:
    """The gaps of shard ``index`` of ``count`` (``--shard I/N``) in the unit-rate process that
    :func:`gaps` draws with the same seed: its arrivals are those whose index is I mod N, so the
    first gap spans arrivals 0..I and each later one N arrivals. Every shard draws the same
    process, so the N shards' arrivals together are exactly that one process (a Poisson process
    stays Poisson, a constant one constant), however many hosts they run on."""
    pending = np.empty(0)
    skip = index + 1  # arrivals up to and including this shard's first
    for block in _blocks(1.0, arrival, burstiness, seed, chunk):
        pending = np.concatenate([pending, block])
        if skip:
            if pending.size < skip:
                continue
            yield float(pending[:skip].sum())
            pending, skip = pending[skip:], 0
        whole = pending.size - pending.size % count
        if whole:
            yield from pending[:whole].reshape(-1, count).sum(axis=1).tolist()
            pending = pending[whole:]


def _blocks(rate: float, arrival: str, burstiness: float, seed: int, chunk: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    mean = 1.0 / rate
    while True:
        if arrival == "constant":
            block = np.full(chunk, mean)
        elif arrival == "poisson":
            block = rng.exponential(mean, chunk)
        elif arrival == "gamma":
            shape = 1.0 / burstiness
            block = rng.gamma(shape, mean / shape, chunk)
        else:
            raise ValueError(f"load.arrival: unknown arrival process {arrival!r}")
        yield block
