"""Several routers in front of the same servers: do N replicas with the shared load signal act
as one router does? (issue 19 item 2)

Per layout (``ways.REPLICA_LAYOUTS``) and variant (``ways.REPLICA_VARIANTS``), on fresh simulated
servers: the sweep's levels with every request sent to the next replica in turn (``load.spread``),
then a ramp (``drive``); what is recorded and why: docs/benchmarks.md, "Router replicas".
The analysis and the report are ``replicas_report.py``. Everything is SIMULATED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from dynspec.bench import harness, load, metrics, threshold, ways
from dynspec.bench.load import Prompts, Target
from dynspec.bench.metrics import RequestTrace
from dynspec.bench.report import Record, append_jsonl
from dynspec.bench.simreport import expected_tpot_ms, expected_tput
from dynspec.bench.sweep import ProgressLine, SweepConfig, sweep, sweep_prompts
from dynspec.launcher.sim.profile import Profile, load_profile

logger = logging.getLogger(__name__)

LAYOUTS = tuple(ways.REPLICA_LAYOUTS)
VARIANTS = tuple(ways.REPLICA_VARIANTS)
# The router's own --load-interval default, in wall-clock seconds of a real deployment.
ROUTER_LOAD_INTERVAL = 0.25
SWITCHES = "dynspec_mode_switches_total"


@dataclass(frozen=True)
class ReplicasConfig:
    profile: str
    speed: float
    sweep: SweepConfig
    out: Path
    layouts: Sequence[str] = LAYOUTS
    variants: Sequence[str] = VARIANTS
    threshold: int | None = None  # None: suggest-threshold on the profile's own curves
    hysteresis: int | None = None
    load_interval: float | None = None  # None: the router's default in model time (0.25 / speed)
    peak: int = 128
    cycles: int = 1
    step_seconds: float = 5.0
    sharing: str = "timeslice"
    seed: int = 0
    startup_timeout: float = 60.0
    command: str = ""


def profile_suggestion(profile: Profile) -> threshold.Suggestion:
    """``suggest-threshold`` on the profile's own curves (each mode's decode-only TPOT and tok/s
    at C = 1, 2, 4 ... 256), without a sweep (pure)."""
    levels = [1 << k for k in range(9)]

    def curve(mode: str) -> list[Record]:
        return [
            {
                "target": mode,
                "max_concurrency": c,
                "completed": 1,
                "median_tpot_ms": expected_tpot_ms(profile, mode, c),
                "output_throughput": expected_tput(profile, mode, c),
            }
            for c in levels
        ]

    return threshold.suggest(curve("eagle"), curve("baseline"))


def plan(cfg: ReplicasConfig) -> list[tuple[str, str]]:
    """``(layout, variant)`` in the order they run: layout by layout, the reference first (pure)."""
    layouts = [lay for lay in LAYOUTS if lay in cfg.layouts]
    return [(lay, v) for lay in layouts for v in VARIANTS if v in cfg.variants]


def load_interval(cfg: ReplicasConfig) -> float:
    """The replicas' ``--load-interval`` (wall-clock): the router's default in model time, so a
    reading is as old, next to the requests, as in a real deployment at 0.25 s."""
    if cfg.load_interval is not None:
        return cfg.load_interval
    return round(ROUTER_LOAD_INTERVAL / cfg.speed, 4)


# ---- what the load generator and the replicas' /metrics say (pure) ------------------------------


def in_flight_at(traces: Sequence[RequestTrace], at: float) -> int:
    """Requests the load generator had in flight at ``at``: sent by then and not yet ended (a
    request with no end yet was cut off after the run, so it was still in flight)."""
    return sum(1 for t in traces if t.send <= at and (t.end <= 0 or t.end > at))


def switch_load(
    traces: Sequence[RequestTrace], windows: Sequence[tuple[float, float]], steps: Sequence[int]
) -> dict[str, Any]:
    """The load at which new requests moved to the baseline: on the ramp's first way up (the
    steps up to the first peak), the first request a baseline server answered, and the total
    in flight, counting it, when it was sent. Empty when none went to the baseline."""
    if not windows or not steps:
        return {}
    top = steps.index(max(steps))
    start, end = windows[0][0], windows[min(top, len(windows) - 1)][1]
    up = [t for t in traces if start <= t.send < end and t.backend == "baseline"]
    if not up:
        return {}
    first = min(up, key=lambda t: t.send)
    k = max(i for i, (a, _) in enumerate(windows) if a <= first.send)
    return {
        "switch_load": in_flight_at(traces, first.send),
        "switch_step_c": steps[k],
        "switch_at_s": first.send - start,
    }


def switches_by_label(text: str) -> dict[str, int]:
    """``dynspec_mode_switches_total`` per label set (``to="baseline"``, with pairs
    ``pair="0",to="eagle"``) from a router's ``/metrics`` text."""
    return {labels: round(v) for labels, v in metrics.samples(text, SWITCHES) if labels}


