"""The learned threshold's rules (``autothreshold``) as plain tables: a group and its load in,
the rule's answer out. The derivation's own tables (``derive_threshold``, ``auto_hysteresis``,
``learned_settings``) are in test_pairs.py."""

from __future__ import annotations

from typing import Any

import pytest
from speedkit import DEMO

from dynspec.router.autothreshold import (
    AUTO_MAX,
    AUTO_START,
    PROBE_AFTER_REQUESTS,
    PROBE_AFTER_S,
    auto_bound,
    derive_threshold,
    floor_of,
    measured,
    past_held,
    relearn,
    stale,
)
from dynspec.router.server import Group, Server, ServerSpeed
from dynspec.router.speed import BUCKETS, KEEP, SpeedCurve, profile_from_json, queued_shape
from dynspec.router.thresholds import Thresholds

# EAGLE 10 ms alone, +2 ms per request; the baseline 20 ms, +1 ms: the curves cross at 10-11.
FAST = tuple(0.010 + 0.002 * (b - 1) for b in BUCKETS)
SLOW = tuple(0.020 + 0.001 * (b - 1) for b in BUCKETS)


def server(url: str, pool: str, prior: tuple[float, ...] = FAST, **speed: Any) -> Server:
    """A server whose ServerSpeed has the prior as its curve and the given fields set."""
    prior = speed.pop("prior", prior)
    record = Server(url, pool)  # type: ignore[arg-type]
    limit = speed.pop("limit", None)
    record.speed = ServerSpeed(url, pool, prior, limit, KEEP, seeded=speed.pop("seeded", False))
    for name, value in speed.items():
        setattr(record.speed, name, value)
    return record


def group(
    *servers: Server, settings: tuple[int, int] = (4, 1), mode: str = "eagle", derived: bool = True
) -> Group:
    """A group whose ``settings`` came from its curves (``derived``), else the start value."""
    g = Group(0, servers, Thresholds(*settings), label="0")
    g.mode = mode  # type: ignore[assignment]
    g.derived = derived
    return g


SEEN = {"reach": 3.0, "floor": 1.0, "scale": 1.0}  # seen at loads 1 to 3
E, B = "http://e", "http://b"

# (case, eagle speed, baseline speed, load, settings, expected (threshold, hysteresis) or None,
# expected held, optionally the group's mode (EAGLE else)); the configured hysteresis is 2.
RELEARN: list[tuple[Any, ...]] = [
    ("a profile: the curves' own crossover", {"seeded": True}, {"seeded": True}, 0, (4, 1),
     (10, 3), False),
    ("seen up to 3: held to the start value", SEEN, SEEN, 0, (4, 1), (8, 2), True),
    ("parked on its baseline carrying 10, seen serving it: twice that", SEEN,
     {**SEEN, "reach": 10.0}, 10, (4, 1), (10, 3), False, "baseline"),
    # An opening burst just sent to the baseline is no evidence either: it was seen only to 3.
    ("on its baseline carrying 10, seen serving 3: held to the start value", SEEN, SEEN, 10,
     (4, 1), (8, 2), True, "baseline"),
    # In EAGLE mode the load is what the threshold let in, not evidence: a burst past a held
    # threshold ratcheted it up (simulated h200-8b-accept4 at C=64: 8 -> 15 -> 30 -> 60).
    ("seen up to 3, carrying 10 on EAGLE: held to the start value", SEEN, SEEN, 10, (4, 1),
     (8, 2), True),
    ("seen up to 3, trying EAGLE at 20: the bound does not take it back", SEEN,
     {**SEEN, "prior": tuple(0.1 * b for b in BUCKETS)}, 20, (40, 10), None, True),
    # Past EAGLE's running limit of 6 its curve grows linearly (the queue): the curves cross
    # at 8-9, not at the limit (which once capped it at 6, held) nor at 10-11 (no limit).
    ("EAGLE's running limit: its queue in the curve, not a cap",
     {"seeded": True, "limit": 6, "prior": queued_shape(FAST, 6)}, {"seeded": True}, 0, (4, 1),
     (8, 2), False),
    # The curves cross at 10-11, below the floor: a loss at the floor caps the threshold below
    # it and never raises it (the simulated demo pairs at C=64 went from 8 to 31 on it).
    ("the baseline seen from 16 only, EAGLE losing there: a lower threshold stands",
     {**SEEN, "reach": 32.0}, {**SEEN, "floor": 16.0, "reach": 32.0}, 0, (4, 1), None, False),
    ("the baseline seen from 16 only, EAGLE losing there: a higher one comes to just below",
     {**SEEN, "reach": 32.0}, {**SEEN, "floor": 16.0, "reach": 32.0}, 0, (40, 10), (15, 4),
     False),
    ("EAGLE seen to 8, the baseline at 32 only, carrying 32: not raised to 31",
     {**SEEN, "reach": 8.0}, {**SEEN, "floor": 32.0, "reach": 32.0}, 32, (8, 2), None, False),
    ("within one hysteresis step: kept", {"seeded": True}, {"seeded": True}, 0, (8, 2), None,
     False),
]  # fmt: skip


