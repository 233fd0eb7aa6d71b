"""Routing groups: the layouts as groups, a group's active pool, which group takes a request,
a server's counts and whether it ran alone; and the two rules by which the split layout's one
group still differs from a pair (kept as they were before there were groups)."""

from __future__ import annotations

from typing import Any

import pytest

from dynspec.router.errors import NoServer
from dynspec.router.learning import SpeedLearner
from dynspec.router.policy import ServerView, Snapshot, ThresholdPolicy, least_loaded
from dynspec.router.pool import Pools
from dynspec.router.server import Group, Server, layout
from dynspec.router.thresholds import Thresholds

E0, B0, E1, B1 = "http://e0:1", "http://b0:1", "http://e1:1", "http://b1:1"
SETTINGS = Thresholds(8, 2)


def records() -> list[Server]:
    return [
        Server(E0, "eagle"),
        Server(B0, "baseline"),
        Server(E1, "eagle"),
        Server(B1, "baseline"),
    ]


def test_the_split_layout_is_one_group_of_every_server() -> None:
    servers = records()
    (g,) = layout(servers, (), SETTINGS)
    assert g.servers == tuple(servers) and g.label is None and g.labels == {}
    assert [s.url for s in g.of("eagle")] == [E0, E1] and g.eagle is servers[0]
    assert g.baseline is servers[1] and all(s.mate is None for s in servers)
    assert (g.mode, g.settings, g.switches, g.probing, g.held) == (
        "eagle",
        SETTINGS,
        0,
        False,
        False,
    )


def test_pairs_are_one_group_each_and_mates() -> None:
    servers = records()
    groups = layout(servers, [(E1, B1), (E0, B0)], SETTINGS)
    assert [(g.index, g.label, g.labels) for g in groups] == [
        (0, "0", {"pair": "0"}),
        (1, "1", {"pair": "1"}),
    ]
    assert [[s.url for s in g.servers] for g in groups] == [[E1, B1], [E0, B0]]
    e0, b0 = servers[0], servers[1]
    assert e0.mate is b0 and b0.mate is e0 and groups[1].eagle is e0
    e0.admit(0.0, 1)
    servers[3].admit(0.0, 2)
    assert [g.load for g in groups] == [1, 1]


# (mode, eagle healthy, baseline healthy, drained, active pool)
ACTIVE = [
    ("eagle", True, True, set(), "eagle"),
    ("baseline", True, True, set(), "baseline"),
    ("eagle", False, True, set(), "baseline"),
    ("eagle", True, True, {"eagle"}, "baseline"),
    ("eagle", False, False, set(), "eagle"),  # neither can: the mode's
    ("baseline", True, False, {"eagle"}, "baseline"),
]


@pytest.mark.parametrize("row", ACTIVE)
def test_a_group_s_active_pool(row: tuple[Any, ...]) -> None:
    mode, eagle_up, baseline_up, drained, expected = row
    e, b = Server(E0, "eagle"), Server(B0, "baseline")
    e.healthy, b.healthy = eagle_up, baseline_up
    g = Group(0, (e, b), SETTINGS)
    g.mode = mode
    assert g.active_pool(drained) == expected


def snapshot(load: int, *servers: tuple[str, bool]) -> Snapshot:
    views = tuple(ServerView(url, "eagle", up, 0) for url, up in servers)
    return Snapshot(views, load, "eagle", 8, 2)


# (case, group snapshots, excluded, the group that takes the request)
LEAST = [
    ("the least load", [snapshot(3, (E0, True)), snapshot(2, (E1, True))], set(), 1),
    ("ties: the first, turn 0", [snapshot(2, (E0, True)), snapshot(2, (E1, True))], set(), 0),
    ("ties: the second, turn 1", [snapshot(2, (E0, True)), snapshot(2, (E1, True))], set(), 1, 1),
    ("ties: in turn, turn 2", [snapshot(2, (E0, True)), snapshot(2, (E1, True))], set(), 0, 2),
    ("ties: among the least only",
     [snapshot(2, (E0, True)), snapshot(3, (E1, True)), snapshot(2, (E0, True))], set(), 2, 1),
    ("ties: among those that can take it",
     [snapshot(2, (E0, False)), snapshot(2, (E1, True)), snapshot(2, (E0, True))], set(), 2, 1),
    ("one that cannot take it is skipped", [snapshot(1, (E0, False)), snapshot(5, (E1, True))],
     set(), 1),
    ("excluded servers cannot", [snapshot(1, (E0, True)), snapshot(5, (E1, True))], {E0}, 1),
    ("one server that can is enough", [snapshot(1, (E0, False), (B0, True))], set(), 0),
    ("none can", [snapshot(1, (E0, False)), snapshot(1, (E1, True))], {E1}, None),
]  # fmt: skip


