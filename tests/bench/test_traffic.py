"""Open-loop traffic: the run's windows and SLO figures as tables, the plan's interleaving, the
open-loop driver and the resume against a real simulator, the report's goals, and the command
(bad usage, a tiny simulated run with a router that sheds)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from utils import bench, free_port, usage_error

from dynspec.bench import arrivals, load, openloop, slo, traffic, traffic_report
from dynspec.bench.arrivals import Arrival
from dynspec.bench.load import Target
from dynspec.bench.metrics import RequestTrace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def served(send: float, first: float, end: float, tokens: int, backend: str | None = None):
    """A request that succeeded: its first token at ``first``, ``tokens`` in one chunk each
    from there to ``end``."""
    step = (end - first) / max(1, tokens - 1)
    t = RequestTrace(send=send, end=end, output_tokens=tokens, success=True, status=200)
    t.chunk_times = [first + i * step for i in range(tokens)]
    t.chunk_tokens = [1] * tokens
    t.backend = backend
    return t


def test_windows_count_requests_where_they_arrived_and_judge_both_slos() -> None:
    """Model time at speed 2: wall seconds x 2. Window 0 (model 0-10 s) gets three arrivals: one
    within both SLOs, one whose TPOT misses, one shed; window 1 one that was cut."""
    start = 100.0
    arr = [Arrival(1.0, 8, 11), Arrival(4.0, 8, 11), Arrival(6.0, 8, 11), Arrival(12.0, 8, 11)]
    ok = served(start + 0.5, start + 0.55, start + 1.05, 11, "eagle")  # TTFT 100 ms, TPOT 100 ms
    slow = served(start + 2.0, start + 2.05, start + 4.05, 11, "baseline")  # TPOT 400 ms
    shed = RequestTrace(send=start + 3.0, end=start + 3.01, status=503, retry_after="1")
    cut = RequestTrace(send=start + 6.0, end=start + 9.0, error="cut: still open")
    run = openloop.OpenLoopRun(arr, [ok, slow, shed, cut], start, start + 9.0, speed=2.0, cut=1)
    run.samples = [(start, {"switches": 3.0}), (start + 4.0, {"switches": 5.0})]
    recs = slo.records(
        run,
        arrivals.constant(0.2, 20.0),
        window_s=10.0,
        slo_ttft_ms=300.0,
        slo_tpot_ms=200.0,
        head={"target": "routed"},
    )
    w0, w1, whole = recs
    assert (w0["scope"], w1["scope"], whole["scope"]) == ("window", "window", "run")
    assert (w0["arrived"], w0["completed"], w0["shed"], w0["failed"]) == (3, 2, 1, 0)
    assert w0["slo_met"] == 1 and w0["slo_attainment"] == pytest.approx(1 / 3, abs=1e-3)
    assert w0["goodput"] == pytest.approx(0.1)
    assert w0["median_ttft_ms"] == pytest.approx(100.0)  # 50 ms wall x 2
    assert w0["eagle_share"] == pytest.approx(0.5)
    assert w0["mode_switches"] == 2
    assert w0["scheduled_rate"] == pytest.approx(0.2) and w0["offered_rate"] == pytest.approx(0.3)
    # Window 0 is wall 100-105 s: every token of both served requests (22) over 10 model s.
    assert w0["output_throughput"] == pytest.approx(2.2)
    assert (w1["arrived"], w1["failed"], w1["slo_attainment"]) == (1, 1, 0.0)
    assert whole["requests"] == 4 and whole["cut"] == 1
    assert whole["statuses"] == {"200": 2, "503": 1, "none": 1}
    assert whole["shed_without_retry_after"] == 0
    assert whole["errors"] == {"HTTP 503": 1, "cut": 1}
    assert whole["switches_per_min"] == pytest.approx(2 / (20 / 60))


def test_a_window_reports_the_range_of_the_thresholds_sampled_in_it() -> None:
    """A learned threshold moves: each window keeps the lowest and highest reading taken in it
    (model time at speed 1), and a run sampled without one has no such keys."""
    arr = [Arrival(1.0, 8, 2), Arrival(12.0, 8, 2)]
    reqs = [served(1.0, 1.1, 1.2, 2), served(12.0, 12.1, 12.2, 2)]
    run = openloop.OpenLoopRun(arr, reqs, 0.0, 13.0)
    run.samples = [(0.5, {"threshold": 512.0}), (3.0, {"threshold": 69.0}),
                   (9.0, {"threshold": 84.0}), (11.0, {"threshold": 40.0})]  # fmt: skip
    w0, w1, _ = slo.records(
        run, arrivals.constant(0.1, 20.0), window_s=10.0, slo_ttft_ms=1e3, slo_tpot_ms=1e3,
        head={},
    )  # fmt: skip
    assert (w0["threshold_min"], w0["threshold_max"]) == (69.0, 512.0)
    assert (w1["threshold_min"], w1["threshold_max"]) == (40.0, 40.0)
    run.samples = []
    assert "threshold_min" not in slo.records(
        run, arrivals.constant(0.1, 20.0), window_s=10.0, slo_ttft_ms=1e3, slo_tpot_ms=1e3,
        head={},
    )[0]  # fmt: skip


def test_a_shed_request_without_retry_after_is_counted() -> None:
    shed = RequestTrace(send=1.0, end=1.01, status=429)
    run = openloop.OpenLoopRun([Arrival(0.0, 1, 1)], [shed], 1.0, 1.1)
    whole = slo.records(
        run, arrivals.constant(1.0, 1.0), window_s=1.0, slo_ttft_ms=1.0, slo_tpot_ms=1.0, head={}
    )[-1]
    assert whole["shed_without_retry_after"] == 1 and whole["shed"] == 1


def test_the_plan_rotates_targets_and_gives_a_repeat_one_set_of_arrivals() -> None:
    cfg = traffic.TrafficConfig(
        schedules=(("a", arrivals.constant(2.0, 5.0)), ("b", arrivals.constant(1.0, 5.0))),
        repeats=3,
    )
    got = [(r.repeat, r.schedule, r.target) for r in traffic.plan(cfg, ["x", "y", "z"])]
    assert got[:6] == [(1, s, t) for s in "ab" for t in "xyz"]
    assert [t for r, s, t in got if (r, s) == (2, "a")] == ["y", "z", "x"]
    assert [t for r, s, t in got if (r, s) == (3, "b")] == ["z", "x", "y"]
    sched = cfg.schedules[0][1]
    assert cfg.arrivals_of(sched, 1) == cfg.arrivals_of(sched, 1)
    assert cfg.arrivals_of(sched, 1) != cfg.arrivals_of(sched, 2)


def test_prompts_differ_between_targets_but_not_their_lengths() -> None:
    a = Arrival(0.0, 40, 7)
    p, q = openloop.prompt_of(a, "s:1:day:eagle:0"), openloop.prompt_of(a, "s:1:day:routed:0")
    assert p.text != q.text
    assert len(p.text.split()) == len(q.text.split()) == 40 and p.output_tokens == 7


def test_simulated_targets_get_the_same_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulator draws a request's accept lengths from its seed and prompt: EAGLE alone and the
    routed pair (on fresh simulators of one seed) must be sent the same prompts, or the lowest
    rate's TPOT compares two draws (h200-8b-accept2 at 1 req/s read routed 1.106x EAGLE alone in
    one repeat with every request on EAGLE, 1.000x on the same prompts)."""
    sent: dict[str, list[str]] = {}
    real = openloop.prompt_of

    def spy(arrival: Arrival, key: str) -> load.Prompt:
        prompt = real(arrival, key)
        sent.setdefault(key.rsplit(":", 1)[0], []).append(prompt.text)
        return prompt

    monkeypatch.setattr(openloop, "prompt_of", spy)
    cfg = traffic.TrafficConfig(
        schedules=(("rate-4", arrivals.constant(4.0, 1.0)),),
        input_len=16,
        output_len=8,
        window_s=1.0,
        repeats=1,
        speed=4.0,
        drain_s=10.0,
    )
    sim = traffic.SimTraffic(
        profile="demo", targets=("routed", "eagle"), router_settings=("--threshold", "8"), speed=4.0
    )
    recs = traffic.run_simulated(cfg, sim, tmp_path / "t.jsonl")
    whole = {r["target"]: r for r in recs if r["scope"] == "run"}
    assert whole["routed"]["completed"] == whole["eagle"]["completed"] == whole["eagle"]["requests"]
    assert len(sent) == 1, sorted(sent)  # one prompt key for both targets
    texts = next(iter(sent.values()))
    n = whole["eagle"]["requests"]
    assert n > 0 and texts[:n] == texts[n:]


