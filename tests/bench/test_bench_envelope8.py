"""Eight GPUs seven ways: the router plan per way, the goal evaluation as tables, the report
from its JSONL, and short real runs of the split and the paired ways (loopback only)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from utils import bench

from dynspec.bench import envelope8, envelope8_report, harness, ways
from dynspec.bench.envelope8_report import evaluate, verdict_lines, verdicts
from dynspec.bench.sweep import SweepConfig
from dynspec.bench.ways import Router, Servers, way_router
from dynspec.launcher.sim.profile import load_profile

SERVERS = Servers(
    eagle=("http://e1", "http://e2"),
    baseline=("http://b1", "http://b2"),
    shared_gpus=(("http://pe1", "http://pb1"), ("http://pe2", "http://pb2")),
    adaptive=("http://a1", "http://a2"),
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PAIRS = "--pair http://pe1,http://pb1 --pair http://pe2,http://pb2"
SPLIT = "--eagle-url http://e1 --baseline-url http://b1"


@pytest.mark.parametrize(
    ("way", "thr", "profile", "interval", "servers", "settings", "healthy"),
    [
        ("split-threshold", 7, None, None, SPLIT, "--threshold 7 --hysteresis 2", 2),
        # suggest-threshold's "EAGLE never wins": the baseline server alone.
        ("split-threshold", 0, None, None, "--baseline-url http://b1", "", 1),
        (
            "split-balance",
            7,
            Path("/p.json"),
            None,
            SPLIT,
            "--policy balance --speed-profile /p.json",
            2,
        ),
        ("split-balance", 7, None, 0.5, SPLIT, "--policy balance --metrics-interval 0.5", 2),
        ("paired-threshold", 7, None, None, PAIRS, "--threshold 7 --hysteresis 2", 4),
        ("paired-threshold", 0, None, None, "--baseline-url http://pb1,http://pb2", "", 2),
        # No profile, whatever the run has: auto learns from nothing.
        ("paired-auto", 7, Path("/p.json"), 0.5, PAIRS, "--threshold auto", 4),
        ("2x-eagle", 7, Path("/p.json"), 0.5, "--eagle-url http://e1,http://e2", "", 2),
        ("2x-baseline", 0, None, None, "--baseline-url http://b1,http://b2", "", 2),
        ("2x-adaptive", 7, None, None, "--eagle-url http://a1,http://a2", "", 2),
    ],
)
def test_the_router_of_each_way(  # noqa: PLR0917
    way: str,
    thr: int,
    profile: Path | None,
    interval: float | None,
    servers: str,
    settings: str,
    healthy: int,
) -> None:
    got = way_router(
        way,
        SERVERS,
        threshold=thr,
        hysteresis=2,
        speed_profile=profile,
        metrics_interval=interval,
    )
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
    # Chosen by hand: run as asked.
    run, adaptive, notes = plan("h200-8b-accept2", adaptive_profile="h200-8b-adaptive")
    assert "2x-adaptive" in run and adaptive == "h200-8b-adaptive" and notes == []
    assert plan("demo", ways=["2x-eagle"]) == (["2x-eagle"], None, [])


def rec(way: str, c: int, tput: float, tpot: float) -> dict[str, Any]:
    return {"target": way, "max_concurrency": c, "output_throughput": tput, "median_tpot_ms": tpot}


# C: (split-threshold, paired-auto, 2x-eagle, 2x-baseline) tok/s, and paired-auto's p50 TPOT ms
# (the pairs' TPOT is 1000 C / tok/s). Threshold 7: TPOT applies at C < 7, split at C >= 14.
LEVELS = {
    1: ((92.0, 91.0, 90.0, 47.0), 11.5),  # 1.011x 2x-eagle; TPOT 1.035x: both in
    4: ((204.0, 180.0, 205.0, 160.0), 23.0),  # 0.878x; TPOT 1.179x: both missed
    16: ((380.0, 510.0, 507.0, 518.0), 31.0),  # 0.985x 2x-baseline; 1.342x split
    64: ((600.0, 740.0, 627.0, 1010.0), 86.0),  # 0.733x; 1.233x split: both missed
    128: ((602.0, 1190.0, 652.0, 1197.0), 107.0),  # 0.994x; 1.977x split
}


def records(levels: dict[int, tuple[tuple[float, ...], float]]) -> list[Any]:
    split = "split-threshold"
    out = []
    for c, ((t, a, e2, b2), tp_a) in levels.items():
        out += [
            rec(split, c, t, 1000 * c / t),
            rec("paired-auto", c, a, tp_a),
            rec("2x-eagle", c, e2, 1000 * c / e2),
            rec("2x-baseline", c, b2, 1000 * c / b2),
        ]
    return out


def test_goals_per_level() -> None:
    rows = {r.c: r for r in evaluate(records(LEVELS), thr=7)}
    assert sorted(rows) == sorted(LEVELS)
    expect = {
        # C: (>= 0.95x best pair, TPOT <= 1.05x best (C < 7), >= 1.3x split (C >= 14))
        1: (True, True, None),
        4: (False, False, None),
        16: (True, None, True),
        64: (False, None, False),
        128: (True, None, True),
    }
    for c, want in expect.items():
        got = rows[c].checks
        assert (got["best"], got["tpot"], got["split"]) == want, c
    assert rows[1].best_pair == "2x-eagle" and rows[16].best_pair == "2x-baseline"
    assert rows[16].vs_best_tput == pytest.approx(510 / 518)
    assert rows[4].vs_best_tpot == pytest.approx(23.0 / (4000 / 205))
    assert rows[64].vs_split_tput == pytest.approx(740 / 600)


def test_verdicts_say_pass_or_miss_with_the_figures() -> None:
    rows = evaluate(records(LEVELS), thr=7)
    assert verdicts(rows) == {
        "best": (False, [4, 64]),
        "tpot": (False, [4]),
        "split": (False, [64]),
    }
    lines = verdict_lines(rows)
    assert lines[0].startswith("- MISS: paired-auto tok/s >= 0.95x the best homogeneous")
    assert "C=4 0.878x 2x-eagle; C=64 0.733x 2x-baseline" in lines[0]
    good = evaluate(records({c: lv for c, lv in LEVELS.items() if c in (1, 16, 128)}), thr=7)
    assert verdicts(good) == {"best": (True, []), "tpot": (True, []), "split": (True, [])}
    assert verdict_lines(good)[2] == (
        "- PASS: paired-auto tok/s >= 1.3x split-threshold's, C >= 2 x threshold "
        "(worst: C=16 1.342x)."
    )


def test_the_crossover_bounds_the_tpot_goal_and_a_high_threshold_the_split_goal() -> None:
    # TPOT applies below the crossover (here 5: C=1 and 4), not below the threshold.
    assert verdicts(evaluate(records(LEVELS), thr=7, crossover=2.0))["tpot"] == (True, [])
    # eagle3-h100: suggest-threshold keeps everything on EAGLE up to C=256.
    v = verdicts(evaluate(records(LEVELS), thr=256))
    assert v["split"] == (None, [])
    assert verdict_lines(evaluate(records(LEVELS), thr=256))[2].startswith("- not evaluated")


def test_levels_without_paired_auto_or_any_pair_are_not_evaluated() -> None:
    recs = [
        r
        for r in records(LEVELS)
        if not (r["target"] == "paired-auto" and r["max_concurrency"] == 4)
    ]
    assert 4 not in [r.c for r in evaluate(recs, thr=7)]
    assert evaluate([r for r in recs if not r["target"].startswith("2x")], thr=7) == []
    zero = [
        {**r, "output_throughput": 0.0} if r["target"] == "split-threshold" else r for r in recs
    ]
    assert all(math.isnan(r.vs_split_tput) for r in evaluate(zero, thr=7))
    assert not any(r.checks["split"] for r in evaluate(zero, thr=7))


def test_the_goals_judge_the_medians_over_repeats() -> None:
    """Three repeats: each way's median tok/s and TPOT are judged, not one repeat's figures."""
    recs = []
    # paired-auto at C=4: 150 / 190 / 200 tok/s over the repeats, so the median 190 is 0.927x
    # 2x-eagle's median 205 (MISS), and one good repeat (200) does not hide it.
    for rep, auto4 in ((1, 150.0), (2, 200.0), (3, 190.0)):
        for r in records(LEVELS):
            if r["target"] == "paired-auto" and r["max_concurrency"] == 4:
                r["output_throughput"] = auto4
            if r["target"] == "2x-eagle" and r["max_concurrency"] == 4:
                r["output_throughput"] = 205.0 + 10 * (rep - 2)  # 195, 205, 215
            recs.append({**r, "repeat": rep})
    rows = {r.c: r for r in evaluate(recs, thr=7)}
    assert rows[4].vs_best_tput == pytest.approx(190 / 205)
    assert rows[4].spread["paired-auto"].cell(1) == "190.0 (150.0-200.0)"
    assert rows[16].vs_best_tput == pytest.approx(510 / 518)  # equal repeats: the same figure
    assert verdicts(list(rows.values()))["best"] == (False, [4, 64])
    table = envelope8_report.goal_table(list(rows.values()))
    assert "| 4 | 190.0 (150.0-200.0) | 2x-eagle | 205.0 (195.0-215.0) | 0.927 |" in table
    assert "| 16 | 510.0 (510.0-510.0) | 2x-baseline | 518.0 (518.0-518.0) | 0.985 |" in table
    way = envelope8_report.way_table(recs, ["paired-auto", "2x-eagle"], "output_throughput", "x")
    assert "| 4 | 190.0 (150.0-200.0) | 205.0 (195.0-215.0) |" in way


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
        "sharing": "timeslice",
        "not_run": ["2x-adaptive: profile demo has no adaptive counterpart"],
        "requests_per_c": 2,
        "min_requests": 16,
        "dataset_name": "random",
        "random_input_len": 256,
        "random_output_len": 128,
        "random_range_ratio": 1.0,
        "command": "dynspec-bench envelope --simulate --eight-gpus --profile demo --speed 2",
        "machine": {"cpus": 2, "cpu": "test CPU", "platform": "Linux", "python": "3.11"},
        "run_started": "2026-12-01T07:00:00+00:00",
    }
    out: list[dict[str, Any]] = []
    for c in (1, 16):
        for mode, tput in (("eagle", 46.0 * c), ("baseline", 25.0 * c)):
            out.append({**base, **rec(mode, c, tput / (1 + c / 8), 5.0 * (1 + c / 8))})
    for level in records({c: LEVELS[c] for c in (1, 16)}):
        r = {**base, **level, "threshold": 7, "hysteresis": 2, "loadavg_1m": 3.5}
        r["crossover"] = 7.5
        r["output_throughput"] *= 2.0  # wall-clock figures at --speed 2
        r["median_tpot_ms"] /= 2.0
        r["timestamp"] = "2026-12-01T07:10:00+00:00"
        out.append(r)
    return out


def test_report_states_simulated_machine_command_and_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "envelope8-demo.jsonl"
    recs = full_records()
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md, png = envelope8_report.write_report(out, recs)
    text = md.read_text()
    assert text.startswith("# SIMULATED")
    assert "**SIMULATED.**" in text and "share them by `timeslice`" in text
    assert all("SIMULATED" in h for h in text.splitlines() if h.startswith("#"))
    assert "2 CPUs (test CPU)" in text and "load average 3.5-3.5" in text
    assert "dynspec-bench envelope --simulate --eight-gpus --profile demo --speed 2" in text
    assert "`--threshold 7 --hysteresis 2`, picked by `suggest-threshold`" in text
    assert "crossover C=7.5" in text
    assert "- Not run: 2x-adaptive: profile demo has no adaptive counterpart." in text
    # The way absent has its column in the tables, and why under the first of them.
    assert "| 2x-baseline tok/s | 2x-adaptive tok/s |" in text
    assert "| 1 | 92.0 | 91.0 | 90.0 | 47.0 | - |" in text
    tput = text.split("## SIMULATED: output tok/s per way")[1].split("## SIMULATED: p50 TPOT")[0]
    assert "- Not run: 2x-adaptive: profile demo has no adaptive counterpart." in tput
    # Model time: --speed 2 doubles the tok/s back.
    assert "| 1 | 91.0 | 2x-eagle | 90.0 | 1.011 |" in text
    assert "- PASS: paired-auto tok/s >= 0.95x the best homogeneous pair's" in text
    assert "- PASS: paired-auto tok/s >= 1.3x split-threshold's" in text
    assert png.read_bytes().startswith(PNG_MAGIC)
    # The CLI rewrites the same report from the JSONL alone.
    md.unlink()
    r = bench("envelope", "--from-jsonl", str(out))
    assert r.returncode == 0, r.stderr
    assert md.read_text() == text
    assert r.stdout.startswith("SIMULATED") and "PASS: paired-auto" in r.stdout


def test_the_report_of_repeats_says_how_they_ran_and_gives_medians(tmp_path: Path) -> None:
    recs = []
    for rep in (1, 2, 3):
        for one in full_records():
            r = {**one, "repeat": rep, "repeats": 3}
            if r["target"] == "paired-auto":
                r["output_throughput"] *= {1: 0.5, 2: 1.0, 3: 1.1}[rep]
            if rep == 3 and r.get("threshold") is not None:
                r["threshold"] = 8
            recs.append(r)
    md, _ = envelope8_report.write_report(tmp_path / "x.jsonl", recs)
    text = md.read_text()
    assert "- 3 repeats, each on simulators and routers started afresh" in text
    assert "the goals judge the medians" in text
    # Model time (--speed 2): paired-auto's C=1 figures 45.5, 91.0, 100.1; the median passes.
    assert "| 1 | 91.0 (45.5-100.1) | 2x-eagle | 90.0 (90.0-90.0) | 1.011 |" in text
    assert "- PASS: paired-auto tok/s >= 0.95x the best homogeneous pair's" in text
    assert "per repeat (threshold, hysteresis, crossover): #1 7/2/7.5, #2 7/2/7.5, #3 8/2/7.5" in (
        text
    )
    assert "every repeat, in the order run" in text
    assert "`--threshold auto`, no profile)" in text and "calibrated" not in text
    cal, _ = envelope8_report.write_report(
        tmp_path / "z.jsonl", [{**r, "calibrated": True} for r in recs]
    )
    assert cal.read_text().startswith(
        "# SIMULATED: eight GPUs, 4 ways, profile demo, pairs timeslice, paired-auto calibrated"
    )
    assert "`--threshold auto`, from a calibrated start: the profile as `--speed-profile`" in (
        cal.read_text()
    )
    # One run without repeats says nothing of them.
    one, _ = envelope8_report.write_report(tmp_path / "y.jsonl", full_records())
    assert "repeats" not in one.read_text() and "per repeat" not in one.read_text()


def test_records_from_two_runs_are_flagged(tmp_path: Path) -> None:
    recs = full_records()
    for r in recs:
        if r["target"] == "paired-auto":
            r["run_started"] = "2026-12-01T08:00:00+00:00"
            r["command"] = "dynspec-bench envelope --eight-gpus --append --ways paired-auto"
    md, _ = envelope8_report.write_report(tmp_path / "x.jsonl", recs)
    text = md.read_text()
    assert "come from more than one run" in text
    assert "--append --ways paired-auto" in text


def with_adaptive(profile: str, **more: Any) -> list[dict[str, Any]]:
    """full_records() as a run of ``profile`` whose 2x-adaptive (h200-8b-adaptive's curve)
    served more than every other way at both levels."""
    recs = [{**r, "profile": profile, "not_run": [], **more} for r in full_records()]
    recs[0]["adaptive_profile"] = "h200-8b-adaptive"
    return recs + [{**recs[-1], **rec("2x-adaptive", c, 5000.0, 1.0)} for c in (1, 16)]


def test_an_adaptive_curve_measured_at_another_acceptance_is_no_ceiling(tmp_path: Path) -> None:
    """Records of a run before the rule (h200-8b-accept2 beside h200-8b-adaptive's curve): the
    report leaves 2x-adaptive out of the goals and the tables, says why, keeps its levels."""
    recs = with_adaptive("h200-8b-accept2")
    for r in recs:
        r["adaptive_profile"] = "h200-8b-adaptive"
    judged, notes = envelope8_report.comparable(recs, load_profile("h200-8b-accept2"))
    assert [r for r in judged if r["target"] == "2x-adaptive"] == []
    assert notes == [
        "Left out: 2x-adaptive: it ran profile h200-8b-adaptive's adaptive curve, and no "
        "adaptive-EAGLE curve was measured at profile h200-8b-accept2's acceptance "
        "(h200-8b-adaptive ran drafts of accept length 3.88, h200-8b-accept2's EAGLE 2.31); "
        "no ceiling for h200-8b-accept2"
    ]
    md, _ = envelope8_report.write_report(tmp_path / "x.jsonl", recs)
    text = md.read_text()
    assert f"- {notes[0]}." in text
    assert "- PASS: paired-auto tok/s >= 0.95x the best homogeneous pair's" in text
    assert "| 2x-adaptive | 16 |" in text  # its levels stay in the table of all levels
    # Where it is the profile's own counterpart, or chosen by hand, it is the ceiling it was.
    for kept in (with_adaptive("h200-8b-accept4"), with_adaptive("h200-8b-accept2")):
        for r in kept:
            r["adaptive_profile"] = "h200-8b-adaptive"
            r["adaptive_by_hand"] = r["profile"] == "h200-8b-accept2"
        rows = envelope8_report._judged(kept)[2]
        assert {r.best_pair for r in rows} == {"2x-adaptive"}
        assert verdicts(rows)["best"] == (False, [1, 16])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("envelope", "--simulate", "--eight-gpus", "--ways", "3x-eagle"), "--ways"),
        # The four-way comparison is retired; its spelling went with it.
        (("envelope", "--simulate", "--four-way"), "unrecognized arguments: --four-way"),
        (("envelope", "--simulate", "--eight-gpus", "--sharing", "nvlink"), "--sharing"),
        (
            ("envelope", "--simulate", "--eight-gpus", "--metrics-interval", "0"),
            "--metrics-interval",
        ),
        (
            ("envelope", "--simulate", "--eight-gpus", "--append", "--out", "/nonexistent/x"),
            "--append",
        ),
        (("envelope", "--eight-gpus"), "only --simulate"),
        (("envelope", "--simulate", "--eight-gpus", "--repeats", "0"), "--repeats"),
        (("envelope", "--simulate", "--repeats", "2"), "run --eight-gpus"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


TINY = (
    "--profile", "demo", "--speed", "10", "--concurrency", "1,16", "--requests", "16",
    "--output-len", "24", "--input-len", "32", "--pause", "0.2", "--no-progress",
)  # fmt: skip


def _run_ways(tmp_path: Path, chosen: str, *more: str) -> list[dict[str, Any]]:
    stem = tmp_path / "e8"
    r = bench(
        "envelope", "--simulate", "--eight-gpus", "--ways", chosen, *TINY, *more,
        "--out", str(stem), timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert stem.with_suffix(".md").read_text().startswith("# SIMULATED")
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    recs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    for x in recs:
        assert x["simulated"] and x["profile"] == "demo" and x["speed"] == 10.0
        assert x["completed"] == 16 and x["failed"] == 0, x
        assert x["total_output_tokens"] == 16 * 24
    return recs


def test_the_split_ways_run(tmp_path: Path) -> None:
    """Four sims and four routers at a tiny scale."""
    recs = _run_ways(tmp_path, "split-threshold,split-balance,2x-eagle,2x-baseline")
    run = ("split-threshold", "split-balance", "2x-eagle", "2x-baseline", "eagle", "baseline")
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (t, c) for t in run for c in (1, 16)
    }
    by = {(x["target"], x["max_concurrency"]): x for x in recs}
    assert by[("2x-eagle", 16)]["backend_share"] == {"eagle": 1.0}
    assert by[("2x-baseline", 16)]["backend_share"] == {"baseline": 1.0}
    assert by[("split-threshold", 1)]["backend_share"] == {"eagle": 1.0}
    # A lone request goes to EAGLE (demo: about 2x faster at C=1); where balance sends the rest
    # is its own tests' business (it learns, and explores now and then).
    assert by[("split-balance", 1)]["backend_share"].get("eagle", 0.0) >= 0.75
    assert set(by[("split-balance", 16)]["backend_share"]) <= {"eagle", "baseline"}
    # balance learns from its servers: they are its own; the others share the first EAGLE.
    used = by[("split-balance", 1)]["way_servers"]
    assert used["split-balance"]["set"] == "split-balance"
    assert {used[w]["set"] for w in run[:4] if w != "split-balance"} == {ways.SHARED}
    assert set(used["split-balance"]["urls"]).isdisjoint(
        u for w in run[:4] if w != "split-balance" for u in used[w]["urls"]
    )
    assert used["split-threshold"]["urls"][0] == used["2x-eagle"]["urls"][0]
    assert by[("eagle", 1)]["url"] == used["2x-eagle"]["urls"][0]


@pytest.mark.usefixtures("needs_pairs")
def test_the_paired_ways_run(tmp_path: Path) -> None:
    """Two shared-GPU sims behind --pair routers, tiny: both serve every request of both levels."""
    recs = _run_ways(
        tmp_path, "paired-threshold,paired-auto,2x-baseline", "--threshold", "4",
        "--hysteresis", "1", "--sharing", "mps",
    )  # fmt: skip
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (t, c) for t in ("paired-threshold", "paired-auto", "2x-baseline") for c in (1, 16)
    }
    by = {(x["target"], x["max_concurrency"]): x for x in recs}
    assert by[("paired-threshold", 1)]["sharing"] == "mps"
    # Below the threshold a lone request speculates; at C=16 > 4 both pairs are past it.
    assert by[("paired-threshold", 1)]["backend_share"] == {"eagle": 1.0}
    assert by[("paired-threshold", 16)]["backend_share"].get("baseline", 0.0) >= 0.5


def _flag_urls(argv: list[str]) -> set[str]:
    """The server URLs on a dynspec-router command line."""
    flags = ("--pair", "--eagle-url", "--baseline-url")
    pairs = itertools.pairwise(argv)
    return {u for flag, value in pairs if flag in flags for u in value.split(",")}


@pytest.mark.usefixtures("needs_pairs")
def test_paired_auto_learns_from_simulators_no_other_way_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paired-auto's router polls its servers' /metrics and learns from them: the servers
    paired-threshold loads must not be among them (they were, one set for all)."""
    started: dict[str, list[str]] = {}
    start_router = harness.start_router

    def spy(procs: Any, name: str, router: Router, timeout: float) -> Any:
        url, proc = start_router(procs, name, router, timeout)
        started[name.removeprefix("router-")] = [str(a) for a in proc.args]
        return url, proc

    monkeypatch.setattr(harness, "start_router", spy)
    level = SweepConfig(concurrencies=[1, 4], requests=8, input_len=32, output_len=16, pause=0.1)
    cfg = envelope8.EightGpusConfig(
        "demo", 10.0, level, tmp_path / "e8.jsonl", ways=["paired-threshold", "paired-auto"],
        threshold=2, hysteresis=1,
    )  # fmt: skip
    recs = envelope8.run(cfg)
    assert sorted(started) == ["paired-auto", "paired-threshold"]
    auto, fixed = _flag_urls(started["paired-auto"]), _flag_urls(started["paired-threshold"])
    assert len(auto) == len(fixed) == 4
    assert auto.isdisjoint(fixed), (auto, fixed)
    # Every record says so: the set and the URLs each way's router was pointed at.
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (w, c) for w in started for c in (1, 4)
    }
    for x in recs:
        assert x["failed"] == 0, x
        used = x["way_servers"]
        assert used["paired-auto"]["set"] == "paired-auto"
        assert set(used["paired-auto"]["urls"]) == auto
        assert used["paired-threshold"]["set"] == ways.SHARED
        assert set(used["paired-threshold"]["urls"]) == fixed
    md, _ = envelope8_report.write_report(cfg.out, recs)
    assert (
        "- Simulators of their own (no other way's load on what their routers learn from): "
        "`paired-auto`; the other ways shared theirs" in md.read_text()
    )


def test_each_repeat_starts_every_server_and_router_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--repeats 2: two harness.processes() blocks, the simulators seeded seed + r - 1, every
    record naming its repeat and the servers of that repeat."""
    blocks: list[int] = []
    seeds: list[int] = []
    processes, start_servers = harness.processes, harness.start_servers

    def count() -> Any:
        blocks.append(len(blocks) + 1)
        return processes()

    def spy(procs: Any, want: Any, sim: Any, *a: Any, **k: Any) -> Any:
        seeds.append(sim.seed)
        return start_servers(procs, want, sim, *a, **k)

    monkeypatch.setattr(harness, "processes", count)
    monkeypatch.setattr(harness, "start_servers", spy)
    level = SweepConfig(concurrencies=[1, 4], requests=8, input_len=32, output_len=16, pause=0.1)
    cfg = envelope8.EightGpusConfig(
        "demo", 10.0, level, tmp_path / "e8.jsonl", ways=["split-balance", "2x-eagle"],
        threshold=2, hysteresis=1, seed=5, repeats=2,
    )  # fmt: skip
    recs = envelope8.run(cfg)
    assert blocks == [1, 2]
    assert sorted(seeds) == [5, 5, 6, 6]  # two server sets a repeat
    got = {(x["target"], x["max_concurrency"], x["repeat"]) for x in recs}
    assert got == {(w, c, r) for w in ("split-balance", "2x-eagle") for c in (1, 4) for r in (1, 2)}
    assert all(x["failed"] == 0 and x["repeats"] == 2 for x in recs)
    urls = {r: {u for x in recs if x["repeat"] == r for s in x["way_servers"].values()
                for u in s["urls"]} for r in (1, 2)}  # fmt: skip
    assert urls[1].isdisjoint(urls[2])
    assert [json.loads(line)["repeat"] for line in cfg.out.read_text().splitlines()] == [
        x["repeat"] for x in recs
    ]


def test_the_repeats_flag_reaches_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynspec.bench import cli

    got: list[envelope8.EightGpusConfig] = []

    def capture(cfg: envelope8.EightGpusConfig, progress: object = None) -> None:
        got.append(cfg)
        raise KeyboardInterrupt  # run_then_report keeps what finished (nothing), exits 130

    monkeypatch.setattr(envelope8, "run", capture)
    for flags, want in (([], 1), (["--repeats", "3"], 3)):
        with pytest.raises(SystemExit):
            cli.main(["envelope", "--simulate", "--eight-gpus", "--no-progress", *flags])
        assert got[-1].repeats == want and not got[-1].calibrated
        assert got[-1].out.name == "envelope8-demo.jsonl"
    with pytest.raises(SystemExit):
        cli.main(["envelope", "--simulate", "--eight-gpus", "--calibrated", "--sharing", "mps"])
    assert got[-1].calibrated and got[-1].out.name == "envelope8-demo-mps-calibrated.jsonl"
