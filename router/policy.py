"""Routing policies: pure functions of a frozen snapshot, so they are tested with plain tables.

A policy sees one routing group (``server.Group``: every server in the split layout, a pair's two
with ``--pair``) as immutable server views plus the group's load and current mode, and returns
which server takes the request, what the group's mode is afterwards and why (the ``reason`` label
of ``dynspec_route_decisions_total``). Which group it sees is ``least_loaded``'s choice. It holds
no state, no clock and no I/O; ``pool.Pools`` owns the state and applies the choice. A policy is a
subclass of ``Policy`` registered in ``POLICIES``.
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
    # True when a probe may go to it: due one (``autothreshold.stale``) and no other probe in
    # flight in its group (``pool.Pools`` decides; False: never probe).
    stale: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One routing group as the policy sees it."""

    servers: tuple[ServerView, ...]
    # Requests in flight on the group's servers, counting the one being routed.
    load: int
    mode: PoolName
    threshold: int
    hysteresis: int
    # Requests routed so far, this one included: what deterministic exploration counts.
    seq: int = 0
    # Whether a group in baseline mode may go back to EAGLE now: its load has stayed low for the
    # router's --return-delay (``pool.Pools`` keeps the clock; always True without a delay).
    may_return: bool = True
    # What the load is predicted to gain before a request admitted now ends (``trend``,
    # --switch-lead; 0 without it): a rising load switches away from EAGLE before it arrives.
    ahead: float = 0.0


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


def can_take(s: ServerView, exclude: frozenset[str] = frozenset()) -> bool:
    """Whether the server may get the request: healthy, its pool not drained, not excluded."""
    return s.healthy and s.accepting and s.url not in exclude


def least_in_flight(
    servers: Sequence[ServerView], pool: PoolName, exclude: frozenset[str]
) -> ServerView | None:
    best: ServerView | None = None
    for s in servers:
        if s.pool != pool or not can_take(s, exclude):
            continue
        # Ties go to the first server listed, so the order of --eagle-url is the preference.
        if best is None or s.in_flight < best.in_flight:
            best = s
    return best


def probe_load(threshold: int) -> int:
    """The largest load (counting the new request) at which a probe may go out: light load."""
    return max(1, threshold // 4)


def _probe(servers: Sequence[ServerView], exclude: frozenset[str]) -> ServerView | None:
    for s in servers:
        if s.stale and can_take(s, exclude):
            return s
    return None


class ThresholdPolicy(Policy):
    """Two modes with hysteresis: EAGLE while the load is light, baseline while it is heavy.

    In ``eagle`` mode a request whose load exceeds ``threshold`` switches to ``baseline``; in
    ``baseline`` mode a request whose load is at or below ``threshold - hysteresis`` switches back,
    once the snapshot says it may (``may_return``: the load has stayed that low for the router's
    ``--return-delay``). Leaving EAGLE is never delayed: a rising load is what overloads it.
    Both compare the load plus ``ahead``, the gain predicted under a rising load (0 unless the
    router has ``--switch-lead``), so such a load leaves EAGLE early and does not come back yet.
    The request goes to the least in-flight server of the mode's pool; a pool with no server that
    can take it is skipped, whatever the load. At light load (``probe_load``) a stale server of
    the other pool (``ServerView.stale``) gets the request instead, reason ``probe``.
    """

    name = "threshold"
    reasons = ("mode", "fallback", "probe")

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        mode = snapshot.mode
        heading = snapshot.load + snapshot.ahead
        if mode == "eagle" and heading > snapshot.threshold:
            mode = "baseline"
        elif (
            mode == "baseline"
            and heading <= snapshot.threshold - snapshot.hysteresis
            and snapshot.may_return
        ):
            mode = "eagle"
        if snapshot.load <= probe_load(snapshot.threshold):
            other = other_pool(mode)
            probe = _probe([s for s in snapshot.servers if s.pool == other], exclude)
            if probe is not None:
                return Choice(server=probe, mode=mode, reason="probe")
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

    At light load (``probe_load`` of the threshold) a stale server (``ServerView.stale``: nothing
    learned of it for a while) gets the request whatever its prediction, reason ``probe``, so an
    estimate that may be out of date is measured again.

    Reasons: ``only`` (one candidate), ``fastest``, ``tie``, ``explore``, ``full``, ``probe``.
    """

    name = "balance"
    reasons = ("only", "fastest", "tie", "explore", "full", "probe")
    switches_modes = False

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        open_: list[_Entry] = []
        full: list[_Entry] = []
        for i, s in enumerate(snapshot.servers):
            if not can_take(s, exclude):
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
        if len(candidates) > 1 and snapshot.load <= probe_load(snapshot.threshold):
            probe = _probe([e[2] for e in candidates], exclude)
            if probe is not None:
                return Choice(probe, probe.pool, "probe")
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


# -- groups ----------------------------------------------------------------------------------------


def least_loaded(
    groups: Sequence[Snapshot], exclude: frozenset[str] = frozenset(), turn: int = 0
) -> int | None:
    """The routing group (its snapshot's index) that takes the next request: the least load among
    those with a server that can take it; None when none has. The pool then runs its policy on
    that group's snapshot.

    Ties are taken in turn: ``turn`` (the requests routed before this one) picks among the tied
    groups in the order given. Ties to the first group sent every request of a light load to
    pair 0, so the other pairs were never seen at it and learned nothing there (simulated
    ``h200-8b-accept2``: pair 1 kept the start threshold 8 where the crossover is 2, 0.875x the
    best pair at C=16)."""
    least: list[int] = []
    for i, g in enumerate(groups):
        if not any(can_take(s, exclude) for s in g.servers):
            continue
        if not least or g.load < groups[least[0]].load:
            least = [i]
        elif g.load == groups[least[0]].load:
            least.append(i)
    return least[turn % len(least)] if least else None


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (ThresholdPolicy, BalancePolicy)}
