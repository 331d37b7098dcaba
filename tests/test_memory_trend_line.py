"""The memory verdict's trend line: the same figures as ``scipy.stats.theilslopes``, which
soakd no longer imports for it (that import cost every ``soakd run`` ~0.6 s)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import theilslopes

from soakd.verdicts.memory import TREND_POINTS, trend_line


@pytest.mark.parametrize("n", [3, 4, 10, TREND_POINTS, 3 * TREND_POINTS + 7])
def test_trend_line_is_scipys_theil_sen_slope_and_intercept(n: int) -> None:
    rng = np.random.default_rng(n)
    t = 1.7e9 + np.sort(rng.uniform(0, 3600, n))
    v = 1e9 + 5e3 * (t - t[0]) + rng.normal(0, 2e6, n)
    v[::5] = v[0]  # ties in v, as a flat allocator makes
    idx = np.unique(np.linspace(0, n - 1, min(n, TREND_POINTS)).astype(np.int64))  # the even subsample
    want = theilslopes(v[idx], t[idx])
    got = trend_line(t, v)
    assert got is not None
    assert got == pytest.approx((want.slope, want.intercept), rel=1e-9)


def test_trend_line_needs_three_points() -> None:
    assert trend_line(np.array([0.0, 1.0]), np.array([1.0, 2.0])) is None
