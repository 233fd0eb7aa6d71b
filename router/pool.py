"""The servers, their in-flight counts and the routing mode: the only code that changes them.

Every request that reaches a server holds a ``Lease``; releasing it is the one way a count goes
down, and releasing twice is harmless, so the proxy releases in ``finally`` whatever happened
(success, upstream error, timeout, client gone, server dead mid-stream, cancellation).
Everything here is synchronous and runs on the one event loop, so no lock is needed.

Each server also keeps the running integral of its in-flight count over time, updated on every
acquire and release (O(1)): a lease reads it at both ends, which gives the server's mean in-flight
count over that request's life, the load a finished request's speed is learned against.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dynspec.router.errors import NoServer, Overloaded
from dynspec.router.policy import POOLS, Policy, PoolName, ServerView, Snapshot, other_pool
from dynspec.router.speed import SpeedCurve

logger = logging.getLogger(__name__)


class Server:
    __slots__ = ("area", "changed", "curve", "healthy", "in_flight", "pool", "url")

    def __init__(self, url: str, pool: PoolName) -> None:
        self.url = url
        self.pool: PoolName = pool
        # Unknown until the first health check answers; the router starts with every server down.
        self.healthy = False
        self.in_flight = 0
        # The integral of in_flight over time (request-seconds) up to ``changed`` (the clock's
        # time of the last count change).
        self.area = 0.0
        self.changed = 0.0
        # Set by the speed learner whenever it rebuilds the server's curve.
        self.curve: SpeedCurve | None = None


class Lease:
    __slots__ = ("_area", "_pools", "_released", "_since", "mean_in_flight", "server")

    def __init__(self, pools: Pools, server: Server, now: float) -> None:
        self._pools = pools
        self.server = server
        self._released = False
        self._area = server.area
        self._since = now
        # The server's mean in-flight count over the lease's life (this request included),
        # known once the lease is released.
        self.mean_in_flight = 0.0

    @property
    def pool(self) -> PoolName:
        return self.server.pool

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        server = self.server
        now = self._pools._release(server)
        elapsed = now - self._since
        self.mean_in_flight = (
            (server.area - self._area) / elapsed if elapsed > 0 else float(server.in_flight + 1)
        )


@dataclass(frozen=True, slots=True)
class Thresholds:
    threshold: int
    hysteresis: int


def validate_settings(threshold: int, hysteresis: int) -> str | None:
    """Why a threshold/hysteresis pair is unusable, or None."""
    if threshold < 1:
        return "threshold must be at least 1"
    if hysteresis < 0:
        return "hysteresis must not be negative"
    if hysteresis >= threshold:
        # Switching back needs load <= threshold - hysteresis, and load counts the new request.
        return "hysteresis must be smaller than threshold"
    return None


class Pools:
    def __init__(
        self,
        servers: Sequence[tuple[str, PoolName]],
        policy: Policy,
        *,
        threshold: int,
        hysteresis: int,
        max_concurrency: int = 0,
        on_switch: Callable[[PoolName], None] | None = None,
        on_route: Callable[[PoolName, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servers: tuple[Server, ...] = tuple(Server(url, pool) for url, pool in servers)
        self._by_url = {s.url: s for s in self.servers}
        self.policy = policy
        self.settings = Thresholds(threshold, hysteresis)
        self.max_concurrency = max_concurrency
        self.mode: PoolName = "eagle"
        self.load = 0
        self.drained: set[PoolName] = set()
        self.on_switch = on_switch
        self.on_route = on_route
        self.clock = clock
        # Requests routed so far (each acquire, retries included): the policy's exploration count.
        self.seq = 0
        now = clock()
        for s in self.servers:
            s.changed = now

    # -- requests ---------------------------------------------------------------------------------

    def acquire(self, exclude: frozenset[str] = frozenset(), *, limit: bool = True) -> Lease:
        """Route one request: raises ``Overloaded`` or ``NoServer`` before any count changes."""
        if limit and self.max_concurrency and self.load >= self.max_concurrency:
            raise Overloaded(f"the router already has {self.load} requests in flight")
        self.seq += 1
        snapshot = Snapshot(
            servers=self.views(),
            load=self.load + 1,
            mode=self.mode,
            threshold=self.settings.threshold,
            hysteresis=self.settings.hysteresis,
            seq=self.seq,
        )
        choice = self.policy.choose(snapshot, exclude)
        if choice.mode != self.mode:
            if self.policy.switches_modes:
                logger.info(
                    "mode %s -> %s at load %d (threshold %d, hysteresis %d)",
                    self.mode,
                    choice.mode,
                    snapshot.load,
                    snapshot.threshold,
                    snapshot.hysteresis,
                )
                if self.on_switch is not None:
                    self.on_switch(choice.mode)
            self.mode = choice.mode
        if choice.server is None:
            raise NoServer("no healthy server can take the request")
        server = self._by_url[choice.server.url]
        if self.on_route is not None:
            self.on_route(server.pool, choice.reason)
        now = self.clock()
        server.area += server.in_flight * (now - server.changed)
        server.changed = now
        server.in_flight += 1
        self.load += 1
        return Lease(self, server, now)

    def _release(self, server: Server) -> float:
        now = self.clock()
        server.area += server.in_flight * (now - server.changed)
        server.changed = now
        server.in_flight -= 1
        self.load -= 1
        return now

    # -- views ------------------------------------------------------------------------------------

    def views(self) -> tuple[ServerView, ...]:
        drained = self.drained
        return tuple(
            ServerView(s.url, s.pool, s.healthy, s.in_flight, s.pool not in drained, s.curve)
            for s in self.servers
        )

    def in_flight(self, pool: PoolName) -> int:
        return sum(s.in_flight for s in self.servers if s.pool == pool)

    def can_take(self, pool: PoolName) -> bool:
        return pool not in self.drained and any(s.healthy for s in self.servers if s.pool == pool)

    def active_pool(self) -> PoolName:
        """The pool new requests go to now: the mode's, unless it cannot take any.

        Under a policy without modes (``balance``) the mode is the pool the last request went to.
        """
        if not self.can_take(self.mode) and self.can_take(other_pool(self.mode)):
            return other_pool(self.mode)
        return self.mode

    def draining(self, pool: PoolName) -> bool:
        """Inactive (or drained by an operator) with requests still in flight.

        Under a policy without modes no pool is inactive: only an operator's drain counts.
        """
        inactive = pool in self.drained or (
            self.policy.switches_modes and pool != self.active_pool()
        )
        return inactive and self.in_flight(pool) > 0

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self.servers)

    def server(self, url: str) -> Server:
        return self._by_url[url]

    # -- operator and health controls --------------------------------------------------------------

    def set_healthy(self, url: str, healthy: bool) -> bool:
        """Mark a server up or down; True when that changed its state."""
        server = self._by_url[url]
        if server.healthy == healthy:
            return False
        server.healthy = healthy
        return True

    def set_settings(self, threshold: int, hysteresis: int) -> None:
        reason = validate_settings(threshold, hysteresis)
        if reason is not None:
            raise ValueError(reason)
        self.settings = Thresholds(threshold, hysteresis)
        logger.info("threshold %d, hysteresis %d", threshold, hysteresis)

    def drain(self, pool: PoolName) -> None:
        self.drained.add(pool)
        logger.info("pool %s drained: no new requests until resumed", pool)

    def resume(self, pool: PoolName) -> None:
        self.drained.discard(pool)
        logger.info("pool %s resumed", pool)


__all__ = ["POOLS", "Lease", "Pools", "Server", "Thresholds", "validate_settings"]
