"""Routing policies: pure functions of a frozen snapshot, so they are tested with plain tables.

A policy sees the servers as immutable views plus the router's load and current mode, and returns
which server takes the request, what the mode is afterwards and why (the ``reason`` label of
``dynspec_route_decisions_total``). It holds no state, no clock and no I/O; ``pool.Pools`` owns the
state and applies the choice. A policy is a subclass of ``Policy`` registered in ``POLICIES``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from dynspec.router.speed import NEUTRAL_CURVE, SpeedCurve

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
    # The server's predicted speed by load (``balance``); None: no estimate (the neutral curve).
    curve: SpeedCurve | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    servers: tuple[ServerView, ...]
    # Requests in flight over all servers, counting the one being routed.
    load: int
    mode: PoolName
    threshold: int
    hysteresis: int
    # Requests routed so far, this one included: what deterministic exploration counts.
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Choice:
    # None when no server can take the request (every candidate unhealthy, drained or excluded).
    server: ServerView | None
    mode: PoolName
    reason: str = ""


class Policy(abc.ABC):
    name: ClassVar[str]
    # Every reason ``choose`` may give (the route-decision counter starts each at 0).
    reasons: ClassVar[tuple[str, ...]]
    # True: the mode is a routing state whose changes are logged and counted as switches.
    # False: the mode only records the pool the last request went to.
    switches_modes: ClassVar[bool] = True

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
    reasons = ("mode", "fallback")

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        mode = snapshot.mode
        if mode == "eagle" and snapshot.load > snapshot.threshold:
            mode = "baseline"
        elif mode == "baseline" and snapshot.load <= snapshot.threshold - snapshot.hysteresis:
            mode = "eagle"
        server = least_in_flight(snapshot.servers, mode, exclude)
        if server is not None:
            return Choice(server=server, mode=mode, reason="mode")
        server = least_in_flight(snapshot.servers, other_pool(mode), exclude)
        return Choice(server=server, mode=mode, reason="fallback" if server else "")


# Two predictions closer than this (relative) are equal: the tie-break decides.
TIE_EPSILON = 1e-9
# Every EXPLORE_EVERY-th request goes to the runner-up when its prediction is within
# EXPLORE_WITHIN of the best, so the curve of a server that is rarely chosen keeps being measured.
EXPLORE_EVERY = 50
EXPLORE_WITHIN = 1.2


_Entry = tuple[float, int, ServerView]


def _preference(entry: _Entry) -> tuple[int, int, int]:
    # Ties go to the EAGLE pool (lower latency at equal speed), then least in flight, then the
    # order the servers were listed in.
    s = entry[2]
    return (0 if s.pool == "eagle" else 1, s.in_flight, entry[1])


def _best(entries: list[_Entry]) -> tuple[_Entry, bool]:
    """The lowest prediction, ties broken by preference; and whether there was a tie."""
    best = entries[0]
    for e in entries:
        if e[0] < best[0]:
            best = e
    bound = best[0] * (1 + TIE_EPSILON)
    tied = [e for e in entries if e[0] <= bound]
    if len(tied) == 1:
        return best, False
    return min(tied, key=_preference), True


class BalancePolicy(Policy):
    """Each request to the server with the lowest predicted time per output token if admitted.

    A server that can take the request (healthy, not drained, not excluded, below its running
    limit when the limit is known) is predicted at its speed curve's value for its in-flight
    count plus one. Ties (within ``TIE_EPSILON``) go to EAGLE, then least in flight, then listing
    order. When every such server is at its running limit, all of them compete on the same terms
    (their curves grow with the queue), with the reason ``full``. Both pools serve at every load;
    only operator drains stop a pool.

    Reasons: ``only`` (one candidate), ``fastest``, ``tie``, ``explore``, ``full``.
    """

    name = "balance"
    reasons = ("only", "fastest", "tie", "explore", "full")
    switches_modes = False

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        open_: list[_Entry] = []
        full: list[_Entry] = []
        for i, s in enumerate(snapshot.servers):
            if not s.healthy or not s.accepting or s.url in exclude:
                continue
            curve = s.curve or NEUTRAL_CURVE
            limit = curve.limit
            entry = (curve.at(s.in_flight + 1), i, s)
            if limit is not None and s.in_flight >= limit:
                full.append(entry)
            else:
                open_.append(entry)
        candidates = open_ or full
        if not candidates:
            return Choice(server=None, mode=snapshot.mode)
        if len(candidates) == 1:
            server = candidates[0][2]
            return Choice(server, server.pool, "only" if open_ else "full")
        winner, tie = _best(candidates)
        if snapshot.seq % EXPLORE_EVERY == 0:
            second, _ = _best([e for e in candidates if e is not winner])
            if second[0] <= winner[0] * EXPLORE_WITHIN:
                return Choice(second[2], second[2].pool, "explore")
        server = winner[2]
        reason = "full" if not open_ else ("tie" if tie else "fastest")
        return Choice(server, server.pool, reason)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (ThresholdPolicy, BalancePolicy)}
