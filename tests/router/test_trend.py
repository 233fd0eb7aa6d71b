"""The load's trend (--switch-lead): a ramp predicted a stay ahead, nothing before a measured stay,
a step bounded, a falling or flat load no gain."""

from __future__ import annotations

import pytest

from dynspec.router.trend import STAY_WEIGHT, LoadTrend


def _ramp(trend: LoadTrend, slope: float, until: float, step: float = 0.01) -> float:
    """Feed a load rising ``slope`` a second from 0 at t=0 (in whole requests, as counts are);
    returns the load at ``until``."""
    t, load = 0.0, 0
    while t < until:
        t = round(t + step, 6)
        if int(slope * t) != load:
            load = int(slope * t)
            trend.observe(t, load)
    return slope * until


def test_nothing_is_predicted_before_a_stay_is_measured() -> None:
    trend = LoadTrend(0.0)
    _ramp(trend, 10.0, 5.0)
    assert trend.stay is None
    assert trend.ahead(5.0, 1.0) == 0.0


def test_a_ramp_is_predicted_one_stay_ahead() -> None:
    """Load rising 10 a second, EAGLE stays of 2 s: after a few stays the gain over one stay reads
    about 20 (the load 2 s on), over half a stay about 10."""
    trend = LoadTrend(0.0)
    trend.stayed(2.0)
    _ramp(trend, 10.0, 12.0)
    assert trend.ahead(12.0, 1.0) == pytest.approx(20.0, rel=0.1)
    assert trend.ahead(12.0, 0.5) == pytest.approx(10.0, rel=0.1)


def test_the_first_stay_starts_the_averages_where_the_load_is() -> None:
    """A load that rose to 50 before any stay was known reads flat from then on, not as a rise
    from 0."""
    trend = LoadTrend(0.0)
    trend.observe(1.0, 50)
    trend.stayed(1.0)
    trend.observe(2.0, 50)
    assert trend.ahead(3.0, 1.0) == 0.0


def test_a_flat_or_falling_load_gains_nothing() -> None:
    trend = LoadTrend(0.0)
    trend.stayed(1.0)
    trend.observe(0.0, 40)
    for i in range(1, 40):
        trend.observe(i * 0.1, 40 - i)  # falling 10 a second
    assert trend.ahead(4.0, 1.0) == 0.0
    trend.observe(4.0, 1)
    assert trend.ahead(30.0, 1.0) == 0.0  # flat for a long time: the averages met


def test_a_step_reads_as_at_most_half_of_it_at_a_lead_of_one() -> None:
    """A closed loop starting 64 requests at once: the gain peaks near a quarter of the step
    doubled (32, about 0.7 stays later) and fades within a few stays."""
    trend = LoadTrend(0.0)
    trend.stayed(1.0)
    trend.observe(0.0, 64)
    gains = [trend.ahead(i * 0.05, 1.0) for i in range(200)]
    assert max(gains) == pytest.approx(32.0, rel=0.01)
    assert 0.6 <= gains.index(max(gains)) * 0.05 <= 0.8
    assert gains[-1] < 1.0


def test_the_stay_is_a_running_mean_of_the_finished() -> None:
    trend = LoadTrend(0.0)
    trend.stayed(0.0)  # no time: not a stay
    assert trend.stay is None
    trend.stayed(2.0)
    trend.stayed(4.0)
    assert trend.stay == pytest.approx(2.0 + STAY_WEIGHT * 2.0)
