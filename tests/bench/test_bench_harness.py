"""The bench harness: router command lines made by the launcher's own builder (and read by the
router's own parser as the flags they replaced), and the router's profile at the simulators'
speed. Its processes are exercised by every experiment's tiny run."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from dynspec.bench import harness
from dynspec.bench.ways import Router, Servers, way_router
from dynspec.launcher.sim.profile import load_profile
from dynspec.router.config import parse_config

SERVERS = Servers(
    eagle=("http://127.0.0.1:9001", "http://127.0.0.1:9002"),
    baseline=("http://127.0.0.1:9003", "http://127.0.0.1:9004"),
    shared_gpus=(
        ("http://127.0.0.1:9005", "http://127.0.0.1:9006"),
        ("http://127.0.0.1:9007", "http://127.0.0.1:9008"),
    ),
)
E, B = "http://127.0.0.1:9001", "http://127.0.0.1:9003"


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "demo.json"
    path.write_text(load_profile("demo").dumps(), encoding="utf-8")
    return path


def routers(profile: Path) -> list[tuple[Router, str]]:
    """Each kind of router the experiments start, and the flags the bench gave it by hand
    before its command lines came from the launcher."""
    pairs = "--pair http://127.0.0.1:9005,http://127.0.0.1:9006 "
    pairs += "--pair http://127.0.0.1:9007,http://127.0.0.1:9008 "
    return [
        (
            way_router("split-threshold", SERVERS, threshold=7, hysteresis=2),
            f"--eagle-url {E} --baseline-url {B} --policy threshold --threshold 7 --hysteresis 2",
        ),
        (
            way_router("split-threshold", SERVERS, threshold=0, hysteresis=0),
            f"--baseline-url {B}",
        ),
        (
            way_router(
                "split-balance",
                SERVERS,
                threshold=7,
                hysteresis=2,
                speed_profile=profile,
            ),
            f"--eagle-url {E} --baseline-url {B} --policy balance --speed-profile {profile}",
        ),
        (way_router("paired-auto", SERVERS, threshold=7, hysteresis=2), pairs + "--threshold auto"),
        (
            way_router("2x-eagle", SERVERS, threshold=7, hysteresis=2),
            "--eagle-url http://127.0.0.1:9001,http://127.0.0.1:9002",
        ),
        (
            way_router(
                "paired-auto",
                SERVERS,
                threshold=7,
                hysteresis=2,
                speed_profile=profile,
                calibrated=True,
            ),
            pairs + f"--threshold auto --speed-profile {profile}",
        ),
    ]


def test_router_command_lines_come_from_the_launcher_and_mean_what_the_bench_meant(
    profile_file: Path,
) -> None:
    for router, flags in routers(profile_file):
        argv = harness.router_argv(router, 18000)
        assert argv[:3] == [sys.executable, "-m", "dynspec.router"]
        # The bench's servers stand where the launcher puts its own, and nothing of its
        # placeholder servers is left.
        assert argv[3 : 3 + len(router.servers)] == list(router.servers)
        assert not any(a.endswith((":1", ":2")) for a in argv), argv
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--log-level") + 1] == "warning"
        by_hand = [*flags.split(), "--host", "127.0.0.1", "--port", "18000"]
        assert parse_config(argv[3:], environ={}) == parse_config(
            [*by_hand, "--log-level", "warning"], environ={}
        ), flags


def test_a_router_setting_the_launcher_refuses_is_a_usage_error() -> None:
    from dynspec.common.cli import UsageError

    bad = Router(("--eagle-url", E, "--baseline-url", B), ("--threshold", "2", "--hysteresis", "2"))
    with pytest.raises(UsageError, match="--hysteresis 2 must be below --threshold 2"):
        harness.router_argv(bad, 18000)


def test_the_router_profile_runs_at_the_simulators_wall_clock_speed() -> None:
    demo = load_profile("demo")
    fast = harness.wall_clock_profile(demo, 4.0)
    for mode in ("eagle", "baseline"):
        m, f = demo.mode(mode), fast.mode(mode)
        assert [b for b, _ in f.throughput] == [b for b, _ in m.throughput]
        for (_, slow), (_, quick) in zip(m.throughput, f.throughput, strict=True):
            assert quick == pytest.approx(4.0 * slow, rel=1e-3)
        assert f.step_time(8) == pytest.approx(m.step_time(8) / 4.0, rel=1e-3)
        assert f.prefill_time(256) == pytest.approx(m.prefill_time(256) / 4.0)
    assert "4x faster" in fast.source
    assert harness.wall_clock_profile(demo, 1.0) is demo


class _Ran(Exception):
    pass


def test_router_log_level_reaches_the_routers_command_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``envelope --router-log-level info`` gives the routers the bench starts ``--log-level
    info`` (their learned thresholds and switches are info lines); the default stays warning."""
    from dynspec.bench import cli, envelope8

    got: list[envelope8.EightGpusConfig] = []

    def capture(cfg: envelope8.EightGpusConfig, progress: object = None) -> None:
        got.append(cfg)
        raise _Ran

    monkeypatch.setattr(envelope8, "run", capture)
    for flags, level in (([], "warning"), (["--router-log-level", "info"], "info")):
        with pytest.raises(SystemExit):
            cli.main(["envelope", "--simulate", "--eight-gpus", "--no-progress", *flags])
        assert got[-1].router_log_level == level
    router = way_router("paired-auto", SERVERS, threshold=7, hysteresis=2)
    argv = harness.router_argv(dataclasses.replace(router, log_level="info"), 18000)
    assert argv[argv.index("--log-level") + 1] == "info"
    assert parse_config(argv[3:], environ={}).log_level == "info"
