"""The threshold policy as plain tables: snapshot in, choice out."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dynspec.router.policy import Choice, ServerView, Snapshot, ThresholdPolicy

E1, E2 = "http://e1", "http://e2"
B1, B2 = "http://b1", "http://b2"


def servers(*specs: tuple[str, str, bool, int, bool]) -> tuple[ServerView, ...]:
    return tuple(
        ServerView(url, pool, healthy, n, accepting) for url, pool, healthy, n, accepting in specs
    )  # type: ignore[arg-type]


ONE_EACH = servers((E1, "eagle", True, 0, True), (B1, "baseline", True, 0, True))
EAGLE_DOWN = servers((E1, "eagle", False, 0, True), (B1, "baseline", True, 0, True))
BASELINE_DOWN = servers((E1, "eagle", True, 0, True), (B1, "baseline", False, 0, True))
BOTH_DOWN = servers((E1, "eagle", False, 0, True), (B1, "baseline", False, 0, True))
EAGLE_DRAINED = servers((E1, "eagle", True, 0, False), (B1, "baseline", True, 0, True))
SEVERAL = servers(
    (E1, "eagle", True, 3, True),
    (E2, "eagle", True, 1, True),
    (B1, "baseline", True, 5, True),
    (B2, "baseline", True, 2, True),
)
TIED = servers(
    (E1, "eagle", True, 2, True), (E2, "eagle", True, 2, True), (B1, "baseline", True, 0, True)
)
SEVERAL_ONE_DOWN = servers(
    (E1, "eagle", True, 3, True), (E2, "eagle", False, 0, True), (B1, "baseline", True, 0, True)
)

# (case, servers, mode, load counting the new request, threshold, hysteresis, server, new mode)
CASES = [
    ("eagle below threshold", ONE_EACH, "eagle", 7, 8, 2, E1, "eagle"),
    ("eagle at threshold stays", ONE_EACH, "eagle", 8, 8, 2, E1, "eagle"),
    ("eagle above threshold switches", ONE_EACH, "eagle", 9, 8, 2, B1, "baseline"),
    ("baseline above threshold stays", ONE_EACH, "baseline", 9, 8, 2, B1, "baseline"),
    ("baseline at threshold stays (band)", ONE_EACH, "baseline", 8, 8, 2, B1, "baseline"),
    ("baseline inside band stays", ONE_EACH, "baseline", 7, 8, 2, B1, "baseline"),
    ("baseline at threshold-hysteresis switches back", ONE_EACH, "baseline", 6, 8, 2, E1, "eagle"),
    ("baseline far below switches back", ONE_EACH, "baseline", 1, 8, 2, E1, "eagle"),
    ("eagle inside band stays", ONE_EACH, "eagle", 7, 8, 2, E1, "eagle"),
    ("no hysteresis: back at threshold", ONE_EACH, "baseline", 8, 8, 0, E1, "eagle"),
    ("threshold 1: second request switches", ONE_EACH, "eagle", 2, 1, 0, B1, "baseline"),
    ("eagle unhealthy: light load to baseline", EAGLE_DOWN, "eagle", 1, 8, 2, B1, "eagle"),
    ("baseline unhealthy: heavy load to eagle", BASELINE_DOWN, "eagle", 50, 8, 2, E1, "baseline"),
    ("both unhealthy: no server", BOTH_DOWN, "eagle", 1, 8, 2, None, "eagle"),
    ("both unhealthy, switch still recorded", BOTH_DOWN, "eagle", 9, 8, 2, None, "baseline"),
    ("drained eagle: light load to baseline", EAGLE_DRAINED, "eagle", 1, 8, 2, B1, "eagle"),
    ("several eagle: least in flight wins", SEVERAL, "eagle", 3, 8, 2, E2, "eagle"),
    ("several baseline: least in flight wins", SEVERAL, "eagle", 12, 8, 2, B2, "baseline"),
    ("tie: first listed wins", TIED, "eagle", 5, 8, 2, E1, "eagle"),
    ("unhealthy server in pool skipped", SEVERAL_ONE_DOWN, "eagle", 4, 8, 2, E1, "eagle"),
]


@pytest.mark.parametrize("case", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_threshold_policy(case: tuple[Any, ...]) -> None:
    servers_, mode, load, threshold, hysteresis, want_url, want_mode = case
    snap = Snapshot(servers_, load, mode, threshold, hysteresis)
    choice = ThresholdPolicy().choose(snap)
    assert isinstance(choice, Choice)
    assert (choice.server.url if choice.server else None) == want_url
    assert choice.mode == want_mode


EXCLUDE_CASES = [
    ("retry in own pool first", SEVERAL, "eagle", 3, frozenset({E2}), E1),
    ("own pool exhausted: other pool", ONE_EACH, "eagle", 1, frozenset({E1}), B1),
    ("baseline exhausted: eagle", ONE_EACH, "baseline", 20, frozenset({B1}), E1),
    ("everything excluded", ONE_EACH, "eagle", 1, frozenset({E1, B1}), None),
]


@pytest.mark.parametrize(
    ("servers_", "mode", "load", "exclude", "want_url"),
    [c[1:] for c in EXCLUDE_CASES],
    ids=[c[0] for c in EXCLUDE_CASES],
)
def test_exclude_for_retry(
    servers_: tuple[ServerView, ...],
    mode: str,
    load: int,
    exclude: frozenset[str],
    want_url: str | None,
) -> None:
    choice = ThresholdPolicy().choose(Snapshot(servers_, load, mode, 8, 2), exclude)  # type: ignore[arg-type]
    assert (choice.server.url if choice.server else None) == want_url


def test_ramp_up_and_down_switches_once_each_way() -> None:
    """A load ramp 1..12..1 through the policy: one switch up past 8, one back at 6."""
    policy = ThresholdPolicy()
    mode = "eagle"
    trace = []
    for load in [*range(1, 13), *range(11, 0, -1)]:
        mode = policy.choose(Snapshot(ONE_EACH, load, mode, 8, 2)).mode  # type: ignore[arg-type]
        trace.append((load, mode))
    switches = [(a, b) for a, b in itertools.pairwise(trace) if a[1] != b[1]]
    assert switches == [((8, "eagle"), (9, "baseline")), ((7, "baseline"), (6, "eagle"))]


@pytest.mark.parametrize(
    ("mode", "load", "may_return", "want"),
    [
        ("baseline", 6, False, "baseline"),  # low enough, but not for long enough
        ("baseline", 6, True, "eagle"),
        ("baseline", 7, True, "baseline"),  # above 8 - 2
        ("eagle", 9, False, "baseline"),  # leaving EAGLE is never held
    ],
)
def test_going_back_to_eagle_waits_for_may_return(
    mode: str, load: int, may_return: bool, want: str
) -> None:
    snap = Snapshot(ONE_EACH, load, mode, 8, 2, may_return=may_return)  # type: ignore[arg-type]
    assert ThresholdPolicy().choose(snap).mode == want


@pytest.mark.parametrize(
    ("mode", "load", "ahead", "want"),
    [
        ("eagle", 6, 2.0, "eagle"),  # heading for 8: not past it
        ("eagle", 6, 2.5, "baseline"),  # heading past 8 before the load is: leave early
        ("eagle", 9, 0.0, "baseline"),  # no trend: the load alone, as without --switch-lead
        ("baseline", 6, 0.0, "eagle"),
        ("baseline", 6, 0.5, "baseline"),  # still rising: do not come back yet
        ("baseline", 3, 3.0, "eagle"),  # heading for 6: back
    ],
)
def test_the_load_ahead_counts_both_ways(mode: str, load: int, ahead: float, want: str) -> None:
    snap = Snapshot(ONE_EACH, load, mode, 8, 2, ahead=ahead)  # type: ignore[arg-type]
    assert ThresholdPolicy().choose(snap).mode == want
