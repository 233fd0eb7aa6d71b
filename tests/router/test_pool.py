"""Leases: the only way counts change; releasing twice is harmless; refusals change nothing."""

from __future__ import annotations

import pytest

from dynspec.router.errors import NoServer, Overloaded
from dynspec.router.health import HealthTracker, Probe
from dynspec.router.policy import BalancePolicy, ThresholdPolicy
from dynspec.router.pool import Lease, Pools, Server
from dynspec.router.thresholds import validate_settings


def make(max_concurrency: int = 0, threshold: int = 2, hysteresis: int = 1) -> Pools:
    pools = Pools(
        [("http://e1", "eagle"), ("http://e2", "eagle"), ("http://b1", "baseline")],
        ThresholdPolicy(),
        threshold=threshold,
        hysteresis=hysteresis,
        max_concurrency=max_concurrency,
    )
    for s in pools.servers:
        pools.set_healthy(s.url, True)
    return pools


def test_release_twice_counts_once() -> None:
    pools = make()
    lease = pools.acquire()
    assert pools.load == 1 and lease.server.in_flight == 1
    lease.release()
    lease.release()
    assert pools.load == 0 and lease.server.in_flight == 0


def test_least_in_flight_spreads_and_mode_switches_with_callback() -> None:
    switched: list[str] = []
    pools = make()
    pools.on_switch = lambda to, pair: switched.append(to)
    a, b = pools.acquire(), pools.acquire()
    assert {a.server.url, b.server.url} == {"http://e1", "http://e2"}
    c = pools.acquire()  # load 3 > threshold 2
    assert c.pool == "baseline" and pools.mode == "baseline" and switched == ["baseline"]
    for lease in (a, b, c):
        lease.release()
    d = pools.acquire()  # load 1 <= 2 - 1
    assert d.pool == "eagle" and switched == ["baseline", "eagle"]
    d.release()
    assert pools.load == 0


def test_max_concurrency_refuses_before_counting() -> None:
    pools = make(max_concurrency=2, threshold=5)
    leases = [pools.acquire(), pools.acquire()]
    with pytest.raises(Overloaded):
        pools.acquire()
    assert pools.load == 2
    # A retry moves a request that is already counted: never refused by the limit.
    leases[0].release()
    leases[0] = pools.acquire(frozenset({leases[0].server.url}), limit=False)
    for lease in leases:
        lease.release()
    assert pools.load == 0


def test_no_server_refuses_before_counting() -> None:
    pools = make()
    for s in pools.servers:
        pools.set_healthy(s.url, False)
    with pytest.raises(NoServer):
        pools.acquire()
    assert pools.load == 0 and all(s.in_flight == 0 for s in pools.servers)


def test_drain_and_resume() -> None:
    pools = make(threshold=5)
    pools.drain("eagle")
    lease = pools.acquire()
    assert lease.pool == "baseline" and pools.active_pool() == "baseline"
    assert not pools.draining("eagle")
    pools.resume("eagle")
    lease2 = pools.acquire()
    assert lease2.pool == "eagle"
    # The baseline request still runs while eagle is active again: baseline is draining.
    assert pools.draining("baseline")
    lease.release()
    lease2.release()
    assert not pools.draining("baseline")


@pytest.mark.parametrize(
    ("threshold", "hysteresis", "ok"),
    [(8, 2, True), (1, 0, True), (0, 0, False), (8, 8, False), (8, -1, False), (8, 7, True)],
)
def test_validate_settings(threshold: int, hysteresis: int, ok: bool) -> None:
    assert (validate_settings(threshold, hysteresis) is None) == ok


# (probes in order, verdicts in order): a few failures mark down, one success up, refused at once.
HEALTH_CASES = [
    ([Probe.OK], [True]),
    ([Probe.FAILED, Probe.FAILED, Probe.FAILED], [None, None, False]),
    ([Probe.FAILED, Probe.OK, Probe.FAILED, Probe.FAILED], [None, True, None, None]),
    ([Probe.REFUSED], [False]),
    ([Probe.REFUSED, Probe.OK], [False, True]),
    ([Probe.FAILED, Probe.FAILED, Probe.FAILED, Probe.FAILED], [None, None, False, False]),
]