@pytest.mark.parametrize("row", [c[1:] for c in RELEARN], ids=[c[0] for c in RELEARN])
def test_relearn(row: tuple[Any, ...]) -> None:
    eagle, baseline, load, settings, expected, held, *mode = row
    g = group(
        server(E, "eagle", **eagle),
        server(B, "baseline", **{"prior": SLOW, **baseline}),
        settings=settings,
        mode=mode[0] if mode else "eagle",
    )
    new, was_held = relearn(g, load, 2) or (None, None)
    got = (new.threshold, new.hysteresis) if new is not None else None
    assert (got, was_held) == (expected, held)


def test_relearn_spreads_the_load_over_each_pool_s_servers() -> None:
    """The split layout's group with two servers per pool: the first of each stands for its pool,
    and the crossover (10 per server) and the bound (8 per server) are the pools' totals."""
    two = [
        server(E, "eagle", seeded=True),
        server("http://e2", "eagle", seeded=True),
        server(B, "baseline", SLOW, seeded=True),
        server("http://b2", "baseline", SLOW, seeded=True),
    ]
    new, held = relearn(group(*two), 0, 2) or (None, None)
    assert new == Thresholds(20, 5) and held is False
    two[0] = server(E, "eagle", **SEEN)
    two[2] = server(B, "baseline", SLOW, **SEEN)
    new, held = relearn(group(*two), 0, 2) or (None, None)
    assert new == Thresholds(12, 3) and held is True


@pytest.mark.parametrize(
    ("derived", "expected"),
    [
        # The start value of 8 is a guess: the calibration's crossing at 10 replaces it, though
        # within one hysteresis step (a calibrated h200-8b-accept2 pair kept 8 for good).
        (False, Thresholds(10, 3)),
        # Learned once, a step of 2 under a hysteresis of 2 is the curves' noise: kept.
        (True, None),
    ],
)
def test_the_first_derivation_replaces_the_start_value_whatever_the_step(
    derived: bool, expected: Thresholds | None
) -> None:
    g = group(
        server(E, "eagle", seeded=True),
        server(B, "baseline", SLOW, seeded=True),
        settings=(AUTO_START, 2),
        derived=derived,
    )
    new, held = relearn(g, 0, 2) or (None, None)
    assert (new, held) == (expected, False)


def _pair(shared: bool) -> Group:
    eagle, baseline = server(E, "eagle", seeded=True), server(B, "baseline", SLOW, seeded=True)
    if shared:
        eagle.mate, baseline.mate = baseline, eagle  # as server.layout() pairs them
    return group(eagle, baseline)


@pytest.mark.parametrize(
    ("shared", "margin", "expected"),
    [
        (True, 0.0, Thresholds(10, 3)),  # the curves' own crossover
        # EAGLE at least 10% faster only up to 8: a rising load leaves it with 8 to drain.
        (True, 0.1, Thresholds(8, 2)),
        # Split servers share no GPU: leaving EAGLE costs nothing, the margin does not apply.
        (False, 0.1, Thresholds(10, 3)),
    ],
)
def test_relearn_a_switch_margin_lowers_only_a_pair_s_threshold(
    shared: bool, margin: float, expected: Thresholds
) -> None:
    new, held = relearn(_pair(shared), 0, 2, margin) or (None, None)
    assert (new, held) == (expected, False)


@pytest.mark.parametrize(("margin", "threshold"), [(0.0, 8), (0.05, 7), (0.1, 6), (0.2, 4)])
def test_the_demo_profile_s_threshold_under_a_switch_margin(margin: float, threshold: int) -> None:
    # The demo pair's curves cross at 8; EAGLE is 1.05x faster a token at 7, 1.12x at 6, 1.32x
    # at 4. Its simulated day at a fixed threshold of 8 missed, at 6 and 4 it passed
    # (bench/results/traffic/fixed-demo-tT.md).
    demo = profile_from_json(DEMO)
    eagle, baseline = (SpeedCurve(demo.modes[m].prior) for m in ("eagle", "baseline"))
    assert derive_threshold(eagle, baseline, margin=margin) == threshold


@pytest.mark.parametrize(
    ("case", "servers"),
    [
        ("EAGLE not measured yet", [server(E, "eagle"), server(B, "baseline", seeded=True)]),
        ("no baseline server", [server(E, "eagle", seeded=True)]),
        ("no speed at all", [Server(E, "eagle"), Server(B, "baseline")]),
    ],
)
def test_relearn_says_nothing_before_both_curves_do(case: str, servers: list[Server]) -> None:
    assert relearn(group(*servers), 0, 2) is None, case


