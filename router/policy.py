"""Routing policies: pure functions of a frozen snapshot, so they are tested with plain tables.

A policy sees the servers as immutable views plus the router's load and current mode, and returns
which server takes the request and what the mode is afterwards. It holds no state, no clock and no
I/O; ``pool.Pools`` owns the state and applies the choice. A second policy is a new subclass of
``Policy`` registered in ``POLICIES``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

PoolName = Literal["eagle", "baseline"]
POOLS: tuple[PoolName, PoolName] = ("eagle", "baseline")


def other_pool(pool: PoolName) -> PoolName:
    return "baseline" if pool == "eagle" else "eagle"


@dataclass(frozen=True, slots=True)
class ServerView:
    url: str
    pool: PoolName
    healthy: bool
    in_flight: int
    # False while an operator has drained the server's pool (POST /admin/drain/{pool}).
    accepting: bool = True


@dataclass(frozen=True, slots=True)
class Snapshot:
    servers: tuple[ServerView, ...]
    # Requests in flight over all servers, counting the one being routed.
    load: int
    mode: PoolName
    threshold: int
    hysteresis: int


@dataclass(frozen=True, slots=True)
class Choice:
    # None when no server can take the request (every candidate unhealthy, drained or excluded).
    server: ServerView | None
    mode: PoolName


class Policy(abc.ABC):
    name: ClassVar[str]

    @abc.abstractmethod
    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        """Pick a server for one request; ``exclude`` holds URLs that just failed to connect."""


def least_in_flight(
    servers: Sequence[ServerView], pool: PoolName, exclude: frozenset[str]
) -> ServerView | None:
    best: ServerView | None = None
    for s in servers:
        if s.pool != pool or not s.healthy or not s.accepting or s.url in exclude:
            continue
        # Ties go to the first server listed, so the order of --eagle-url is the preference.
        if best is None or s.in_flight < best.in_flight:
            best = s
    return best


class ThresholdPolicy(Policy):
    """Two modes with hysteresis: EAGLE while the load is light, baseline while it is heavy.

    In ``eagle`` mode a request whose load exceeds ``threshold`` switches to ``baseline``; in
    ``baseline`` mode a request whose load is at or below ``threshold - hysteresis`` switches back.
    The request goes to the least in-flight server of the mode's pool; a pool with no server that
    can take it is skipped, whatever the load.
    """

    name = "threshold"

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        mode = snapshot.mode
        if mode == "eagle" and snapshot.load > snapshot.threshold:
            mode = "baseline"
        elif mode == "baseline" and snapshot.load <= snapshot.threshold - snapshot.hysteresis:
            mode = "eagle"
        server = least_in_flight(snapshot.servers, mode, exclude)
        if server is None:
            server = least_in_flight(snapshot.servers, other_pool(mode), exclude)
        return Choice(server=server, mode=mode)


POLICIES: dict[str, type[Policy]] = {ThresholdPolicy.name: ThresholdPolicy}
