"""The eight-GPU ways: the router and servers each way gets, the ways a run plans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynspec.bench import envelope8, ways
from dynspec.bench.ways import Router, Servers, way_router
from dynspec.launcher.sim.profile import load_profile

SERVERS = Servers(
    eagle=("http://e1", "http://e2"),
    baseline=("http://b1", "http://b2"),
    shared_gpus=(("http://pe1", "http://pb1"), ("http://pe2", "http://pb2")),
    adaptive=("http://a1", "http://a2"),
)
PAIRS = "--pair http://pe1,http://pb1 --pair http://pe2,http://pb2"
SPLIT = "--eagle-url http://e1 --baseline-url http://b1"


@pytest.mark.parametrize(
    ("way", "thr", "profile", "servers", "settings", "healthy"),
    [
        ("split-threshold", 7, None, SPLIT, "--threshold 7 --hysteresis 2", 2),
        # suggest-threshold's "EAGLE never wins": the baseline server alone.
        ("split-threshold", 0, None, "--baseline-url http://b1", "", 1),
        ("split-balance", 7, Path("/p.json"), SPLIT, "--policy balance --speed-profile /p.json", 2),
        ("split-balance", 7, None, SPLIT, "--policy balance", 2),
        ("paired-threshold", 7, None, PAIRS, "--threshold 7 --hysteresis 2", 4),
        ("paired-threshold", 0, None, "--baseline-url http://pb1,http://pb2", "", 2),
        # No profile, whatever the run has: auto learns from nothing.
        ("paired-auto", 7, Path("/p.json"), PAIRS, "--threshold auto", 4),
        ("2x-eagle", 7, Path("/p.json"), "--eagle-url http://e1,http://e2", "", 2),
        ("2x-baseline", 0, None, "--baseline-url http://b1,http://b2", "", 2),
        ("2x-adaptive", 7, None, "--eagle-url http://a1,http://a2", "", 2),
    ],
)
def test_the_router_of_each_way(  # noqa: PLR0917
    way: str,
    thr: int,
    profile: Path | None,
    servers: str,
    settings: str,
    healthy: int,
) -> None:
    got = way_router(way, SERVERS, threshold=thr, hysteresis=2, speed_profile=profile)
    assert got == Router(tuple(servers.split()), tuple(settings.split()), healthy)


def test_a_calibrated_paired_auto_starts_from_the_profile() -> None:
    """--calibrated: paired-auto gets the profile, as a launch's --calibrate starts it; the
    other ways are as they were."""
    r = way_router(
        "paired-auto", SERVERS, threshold=7, hysteresis=2, speed_profile=Path("/p.json"),
        calibrated=True,
    )  # fmt: skip
    assert " ".join(r.settings) == "--threshold auto --speed-profile /p.json"
    assert r.urls() == ("http://pe1", "http://pb1", "http://pe2", "http://pb2")
    for way in ways.EIGHT_WAYS:
        if way != "paired-auto":
            kw: dict[str, Any] = {"threshold": 7, "hysteresis": 2, "speed_profile": Path("/p")}
            assert way_router(way, SERVERS, **kw, calibrated=True) == way_router(way, SERVERS, **kw)
    with pytest.raises(ValueError, match="speed profile"):
        way_router("paired-auto", SERVERS, threshold=7, hysteresis=2, calibrated=True)


def test_unknown_way_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown way"):
        way_router("3x-eagle", SERVERS, threshold=1, hysteresis=0)
    with pytest.raises(ValueError, match="unknown way"):
        ways.needs("3x-eagle")


def test_each_way_uses_eight_gpus() -> None:
    # Each simulated server stands for four GPUs; a shared-GPU simulator for four shared ones.
    for way in ways.EIGHT_WAYS:
        assert sum(ways.needs(way).values()) == 2, way


def test_a_way_that_learns_has_servers_of_its_own() -> None:
    # --threshold auto and --policy balance route by what they learn from the servers' /metrics.
    assert [w for w in ways.EIGHT_WAYS if ways.server_set(w) != ways.SHARED] == [
        "split-balance",
        "paired-auto",
    ]
    assert ways.plan_servers(["paired-threshold", "paired-auto"]) == {
        ways.SHARED: {"shared_gpus": 2},
        "paired-auto": {"shared_gpus": 2},
    }
    singles = {"eagle": 1, "baseline": 1}
    assert ways.plan_servers(["split-threshold", "split-balance", "2x-eagle"], singles) == {
        ways.SHARED: {"eagle": 2, "baseline": 1},
        "split-balance": {"eagle": 1, "baseline": 1},
    }
    # A run of learning ways alone with a set threshold starts no shared set.
    assert ways.plan_servers(["paired-auto"]) == {"paired-auto": {"shared_gpus": 2}}
    with pytest.raises(ValueError, match="unknown way"):
        ways.server_set("3x-eagle")


def test_a_routers_urls_are_those_its_flags_name() -> None:
    router = way_router("paired-auto", SERVERS, threshold=7, hysteresis=2)
    assert router.urls() == ("http://pe1", "http://pb1", "http://pe2", "http://pb2")
    router = way_router("2x-baseline", SERVERS, threshold=7, hysteresis=2)
    assert router.urls() == ("http://b1", "http://b2")


def test_ways_parse_in_the_run_order_and_the_four_way_names_are_gone() -> None:
    assert ways.parse_ways("2x-eagle,split-threshold") == ["split-threshold", "2x-eagle"]
    for gone in ("3x-eagle", "routed-threshold"):
        with pytest.raises(Exception, match="expected some of"):
            ways.parse_ways(gone)


def test_the_adaptive_counterpart_is_the_one_measured_at_the_profiles_acceptance() -> None:
    counterpart = envelope8.adaptive_counterpart
    assert counterpart(load_profile("h200-8b-accept4")) == ("h200-8b-adaptive", "")
    assert counterpart(load_profile("h200-8b-adaptive")) == ("h200-8b-adaptive", "")
    for name in ("h200-8b-accept1", "h200-8b-accept2", "h200-8b-accept3"):
        got, why = counterpart(load_profile(name))
        assert got is None, name
        assert f"measured at profile {name}'s acceptance" in why
    assert counterpart(load_profile("h200-8b-accept2"))[1].endswith(
        "(h200-8b-adaptive ran drafts of accept length 3.88, h200-8b-accept2's EAGLE 2.31)"
    )
    assert counterpart(load_profile("demo")) == (None, "profile demo has no adaptive counterpart")


def test_the_plan_leaves_out_a_way_without_a_ceiling_and_says_why() -> None:
    def plan(profile: str, **kw: Any) -> tuple[list[str], str | None, list[str]]:
        cfg = envelope8.EightGpusConfig(profile, 1.0, None, Path("x"), **kw)  # type: ignore[arg-type]
        return envelope8.plan_ways(cfg)

    run, adaptive, notes = plan("demo")
    assert "2x-adaptive" not in run and adaptive is None
    assert notes == ["2x-adaptive: profile demo has no adaptive counterpart"]
    run, adaptive, notes = plan("h200-8b-accept2")
    assert "2x-adaptive" not in run and adaptive is None
    assert notes[0].startswith("2x-adaptive: no adaptive-EAGLE curve was measured")
    assert plan("h200-8b-accept4") == (list(ways.EIGHT_WAYS), "h200-8b-adaptive", [])
    assert plan("demo", ways=["2x-eagle"]) == (["2x-eagle"], None, [])
