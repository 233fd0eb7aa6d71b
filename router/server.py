"""The records the router keeps: one ``Server`` per upstream server, one ``Pair`` per ``--pair``.

A ``Server`` owns everything known of one server: its health (and the failed checks in a row that
lead to it), its in-flight count and the integral of that count over time, its speed (the
learner's ``ServerSpeed``, which holds the running limit and the curve) and what the metrics
poller has learned about what it exports. The health checker, the poller, the learner and the
proxy hold references to these records (the learner keeps a URL index of its ``ServerSpeed``s for
its URL-taking entry points; the upstream client its connection pools per origin).

A ``Pair`` is two servers that share GPUs (``--pair EAGLE_URL,BASELINE_URL``): its load is the
requests in flight on both, and it has its own mode and threshold, switched as the ``threshold``
policy switches the pools' mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynspec.router.policy import PoolName, other_pool
from dynspec.router.speed import SpeedCurve
from dynspec.router.thresholds import Thresholds

if TYPE_CHECKING:
    from dynspec.router.learning import ServerSpeed


class Server:
    __slots__ = (
        "area",
        "changed",
        "down_reason",
        "failures",
        "healthy",
        "in_flight",
        "limit_asked",
        "mate",
        "poll_warned",
        "pool",
        "routed",
        "routed_at",
        "speed",
        "url",
    )

    def __init__(self, url: str, pool: PoolName) -> None:
        self.url = url
        self.pool: PoolName = pool
        # Unknown until the first health check answers; the router starts with every server down.
        self.healthy = False
        # Failed health checks in a row, and why the last one failed (for the log line).
        self.failures = 0
        self.down_reason = ""
        self.in_flight = 0
        # The router's request count (``Pools.seq``) when it last got a request.
        self.routed = 0
        # The clock's time when it last got a request (what spaces probes out; see pool._stale).
        self.routed_at = 0.0
        # The integral of in_flight over time (request-seconds) up to ``changed`` (the clock's
        # time of the last count change).
        self.area = 0.0
        self.changed = 0.0
        # Set by the speed learner: the server's observations, running limit and curve.
        self.speed: ServerSpeed | None = None
        # The other server of its pair (None: split layout).
        self.mate: Server | None = None
        # The metrics poller's: whether /get_server_info was asked, whether a warning was logged.
        self.limit_asked = False
        self.poll_warned = False

    @property
    def curve(self) -> SpeedCurve | None:
        speed = self.speed
        return speed.curve if speed is not None else None

    def account(self, now: float, delta: int) -> None:
        """Add ``delta`` to the in-flight count at time ``now``, keeping the integral."""
        self.area += self.in_flight * (now - self.changed)
        self.changed = now
        self.in_flight += delta

    def area_at(self, now: float) -> float:
        return self.area + self.in_flight * (now - self.changed)


class Pair:
    __slots__ = (
        "baseline",
        "eagle",
        "held",
        "index",
        "mode",
        "probing",
        "settings",
        "switches",
    )

    def __init__(self, index: int, eagle: Server, baseline: Server, settings: Thresholds) -> None:
        self.index = index
        self.eagle = eagle
        self.baseline = baseline
        eagle.mate = baseline
        baseline.mate = eagle
        self.mode: PoolName = "eagle"
        self.settings = settings
        self.switches = 0
        # A probe request in flight (at most one per pair).
        self.probing = False
        # --threshold auto: the last derived threshold was held down by its bound (the curves
        # allowed more), so a load past it derives again at once (``Pools.acquire``).
        self.held = False

    @property
    def label(self) -> str:
        return str(self.index)

    @property
    def load(self) -> int:
        return self.eagle.in_flight + self.baseline.in_flight

    def server(self, pool: PoolName) -> Server:
        return self.eagle if pool == "eagle" else self.baseline

    def active_pool(self, drained: set[PoolName]) -> PoolName:
        """The pool whose server takes this pair's new requests: the mode's unless it cannot."""

        def can_take(pool: PoolName) -> bool:
            return pool not in drained and self.server(pool).healthy

        if not can_take(self.mode) and can_take(other_pool(self.mode)):
            return other_pool(self.mode)
        return self.mode


__all__ = ["Pair", "Server"]
