"""A load that changes: closed-loop concurrency stepped 1 -> peak -> 1, more than once
(``schedule``, ``drive``), on routers that learn from nothing and their twins seeded with the
profile, one after the other on the same simulated servers. Per step and per cycle: the tok/s
delivered inside the window and the p50 TPOT / TTFT of the requests that ended in it
(``records_of``). What it asks and the goals: docs/benchmarks.md, "ramp". Everything is SIMULATED.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from dynspec.bench import harness, load, metrics, ways
from dynspec.bench.load import Target
from dynspec.bench.metrics import RequestTrace
from dynspec.bench.procs import stop_group
from dynspec.bench.report import Record, append_jsonl
from dynspec.bench.ways import RAMP_PAIRS, RAMP_VARIANTS
from dynspec.launcher.sim.profile import load_profile

logger = logging.getLogger(__name__)

VARIANTS = RAMP_VARIANTS
PAIRS = RAMP_PAIRS  # (learning only, profile-seeded, goal: within this fraction after cycle 1)


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


@dataclass(frozen=True)
class RampConfig:
    profile: str
    speed: float
    out: Path
    peak: int = 256
    cycles: int = 2
    step_seconds: float = 10.0
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 1.0
    seed: int = 0
    prompt_pool: int = 0  # 0: a new random prompt for every request (load.Prompts)
    variants: Sequence[str] = VARIANTS
    metrics_interval: float | None = None
    sharing: str = "timeslice"
    startup_timeout: float = 60.0
    request_timeout: float = 600.0
    command: str = ""


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


async def _ramp(
    url: str,
    variant: str,
    cfg: RampConfig,
    prompts: load.Prompts,
    plan: Sequence[tuple[int, int]],
) -> tuple[list[RequestTrace], list[tuple[float, float]]]:
    async with load.make_session(cfg.request_timeout) as session:
        target = Target(variant, url)
        model = await load.model_name(session, target)
        steps = [c for _, c in plan]
        return await drive(
            session, target, model, prompts, steps=steps, step_seconds=cfg.step_seconds
        )


def run(cfg: RampConfig) -> list[Record]:
    """Run every variant, one after the other, on the same servers (``balance-*`` on an EAGLE and
    a baseline server of their own, ``paired-auto*`` on one shared GPU); records go to
    ``cfg.out`` as each variant ends."""
    prof = load_profile(cfg.profile)
    plan = schedule(cfg.peak, cfg.cycles)
    prompts = load.Prompts.random(cfg.prompt_pool, cfg.input_len, cfg.output_len, cfg.seed,
                                  cfg.range_ratio)  # fmt: skip
    extra: dict[str, Any] = {
        **harness.run_metadata("ramp", cfg.profile, cfg.speed, cfg.command),
        "step_seconds": cfg.step_seconds,
        "dataset_name": "random",
        "random_input_len": cfg.input_len,
        "random_output_len": cfg.output_len,
        "random_range_ratio": cfg.range_ratio,
        "prompt_pool": cfg.prompt_pool,
        "sharing": cfg.sharing,
    }
    cfg.out.write_text("", encoding="utf-8")
    records: list[Record] = []
    split = int(any(v.startswith("balance") for v in cfg.variants))
    shared = int(any(v.startswith("paired") for v in cfg.variants))
    with harness.processes() as procs:
        want = {"eagle": split, "baseline": split, "shared_gpus": shared}
        servers = harness.start_servers(procs, want, cfg)
        path = harness.router_profile(procs, prof, cfg.speed)
        for variant in cfg.variants:
            router = ways.variant_router(
                variant, servers, profile=path, metrics_interval=cfg.metrics_interval
            )
            url, proc = harness.start_router(
                procs, f"router-{variant}", router, cfg.startup_timeout
            )
            load_before = harness.load_average()

            traces, windows = asyncio.run(_ramp(url, variant, cfg, prompts, plan))
            stop_group(proc)
            stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            more = {**extra, "loadavg_1m": load_before, "timestamp": stamp}
            recs = records_of(variant, plan, traces, windows, more)
            for rec in recs:
                append_jsonl(cfg.out, rec)
            records += recs
    return records
