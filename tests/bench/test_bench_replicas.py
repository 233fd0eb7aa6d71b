"""Router replicas in front of the same servers: the plan, the switch load from traces, the goals
as tables (met and missed), the report from its JSONL, bad usage, and one tiny real run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from utils import bench, rerendered, usage_error

from dynspec.bench import load, replicas, replicas_report, simreport, ways
from dynspec.bench.load import Target
from dynspec.bench.metrics import RequestTrace
from dynspec.bench.sweep import SweepConfig
from dynspec.bench.ways import Router, Servers
from dynspec.launcher.sim.profile import load_profile

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPEED = 4.0
META: dict[str, Any] = {
    "simulated": True,
    "experiment": "replicas",
    "profile": "demo",
    "speed": SPEED,
    "command": "dynspec-bench replicas --simulate --profile demo --speed 4",
    "machine": {"cpus": 2, "cpu": "test CPU", "platform": "Linux", "python": "3.11"},
    "code_commit": "abc1234",
    "run_started": "2026-12-02T05:00:00+00:00",
    "timestamp": "2026-12-02T05:30:00+00:00",
    "threshold": 8,
    "hysteresis": 2,
    "load_interval": 0.0625,
    "step_seconds": 5.0,
    "peak": 128,
    "requests_per_c": 2,
    "min_requests": 16,
    "random_input_len": 256,
    "random_output_len": 128,
    "sharing": "timeslice",
    "loadavg_1m": 2.5,
}
LEVELS = (1, 4, 16, 32)
ONE = {"split": [90.0, 180.0, 400.0, 530.0], "paired": [90.0, 270.0, 490.0, 800.0]}


def level(layout: str, variant: str, c: int, tput: float, baseline: float) -> dict[str, Any]:
    """A level record as the run writes it: wall-clock tok/s (model tok/s x speed)."""
    return {
        **META,
        "scope": "level",
        "layout": layout,
        "target": variant,
        "max_concurrency": c,
        "completed": 2 * c,
        "output_throughput": tput * SPEED,
        "median_tpot_ms": 10.0,
        "backend_share": {"baseline": baseline, "eagle": 1.0 - baseline},
        "mode_switches": 0,
    }


def run_rec(
    layout: str, variant: str, load_at: int | None, switches: list[int], seconds: float = 150.0
) -> dict[str, Any]:
    """A run record: ``seconds`` wall-clock (150 s at speed 4 = 10 model minutes)."""
    return {
        **META,
        "scope": "run",
        "layout": layout,
        "target": variant,
        "replicas": len(switches),
        "switch_load": load_at,
        "switch_step_c": None if load_at is None else 16,
        "replica_switches": switches,
        "replica_switches_by_label": [
            {'to="baseline"': s // 2, 'to="eagle"': s - s // 2} for s in switches
        ],
        "run_seconds": seconds,
    }


def records(
    layout: str = "split",
    servers: tuple[float, ...] = (1.0, 0.98, 1.02, 0.97),
    servers_load: int | None = 10,
    servers_switches: tuple[int, ...] = (10, 11, 12),
) -> list[dict[str, Any]]:
    """One router (switch load 9, 10 switches in 10 model minutes), 3-local (moves at 25, stays
    on EAGLE at C=16 and 32) and 3-servers (the ratios given)."""
    one = ONE[layout]
    share = {1: 0.0, 4: 0.0, 16: 1.0, 32: 1.0}
    out = [level(layout, "1-router", c, t, share[c]) for c, t in zip(LEVELS, one, strict=True)]
    local = (1.0, 1.0, 0.66, 0.6)
    out += [
        level(layout, "3-local", c, t * x, 0.0 if c < 32 else 0.4)
        for c, t, x in zip(LEVELS, one, local, strict=True)
    ]
    out += [
        level(layout, "3-servers", c, t * x, share[c])
        for c, t, x in zip(LEVELS, one, servers, strict=True)
    ]
    out += [
        run_rec(layout, "1-router", 9, [10]),
        run_rec(layout, "3-local", 25, [4, 4, 4]),
        run_rec(layout, "3-servers", servers_load, list(servers_switches)),
    ]
    return out


def verdicts(recs: list[dict[str, Any]], subject: str = "3-servers") -> dict[str, bool | None]:
    model = simreport.in_model_time(recs)
    return {g.key: g.ok for g in replicas_report.goals(model, "split", subject)}


def test_the_shared_signal_meeting_every_goal_and_local_counts_missing() -> None:
    recs = records()
    assert verdicts(recs) == {"switch_load": True, "tput": True, "switch_rate": True}
    # 3-local: moves at 25 (2.78x), 0.66x at C=16; fewer switches is not a miss.
    assert verdicts(recs, "3-local") == {"switch_load": False, "tput": False, "switch_rate": True}
    model = simreport.in_model_time(recs)
    runs = replicas_report.run_rows(model, "split")
    assert runs["1-router"].minutes == pytest.approx(10.0)  # 150 s wall x speed 4
    assert runs["1-router"].busiest == pytest.approx(1.0)
    assert runs["3-servers"].per_minute == pytest.approx((1.0, 1.1, 1.2))
    assert runs["3-servers"].majority_c == 16 and runs["3-local"].majority_c is None
    rows = replicas_report.level_rows(model, "split")
    assert [w.c for w in rows] == list(LEVELS)
    assert rows[0].tput["1-router"] == pytest.approx(90.0)  # model time
    assert rows[2].ratio("3-local") == pytest.approx(0.66)


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"servers_load": 12}, "switch_load"),  # 1.33x one router's 9
        ({"servers_load": 6}, "switch_load"),  # 0.67x: too early is a miss too
        ({"servers_load": None}, "switch_load"),  # never moved on the way up
        ({"servers": (1.0, 0.98, 0.94, 1.1)}, "tput"),  # 0.94x at C=16
        ({"servers_switches": (16, 10, 10)}, "switch_rate"),  # the busiest: 1.6x
    ],
)
def test_each_goal_can_be_missed(change: dict[str, Any], missed: str) -> None:
    got = verdicts(records(**change))
    assert got[missed] is False
    assert all(ok for key, ok in got.items() if key != missed)


def test_the_goals_edges_pass() -> None:
    # 11 / 9 = 1.22x, exactly 0.95x, exactly 1.5x.
    recs = records(servers_load=11, servers=(1.0, 1.0, 0.95, 1.3), servers_switches=(15, 0, 0))
    assert verdicts(recs) == {"switch_load": True, "tput": True, "switch_rate": True}


def test_not_evaluated_without_the_reference() -> None:
    recs = [r for r in records() if r["target"] != "1-router"]
    assert set(verdicts(recs).values()) == {None}
    never = [
        {**r, "switch_load": None} if r["target"] == "1-router" and r["scope"] == "run" else r
        for r in records()
    ]
    assert verdicts(never)["switch_load"] is None


def trace(send: float, end: float, backend: str) -> RequestTrace:
    return RequestTrace(send=send, end=end, backend=backend, success=end > 0)


def test_the_switch_load_is_the_total_in_flight_at_the_first_baseline_answer_going_up() -> None:
    windows = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)]
    steps = [1, 2, 4, 2, 1]
    traces = [
        trace(0.1, 0.9, "eagle"),
        trace(1.0, 2.5, "eagle"),
        trace(1.1, 0.0, "eagle"),  # cut off after the run: still in flight
        trace(2.0, 2.1, "eagle"),  # ended before the baseline one was sent
        trace(2.2, 2.9, "eagle"),
        trace(2.3, 2.8, "baseline"),
        trace(3.5, 4.0, "baseline"),
    ]
    assert replicas.in_flight_at(traces, 2.3) == 4
    got = replicas.switch_load(traces, windows, steps)
    assert got == {"switch_load": 4, "switch_step_c": 4, "switch_at_s": pytest.approx(2.3)}
    # A baseline answer only on the way down is no move on the way up.
    assert replicas.switch_load([*traces[:5], traces[6]], windows, steps) == {}
    assert replicas.switch_load(traces, [], []) == {}


def test_switches_are_read_per_label() -> None:
    text = (
        "# HELP dynspec_mode_switches_total Mode switches\n"
        "# TYPE dynspec_mode_switches_total counter\n"
        'dynspec_mode_switches_total{pair="0",to="baseline"} 3.0\n'
        'dynspec_mode_switches_total{pair="1",to="eagle"} 2.0\n'
        'dynspec_mode_switches_created{pair="0",to="baseline"} 1.7e9\n'
    )
    assert replicas.switches_by_label(text) == {
        'pair="0",to="baseline"': 3,
        'pair="1",to="eagle"': 2,
    }
    assert replicas.switches_by_label("") == {}


@pytest.mark.parametrize(
    ("peak", "cycles", "steps"),
    [
        (1, 1, [(1, 1)]),
        (4, 1, [(1, 1), (1, 2), (1, 4), (1, 2), (1, 1)]),
        (6, 1, [(1, 1), (1, 2), (1, 4), (1, 6), (1, 4), (1, 2), (1, 1)]),
        (
            4,
            2,
            [(1, 1), (1, 2), (1, 4), (1, 2), (1, 1), (2, 2), (2, 4), (2, 2), (2, 1)],
        ),
    ],
)
def test_ramp_schedule(peak: int, cycles: int, steps: list[tuple[int, int]]) -> None:
    assert replicas.schedule(peak, cycles) == steps
    with pytest.raises(ValueError):
        replicas.schedule(0, 1)


def test_ramp_clients_follow_the_steps_and_the_run_ends_on_time(eagle_sim: str) -> None:
    async def go() -> tuple[list[Any], list[tuple[float, float]]]:
        async with load.make_session(60) as session:
            target = Target("sim", eagle_sim)
            model = await load.model_name(session, target)
            prompts = load.Prompts(load.random_prompts(16, 16, 16, 0))
            return await replicas.drive(
                session, target, model, prompts, steps=[1, 4, 1], step_seconds=1.5
            )

    traces, windows = asyncio.run(go())
    assert len(windows) == 3
    # Each step lasted its time; the run did not wait for requests after the last step.
    for a, b in windows:
        assert b - a >= 1.5
    assert traces and all(t.send <= windows[-1][1] for t in traces)
    recs = replicas.records_of("1-router", [(1, 1), (1, 4), (1, 1)], traces, windows, {})
    steps = [r for r in recs if r["scope"] == "step"]
    assert [r["max_concurrency"] for r in steps] == [1, 4, 1]
    # At C=4 about four requests are in flight at a time, at C=1 about one.
    assert 3.0 <= steps[1]["concurrency"] <= 4.05
    assert steps[0]["concurrency"] <= 1.05
    assert all(r["completed"] > 0 and r["output_throughput"] > 0 for r in steps)
    assert [r["cycle"] for r in recs if r["scope"] == "cycle"] == [1]


def test_requests_go_round_robin_over_the_replicas() -> None:
    one = Target("r", "http://a")
    ring = [Target("r0", "http://a"), Target("r1", "http://b"), Target("r2", "http://c")]
    dest = load.spread(one, ring)
    assert [dest(i).base_url for i in range(5)] == [
        "http://a", "http://b", "http://c", "http://a", "http://b",
    ]  # fmt: skip
    assert load.spread(one)(7) is one


@pytest.mark.parametrize(
    ("way", "signal", "servers", "settings"),
    [
        (
            "split-threshold",
            "servers",
            "--eagle-url E --baseline-url B",
            "--threshold 8 --hysteresis 2 --load-signal servers --load-interval 0.0625"
            " --return-delay 0",
        ),
        (
            "split-threshold",
            "local",
            "--eagle-url E --baseline-url B",
            "--threshold 8 --hysteresis 2 --load-signal local --return-delay 0",
        ),
        (
            "paired-threshold",
            "servers",
            "--pair PE1,PB1 --pair PE2,PB2",
            "--threshold 8 --hysteresis 2 --load-signal servers --load-interval 0.0625"
            " --return-delay 0",
        ),
    ],
)
def test_the_router_of_each_replica(way: str, signal: str, servers: str, settings: str) -> None:
    shared = (("PE1", "PB1"), ("PE2", "PB2"))
    got = ways.replica_router(
        way,
        Servers(eagle=("E",), baseline=("B",), shared_gpus=shared),
        threshold=8,
        hysteresis=2,
        signal=signal,
        load_interval=0.0625,
    )
    healthy = 4 if way.startswith("paired") else 2
    assert got == Router(tuple(servers.split()), tuple(settings.split()), healthy)


def test_the_plan() -> None:
    assert ways.REPLICA_LAYOUTS == {"split": "split-threshold", "paired": "paired-threshold"}
    cfg = replicas.ReplicasConfig(
        "demo",
        4.0,
        SweepConfig([1]),
        Path("x"),
        layouts=ways.parse_layouts("paired,split"),
        variants=ways.parse_replica_variants("3-servers,1-router"),
    )
    assert replicas.plan(cfg) == [
        ("split", "1-router"), ("split", "3-servers"),
        ("paired", "1-router"), ("paired", "3-servers"),
    ]  # fmt: skip
    # The router's 0.25 s in model time.
    assert replicas.load_interval(cfg) == 0.0625
    s = replicas.profile_suggestion(load_profile("demo"))
    assert (s.threshold, s.hysteresis) == (8, 2)


def test_report_states_simulated_machine_command_and_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "replicas-demo.jsonl"
    recs = records() + records("paired")
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md, png = replicas_report.write_report(out, recs)
    text = md.read_text()
    assert text.startswith("# SIMULATED") and "**SIMULATED.**" in text
    assert all("SIMULATED" in h for h in text.splitlines() if h.startswith("#"))
    assert "dynspec-bench replicas --simulate --profile demo --speed 4" in text
    assert "2 CPUs (test CPU)" in text and "commit abc1234" in text
    assert "`--threshold 8 --hysteresis 2`" in text and "every 0.0625 s wall-clock" in text
    assert "- PASS: the load at which new requests move to the baseline" in text
    assert "- MISS: tok/s >= 0.95x 1-router's at every C: 3-local" in text
    assert "## SIMULATED: split" in text and "## SIMULATED: paired" in text
    assert "| 16 | 400.0 | 264.0 | 408.0 | 0.660 | 1.020 |" in text
    assert png.read_bytes().startswith(PNG_MAGIC)
    again, stdout = rerendered("replicas", out)
    assert again == text
    assert stdout.startswith("SIMULATED") and "split:" in stdout and "paired:" in stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("replicas",), "--simulate"),
        (("replicas", "--simulate", "--layouts", "ring"), "--layouts"),
        (("replicas", "--simulate", "--variants", "5-servers"), "--variants"),
        (("replicas", "--simulate", "--threshold", "4", "--hysteresis", "4"), "--hysteresis"),
        # The seed profile: EAGLE never wins, so nothing would switch without a set threshold.
        (("replicas", "--simulate", "--profile", "seed"), "--threshold"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    assert needle in usage_error(*args)


@pytest.mark.usefixtures("needs_pairs")
def test_a_tiny_run_of_both_layouts(tmp_path: Path) -> None:
    """Fresh sims and 1 or 3 routers per run, two levels and a ramp to 16: the files are
    written and every record the report reads is there."""
    stem = tmp_path / "rep"
    r = bench(
        "replicas", "--simulate", "--layouts", "split,paired", "--variants", "1-router,3-servers",
        "--profile", "demo", "--speed", "10", "--concurrency", "1,16", "--requests", "8",
        "--threshold", "4", "--hysteresis", "1", "--peak", "16", "--step-seconds", "1",
        "--input-len", "32", "--output-len", "24", "--pause", "0.2", "--no-progress",
        "--out", str(stem), timeout=170,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    assert all(x["simulated"] and x["experiment"] == "replicas" for x in recs)
    for layout in ("split", "paired"):
        for variant, n in (("1-router", 1), ("3-servers", 3)):
            mine = [x for x in recs if x["layout"] == layout and x["target"] == variant]
            levels = [x for x in mine if x["scope"] == "level"]
            assert [x["max_concurrency"] for x in levels] == [1, 16]
            for x in levels:
                assert x["completed"] == 8 and x["failed"] == 0, x
                assert x["output_throughput"] > 0 and len(x["replica_switches"]) == n
            # Above the threshold (4, per pair in paired) some requests went to the baseline.
            assert levels[1]["backend_share"].get("baseline", 0.0) > 0
            steps = [x for x in mine if x["scope"] == "step"]
            assert [x["max_concurrency"] for x in steps] == [1, 2, 4, 8, 16, 8, 4, 2, 1]
            (run,) = [x for x in mine if x["scope"] == "run"]
            assert run["replicas"] == n and len(run["replica_switches"]) == n
            assert run["load_signal"] == ("servers" if n == 3 else "local")
            # Past the threshold (a stale reading may move the shared signal a little early).
            assert run["switch_load"] >= 3 and run["switch_step_c"] in (4, 8, 16)
            assert run["run_seconds"] > run["ramp_seconds"] > 9
            assert sum(run["replica_switches"]) > 0
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("# SIMULATED") and "Goals, `3-servers` against `1-router`" in md
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    assert r.stdout.startswith("SIMULATED")
