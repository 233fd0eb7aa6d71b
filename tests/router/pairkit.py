"""In-process pair helpers for the learned-threshold tests (no processes): one pair's ``Pools``
under ``--threshold auto`` on a test's clock. One home, imported by each test module that needs
it."""

from __future__ import annotations

from dynspec.router.policy import ThresholdPolicy
from dynspec.router.pool import Pools

E0, B0 = "http://e0:1", "http://b0:1"
E1, B1 = "http://e1:1", "http://b1:1"


def one_pair_pools(
    now: list[float],
    *,
    threshold: int = 8,
    hysteresis: int,
    auto: bool = True,
    return_delay: float = 0.0,
) -> Pools:
    """One pair (E0, B0) under ``--threshold auto`` from ``threshold`` (a set threshold with
    ``auto`` False), both healthy, on the clock ``now``."""
    pools = Pools(
        [(E0, "eagle"), (B0, "baseline")],
        ThresholdPolicy(),
        threshold=threshold,
        hysteresis=hysteresis,
        pairs=[(E0, B0)],
        auto=auto,
        clock=lambda: now[0],
        return_delay=return_delay,
    )
    for s in pools.servers:
        s.healthy = True
    return pools