async def _switches(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[dict[str, int]]:
    texts = await asyncio.gather(*(load.fetch_text(session, u + "/metrics") for u in urls))
    return [switches_by_label(t or "") for t in texts]


def _totals(counts: Sequence[dict[str, int]]) -> list[int]:
    return [sum(c.values()) for c in counts]


def _diff(after: Sequence[dict[str, int]], before: Sequence[dict[str, int]]) -> list[int]:
    return [a - b for a, b in zip(_totals(after), _totals(before), strict=True)]


# ---- the ramp: closed-loop concurrency stepped 1 -> peak -> 1 ----------------------------------


def schedule(peak: int, cycles: int) -> list[tuple[int, int]]:
    """``(cycle, concurrency)`` per step: 1, 2, 4 ... peak ... 2, 1, then again from 2 (pure).

    Powers of two up to ``peak`` (``peak`` itself is the top step even when it is not one).
    """
    if peak < 1 or cycles < 1:
        raise ValueError("peak and cycles must be >= 1")
    up = [1 << k for k in range(peak.bit_length()) if (1 << k) < peak] + [peak]
    one = up + up[-2::-1]
    steps = [(1, c) for c in one]
    for k in range(2, cycles + 1):
        steps += [(k, c) for c in one[1:]]
    return steps


async def drive(
    session: aiohttp.ClientSession,
    target: Target,
    model: str,
    prompts: load.Prompts,
    *,
    steps: Sequence[int],
    step_seconds: float,
    replicas: Sequence[Target] = (),
) -> tuple[list[RequestTrace], list[tuple[float, float]]]:
    """Closed-loop clients whose number follows ``steps``; returns every request's trace and
    each step's ``(start, end)`` (``perf_counter`` seconds). Ends after the last step: requests
    still in flight are cancelled then (the server aborts them), so the run is bounded in time.
    With ``replicas``, requests go round-robin over them (``load.spread``)."""
    clients = load.ClosedLoop(session, target, model, prompts, replicas)
    windows: list[tuple[float, float]] = []
    try:
        for c in steps:
            start = time.perf_counter()
            clients.set(c)
            await asyncio.sleep(max(0.0, start + step_seconds - time.perf_counter()))
            windows.append((start, time.perf_counter()))
    finally:
        await clients.stop()
    return clients.traces, windows


def step_record(
    traces: Sequence[RequestTrace], start: float, end: float, per_chunk: float
) -> dict[str, Any]:
    """bench_serving-named figures of one window: tokens delivered inside it, and latencies of
    the requests that finished inside it."""
    win = metrics.window(traces, start, end, tokens_per_chunk=per_chunk)
    done = [t for t in traces if t.success and start <= t.end < end]
    tpots = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in done if t.output_tokens > 1]
    ttfts = [t.ttft for t in done]
    failed = sum(1 for t in traces if not t.success and t.error and start <= t.end < end)
    length = max(end - start, 1e-9)
    rec: dict[str, Any] = {
        "duration": length,
        "completed": len(done),
        "failed": failed,
        "total_output_tokens": round(win.output_tokens),
        "output_throughput": win.output_tokens / length,
        "request_throughput": len(done) / length,
        "concurrency": win.busy / length,
        "median_tpot_ms": 1000.0 * metrics.percentile(tpots, 50) if tpots else None,
        "p90_tpot_ms": 1000.0 * metrics.percentile(tpots, 90) if tpots else None,
        "median_ttft_ms": 1000.0 * metrics.percentile(ttfts, 50) if ttfts else None,
        "p99_ttft_ms": 1000.0 * metrics.percentile(ttfts, 99) if ttfts else None,
    }
    pools = Counter(t.backend for t in done if t.backend)
    if pools:
        n = sum(pools.values())
        rec["backend_share"] = {k: v / n for k, v in sorted(pools.items())}
    return rec


