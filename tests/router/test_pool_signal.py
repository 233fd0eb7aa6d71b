"""--load-signal servers in the pool: leases feed the signal, and the mode follows its load."""

from __future__ import annotations

from dynspec.router.loadsignal import LoadSignal
from dynspec.router.policy import ThresholdPolicy
from dynspec.router.pool import Pools

URLS = ("http://e1", "http://b1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(signal: LoadSignal | None, pairs: bool = False) -> Pools:
    pools = Pools(
        [(URLS[0], "eagle"), (URLS[1], "baseline")],
        ThresholdPolicy(),
        threshold=4,
        hysteresis=1,
        pairs=[URLS] if pairs else (),
        signal=signal,
    )
    for s in pools.servers:
        pools.set_healthy(s.url, True)
    return pools


def test_leases_are_told_to_the_signal() -> None:
    clock = Clock()
    signal = LoadSignal(URLS, max_age=2.0, clock=clock)
    pools = make(signal)
    lease = pools.acquire()
    assert lease.server.url == URLS[0] and signal.load(URLS[0]) == 1  # no reading: local count
    signal.reading(URLS[0], 1, 0, clock.now)  # the server shows it
    clock.now += 0.1
    lease.release()
    assert signal.load(URLS[0]) == 0  # read 1, finished 1 since
    lease.release()  # twice: counted once
    assert signal.load(URLS[0]) == 0 and pools.load == 0


def test_other_routers_load_switches_the_pools_mode() -> None:
    clock = Clock()
    signal = LoadSignal(URLS, max_age=2.0, clock=clock)
    pools = make(signal)
    # Another router has 5 requests on the EAGLE server: this router's first request is load 6.
    signal.reading(URLS[0], 3, 2, clock.now)
    lease = pools.acquire()
    assert lease.pool == "baseline" and pools.mode == "baseline"
    assert pools.policy_load() == 6 and pools.load == 1
    # They finish: the next reading takes the mode back (load 1 + this one <= 4 - 1).
    clock.now += 0.25
    signal.reading(URLS[0], 0, 0, clock.now)
    signal.reading(URLS[1], 1, 0, clock.now)
    assert pools.acquire().pool == "eagle"
    # The reading goes stale: the load is this router's own again.
    clock.now += 3.0
    assert not signal.from_server(URLS[0]) and pools.policy_load() == pools.load == 2
    lease.release()


def test_local_signal_is_the_own_count() -> None:
    pools = make(None)
    leases = [pools.acquire() for _ in range(4)]
    assert pools.mode == "eagle" and pools.policy_load() == 4
    assert pools.acquire().pool == "baseline"  # 5 > 4 counts only this router's
    for lease in leases:
        lease.release()


def test_pair_mode_follows_the_signal() -> None:
    clock = Clock()
    signal = LoadSignal(URLS, max_age=2.0, clock=clock)
    pools = make(signal, pairs=True)
    signal.reading(URLS[0], 4, 0, clock.now)
    signal.reading(URLS[1], 0, 0, clock.now)
    pair = pools.groups[0]
    assert pools.group_load(pair) == 4 and pair.load == 0
    lease = pools.acquire()
    assert lease.pool == "baseline" and pair.mode == "baseline" and pair.switches == 1
    assert pools.server_load(pools.server(URLS[1])) == 1
    lease.release()