@pytest.mark.parametrize("row", [c[1:] for c in LEAST], ids=[c[0] for c in LEAST])
def test_least_loaded(row: tuple[Any, ...]) -> None:
    groups, exclude, expected, *turn = row
    assert least_loaded(groups, frozenset(exclude), *turn) == expected


def test_a_server_s_counts_and_whether_it_ran_alone() -> None:
    e, b = Server(E0, "eagle", now=1.0), Server(B0, "baseline", now=1.0)
    e.mate, b.mate = b, e
    e.admit(1.0, 7)
    assert (e.in_flight, e.routed, e.routed_at, e.area_at(3.0)) == (1, 7, 1.0, 2.0)
    mark = e.mate_area(3.0)
    assert e.alone_since(e.mate_area(4.0), 4.0) and e.alone_since(mark, 4.0)
    b.admit(4.0, 8)  # the mate runs: not alone, now or since the mark
    assert not e.alone_since(e.mate_area(4.0), 4.0) and not e.alone_since(mark, 4.0)
    b.finish(5.0)
    assert e.alone_since(e.mate_area(6.0), 6.0) and not e.alone_since(mark, 6.0)  # it ran meanwhile
    assert e.alone_since(e.mate_area(6.0), 6.0)
    e.finish(6.0)
    assert (e.in_flight, e.area) == (0, 5.0)
    assert Server(E1, "eagle").alone_since(0.0, 9.0)  # no mate: always alone


def test_the_learner_drops_what_did_not_run_alone_from_either_source() -> None:
    lr = SpeedLearner([(E0, "eagle")], clock=lambda: 5.0)
    before, seen = lr.curve(E0), lr.servers[E0].seen
    lr.finished(E0, 1, stay=1.0, output_tokens=100, alone=False)
    lr.rebuild()
    assert lr.curve(E0) == before and lr.servers[E0].seen == seen
    lr.finished(E0, 1, stay=1.0, output_tokens=100, alone=True)
    lr.rebuild()
    assert lr.curve(E0) != before and lr.servers[E0].seen == 5.0


# -- where the split layout's group and a pair still differ ---------------------------------------


def pools(pairs: bool, auto: bool = False) -> Pools:
    p = Pools(
        [(E0, "eagle"), (B0, "baseline")],
        ThresholdPolicy(),
        threshold=2,
        hysteresis=1,
        pairs=[(E0, B0)] if pairs else (),
        auto=auto,
        clock=lambda: 0.0,
    )
    for s in p.servers:
        s.healthy = True
    return p


@pytest.mark.parametrize(("pairs", "mode_after"), [(False, "eagle"), (True, "baseline")])
def test_a_refused_request_switches_only_the_split_layout_s_mode(
    pairs: bool, mode_after: str
) -> None:
    """With every server down, the split layout's mode still follows the load (the policy sees
    the request and records the switch), as it did before groups; a pair that cannot take the
    request is not shown it, so its mode stays."""
    p = pools(pairs)
    p.groups[0].mode = "baseline"
    for s in p.servers:
        s.healthy = False
    with pytest.raises(NoServer) as refused:
        p.acquire()  # load 1 <= 2 - 1: back to EAGLE, were it shown the request
    assert p.groups[0].mode == mode_after and p.load == 0
    assert ("pair" in refused.value.message) == pairs


@pytest.mark.parametrize("pairs", [False, True])
def test_the_router_s_settings_are_the_split_group_s_or_the_pairs_common_ones(pairs: bool) -> None:
    """``Pools.settings`` (what ``PUT /admin/threshold`` keeps the hysteresis of): the split
    layout's group's, learned ones included; with --pair the ones every pair started from."""
    p = pools(pairs, auto=True)
    learned = Thresholds(16, 4)
    p.groups[0].settings = learned
    assert p.settings == (Thresholds(2, 1) if pairs else learned)
    p.set_settings(5, 1)
    assert p.settings == p.groups[0].settings == Thresholds(5, 1) and not p.auto