def test_replay_sends_on_time_whatever_is_in_flight_and_cuts_at_the_drain(eagle_sim: str) -> None:
    """Ten requests in the first 0.45 s, open loop: all are sent before any long one ends; then
    the long ones outlive a short drain and are cut, counted, never left running."""
    got = [Arrival(0.05 * i, 16, 4000 if i % 2 else 4) for i in range(10)]

    async def go() -> openloop.OpenLoopRun:
        async with load.make_session(30) as session:
            target = Target("sim", eagle_sim)
            model = await load.model_name(session, target)
            return await openloop.replay(session, target, model, got, key="k", drain_s=0.5)

    run = asyncio.run(go())
    assert all(t.send >= run.start + a.at for a, t in zip(got, run.traces, strict=True))
    longs = [t for i, t in enumerate(run.traces) if i % 2]
    # Open loop: the last request went out before the first long one could have ended.
    assert max(t.send for t in run.traces) < min(t.end for t in longs)
    assert run.cut == 5 and all(not t.success and t.error.startswith("cut") for t in longs)
    assert all(t.success for i, t in enumerate(run.traces) if i % 2 == 0)
    assert run.end - run.start < 10.0


async def _client_port(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app answering each request with the client's port: which connection it came on."""
    body = str(scope["client"][1]).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_the_client_drops_a_connection_idle_near_the_servers_keep_alive() -> None:
    """uvicorn (SGLang's server, the router) closes a connection idle for 5 s: the bench's client
    does not send on one idle that long (aiohttp's own 15 s did, and lost requests to
    ServerDisconnectedError on an H100), while a connection idle briefly is reused."""

    async def ports(idle: float) -> list[str]:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(_client_port, port=port, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        for _ in range(1000):  # at most 10 s
            if server.started:
                break
            await asyncio.sleep(0.01)
        seen = []
        async with load.make_session(30) as session:
            for wait in (idle, 0):
                async with session.get(f"http://127.0.0.1:{port}/") as resp:
                    seen.append(await resp.text())
                await asyncio.sleep(wait)
        server.should_exit = True
        await serving
        return seen

    first, again = asyncio.run(ports(0.1))
    assert first == again
    first, again = asyncio.run(ports(load.KEEPALIVE_S + 0.3))
    assert first != again


def test_run_live_appends_as_it_goes_and_resumes(eagle_sim: str, tmp_path: Path) -> None:
    cfg = traffic.TrafficConfig(
        schedules=(("rate-5", arrivals.constant(5.0, 1.0)),),
        input_len=16,
        output_len=8,
        window_s=0.5,
        repeats=1,
        drain_s=10.0,
    )
    out = tmp_path / "t.jsonl"
    first = traffic.run_live([Target("eagle", eagle_sim)], cfg, out, extra={"plan": "test"})
    assert [r["scope"] for r in first] == ["window", "window", "run"]
    assert first[-1]["plan"] == "test" and first[-1]["completed"] == first[-1]["requests"]
    again = traffic.run_live([Target("eagle", eagle_sim)], cfg, out)
    assert again == []  # the run is in the file already
    more = traffic.run_live([Target("eagle", eagle_sim)], dataclasses.replace(cfg, repeats=2), out)
    assert {r["repeat"] for r in more} == {2}
    lines = out.read_text().splitlines()
    assert len(lines) == 6 and {json.loads(x)["repeat"] for x in lines} == {1, 2}


def _run(schedule: str, target: str, repeat: int, **fields: Any) -> dict[str, Any]:
    return {"scope": "run", "schedule": schedule, "target": target, "repeat": repeat, **fields}


def _win(schedule: str, target: str, repeat: int, k: int, attained: float) -> dict[str, Any]:
    return {
        "scope": "window", "schedule": schedule, "target": target, "repeat": repeat,
        "window": k, "t0_s": 10.0 * k, "t1_s": 10.0 * (k + 1), "slo_attainment": attained,
    }  # fmt: skip


def test_goals_on_medians_of_repeats() -> None:
    recs = []
    for r, (mine, eagle, base) in enumerate([(0.95, 0.99, 0.5), (0.90, 0.93, 0.5), (0.99, 0.9, 1)]):
        recs += [_win("day", "routed", r, 0, mine), _win("day", "eagle", r, 0, eagle)]
        recs += [_win("day", "baseline", r, 0, base)]
        # Window 1: routed well under the better single.
        recs += [_win("day", "routed", r, 1, 0.5), _win("day", "baseline", r, 1, 0.8)]
        recs += [_run("day", "routed", r, goodput=2.0 + r, switches_per_min=3.0)]
        recs += [_run("day", "eagle", r, goodput=1.0), _run("day", "baseline", r, goodput=2.5)]
    # A variant (traffic --variant) is judged by the same goals under its own name.
    named = [{**x, "target": "lead"} if x["target"] == "routed" else x for x in recs]
    assert traffic_report.goals(named, "lead") == traffic_report.goals(recs)
    got = {g: (ok, detail) for g, ok, detail in traffic_report.goals(recs)}
    every = next(k for k in got if "every window" in k)
    # Window 0: routed median 0.95 >= eagle's median 0.93 - 0.02; window 1: 0.5 < 0.8 - 0.02.
    ok, detail = got[every]
    assert ok is False and "window 1 " in detail and "window 0" not in detail
    good = next(k for k in got if "goodput" in k)
    assert got[good][0] is True and got[good][1].startswith("1.200x baseline")
    flaps = next(k for k in got if "switches" in k)
    assert got[flaps][0] is True


def test_sweep_goals_take_the_lowest_and_highest_rate() -> None:
    recs = [
        _run("rate-1", "routed", 1, scheduled_rate=1.0, median_tpot_ms=10.4),
        _run("rate-1", "eagle", 1, scheduled_rate=1.0, median_tpot_ms=10.0),
        _run("rate-8", "routed", 1, scheduled_rate=8.0, output_throughput=900.0),
        _run("rate-8", "baseline", 1, scheduled_rate=8.0, output_throughput=1000.0),
        _run("rate-2", "routed", 1, scheduled_rate=2.0, output_throughput=1.0),
        _run("rate-2", "baseline", 1, scheduled_rate=2.0, output_throughput=1000.0),
    ]
    got = {g.split(":")[0]: ok for g, ok, _ in traffic_report.goals(recs)}
    assert got["lowest rate (rate-1)"] is True
    assert got["highest rate (rate-8)"] is False  # 0.90x < 0.95x


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("traffic", "--simulate"), "no load"),
        (("traffic", "--simulate", "--schedule", "3@x"), "--schedule"),
        (("traffic", "--simulate", "--schedule", "day"), "--schedule"),
        (("traffic", "--simulate", "--rates", "0,2"), "--rates"),
        (("traffic", "--simulate", "--request-rate", "2", "--targets", "a"), "--targets"),
        (("traffic", "--simulate", "--request-rate", "2", "--url", "x=http://a:1"), "--url"),
        (("traffic", "--request-rate", "2"), "--simulate"),
        (("traffic", "--simulate", "--request-rate", "2", "--threshold", "0"), "--threshold"),
        (("traffic", "--simulate", "--request-rate", "2", "--variant", "lead"), "NAME=FLAGS"),
        (
            ("traffic", "--request-rate", "2", "--url", "x=http://a:1", "--variant", "b="),
            "--url: not with --simulate or --variant",
        ),
        (("traffic", "--simulate", "--request-rate", "2", "--variant", "eagle="), "NAME=FLAGS"),
        (
            ("traffic", "--simulate", "--request-rate", "2", "--variant", "a=", "--variant", "a="),
            "NAME=FLAGS",
        ),
        (
            ("traffic", "--simulate", "--request-rate", "2", "--variant", "lead=--switch-lead x"),
            "--variant lead: argument --switch-lead: invalid",
        ),
        (
            ("traffic", "--simulate", "--request-rate", "2", "--variant", "lead=--no-such 1"),
            "--variant lead: unrecognized arguments: --no-such 1",
        ),
        (
            ("traffic", "--simulate", "--request-rate", "2", "--variant", "q=--hysteresis '1"),
            "--variant q: No closing quotation",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    assert needle in usage_error(*args)


def test_a_bad_trace_row_is_named_by_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0,10,5\n1,ten,5\n")
    line = usage_error("traffic", "--simulate", "--trace", str(trace))
    assert "--trace" in line and ":3:" in line
    trace.write_text("timestamp,input_tokens,output_tokens\n0,10,5\n")
    line = usage_error("traffic", "--simulate", "--trace", str(trace), "--request-rate", "2")
    assert line.endswith("not with --request-rate, --schedule or --rates")


def test_a_tiny_simulated_run_with_a_router_that_sheds(tmp_path: Path) -> None:
    """Routed (a router capped at 2 in flight) and the baseline alone at 30 req/s for 1.5 s of
    model time: the router sheds with 503 and Retry-After, nothing is lost, the report and its
    picture are written, and --from-jsonl writes them again. A variant (the same router capped at
    40, after the routed one's flags) runs too, and is judged under its name."""
    stem = tmp_path / "t"
    r = bench(
        "traffic", "--simulate", "--profile", "demo", "--speed", "4", "--targets",
        "routed,baseline", "--threshold", "8", "--max-concurrency", "2", "--schedule",
        "burst=30@1.5", "--window", "0.5", "--repeats", "1", "--input-len", "16",
        "--output-len", "16", "--drain", "20", "--out", str(stem),
        "--variant", "cap40=--max-concurrency 40", timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in stem.with_suffix(".jsonl").read_text().splitlines()]
    whole = {x["target"]: x for x in recs if x["scope"] == "run"}
    routed = whole["routed"]
    assert routed["statuses"].get("503", 0) > 0 and routed["shed_without_retry_after"] == 0
    assert routed["completed"] + routed["shed"] + routed["failed"] == routed["requests"]
    assert routed["failed"] == 0 and routed["cut"] == 0
    assert whole["baseline"]["completed"] == whole["baseline"]["requests"]
    wide = whole["cap40"]
    assert wide["router"].endswith("--max-concurrency 2 --max-concurrency 40")
    assert wide["completed"] == wide["requests"] > routed["completed"] and wide["shed"] == 0
    rss = routed["router_rss_mib"]
    assert rss["max"] > 0 and len(rss["quarters"]) == 3 and rss["first"] <= rss["max"]
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("# SIMULATED") and "## Shed and cut requests" in md
    flags = "--threshold 8 --max-concurrency 2 --max-concurrency 40"
    assert f"## Goals: `cap40` (router `{flags}`)" in md
    assert (tmp_path / "t-burst.png").read_bytes().startswith(PNG_MAGIC)
    again = bench("traffic", "--from-jsonl", str(stem.with_suffix(".jsonl")))
    assert again.returncode == 0, again.stderr


def test_a_schedule_without_single_servers_is_not_judged() -> None:
    recs = [_win("overload", "routed", 1, 0, 0.5), _run("overload", "routed", 1, goodput=1.0)]
    got = {g: (ok, detail) for g, ok, detail in traffic_report.goals(recs)}
    ok, detail = next(v for k, v in got.items() if "every window" in k)
    assert ok is None and detail.startswith("not judged")
