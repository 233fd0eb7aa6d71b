"""The balance policy as plain tables: servers with speed curves in, choice and reason out."""

from __future__ import annotations

from typing import Any

import pytest

from dynspec.router.policy import (
    EXPLORE_EVERY,
    BalancePolicy,
    ServerView,
    Snapshot,
)
from dynspec.router.speed import BUCKETS, NEUTRAL_CURVE, SpeedCurve

E1, E2 = "http://e1", "http://e2"
B1, B2 = "http://b1", "http://b2"


def linear(first: float, per_request: float, limit: int | None = None) -> SpeedCurve:
    """TPOT = first + per_request * (load - 1), in milliseconds, at every bucket."""
    return SpeedCurve(tuple((first + per_request * (b - 1)) / 1000 for b in BUCKETS), limit)


# EAGLE: fast alone, slow under load; baseline: slower alone, flatter. Equal at load 9.
EAGLE = linear(10, 4)
BASE = linear(22, 2.5)
EAGLE_CAPPED = linear(10, 4, limit=4)
BASE_CAPPED = linear(22, 2.5, limit=2)


def view(
    url: str,
    pool: str,
    in_flight: int,
    curve: SpeedCurve | None,
    *,
    healthy: bool = True,
    accepting: bool = True,
) -> ServerView:
    return ServerView(url, pool, healthy, in_flight, accepting, curve)  # type: ignore[arg-type]


def snap(*servers: ServerView, seq: int = 1) -> Snapshot:
    load = sum(s.in_flight for s in servers) + 1
    return Snapshot(servers, load, "eagle", 8, 2, seq=seq)


# (case, servers, seq, exclude, chosen server, reason)
CASES: list[tuple[Any, ...]] = [
    ("idle: eagle is faster", (view(E1, "eagle", 0, EAGLE), view(B1, "baseline", 0, BASE)),
     1, (), E1, "fastest"),
    ("eagle with 4 in flight predicts 26 ms, the idle baseline 22 ms",
     (view(E1, "eagle", 4, EAGLE), view(B1, "baseline", 0, BASE)), 1, (), B1, "fastest"),
    ("eagle with 3 in flight predicts 22 ms, as the idle baseline: a tie, to eagle",
     (view(E1, "eagle", 3, EAGLE), view(B1, "baseline", 0, BASE)), 1, (), E1, "tie"),
    ("both loaded: lower prediction wins",
     (view(E1, "eagle", 10, EAGLE), view(B1, "baseline", 10, BASE)), 1, (), B1, "fastest"),
    ("same curves, equal load: eagle pool",
     (view(B1, "baseline", 2, EAGLE), view(E1, "eagle", 2, EAGLE)), 1, (), E1, "tie"),
    ("same pool, same curve: least in flight",
     (view(E1, "eagle", 2, NEUTRAL_CURVE), view(E2, "eagle", 1, NEUTRAL_CURVE)), 1, (), E2,
     "fastest"),
    ("same pool, tie: listing order",
     (view(E1, "eagle", 1, EAGLE), view(E2, "eagle", 1, EAGLE)), 1, (), E1, "tie"),
    ("no curve: neutral for both, eagle wins the tie",
     (view(B1, "baseline", 0, None), view(E1, "eagle", 0, None)), 1, (), E1, "tie"),
    ("only one healthy", (view(E1, "eagle", 0, EAGLE, healthy=False),
                          view(B1, "baseline", 30, BASE)), 1, (), B1, "only"),
    ("drained pool skipped", (view(E1, "eagle", 0, EAGLE, accepting=False),
                              view(B1, "baseline", 30, BASE)), 1, (), B1, "only"),
    ("excluded after a failed connect",
     (view(E1, "eagle", 0, EAGLE), view(B1, "baseline", 0, BASE)), 1, (E1,), B1, "only"),
    ("eagle at its running limit: not a candidate",
     (view(E1, "eagle", 4, EAGLE_CAPPED), view(B1, "baseline", 40, BASE)), 1, (), B1, "only"),
    ("eagle below its limit competes",
     (view(E1, "eagle", 3, EAGLE_CAPPED), view(B1, "baseline", 40, BASE)), 1, (), E1, "fastest"),
    ("all at their limit: the cheapest queue (27.5 ms vs 36.75 ms)",
     (view(E1, "eagle", 4, EAGLE_CAPPED), view(B1, "baseline", 2, BASE_CAPPED)), 1, (), E1,
     "full"),
    ("one server at its limit alone", (view(E1, "eagle", 4, EAGLE_CAPPED),), 1, (), E1, "full"),
    ("exploration: runner-up within 20%",
     (view(E1, "eagle", 0, linear(10, 4)), view(B1, "baseline", 0, linear(11, 4))),
     EXPLORE_EVERY, (), B1, "explore"),
    ("exploration only every so often",
     (view(E1, "eagle", 0, linear(10, 4)), view(B1, "baseline", 0, linear(11, 4))),
     EXPLORE_EVERY + 1, (), E1, "fastest"),
    ("no exploration when the runner-up is far slower",
     (view(E1, "eagle", 0, linear(10, 4)), view(B1, "baseline", 0, linear(13, 4))),
     2 * EXPLORE_EVERY, (), E1, "fastest"),
    ("exploration of a tie goes to the other server",
     (view(E1, "eagle", 0, EAGLE), view(B1, "baseline", 0, EAGLE)), EXPLORE_EVERY, (), B1,
     "explore"),
]  # fmt: skip


@pytest.mark.parametrize("case", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_balance_policy(case: tuple[Any, ...]) -> None:
    servers, seq, exclude, want_url, want_reason = case
    choice = BalancePolicy().choose(snap(*servers, seq=seq), frozenset(exclude))
    assert choice.server is not None
    assert (choice.server.url, choice.reason) == (want_url, want_reason)
    # The mode records the pool the request went to; the policy has no modes of its own.
    assert choice.mode == choice.server.pool


def test_no_server_leaves_mode() -> None:
    servers = (view(E1, "eagle", 0, EAGLE, healthy=False), view(B1, "baseline", 0, BASE))
    choice = BalancePolicy().choose(snap(*servers), frozenset({B1}))
    assert choice.server is None and choice.mode == "eagle"


def test_closed_loop_fills_both_pools_by_speed() -> None:
    """Requests arriving one by one: eagle alone first, then both, as their curves cross."""
    policy = BalancePolicy()
    n = {"eagle": 0, "baseline": 0}
    order = []
    for seq in range(1, 41):
        servers = (view(E1, "eagle", n["eagle"], EAGLE), view(B1, "baseline", n["baseline"], BASE))
        choice = policy.choose(snap(*servers, seq=seq))
        assert choice.server is not None
        n[choice.server.pool] += 1
        order.append(choice.server.pool)
    # Up to the crossing (eagle at 4 in flight predicts 22 ms, the baseline alone 22 ms: a tie)
    # all goes to eagle; then both take requests, each roughly where the other's prediction is.
    assert order[:5] == ["eagle"] * 4 + ["baseline"]
    assert n["eagle"] > 0 and n["baseline"] > 0
    e, b = EAGLE.at(n["eagle"]), BASE.at(n["baseline"])
    assert abs(e - b) <= max(EAGLE.at(n["eagle"] + 1) - e, BASE.at(n["baseline"] + 1) - b)
