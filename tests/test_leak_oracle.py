"""bench/leak/oracle.py: its replicas are the trace's noise law, and its threshold holds its level."""

from __future__ import annotations

import numpy as np
from scipy import stats

from bench.leak import fresh_traces as fresh
from bench.leak import oracle as lo

MIB = float(1 << 20)


def test_a_replica_keeps_the_traces_parameters_and_draws_fresh_noise() -> None:
    before = fresh.generate("leak_sawtooth", 0)
    own = lo.build("leak_sawtooth", 0)
    parts = fresh.components("leak_sawtooth", 0)
    assert own.parts.keys() == parts.keys() == {"level", "jitter", "wander", "sawtooth", "leak"}
    assert all(np.array_equal(own.parts[k], parts[k]) for k in parts)  # no replica: the trace's own
    one, two = lo.build("leak_sawtooth", 0, replica=1), lo.build("leak_sawtooth", 0, replica=2)
    for rep in (one, two):
        assert rep.info == own.info and rep.leak_start == own.leak_start  # sigma, tau, period, rate...
        assert np.array_equal(rep.parts["level"], own.parts["level"])
        assert np.array_equal(rep.parts["leak"], own.parts["leak"])
        for k in ("jitter", "wander", "sawtooth"):
            assert not np.allclose(rep.parts[k], own.parts[k])
    assert not np.allclose(one.noise, two.noise)
    # The jitter's sigma is the drawn one in every replica (same law, other draws).
    for rep in (own, one, two):
        assert 0.8 < np.std(rep.parts["jitter"]) / own.info["jitter_sigma"] < 1.25
    # A part drawn from the parameters only (the warm-up) is the trace's own in every replica.
    warm = lo.build("leak_warmup", 1), lo.build("leak_warmup", 1, replica=5)
    assert np.array_equal(warm[0].parts["warmup"], warm[1].parts["warmup"])
    assert not np.allclose(warm[0].parts["wander"], warm[1].parts["wander"])
    after = fresh.generate("leak_sawtooth", 0)
    assert np.array_equal(before.v, after.v)  # building replicas leaves the generator alone


def test_the_trace_itself_is_one_more_draw_of_its_replicas_noise() -> None:
    """Where the trace's own leak-free parts fall among its replicas' slopes: uniform over seeds.
    (Shared noise would put them all at one end, a wrong scale at both.)"""
    p = []
    for seed in range(30):
        h = fresh.generate("leak_wander_5", seed)
        since = max(h.leak_start or 0.0, lo.SKIP)
        replicas = np.stack([lo.build("leak_wander_5", seed, replica=r).noise for r in range(60)])
        null = lo.slopes(h.t, lo.pages(replicas), since)
        real = lo.slopes(h.t, lo.pages(lo.build("leak_wander_5", seed).noise), since)
        p.append(float(np.mean(null["raw"] >= real["raw"][0])))
    assert 0.35 < np.mean(p) < 0.65
    assert stats.kstest(p, "uniform").pvalue > 0.001


def test_a_big_leak_is_found_and_noise_alone_at_the_level() -> None:
    seed = next(s for s in range(40) if fresh.generate("leak_white", s).leak_rate >= 50 * MIB)
    big = lo.oracle("leak_white", seed, replicas=200)
    assert big.rate >= 50 * MIB
    assert all(big.power[k] >= 0.99 for k in big.power) and all(big.actual.values())
    assert big.leak_slope["raw"] > 20 * big.null_sd["raw"]
    # The leak taken out: a 1% threshold flags about 1% of the noise, 0.1% about 0.1%.
    alone = [lo.oracle(sh, 2, replicas=400, leak_scale=0.0) for sh in ("leak_white", "leak_wander_10")]
    for o in alone:
        for s in lo.STATS:
            assert 0.0025 <= o.power[s, 0.01] <= 0.025
            assert o.power[s, 0.001] <= 0.006
    # A leak scaled to (z(1%) + z(10%)) standard errors of white jitter's slope: about 90% power.
    scale = (2.326 + 1.282) * big.null_sd["raw"] / big.leak_slope["raw"]
    mid = lo.oracle("leak_white", seed, replicas=400, leak_scale=scale)
    assert 0.75 <= mid.power["raw", 0.01] <= 0.97
    assert mid.power["raw", 0.001] < mid.power["raw", 0.01]