@pytest.mark.parametrize(("probes", "verdicts"), HEALTH_CASES)
def test_health_tracker(probes: list[Probe], verdicts: list[bool | None]) -> None:
    tracker = HealthTracker(failures_to_down=3)
    record = Server("http://s", "eagle")
    assert [tracker.verdict(record, p) for p in probes] == verdicts


def test_mean_in_flight_over_a_lease() -> None:
    now = [0.0]
    pools = Pools(
        [("http://e1", "eagle")], BalancePolicy(), threshold=2, hysteresis=1, clock=lambda: now[0]
    )
    pools.set_healthy("http://e1", True)
    a = pools.acquire()  # t=0: 1 in flight
    now[0] = 1.0
    b = pools.acquire()  # t=1: 2
    now[0] = 3.0
    b.release()  # b saw 2 for 2 s
    now[0] = 4.0
    a.release()  # a saw 1 for 1 s, 2 for 2 s, 1 for 1 s
    assert b.mean_in_flight == pytest.approx(2.0)
    assert a.mean_in_flight == pytest.approx(6.0 / 4.0)
    c = pools.acquire()
    c.release()  # no time passed: the count it saw
    assert c.mean_in_flight == 1.0 and pools.load == 0


def test_balance_records_the_last_pool_without_switches() -> None:
    switched: list[str] = []
    routed: list[tuple[str, str]] = []
    pools = Pools(
        [("http://e1", "eagle"), ("http://b1", "baseline")],
        BalancePolicy(),
        threshold=2,
        hysteresis=1,
        on_switch=lambda to, pair: switched.append(to),
        on_route=lambda pool, reason: routed.append((pool, reason)),
    )
    for s in pools.servers:
        pools.set_healthy(s.url, True)
    leases = [pools.acquire() for _ in range(3)]
    # No curves yet: the neutral one for both. Idle, a tie to eagle; then the idle baseline is
    # faster than eagle with one; then a tie again.
    assert [lease.pool for lease in leases] == ["eagle", "baseline", "eagle"]
    assert routed == [("eagle", "tie"), ("baseline", "fastest"), ("eagle", "tie")]
    # No mode and no active pool under balance (each request picks its server): no switch.
    assert switched == [] and pools.mode is None and pools.active_pool() is None
    assert not pools.switches
    # /health_generate asks every server that can take a request, not the last one's pool.
    assert [s.url for s in pools.active_servers()] == ["http://e1", "http://b1"]
    assert not pools.draining("baseline")  # no pool is inactive under balance
    pools.drain("baseline")
    assert pools.draining("baseline")
    assert [s.url for s in pools.active_servers()] == ["http://e1"]
    for lease in leases:
        lease.release()


def _out_of_eagle_with_a_return_delay(now: list[float]) -> tuple[Pools, list[Lease]]:
    """Threshold 2, hysteresis 1, --return-delay 5 on clock ``now``: three requests in flight,
    the third (load 3 > 2) took the pools to baseline mode."""
    pools = Pools(
        [("http://e1", "eagle"), ("http://b1", "baseline")],
        ThresholdPolicy(),
        threshold=2,
        hysteresis=1,
        clock=lambda: now[0],
        return_delay=5.0,
    )
    for s in pools.servers:
        pools.set_healthy(s.url, True)
    return pools, [pools.acquire(), pools.acquire(), pools.acquire()]


