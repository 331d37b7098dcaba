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
        yield from block.tolist()