def records_of(
    variant: str,
    plan: Sequence[tuple[int, int]],
    traces: Sequence[RequestTrace],
    windows: Sequence[tuple[float, float]],
    extra: dict[str, Any],
) -> list[Record]:
    """One record per step and one per cycle (``"scope": "cycle"``)."""
    ok = [t for t in traces if t.success]
    chunks = sum(len(t.chunk_times) for t in ok)
    per_chunk = sum(t.output_tokens for t in ok) / chunks if chunks else 1.0
    t0 = windows[0][0] if windows else 0.0
    out: list[Record] = []
    for i, ((cycle, c), (a, b)) in enumerate(zip(plan, windows, strict=False)):
        rec: Record = {"target": variant, "scope": "step", "step": i, "cycle": cycle}
        rec["max_concurrency"] = c
        rec["step_start_s"] = a - t0
        rec.update(step_record(traces, a, b, per_chunk))
        rec.update(extra)
        out.append(rec)
    for cycle in sorted({k for k, _ in plan}):
        spans = [w for (k, _), w in zip(plan, windows, strict=False) if k == cycle]
        if not spans:
            continue
        a, b = spans[0][0], spans[-1][1]
        rec = {"target": variant, "scope": "cycle", "cycle": cycle}
        rec["max_concurrency"] = max(c for k, c in plan if k == cycle)
        rec["step_start_s"] = a - t0
        rec.update(step_record(traces, a, b, per_chunk))
        rec.update(extra)
        out.append(rec)
    return out


# ---- one run: fresh servers and routers, the levels, the ramp -----------------------------------


@dataclass(frozen=True)
class _Run:
    layout: str
    variant: str
    urls: tuple[str, ...]
    extra: dict[str, Any]


def _settle(run: _Run, cfg: ReplicasConfig) -> None:
    """Nothing in flight on any replica, by its count and its signal, before the next load."""
    if not harness.wait_idle(run.urls, cfg.startup_timeout):
        logger.warning("%s %s: replicas still not idle; going on", run.layout, run.variant)


