"""The overhead benchmark's runs: one load-generator process per run with the routers' CPU and
RSS over exactly its measured window, the phases that run every target in turn, and the soak."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dynspec.bench.host import RssSampler, cpu_seconds, machine, rss_bytes
from dynspec.bench.overhead_analysis import cost_model, summarize
from dynspec.bench.overhead_plan import (
    RELAYS,
    OverheadConfig,
    Service,
    Workload,
    services,
    workloads,
)
from dynspec.bench.procs import Children, stop_group

log = logging.getLogger(__name__)


def run_load(
    urls: Sequence[str],
    workload: Workload,
    watch: dict[str, int],
    max_seconds: float,
    *,
    warmup: bool = True,
    stagger_ms: float = 0.0,
) -> dict[str, Any]:
    """One load-generator process; CPU of the watched processes over the measured window only.

    The generator warms up, says ``warm`` and waits for a line on stdin, so that the warm-up's
    requests are outside the window.
    """
    argv = [sys.executable, "-m", "dynspec.bench.overhead_load"]
    for u in urls:
        argv += ["--url", u]
    argv += [
        "--concurrency", str(workload.concurrency),
        "--requests", str(workload.requests),
        "--tokens", str(workload.tokens),
        "--max-seconds", str(max_seconds),
        "--warmup", str(workload.concurrency if warmup else 0),
        "--stagger-ms", str(stagger_ms),
        "--handshake",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = _readline(proc, max_seconds + 120)
        if line.strip() != b"warm":
            raise RuntimeError(f"load generator did not warm up: {line[:200]!r}")
        before = {name: cpu_seconds(pid) for name, pid in watch.items()}
        with RssSampler(watch) as rss:
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            line = _readline(proc, max_seconds + 120)
            after = {name: cpu_seconds(pid) for name, pid in watch.items()}
        if not line:
            raise RuntimeError(f"load generator ended without a result (exit {proc.wait()})")
        result: dict[str, Any] = json.loads(line)
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    result["cpu_s"] = {name: round(after[name] - before[name], 3) for name in watch}
    result["rss_peak_mb"] = {name: round(v / 2**20, 1) for name, v in rss.peak.items()}
    result["loadgen_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    return result


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        stop_group(proc)
        raise RuntimeError(f"load generator silent for {timeout:.0f}s")
    return proc.stdout.readline()


@contextlib.contextmanager
def started(
    phase: Sequence[Service], log_dir: Path, timeout: float = 60.0
) -> Iterator[dict[str, int]]:
    """Start every child of a phase at once, wait until each is ready, always stop them all.

    Yields each child's pid by name. Logs are appended: a name comes back in every phase.
    """
    with Children(log_dir) as children:
        procs = [children.start(svc.name, svc.argv, env=svc.env, append=True) for svc in phase]
        for svc, proc in zip(phase, procs, strict=True):
            children.wait_ready(proc, svc.ready_url, timeout, name=svc.name)
        yield {svc.name: proc.pid for svc, proc in zip(phase, procs, strict=True)}


def run_benchmark(s: OverheadConfig) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    memory: dict[str, dict[str, Any]] = {}
    # Before anything starts: the routers run the code on disk now.
    host = machine()
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    s.log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dynspec-overhead-model-") as model_dir:
        for interval in s.intervals_ms:
            phase, urls = services(s, interval, Path(model_dir))
            with started(phase, s.log_dir) as pids:
                routers = {name: pid for name, pid in pids.items() if name in RELAYS}
                upstream_pids = {
                    name: pid for name, pid in pids.items() if name.startswith("upstream")
                }
                for name, pid in routers.items():
                    memory.setdefault(name, {})[f"idle_mb_{interval:g}ms"] = round(
                        rss_bytes(pid) / 2**20, 1
                    )
                watch = {**routers, **upstream_pids}
                # Run sets: every workload and target once per set, so a slow spell of a shared
                # machine lands on all levels alike rather than on one.
                for run in range(1, s.runs + 1):
                    for workload in workloads(s, interval):
                        for target in s.targets:
                            result = run_load(
                                urls[target].split(","),
                                workload,
                                watch,
                                s.max_seconds,
                                stagger_ms=s.stagger_for(workload),
                            )
                            record = {
                                "interval_ms": workload.interval_ms,
                                "concurrency": workload.concurrency,
                                "tokens": workload.tokens,
                                "target": target,
                                "run": run,
                                **result,
                            }
                            record["router_cpu_s"] = result["cpu_s"].get(target)
                            record["upstream_cpu_s"] = round(
                                sum(
                                    v
                                    for k, v in result["cpu_s"].items()
                                    if k.startswith("upstream")
                                ),
                                3,
                            )
                            runs.append(record)
                            log.info(
                                "%gms C=%d tokens=%d %s run %d: %.1f req/s, %.0f chunks/s, "
                                "TTFT p50 %s ms, router cpu %s s, bad %d",
                                workload.interval_ms, workload.concurrency, workload.tokens, target,
                                run, result["requests_per_s"], result["chunks_per_s"],
                                result["ttft_ms"]["p50"], record["router_cpu_s"],
                                result["bad_streams"],
                            )  # fmt: skip
                for name, pid in routers.items():
                    served = sum(
                        r["requests_ok"]
                        for r in runs
                        if r["target"] == name and r["interval_ms"] == interval
                    )
                    memory[name][f"after_{interval:g}ms_phase_mb"] = round(
                        rss_bytes(pid) / 2**20, 1
                    )
                    memory[name][f"requests_served_{interval:g}ms_phase"] = served
                if s.soak and interval == s.intervals_ms[-1]:
                    for name, pid in routers.items():
                        memory[name]["soak"] = soak(urls[name], pid, s)
    for name, values in memory.items():
        peaks = [
            r["rss_peak_mb"].get(name, 0.0) for r in runs if r["concurrency"] == max(s.concurrency)
        ]
        values["peak_mb_at_max_c"] = max(peaks, default=None)
    return {
        "machine": host,
        "date": started_at,
        "settings": {
            "targets": s.targets,
            "intervals_ms": s.intervals_ms,
            "concurrency": s.concurrency,
            "tokens": s.tokens,
            "cost_tokens": s.cost_tokens,
            "cost_concurrency": s.cost_concurrency,
            "cost_interval_ms": s.cost_interval_ms,
            "runs": s.runs,
            "max_seconds": s.max_seconds,
            "threshold": s.threshold,
            "stagger_ms": "one stream's duration" if s.stagger_ms is None else s.stagger_ms,
            "dynspec_args": s.dynspec_args,
            "sglang_args": s.sglang_args,
            "chunk": "one SSE event received by the client (role, tokens, finish, usage, [DONE])",
        },
        "runs": runs,
        "summary": summarize(runs),
        "cost_model": cost_model(runs, s),
        "memory": memory,
    }


def soak(url: str, pid: int, s: OverheadConfig) -> dict[str, Any]:
    """Serve ``s.soak`` requests at C=64 in ten slices; RSS after each shows growth or not."""
    slices = 10
    per = max(1, s.soak // slices)
    workload = Workload(s.intervals_ms[-1], 64, s.tokens, per)
    points: list[dict[str, float]] = [{"requests": 0, "rss_mb": round(rss_bytes(pid) / 2**20, 1)}]
    served = 0
    for _ in range(slices):
        result = run_load(
            [url], workload, {"router": pid}, max(s.max_seconds, 3600.0), warmup=False
        )
        served += int(result["requests_ok"])
        points.append({"requests": served, "rss_mb": round(rss_bytes(pid) / 2**20, 1)})
        log.info("soak %d requests: router RSS %.1f MB", served, points[-1]["rss_mb"])
    # Growth after the first slice (allocator pools and caches fill during it).
    first, last = points[1]["rss_mb"], points[-1]["rss_mb"]
    return {
        "points": points,
        "growth_mb_after_first_slice": round(last - first, 1),
        "growth_kb_per_1k_requests": round(
            (last - first) * 1024 / max(1, (served - per) / 1000), 2
        ),
    }