def test_return_delay_holds_baseline_until_the_load_stayed_low_that_long() -> None:
    """--return-delay 5: leaving EAGLE at once, going back only once the load stayed at or below
    threshold - hysteresis for 5 s, as every request routed saw it; a request above it restarts
    the wait."""
    now = [0.0]
    pools, held = _out_of_eagle_with_a_return_delay(now)
    assert pools.mode == "baseline"
    now[0] = 1.0
    for lease in held:
        lease.release()  # load 0 from t=1: the wait starts then
    routed = []
    for t in (1.0, 3.0, 5.9):
        now[0] = t
        lease = pools.acquire()
        routed.append(lease.pool)
        lease.release()
    assert routed == ["baseline"] * 3 and pools.mode == "baseline"
    now[0] = 6.0
    lease = pools.acquire()
    assert lease.pool == "eagle" and pools.mode == "eagle"
    lease.release()
    # Out again at once; then a load above the bound at t=9 restarts the wait.
    held = [pools.acquire(), pools.acquire(), pools.acquire()]
    assert pools.mode == "baseline"
    for lease in held[1:]:
        lease.release()
    now[0] = 7.0
    first = pools.acquire()  # load 2: above the bound of 1
    first.release()
    now[0] = 8.0
    pools.acquire().release()  # load 2 with held[0]: still above
    held[0].release()  # load 0: the wait starts now
    now[0] = 9.0
    pools.acquire().release()  # load 1: low, the wait goes on
    for t, pool in ((12.9, "baseline"), (13.0, "eagle")):
        now[0] = t
        lease = pools.acquire()
        assert lease.pool == pool, t
        lease.release()


def test_return_delay_counts_from_when_the_load_fell_not_from_the_next_request() -> None:
    """A busy spell ends with no arrival after it: the load fell at its last release, so the
    first request of a quiet start after the delay goes to EAGLE (it went to the baseline for a
    whole delay: on an H100, half the night window of a routed run after a busy one)."""
    now = [0.0]
    pools, held = _out_of_eagle_with_a_return_delay(now)
    assert pools.mode == "baseline"
    now[0] = 2.0
    held[0].release()
    now[0] = 3.0
    held[1].release()  # a request now would see load 2: still above the bound
    now[0] = 4.0
    held[2].release()  # load 0: low from t=4
    now[0] = 8.9
    lease = pools.acquire()
    assert lease.pool == "baseline"
    lease.release()
    now[0] = 9.0
    lease = pools.acquire()
    assert lease.pool == "eagle" and pools.mode == "eagle"
    lease.release()
    assert pools.load == 0


def test_without_a_return_delay_the_mode_goes_back_at_once() -> None:
    pools = make()
    assert pools.return_delay == 0.0
    a, b, c = pools.acquire(), pools.acquire(), pools.acquire()
    assert pools.mode == "baseline"
    for lease in (a, b, c):
        lease.release()
    d = pools.acquire()
    assert d.pool == "eagle"
    d.release()


def _ramp_switch_load(lead: float) -> int:
    """One pair, threshold 40: an EAGLE stay of 1 s measured, then a load rising 10 a second
    (every request stays); the load at which the pair left EAGLE."""
    now = [0.0]
    pools = Pools(
        [("http://e1", "eagle"), ("http://b1", "baseline")],
        ThresholdPolicy(),
        threshold=40,
        hysteresis=10,
        pairs=[("http://e1", "http://b1")],
        clock=lambda: now[0],
        switch_lead=lead,
    )
    for s in pools.servers:
        pools.set_healthy(s.url, True)
    first = pools.acquire()
    now[0] = 1.0
    first.release()  # a stay of 1 s
    held = []
    while pools.mode == "eagle":
        now[0] += 0.1
        held.append(pools.acquire())
    load = pools.load
    for lease in held:
        lease.release()
    return load


def test_switch_lead_leaves_eagle_ahead_of_a_rising_load() -> None:
    """--switch-lead 1 with stays of 1 s and a load rising 10 a second: the pair leaves EAGLE
    near 40 - 10 (where the load a stay later passes 40), not at 41 as without it; half a stay
    ahead, near 40 - 5."""
    assert _ramp_switch_load(0.0) == 41
    assert 29 <= _ramp_switch_load(1.0) <= 33
    assert 34 <= _ramp_switch_load(0.5) <= 38
