"""When a rise the trend test is sure of pages: once it has gone on as long as the
time-to-verdict goals allow for its rate (#39).

A GC sawtooth's ramp, a load cycle's rise, a wander's excursion and a leak's onset read alike
while they rise; what tells them apart is that a leak goes on. So a page waits as long as the
goals allow: a rise pages once its rate's 90% lower bound reaches EARLY_SHARE of the rate the
goals need paged within the rise's age (100 MiB/h within 1 h of its start, 20 MiB/h within 3 h,
on the power law through both). The age is how far back the troughs rose at that rate
(:func:`rise_age`): a swing's rise only as far back as its height allows, a steady leak back to
the run's start (a leak cannot have begun before it). A rise held so is a finding ("early") and
pages if it goes on; one that stops was a swing and never paged. The end of a run (the
summary's closing look, ``soakd analyze``) has no later and judges without the hold.

Until #39's ninth round the age was the run's, and only for the first 2 h of judging (a series
had not shown its slow swings turn); after that every rise the test was sure of paged at once.
Graded once on unseen seeds 1000-1009 of every set (6 h, 8 GiB of headroom): leak-free runs
paged 1.5% -> 0.6% (a load cycle's rise, a wander's excursion hours into a run), leaks of
100 MiB/h and more a median 36-55 min from their start either way (docs/leak-verdicts.md).
"""

from __future__ import annotations

import math

import numpy as np

from soakd.analysis.judgement import Judgement
from soakd.analysis.params import MIB
from soakd.analysis.trend import Array, _robust_spread, dur

GOAL_FAST = (100 * MIB, 3600.0)  # bytes/hour paged within seconds of the leak's start
GOAL_SLOW = (20 * MIB, 3 * 3600.0)
EARLY_SHARE = 0.6  # of the goals' rate: the lower bound's margin below the true rate
RISE_SLACK = 3.0  # robust spreads of the troughs' changes a rise may fall short by, as noise
WHOLE_HISTORY = 0.9  # a rise back to this share of the judged history goes back to the run's start
_POWER = math.log(GOAL_FAST[0] / GOAL_SLOW[0]) / math.log(GOAL_SLOW[1] / GOAL_FAST[1])  # 1.46


def goal_rate(elapsed: float) -> float:
    """The leak rate (bytes/hour) the time-to-verdict goals need paged within ``elapsed``
    seconds of its start."""
    return GOAL_FAST[0] * float((GOAL_FAST[1] / max(elapsed, 60.0)) ** _POWER)


def early_page_rate(elapsed: float, scale: float = 1.0) -> float:
    """The 90% lower bound a rise needs to page once it has gone on ``elapsed`` seconds;
    ``scale``: an accelerated run's time factor (``DetectorParams.floor_scale``: its hour is
    1/scale of one, and its rates scale up as its floor does)."""
    return EARLY_SHARE * scale * goal_rate(elapsed * scale)


def rise_age(y: Array, lower: float, run_points: int) -> int:
    """How many points back the rise ending ``y`` goes at ``lower`` per point: to the oldest
    point the newest one stands at least ``lower`` per point above. A swing's rise, or a step,
    goes back only as far as its height allows (a 30 MiB rise read at 60 MiB/h: 30 min, however
    flat before it); a steady leak at that rate goes back over all of ``y``, and then to the
    run's start (``run_points`` back): a leak may begin with the run, and warm-up hides it.
    Noise moves the points compared (RISE_SLACK robust spreads of ``y``'s changes are allowed)
    and may lift its oldest ones: a rise back to within WHOLE_HISTORY of its start counts as
    all of it."""
    if y.size < 3 or not lower > 0:
        return run_points
    k = np.arange(1, y.size, dtype=np.float64)
    slack = RISE_SLACK * _robust_spread(np.diff(y))[1]
    ok = np.nonzero(y[-1] - y[-2::-1] >= lower * k - slack)[0]
    back = int(ok[-1]) + 1 if ok.size else 0
    return run_points if back >= WHOLE_HISTORY * (y.size - 1) else back


def held_early(j: Judgement, *, final: bool = False, in_bytes: bool = True) -> bool:
    """A rise too slow to page for its age yet: a swing may make it. Never at the end of a run
    (``final``), nor for a gauge in its own unit (``in_bytes`` False: a scraped server metric),
    whose rate the goals, in bytes per hour, cannot price: as with its unknown headroom, every
    rise the test is sure of pages."""
    return in_bytes and not final and j.slope_lower_bytes_per_hour < j.early_page_bytes_per_hour


def early_why(j: Judgement) -> str:
    """Why a held rise is a finding, not a page."""
    lower = j.slope_lower_bytes_per_hour / MIB
    return (
        f"not paged yet: {lower:.3g} MiB/h at 90% over a rise of {dur(j.rise_seconds)}, which a swing may "
        f"make; a rise that young pages above {j.early_page_bytes_per_hour / MIB:.3g} MiB/h, so it pages "
        "if it goes on"
    )


def beyond_horizon(j: Judgement, headroom: float, horizon: float) -> str:
    """Why the rise is slow creep, not a page: at its rate's 90% lower bound (a page's consequence
    likely, not just possible) ``headroom`` bytes outlast ``horizon`` seconds; "" when they do not."""
    lower = j.slope_lower_bytes_per_hour
    if lower <= 0:  # a verdict held by its signs whose rate may now be nil
        return "slow creep, not paged: its rate may be nil at 90%, so the headroom may never run out"
    eta = max(0.0, headroom) / (lower / 3600.0)
    if eta <= horizon:
        return ""
    return (
        f"slow creep, not paged: the headroom may last {eta / 86400:.3g} d or more, "
        f"beyond the {horizon / 86400:.3g} d horizon"
    )
