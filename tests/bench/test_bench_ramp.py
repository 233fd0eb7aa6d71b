"""The load ramp: schedule and verdict as tables, the report from its JSONL, a short real run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from utils import bench

from dynspec.bench import load, ramp, ramp_report, ways
from dynspec.bench.load import Target

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
def test_schedule(peak: int, cycles: int, steps: list[tuple[int, int]]) -> None:
    assert ramp.schedule(peak, cycles) == steps


def test_schedule_of_the_default_ramp() -> None:
    steps = ramp.schedule(128, 2)
    assert [c for k, c in steps if k == 1] == [1, 2, 4, 8, 16, 32, 64, 128, 64, 32, 16, 8, 4, 2, 1]
    assert len(steps) == 29 and max(c for _, c in steps) == 128
    # Issue 16's ramp: 1 -> 256 -> 1 twice.
    assert len(ramp.schedule(256, 2)) == 33 and ramp.RampConfig("demo", 1.0, Path("x")).peak == 256
    with pytest.raises(ValueError):
        ramp.schedule(0, 1)


def step(
    variant: str,
    i: int,
    at: tuple[int, int],
    tput: float,
    tpot: float | None,
    *,
    scope: str = "step",
) -> dict[str, Any]:
    cycle, c = at
    r: dict[str, Any] = {
        "target": variant,
        "scope": scope,
        "cycle": cycle,
        "max_concurrency": c,
        "step_start_s": 10.0 * i,
        "duration": 10.0,
        "completed": 8,
        "output_throughput": tput,
        "median_tpot_ms": tpot,
    }
    if scope == "step":
        r["step"] = i
    return r


L, P = ramp.VARIANTS[:2]
AUTO, SEEDED = ramp.VARIANTS[2:]


def test_within_ten_percent_after_the_first_cycle() -> None:
    recs = [
        step(L, 0, (1, 1), 50.0, 20.0),
        step(P, 0, (1, 1), 90.0, 10.0),  # cycle 1: learning far behind, not judged
        step(L, 1, (2, 8), 270.0, 31.0),
        step(P, 1, (2, 8), 290.0, 29.0),  # 0.931x tok/s, 1.069x TPOT: within
        step(L, 2, (2, 1), 80.0, 11.5),
        step(P, 2, (2, 1), 92.0, 10.0),  # 0.870x: outside
        step(L, 3, (2, 1), 90.0, None),
        step(P, 3, (2, 1), 92.0, None),  # no request ended in the step: TPOT not judged
        step(L, 0, (1, 8), 100.0, 30.0, scope="cycle"),
        step(P, 0, (1, 8), 200.0, 15.0, scope="cycle"),
        step(L, 0, (2, 8), 182.0, 21.0, scope="cycle"),
        step(P, 0, (2, 8), 200.0, 20.0, scope="cycle"),
    ]
    rows = ramp_report.compare(recs)
    assert [(r.step, r.cycle, r.c) for r in rows] == [(0, 1, 1), (1, 2, 8), (2, 2, 1), (3, 2, 1)]
    assert [ramp_report.within(r) for r in rows] == [False, True, False, True]
    assert rows[1].ratio("tput") == pytest.approx(270 / 290)
    assert rows[1].ratio("tpot") == pytest.approx(31 / 29)
    ok, text = ramp_report.verdict(recs)
    assert ok is True
    assert "cycle 2: tok/s 0.910x, p50 TPOT 1.050x" in text
    worse = [{**r, "output_throughput": 170.0} if r is recs[10] else r for r in recs]
    assert ramp_report.verdict(worse)[0] is False
    assert ramp_report.verdict(recs[:4])[0] is None  # no cycle records


def ramp_records() -> list[dict[str, Any]]:
    meta = {
        "simulated": True,
        "experiment": "ramp",
        "profile": "demo",
        "speed": 4.0,
        "step_seconds": 2.0,
        "random_input_len": 256,
        "random_output_len": 128,
        "command": "dynspec-bench ramp --simulate --profile demo --speed 4",
        "machine": {"cpus": 2, "cpu": "test CPU", "platform": "Linux", "python": "3.11"},
        "loadavg_1m": 2.5,
    }
    out = []
    for v, f in ((L, 1.0), (P, 1.05)):
        for i, (cycle, c) in enumerate(ramp.schedule(4, 2)):
            out.append({**meta, **step(v, i, (cycle, c), 40.0 * c * f, 2.5 + c / f)})
        for cycle in (1, 2):
            out.append({**meta, **step(v, 0, (cycle, 4), 100.0 * f, 3.0 / f, scope="cycle")})
    return out


def test_report_rewrites_identically_from_its_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "ramp-demo.jsonl"
    recs = ramp_records()
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md, png = ramp_report.write_report(out, recs)
    text = md.read_text()
    assert text.startswith("# SIMULATED")
    assert "**SIMULATED.**" in text
    assert "dynspec-bench ramp --simulate --profile demo --speed 4" in text
    assert "2 CPUs (test CPU)" in text
    assert "every 2 s wall-clock (8 s model time)" in text
    # Model time: tok/s / 4 (40 x C wall-clock at C=1 is 10 model tok/s).
    assert "| 0 | 1 | 1 | 0 | 10.0 | 10.5 | 0.952 |" in text
    assert (
        "PASS: balance-learning within 10% of balance-profile after the first cycle "
        "(cycle 2: tok/s 0.952x" in text
    )
    assert all("SIMULATED" in h for h in text.splitlines() if h.startswith("## "))
    assert png.read_bytes().startswith(PNG_MAGIC)
    md.unlink()
    r = bench("ramp", "--from-jsonl", str(out))
    assert r.returncode == 0, r.stderr
    assert md.read_text() == text
    assert r.stdout.startswith("SIMULATED") and "PASS: balance-learning" in r.stdout


def test_paired_auto_is_held_to_five_percent_of_its_seeded_twin() -> None:
    pair = ramp_report.PAIRS[1]
    assert pair == (AUTO, SEEDED, 0.05)
    recs = [
        step(AUTO, 0, (1, 8), 100.0, 30.0, scope="cycle"),
        step(SEEDED, 0, (1, 8), 200.0, 15.0, scope="cycle"),
        step(AUTO, 0, (2, 8), 192.0, 20.5, scope="cycle"),  # 0.96x, 1.025x: within 5%
        step(SEEDED, 0, (2, 8), 200.0, 20.0, scope="cycle"),
        # The balance pair's records do not count for this one.
        step(L, 0, (2, 8), 10.0, 99.0, scope="cycle"),
        step(P, 0, (2, 8), 200.0, 20.0, scope="cycle"),
    ]
    ok, text = ramp_report.verdict(recs, pair)
    assert ok is True and text.startswith("PASS: paired-auto within 5% of paired-auto-seeded")
    assert ramp_report.verdict(recs)[0] is False  # balance-learning: 0.05x
    worse = [{**r, "output_throughput": 188.0} if r is recs[2] else r for r in recs]
    assert ramp_report.verdict(worse, pair)[0] is False  # 0.94x: inside 10%, outside 5%
    assert ramp_report.pairs_run(recs) == list(ramp_report.PAIRS)
    assert ramp_report.pairs_run(recs[:4]) == [pair]


@pytest.mark.parametrize(
    ("variant", "servers", "settings"),
    [
        ("balance-learning", "--eagle-url E --baseline-url B", "--policy balance"),
        (
            "balance-profile",
            "--eagle-url E --baseline-url B",
            "--policy balance --speed-profile /p",
        ),
        ("paired-auto", "--pair PE,PB", "--threshold auto --metrics-interval 0.5"),
        ("paired-auto-seeded", "--pair PE,PB", "--threshold auto --speed-profile /p"),
    ],
)
def test_the_router_of_each_variant(variant: str, servers: str, settings: str) -> None:
    interval = 0.5 if variant == "paired-auto" else None
    got = ways.variant_router(
        variant,
        ways.Servers(eagle=("E",), baseline=("B",), shared_gpus=(("PE", "PB"),)),
        profile=Path("/p"),
        metrics_interval=interval,
    )
    assert got == ways.Router(tuple(servers.split()), tuple(settings.split()))
    with pytest.raises(ValueError, match="needs a shared GPU"):
        ways.variant_router("paired-auto", ways.Servers(), profile=Path("/p"))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("ramp",), "--simulate"),
        (("ramp", "--simulate", "--variants", "balance-x"), "--variants"),
        (("ramp", "--simulate", "--variants", f"{L},{L}"), "--variants"),
        (("ramp", "--simulate", "--step-seconds", "0"), "--step-seconds"),
        (("ramp", "--simulate", "--profile", "nosuch"), "unknown profile"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


def test_clients_follow_the_steps_and_the_run_ends_on_time(eagle_sim: str) -> None:
    async def go() -> tuple[list[Any], list[tuple[float, float]]]:
        async with load.make_session(60) as session:
            target = Target("sim", eagle_sim)
            model = await load.model_name(session, target)
            prompts = load.Prompts(load.random_prompts(16, 16, 16, 0))
            return await ramp.drive(
                session, target, model, prompts, steps=[1, 4, 1], step_seconds=1.5
            )

    traces, windows = asyncio.run(go())
    assert len(windows) == 3
    # Each step lasted its time; the run did not wait for requests after the last step.
    for a, b in windows:
        assert b - a >= 1.5
    assert traces and all(t.send <= windows[-1][1] for t in traces)
    recs = ramp.records_of(L, [(1, 1), (1, 4), (1, 1)], traces, windows, {})
    steps = [r for r in recs if r["scope"] == "step"]
    assert [r["max_concurrency"] for r in steps] == [1, 4, 1]
    # At C=4 about four requests are in flight at a time, at C=1 about one.
    assert 3.0 <= steps[1]["concurrency"] <= 4.05
    assert steps[0]["concurrency"] <= 1.05
    assert all(r["completed"] > 0 and r["output_throughput"] > 0 for r in steps)
    assert [r["cycle"] for r in recs if r["scope"] == "cycle"] == [1]


def _tiny_ramp(tmp_path: Path, variants: tuple[str, str]) -> list[dict[str, Any]]:
    stem = tmp_path / "r"
    r = bench(
        "ramp",
        "--variants",
        ",".join(variants),
        "--simulate",
        "--profile",
        "demo",
        "--speed",
        "10",
        "--peak",
        "4",
        "--cycles",
        "2",
        "--step-seconds",
        "1.5",
        "--input-len",
        "32",
        "--output-len",
        "24",
        "--out",
        str(stem),
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    for v in variants:
        steps = [x for x in recs if x["target"] == v and x["scope"] == "step"]
        assert [x["max_concurrency"] for x in steps] == [c for _, c in ramp.schedule(4, 2)]
        assert all(x["output_throughput"] > 0 for x in steps), steps
        assert sum(x["completed"] for x in steps) > 0
        assert {x["cycle"] for x in recs if x["target"] == v and x["scope"] == "cycle"} == {1, 2}
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("# SIMULATED") and f"{variants[0]} within" in md
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    return recs


def test_ramp_runs_both_balance_variants(tmp_path: Path) -> None:
    """Two sims and, in turn, a learning and a profile-seeded balance router at tiny scale."""
    _tiny_ramp(tmp_path, (L, P))


@pytest.mark.usefixtures("needs_pairs")
def test_ramp_runs_both_paired_auto_variants(tmp_path: Path) -> None:
    """One pair sim and, in turn, --threshold auto learning and seeded, at tiny scale."""
    recs = _tiny_ramp(tmp_path, (AUTO, SEEDED))
    assert {x["sharing"] for x in recs} == {"timeslice"}
