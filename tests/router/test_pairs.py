"""Pairs (``--pair``) as tables: the pure pair policy and the flags; the learned threshold and
``Pools`` with pairs are in test_pairs_learned.py."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
from pairkit import B0, B1, E0, E1

from dynspec.common.cli import UsageError
from dynspec.router.config import parse_config
from dynspec.router.policy import (
    PoolName,
    ServerView,
    Snapshot,
    ThresholdPolicy,
    least_loaded,
)


@dataclass(frozen=True, slots=True)
class PairView:
    """A pair as a table row."""

    index: int
    eagle: ServerView
    baseline: ServerView
    # Requests in flight on both servers (not counting the one being routed).
    load: int
    mode: PoolName
    threshold: int
    hysteresis: int

    def snapshot(self) -> Snapshot:
        servers = (self.eagle, self.baseline)
        return Snapshot(servers, self.load + 1, self.mode, self.threshold, self.hysteresis)


@dataclass(frozen=True, slots=True)
class PairChoice:
    pair: int | None  # None when no pair has a server that can take the request
    server: ServerView | None
    mode: PoolName = "eagle"  # the chosen pair's mode afterwards
    reason: str = ""


def route_pair(
    pairs: list[PairView], exclude: frozenset[str] = frozenset(), turn: int = 0
) -> PairChoice:
    """What ``Pools`` does with ``--pair`` groups, as a table: the least loaded group
    (``least_loaded``, ties taken in ``turn``), then the threshold policy on that group's
    snapshot."""
    snapshots = [p.snapshot() for p in pairs]
    i = least_loaded(snapshots, exclude, turn)
    if i is None:
        return PairChoice(None, None)
    choice = ThresholdPolicy().choose(snapshots[i], exclude)
    return PairChoice(pairs[i].index, choice.server, choice.mode, choice.reason)


def sv(url: str, pool: str, up: bool = True, n: int = 0, stale: bool = False) -> ServerView:
    return ServerView(url, pool, up, n, True, None, stale)  # type: ignore[arg-type]


def pv(
    index: int,
    e: ServerView,
    b: ServerView,
    *,
    mode: str = "eagle",
    threshold: int = 8,
    hysteresis: int = 2,
) -> PairView:
    return PairView(index, e, b, e.in_flight + b.in_flight, mode, threshold, hysteresis)  # type: ignore[arg-type]


def two(e0n: int = 0, b0n: int = 0, e1n: int = 0, b1n: int = 0, **kw: object) -> list[PairView]:
    return [
        pv(0, sv(E0, "eagle", n=e0n), sv(B0, "baseline", n=b0n), **kw),  # type: ignore[arg-type]
        pv(1, sv(E1, "eagle", n=e1n), sv(B1, "baseline", n=b1n), **kw),  # type: ignore[arg-type]
    ]


# (case, pairs, excluded, (pair, server, mode, reason))
CASES: list[tuple[str, list[PairView], frozenset[str], tuple[int | None, str | None, str, str]]] = [
    ("idle: first pair, eagle", two(), frozenset(), (0, E0, "eagle", "mode")),
    ("least load wins", two(e0n=2, e1n=1), frozenset(), (1, E1, "eagle", "mode")),
    ("a tie, turn 0: the first", two(e0n=1, e1n=1), frozenset(), (0, E0, "eagle", "mode")),
    (
        "pair load counts both servers",
        two(e0n=1, b0n=2, e1n=2),
        frozenset(),
        (1, E1, "eagle", "mode"),
    ),
    (
        "load over threshold switches the pair",
        two(e0n=8, e1n=9),
        frozenset(),
        (0, B0, "baseline", "mode"),
    ),
    ("at threshold stays", two(e0n=7, e1n=9), frozenset(), (0, E0, "eagle", "mode")),
    (
        "baseline mode inside the band stays",
        two(b0n=6, b1n=9, mode="baseline"),
        frozenset(),
        (0, B0, "baseline", "mode"),
    ),
    (
        "baseline mode at threshold - hysteresis goes back",
        two(b0n=5, b1n=9, mode="baseline"),
        frozenset(),
        (0, E0, "eagle", "mode"),
    ),
    (
        "mode server down: the other one",
        [pv(0, sv(E0, "eagle", up=False), sv(B0, "baseline"))],
        frozenset(),
        (0, B0, "eagle", "fallback"),
    ),
    (
        "excluded mode server: the other one",
        [pv(0, sv(E0, "eagle"), sv(B0, "baseline"))],
        frozenset({E0}),
        (0, B0, "eagle", "fallback"),
    ),
    (
        "a pair with neither is skipped, whatever its load",
        [
            pv(0, sv(E0, "eagle", up=False), sv(B0, "baseline", up=False)),
            pv(1, sv(E1, "eagle", n=5), sv(B1, "baseline")),
        ],
        frozenset(),
        (1, E1, "eagle", "mode"),
    ),
    (
        "none: no server",
        [pv(0, sv(E0, "eagle", up=False), sv(B0, "baseline", up=False))],
        frozenset(),
        (None, None, "eagle", ""),
    ),
    (
        "light load and a stale other server: one probe",
        [pv(0, sv(E0, "eagle"), sv(B0, "baseline", stale=True))],
        frozenset(),
        (0, B0, "eagle", "probe"),
    ),
    (
        "not light: no probe",
        [pv(0, sv(E0, "eagle", n=3), sv(B0, "baseline", stale=True))],
        frozenset(),
        (0, E0, "eagle", "mode"),
    ),
]


@pytest.mark.parametrize(("case", "pairs", "exclude", "expected"), CASES, ids=[c[0] for c in CASES])
def test_route_pair(
    case: str,
    pairs: list[PairView],
    exclude: frozenset[str],
    expected: tuple[int | None, str | None, str, str],
) -> None:
    choice = route_pair(pairs, exclude)
    assert isinstance(choice, PairChoice)
    url = choice.server.url if choice.server else None
    assert (choice.pair, url, choice.mode, choice.reason) == expected, case


def test_tied_pairs_are_taken_in_turn() -> None:
    assert [route_pair(two(e0n=1, e1n=1), turn=t).pair for t in range(4)] == [0, 1, 0, 1]
    # Not a tie: the least loaded whatever the turn.
    assert [route_pair(two(e0n=2, e1n=1), turn=t).pair for t in range(4)] == [1, 1, 1, 1]


def test_pair_reasons_are_the_threshold_policy_s() -> None:
    assert {"mode", "fallback", "probe"} <= set(ThresholdPolicy.reasons)


# -- flags -----------------------------------------------------------------------------------------


def test_pair_flags_environment_and_auto() -> None:
    cfg = parse_config(["--pair", f"{E0},{B0}", "--pair", f"{E1},{B1}", "--threshold", "auto"], {})
    assert cfg.pairs == ((E0, B0), (E1, B1)) and cfg.threshold_auto and cfg.threshold == 8
    assert cfg.eagle_urls == (E0, E1) and cfg.baseline_urls == (B0, B1)
    assert [u for u, _ in cfg.servers()] == [E0, B0, E1, B1]
    env = {"DYNSPEC_PAIR": f"{E0},{B0}; {E1},{B1}", "DYNSPEC_THRESHOLD": "auto"}
    cfg = parse_config([], env)
    assert cfg.pairs == ((E0, B0), (E1, B1)) and cfg.threshold_auto
    # The command line replaces the environment's pairs.
    assert parse_config(["--pair", f"{E1},{B1}"], env).pairs == ((E1, B1),)
    # --threshold auto with the split layout too.
    assert parse_config(
        ["--eagle-url", E0, "--baseline-url", B0, "--threshold", "auto"], {}
    ).threshold_auto


@pytest.mark.parametrize(
    "argv",
    [
        ["--pair", f"{E0},{B0}", "--eagle-url", E1],
        ["--pair", f"{E0},{B0}", "--baseline-url", B1],
        ["--pair", f"{E0},{B0}", "--pair", f"{E0},{B0}"],
        ["--pair", f"{E0},{B0}", "--pair", f"{E0},{B1}"],
        ["--pair", f"{E0},{B0}", "--policy", "balance"],
    ],
)
def test_pair_semantic_errors(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_config(argv, {})


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pair", f"{E0},{B0}", "--eagle-url", E1], "--eagle-url"),
        (["--pair", "ftp://e:1,http://b:1"], "http(s)"),
        (["--pair", E0], "exactly two"),
        (["--pair", f"{E0},{B0},{E1}"], "exactly two"),
        (["--pair", f"{E0},{B0}", "--pair", f"{E0},{B0}"], "twice"),
        (["--pair", f"{E0},{B0}", "--pair", f"{E1},{B0}"], "two pairs"),
        (["--pair", f"{E0},{B0}", "--policy", "balance"], "split"),
        (["--pair", f"{E0},{E0}/"], "two different"),
        (["--pair", f"{E0},{B0}", "--threshold", "often"], "auto"),
    ],
)
def test_pair_usage_errors_are_one_line_exit_2(argv: list[str], says: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "dynspec.router", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
