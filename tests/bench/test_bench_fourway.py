"""Eight GPUs four ways: the router plan and the goal evaluation as tables, the report from its
JSONL, and one short real run of every way (simulators and routers on loopback)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dynspec.bench import fourway
from dynspec.bench.fourway import Servers, evaluate, router_flags, verdicts
from dynspec.launcher.sim.profile import load_profile

SERVERS = Servers(eagle=("http://e1", "http://e2"), baseline=("http://b1", "http://b2"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("way", "thr", "profile", "interval", "flags"),
    [
        (
            "routed-threshold",
            7,
            None,
            None,
            "--eagle-url http://e1 --baseline-url http://b1 --policy threshold --threshold 7 "
            "--hysteresis 2",
        ),
        # suggest-threshold's "EAGLE never wins": the baseline server alone.
        ("routed-threshold", 0, None, None, "--baseline-url http://b1"),
        (
            "routed-balance",
            7,
            Path("/p.json"),
            None,
            "--eagle-url http://e1 --baseline-url http://b1 --policy balance "
            "--speed-profile /p.json",
        ),
        (
            "routed-balance",
            7,
            None,
            0.5,
            "--eagle-url http://e1 --baseline-url http://b1 --policy balance "
            "--metrics-interval 0.5",
        ),
        ("2x-eagle", 7, Path("/p.json"), 0.5, "--eagle-url http://e1,http://e2"),
        ("2x-baseline", 0, None, None, "--baseline-url http://b1,http://b2"),
    ],
)
def test_router_flags(
    way: str, thr: int, profile: Path | None, interval: float | None, flags: str
) -> None:
    got = router_flags(
        way,
        SERVERS,
        threshold=thr,
        hysteresis=2,
        speed_profile=profile,
        metrics_interval=interval,
    )
    assert got == flags.split()


def test_unknown_way_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown way"):
        router_flags("3x-eagle", SERVERS, threshold=1, hysteresis=0)


def test_the_router_profile_runs_at_the_simulators_wall_clock_speed() -> None:
    demo = load_profile("demo")
    fast = fourway.wall_clock_profile(demo, 4.0)
    for mode in ("eagle", "baseline"):
        m, f = demo.mode(mode), fast.mode(mode)
        assert [b for b, _ in f.throughput] == [b for b, _ in m.throughput]
        for (_, slow), (_, quick) in zip(m.throughput, f.throughput, strict=True):
            assert quick == pytest.approx(4.0 * slow, rel=1e-3)
        assert f.step_time(8) == pytest.approx(m.step_time(8) / 4.0, rel=1e-3)
        assert f.prefill_time(256) == pytest.approx(m.prefill_time(256) / 4.0)
    assert "4x faster" in fast.source
    assert fourway.wall_clock_profile(demo, 1.0) is demo


def rec(way: str, c: int, tput: float, tpot: float, eagle: float | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {
        "target": way,
        "max_concurrency": c,
        "output_throughput": tput,
        "median_tpot_ms": tpot,
    }
    if eagle is not None:
        r["backend_share"] = {"eagle": eagle, "baseline": 1 - eagle}
    return r


# (C, threshold, balance, 2x-eagle, 2x-baseline) tok/s, and (threshold, balance) p50 TPOT ms.
LEVELS = {
    1: ((92.0, 91.0, 90.0, 47.0), (10.5, 10.9)),  # TPOT 1.038x: inside 1.05x
    4: ((204.0, 198.0, 205.0, 160.0), (19.4, 20.7)),  # 0.97x thr; TPOT 1.067x: both missed
    8: ((257.0, 300.0, 392.0, 314.0), (31.0, 28.0)),  # below 0.85x pair (0.765)
    16: ((380.0, 480.0, 507.0, 518.0), (41.5, 35.0)),  # 1.26x thr: gain ok; pair 0.927 (< 0.95)
    64: ((600.0, 740.0, 627.0, 1010.0), (104.0, 90.0)),  # 1.233x thr: gain missed; pair 0.733
    128: ((602.0, 1150.0, 652.0, 1197.0), (206.0, 110.0)),  # everything met; pair 0.961
}


def records(levels: dict[int, tuple[tuple[float, ...], tuple[float, float]]]) -> list[Any]:
    out = []
    for c, ((t, b, e2, b2), (tp_t, tp_b)) in levels.items():
        out += [
            rec("routed-threshold", c, t, tp_t, 1.0 if c <= 7 else 0.0),
            rec("routed-balance", c, b, tp_b, 0.5),
            rec("2x-eagle", c, e2, 1000 * c / e2),
            rec("2x-baseline", c, b2, 1000 * c / b2),
        ]
    return out


def test_goals_per_level() -> None:
    rows = {r.c: r for r in evaluate(records(LEVELS), thr=7)}
    assert sorted(rows) == sorted(LEVELS)
    expect = {
        # C: (tput >= 0.98x thr, TPOT <= 1.05x (C <= 7), gain >= 1.25x (C >= 14), pair >= 0.85x)
        1: (True, True, None, True),
        4: (False, False, None, True),
        8: (True, None, None, False),
        16: (True, None, True, True),
        64: (True, None, False, False),
        128: (True, None, True, True),
    }
    for c, want in expect.items():
        got = rows[c].checks
        assert (got["tput"], got["tpot"], got["gain"], got["pair"]) == want, c
    assert rows[8].better_pair == "2x-eagle"
    assert rows[16].better_pair == "2x-baseline"
    assert rows[16].vs_threshold_tput == pytest.approx(480 / 380)
    assert rows[4].vs_threshold_tpot == pytest.approx(20.7 / 19.4)
    assert rows[8].vs_pair_tput == pytest.approx(300 / 392)
    assert rows[1].balance_eagle_share == 0.5
    assert [r.c for r in fourway.below_note(list(rows.values()))] == [8, 16, 64]


def test_verdicts_name_the_levels_that_miss() -> None:
    v = verdicts(evaluate(records(LEVELS), thr=7))
    assert v == {
        "tput": (False, [4]),
        "tpot": (False, [4]),
        "gain": (False, [64]),
        "pair": (False, [8, 64]),
    }
    good = {c: lv for c, lv in LEVELS.items() if c in (1, 128)}
    assert verdicts(evaluate(records(good), thr=7)) == {
        "tput": (True, []),
        "tpot": (True, []),
        "gain": (True, []),
        "pair": (True, []),
    }


def test_a_threshold_past_every_level_leaves_the_gain_goal_unevaluated() -> None:
    # eagle3-h100: suggest-threshold keeps everything on EAGLE up to C=256.
    v = verdicts(evaluate(records(LEVELS), thr=256))
    assert v["gain"] == (None, [])
    assert v["tpot"] == (False, [4])  # TPOT applies at every level there


def test_levels_without_all_four_ways_are_not_evaluated() -> None:
    recs = [
        r for r in records(LEVELS) if not (r["target"] == "2x-eagle" and r["max_concurrency"] == 8)
    ]
    assert 8 not in [r.c for r in evaluate(recs, thr=7)]
    zero = [
        {**r, "output_throughput": 0.0} if r["target"] == "routed-threshold" else r for r in recs
    ]
    assert all(math.isnan(r.vs_threshold_tput) for r in evaluate(zero, thr=7))
    assert not any(r.checks["tput"] for r in evaluate(zero, thr=7))


def full_records() -> list[dict[str, Any]]:
    """Synthetic level records with every key the report reads, as a run writes them."""
    base = {
        "completed": 16,
        "failed": 0,
        "concurrency": 1.0,
        "request_throughput": 1.0,
        "median_ttft_ms": 20.0,
        "p99_ttft_ms": 30.0,
        "p90_tpot_ms": 12.0,
        "p99_tpot_ms": 13.0,
        "median_itl_ms": 10.0,
        "median_e2e_latency_ms": 1000.0,
        "simulated": True,
        "experiment": "four-way",
        "profile": "demo",
        "speed": 2.0,
        "requests_per_c": 2,
        "min_requests": 16,
        "dataset_name": "random",
        "random_input_len": 256,
        "random_output_len": 128,
        "random_range_ratio": 1.0,
        "command": "dynspec-bench envelope --simulate --four-way --profile demo --speed 2",
        "machine": {"cpus": 2, "cpu": "test CPU", "platform": "Linux", "python": "3.11"},
        "run_started": "2026-12-01T07:00:00+00:00",
    }
    out: list[dict[str, Any]] = []
    for c in (1, 16):
        for mode, tput in (("eagle", 46.0 * c), ("baseline", 25.0 * c)):
            out.append({**base, **rec(mode, c, tput / (1 + c / 8), 5.0 * (1 + c / 8))})
    for level in records({c: LEVELS[c] for c in (1, 16)}):
        r = {**base, **level, "threshold": 7, "hysteresis": 2, "loadavg_1m": 3.5}
        r["output_throughput"] *= 2.0  # wall-clock figures at --speed 2
        r["median_tpot_ms"] /= 2.0
        r["timestamp"] = "2026-12-01T07:10:00+00:00"
        out.append(r)
    return out


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    return subprocess.run(
        [sys.executable, "-m", "dynspec.bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def test_report_states_simulated_machine_command_and_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "envelope8-demo.jsonl"
    recs = full_records()
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md, png = fourway.write_report(out, recs)
    text = md.read_text()
    assert text.startswith("# SIMULATED")
    assert "**SIMULATED.**" in text
    assert "2 CPUs (test CPU)" in text and "load average 3.5-3.5" in text
    assert "dynspec-bench envelope --simulate --four-way --profile demo --speed 2" in text
    assert "`--threshold 7 --hysteresis 2`, picked by `suggest-threshold`" in text
    # Model time: --speed 2 doubles the tok/s back and halves nothing else in the ratios.
    assert "| 1 | 92.0 | 91.0 | 90.0 | 47.0 |" in text
    assert "tok/s >= 0.98x threshold, every C: MET" in text
    assert "tok/s >= 1.25x threshold, C >= 2 x threshold: MET" in text
    assert "- C=16: 0.927x 2x-baseline" in text
    assert png.read_bytes().startswith(PNG_MAGIC)
    # The CLI rewrites the same report from the JSONL alone.
    md.unlink()
    r = bench("envelope", "--from-jsonl", str(out))
    assert r.returncode == 0, r.stderr
    assert md.read_text() == text
    assert "tok/s >= 0.98x threshold" in r.stdout


def test_records_from_two_runs_are_flagged(tmp_path: Path) -> None:
    recs = full_records()
    for r in recs:
        if r["target"] == "routed-balance":
            r["run_started"] = "2026-12-01T08:00:00+00:00"
            r["command"] = "dynspec-bench envelope --four-way --append --ways routed-balance"
    md, _ = fourway.write_report(tmp_path / "x.jsonl", recs)
    text = md.read_text()
    assert "come from more than one run" in text
    assert "--append --ways routed-balance" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("envelope", "--simulate", "--four-way", "--ways", "3x-eagle"), "--ways"),
        (("envelope", "--simulate", "--four-way", "--metrics-interval", "0"), "--metrics-interval"),
        (
            ("envelope", "--simulate", "--four-way", "--append", "--out", "/nonexistent/x"),
            "--append",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


def test_four_way_runs_every_way(tmp_path: Path) -> None:
    """Four sims and four routers at a tiny scale: every way serves, the JSONL has all four."""
    stem = tmp_path / "e8"
    r = bench(
        "envelope",
        "--simulate",
        "--four-way",
        "--profile",
        "demo",
        "--speed",
        "10",
        "--concurrency",
        "1,16",
        "--requests",
        "16",
        "--output-len",
        "24",
        "--input-len",
        "32",
        "--pause",
        "0.2",
        "--no-progress",
        "--out",
        str(stem),
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (t, c) for t in (*fourway.WAYS, "eagle", "baseline") for c in (1, 16)
    }
    for x in recs:
        assert x["simulated"] and x["profile"] == "demo" and x["speed"] == 10.0
        assert x["completed"] == 16 and x["failed"] == 0, x
        assert x["total_output_tokens"] == 16 * 24
    by = {(x["target"], x["max_concurrency"]): x for x in recs}
    assert by[("2x-eagle", 16)]["backend_share"] == {"eagle": 1.0}
    assert by[("2x-baseline", 16)]["backend_share"] == {"baseline": 1.0}
    assert by[("routed-threshold", 1)]["backend_share"] == {"eagle": 1.0}
    # A lone request goes to EAGLE (demo: about 2x faster at C=1); where balance sends the rest
    # is its own tests' business (it learns, and explores now and then).
    assert by[("routed-balance", 1)]["backend_share"].get("eagle", 0.0) >= 0.75
    assert set(by[("routed-balance", 16)]["backend_share"]) <= {"eagle", "baseline"}
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("# SIMULATED") and "the goals for `balance`" in md
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