@pytest.mark.parametrize(
    ("speed", "expected"),
    [({}, False), ({"seeded": True}, True), ({"scale": 0.5}, True), (None, False)],
)
def test_measured(speed: dict[str, Any] | None, expected: bool) -> None:
    record = server(E, "eagle", **speed) if speed is not None else Server(E, "eagle")
    assert measured(record) == expected


@pytest.mark.parametrize(
    ("eagle", "baseline", "servers", "expected"),
    [
        ({}, {}, 1, 1),  # nothing seen: every load compared
        ({"floor": 1.0}, {"floor": 16.0}, 1, 16),
        ({"floor": 4.0}, {"floor": 2.0}, 1, 4),
        ({"floor": 2.6}, {"floor": 1.0}, 1, 3),
        ({"floor": 1.0}, {"floor": 16.0}, 2, 32),  # two servers per pool: the pools' total
        ({"floor": 1.0}, {"floor": 16.0, "seeded": True}, 1, 1),  # a profile: known everywhere
    ],
)
def test_floor_of(
    eagle: dict[str, Any], baseline: dict[str, Any], servers: int, expected: int
) -> None:
    e = [server(E, "eagle", **eagle) for _ in range(servers)]
    b = [server(B, "baseline", **baseline) for _ in range(servers)]
    assert floor_of(e, b) == expected


# (held, mode, load carried, threshold, whether the next request derives at once)
PAST_HELD = [
    (True, "eagle", 8, 8, True),  # the next request is load 9 > 8
    (True, "eagle", 7, 8, False),  # load 8: at the threshold, not past it
    (False, "eagle", 20, 8, False),  # the curves' own threshold: the switch is right
    (True, "baseline", 20, 8, False),  # already switched
]


@pytest.mark.parametrize(("held", "mode", "load", "threshold", "expected"), PAST_HELD)
def test_past_held(held: bool, mode: str, load: int, threshold: int, expected: bool) -> None:
    g = group(server(E, "eagle"), server(B, "baseline"), settings=(threshold, 2), mode=mode)
    g.held = held
    assert past_held(g, load) == expected


# (in flight, last learned, last routed at, now, routed requests since, expected)
STALE = [
    (0, 0.0, 0.0, PROBE_AFTER_S - 1, 0, False),
    (0, 0.0, 0.0, PROBE_AFTER_S, 0, True),
    (1, 0.0, 0.0, 10 * PROBE_AFTER_S, 0, False),  # busy: its requests are being measured
    (0, 0.0, 25.0, PROBE_AFTER_S + 1, 0, False),  # a probe sent at 25 s taught nothing: wait
    (0, 25.0, 0.0, PROBE_AFTER_S + 1, 0, False),
    (0, 0.0, 0.0, 1.0, PROBE_AFTER_REQUESTS - 1, False),
    (0, 0.0, 0.0, 1.0, PROBE_AFTER_REQUESTS, True),  # left out of many requests
]


@pytest.mark.parametrize("row", STALE)
def test_stale(row: tuple[Any, ...]) -> None:
    in_flight, seen, routed_at, now, since, expected = row
    s = server(B, "baseline", seen=seen)
    s.admit(routed_at, 10)
    if in_flight == 0:
        s.finish(routed_at)
    assert stale(s, now, 10 + since) == expected
    assert not stale(Server(B, "baseline"), now, 10 + since)  # no speed learner: never


def test_a_pair_server_is_probed_only_while_its_mate_is_idle() -> None:
    # The two servers of a pair share the GPU: a probe beside a busy mate teaches nothing (it is
    # not learned) and slows the mate's whole batch (H200, pair-a-steady: C=16 at 0.85x).
    eagle, baseline = server(E, "eagle"), server(B, "baseline")
    eagle.mate, baseline.mate = baseline, eagle  # as server.layout() pairs them
    due = PROBE_AFTER_S + 1
    assert stale(baseline, due, 10)
    eagle.admit(due, 11)
    assert not stale(baseline, due, 10)
    eagle.finish(due)
    assert stale(baseline, due, 10)
    # The split layout's servers have no mate (other GPUs): a busy EAGLE pool does not matter.
    alone = server(B, "baseline")
    assert alone.mate is None and stale(alone, due, 10)


@pytest.mark.parametrize(
    "reach, load, bound",
    [
        (None, 0, AUTO_MAX),  # seeded by a profile: the curves decide
        (0.0, 0, AUTO_START),  # nothing seen yet: never below the start value
        (3.0, 0, AUTO_START),
        (12.0, 0, 24),
        (12.4, 0, 24),
        (400.0, 0, AUTO_MAX),
        (12.0, 40, 80),  # carrying more than was seen: twice the load carried
        (None, 128, AUTO_MAX),
    ],
)
def test_auto_bound(reach: float | None, load: int, bound: int) -> None:
    """EAGLE's running limit is no bound (it was, for decode-TPOT curves): the curves are a
    stay's time per token and show the queue past it (test_speed's limit tests)."""
    assert auto_bound(reach, load) == bound