async def _measure(
    run: _Run, cfg: ReplicasConfig, prompts: Prompts, progress: ProgressLine
) -> list[Record]:
    """The levels (the sweep's, every replica behind the variant's name), then the ramp."""
    steps = schedule(cfg.peak, cfg.cycles)
    replicas = tuple(Target(f"{run.variant}-{k}", u) for k, u in enumerate(run.urls))
    named = Target(run.variant, run.urls[0], replicas=replicas)
    scfg = dataclasses.replace(cfg.sweep, extra={**cfg.sweep.extra, **run.extra, "scope": "level"})

    def loadavg(rec: Record) -> None:
        rec["loadavg_1m"] = harness.load_average()

    started = time.perf_counter()
    records = await sweep([named], scfg, cfg.out, progress, on_record=loadavg,
                          on_start=lambda _: _settle(run, cfg))  # fmt: skip
    _settle(run, cfg)
    async with load.make_session(cfg.sweep.request_timeout) as session:
        model = await load.model_name(session, replicas[0])
        before = await _switches(session, run.urls)
        progress.begin(f"{run.layout} {run.variant} ramp 1..{cfg.peak}")
        traces, windows = await drive(
            session,
            replicas[0],
            model,
            prompts,
            steps=[c for _, c in steps],
            step_seconds=cfg.step_seconds,
            replicas=replicas,
        )
        after = await _switches(session, run.urls)
        ended = time.perf_counter()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    more = {**run.extra, "loadavg_1m": harness.load_average(), "timestamp": stamp}
    ramped = records_of(run.variant, steps, traces, windows, more)
    moved = switch_load(traces, windows, [c for _, c in steps])
    summary: Record = {
        "target": run.variant,
        "scope": "run",
        **more,
        "run_seconds": ended - started,
        "ramp_seconds": windows[-1][1] - windows[0][0] if windows else 0.0,
        "replica_switches": _totals(after),
        "ramp_replica_switches": _diff(after, before),
        "replica_switches_by_label": after,
        **moved,
    }
    for rec in [*ramped, summary]:
        append_jsonl(cfg.out, rec)
    progress.end(
        f"switch load {moved.get('switch_load', '-')}, switches {_totals(after)} "
        f"in {ended - started:.0f} s"
    )
    return [*records, *ramped, summary]


def run_one(
    cfg: ReplicasConfig,
    layout: str,
    variant: str,
    *,
    settings: dict[str, Any],
    prompts: Prompts,
    progress: ProgressLine,
) -> list[Record]:
    """One layout and variant on fresh servers and routers, all stopped at the end."""
    n, signal = ways.REPLICA_VARIANTS[variant]
    way = ways.REPLICA_LAYOUTS[layout]
    thr, hyst = int(settings["threshold"]), int(settings["hysteresis"])
    with harness.processes() as procs:
        servers = harness.start_servers(procs, ways.needs(way), cfg)
        router = ways.replica_router(
            way,
            servers,
            threshold=thr,
            hysteresis=hyst,
            signal=signal,
            load_interval=settings["load_interval"],
        )
        urls = tuple(
            harness.start_router(procs, f"router-{k}", router, cfg.startup_timeout)[0]
            for k in range(n)
        )
        extra = {
            **settings,
            "layout": layout,
            "replicas": n,
            "load_signal": signal,
            "loadavg_start": harness.load_average(),
        }
        run = _Run(layout, variant, urls, extra)
        return asyncio.run(_measure(run, cfg, prompts, progress))


def run(cfg: ReplicasConfig, progress: ProgressLine | None = None) -> list[Record]:
    """Every layout and variant, one after the other; records go to ``cfg.out`` as they end."""
    progress = progress or ProgressLine(enabled=False)
    suggestion = profile_suggestion(load_profile(cfg.profile))
    thr = suggestion.threshold if cfg.threshold is None else cfg.threshold
    hyst = suggestion.hysteresis if cfg.hysteresis is None else cfg.hysteresis
    settings: dict[str, Any] = {
        **harness.run_metadata("replicas", cfg.profile, cfg.speed, cfg.command),
        "threshold": thr,
        "hysteresis": hyst,
        "threshold_by_hand": cfg.threshold is not None,
        "load_interval": load_interval(cfg),
        "sharing": cfg.sharing,
        "step_seconds": cfg.step_seconds,
        "peak": cfg.peak,
        "requests_per_c": cfg.sweep.requests_per_c,
        "min_requests": cfg.sweep.min_requests,
        "dataset_name": "sharegpt" if cfg.sweep.dataset else "random",
        "random_input_len": cfg.sweep.input_len,
        "random_output_len": cfg.sweep.output_len,
        "random_range_ratio": cfg.sweep.range_ratio,
        "prompt_pool": cfg.sweep.prompt_pool,
    }
    prompts = sweep_prompts(cfg.sweep)
    cfg.out.write_text("", encoding="utf-8")
    records: list[Record] = []
    for layout, variant in plan(cfg):
        records += run_one(
            cfg, layout, variant, settings=settings, prompts=prompts, progress=progress
        )
    return records
