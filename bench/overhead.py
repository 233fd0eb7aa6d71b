"""Router hot-path overhead: one streaming load direct, through dynspec-router and SGLang's router.

Every piece is its own process: two lean SGLang-like upstreams (``overhead_upstream``), the routers
under test, and one closed-loop load generator per run (``overhead_load``). For each configuration
(token interval, concurrency C, tokens per stream) the targets take turns, run after run, so slow
drifts of a shared machine spread over all of them. Per run it records the load generator's
requests/s, SSE events/s and TTFT percentiles, and each router's CPU seconds (utime + stime of the
process, all its threads and any child processes, from /proc) over exactly the measured window.

From runs of two stream lengths at one concurrency it solves ``cpu = chunks * a + requests * b``
(least squares over all runs) for each router's cost per relayed chunk ``a`` and per request ``b``.
A "chunk" is one SSE event the client received: role, each token, finish, usage and ``[DONE]``.

Results go to ``OUT.json`` and ``OUT.md``. Run ``python -m dynspec.bench.overhead --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from dynspec.bench.procs import free_port, stop_group
from dynspec.common.cli import FlagParser, UsageError, add_log_level, configure_logging, run_main

log = logging.getLogger(__name__)

# "floor" is a reference, not a router: the cheapest relay Python can be (overhead_floor.py).
# "floor-asgi" is the same on uvicorn with a bare ASGI app, as the router's client side is.
TARGETS = ("direct", "floor", "floor-asgi", "dynspec", "sglang")
RELAYS = ("floor", "floor-asgi", "dynspec", "sglang")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CHAT = "/v1/chat/completions"


# -- /proc ----------------------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc/<pid>/task/<tid>/children."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) and of its live descendants, plus their reaped
    children, in seconds."""
    total = 0
    for p in _descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = _stat_fields(p)
            # After the name: state is field 3, so utime (14), stime (15), cutime (16), cstime (17)
            # sit at offsets 11..14.
            total += sum(int(x) for x in fields[11:15])
    return total / CLK_TCK


def rss_bytes(pid: int) -> int:
    total = 0
    for p in _descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{p}/statm") as f:
            total += int(f.read().split()[1]) * PAGE
    return total


class RssSampler:
    """Largest RSS of some processes while a block runs, sampled by a thread."""

    def __init__(self, pids: dict[str, int], period: float = 0.2) -> None:
        self.pids = pids
        self.period = period
        self.peak: dict[str, int] = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            self.peak[name] = max(self.peak[name], rss_bytes(pid))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- processes ------------------------------------------------------------------------------------
def _http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


@dataclass
class Service:
    name: str
    argv: list[str]
    ready_url: str
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@contextlib.contextmanager
def started(services: Sequence[Service], log_dir: Path, timeout: float = 60.0) -> Iterator[None]:
    """Start each service in its own process group, wait until ready, always stop them all."""
    try:
        for svc in services:
            logf = open(log_dir / f"{svc.name}.log", "ab")  # noqa: SIM115 - closed with the process
            log.debug("starting %s: %s", svc.name, " ".join(svc.argv))
            svc.proc = subprocess.Popen(
                svc.argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **svc.env},
            )
            logf.close()
        for svc in services:
            deadline = time.monotonic() + timeout
            assert svc.proc is not None
            while _http_status(svc.ready_url) != 200:
                if svc.proc.poll() is not None:
                    raise RuntimeError(
                        f"{svc.name} exited with {svc.proc.returncode} before ready "
                        f"(see {log_dir / (svc.name + '.log')})"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{svc.name} not ready at {svc.ready_url} within {timeout:.0f}s"
                    )
                time.sleep(0.1)
        yield
    finally:
        for svc in services:
            if svc.proc is not None:
                stop_group(svc.proc)


def dynspec_available() -> str | None:
    """None when ``python -m dynspec.router`` can run, else why not."""
    if find_spec("dynspec.router.__main__") is None:
        return "dynspec.router has no __main__ yet (router not landed)"
    return None


def sglang_available() -> str | None:
    if find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install sglang-router)"
    return None


# -- one load run ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    interval_ms: float
    concurrency: int
    tokens: int
    requests: int


def run_load(
    urls: Sequence[str],
    level: Level,
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
        "--concurrency", str(level.concurrency),
        "--requests", str(level.requests),
        "--tokens", str(level.tokens),
        "--max-seconds", str(max_seconds),
        "--warmup", str(level.concurrency if warmup else 0),
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


# -- the benchmark --------------------------------------------------------------------------------
@dataclass
class Settings:
    targets: list[str]
    intervals_ms: list[float]
    concurrency: list[int]
    tokens: int
    cost_tokens: list[int]
    cost_concurrency: int
    cost_interval_ms: float
    runs: int
    requests: dict[int, int]
    max_seconds: float
    threshold: int
    soak: int
    out: Path
    log_dir: Path
    dynspec_args: list[str]
    sglang_args: list[str]
    # None: one stream's duration (tokens x interval); else milliseconds.
    stagger_ms: float | None = None
    min_unpaced_requests: int = 300

    def stagger_for(self, level: Level) -> float:
        if self.stagger_ms is not None:
            return self.stagger_ms
        return level.tokens * level.interval_ms


def _requests_for(s: Settings, c: int, tokens: int, interval: float) -> int:
    n = s.requests.get(c)
    if n is None:
        n = max(c * 8, 30)
    if interval == 0:
        # Unpaced streams end in about a millisecond: enough of them to last a while.
        n = max(n, s.min_unpaced_requests)
    # Long streams: as many chunks as the short ones would carry, but at least four rounds.
    if tokens > s.tokens:
        n = max(c * 4, n * s.tokens // tokens)
    return n


def _levels(s: Settings, interval: float) -> list[Level]:
    levels = [
        Level(interval, c, s.tokens, _requests_for(s, c, s.tokens, interval)) for c in s.concurrency
    ]
    if interval == s.cost_interval_ms:
        for t in s.cost_tokens:
            lv = Level(
                interval, s.cost_concurrency, t, _requests_for(s, s.cost_concurrency, t, interval)
            )
            if lv not in levels:
                levels.append(lv)
    return levels


def _services(
    s: Settings, interval: float, model_dir: Path
) -> tuple[list[Service], dict[str, str]]:
    """The upstreams and routers of one phase, and each target's chat URL."""
    py = sys.executable
    ups: list[Service] = []
    for i in (1, 2):
        port = free_port()
        ups.append(
            Service(
                f"upstream{i}-{interval:g}ms",
                [
                    py, "-m", "dynspec.bench.overhead_upstream", "--port", str(port),
                    "--interval-ms", str(interval), "--model-path", str(model_dir),
                    "--log-level", "warning",
                ],
                f"http://127.0.0.1:{port}/health",
            )
        )  # fmt: skip
    up_urls = [svc.ready_url.removesuffix("/health") for svc in ups]
    services = list(ups)
    urls = {"direct": ",".join(u + CHAT for u in up_urls)}
    for name, mode in (("floor", "protocol"), ("floor-asgi", "asgi")):
        if name not in s.targets:
            continue
        port = free_port()
        services.append(
            Service(
                name,
                [
                    py, "-m", "dynspec.bench.overhead_floor", "--port", str(port), "--mode", mode,
                    "--upstream", up_urls[0], "--upstream", up_urls[1], "--log-level", "warning",
                ],
                f"http://127.0.0.1:{port}/health",
            )
        )  # fmt: skip
        urls[name] = f"http://127.0.0.1:{port}{CHAT}"
    if "dynspec" in s.targets:
        port = free_port()
        services.append(
            Service(
                "dynspec",
                [
                    py, "-m", "dynspec.router",
                    "--eagle-url", up_urls[0], "--baseline-url", up_urls[1],
                    "--threshold", str(s.threshold), "--host", "127.0.0.1", "--port", str(port),
                    *s.dynspec_args,
                ],
                f"http://127.0.0.1:{port}/health",
            )
        )  # fmt: skip
        urls["dynspec"] = f"http://127.0.0.1:{port}{CHAT}"
    if "sglang" in s.targets:
        port = free_port()
        services.append(
            Service(
                "sglang",
                [
                    py, "-m", "sglang_router.launch_router", "--worker-urls", *up_urls,
                    "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                    *s.sglang_args,
                ],
                f"http://127.0.0.1:{port}/readiness",
                # The upstreams report a local, empty model directory, so the Rust router looks for
                # a tokenizer there; these keep any hub fallback on this machine.
                env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
            )
        )  # fmt: skip
        urls["sglang"] = f"http://127.0.0.1:{port}{CHAT}"
    return services, urls


def _routers(services: Sequence[Service]) -> dict[str, int]:
    return {svc.name: svc.pid for svc in services if svc.name in RELAYS}


def run_benchmark(s: Settings) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    memory: dict[str, dict[str, Any]] = {}
    # Before anything starts: the routers run the code on disk now.
    host = machine()
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    s.log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dynspec-overhead-model-") as model_dir:
        for interval in s.intervals_ms:
            services, urls = _services(s, interval, Path(model_dir))
            with started(services, s.log_dir):
                routers = _routers(services)
                upstream_pids = {
                    svc.name: svc.pid for svc in services if svc.name.startswith("upstream")
                }
                for name, pid in routers.items():
                    memory.setdefault(name, {})[f"idle_mb_{interval:g}ms"] = round(
                        rss_bytes(pid) / 2**20, 1
                    )
                watch = {**routers, **upstream_pids}
                # Run sets: every level and target once per set, so a slow spell of a shared
                # machine lands on all levels alike rather than on one.
                for run in range(1, s.runs + 1):
                    for level in _levels(s, interval):
                        for target in s.targets:
                            result = run_load(
                                urls[target].split(","),
                                level,
                                watch,
                                s.max_seconds,
                                stagger_ms=s.stagger_for(level),
                            )
                            record = {
                                "interval_ms": level.interval_ms,
                                "concurrency": level.concurrency,
                                "tokens": level.tokens,
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
                                level.interval_ms, level.concurrency, level.tokens, target,
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


def soak(url: str, pid: int, s: Settings) -> dict[str, Any]:
    """Serve ``s.soak`` requests at C=64 in ten slices; RSS after each shows growth or not."""
    slices = 10
    per = max(1, s.soak // slices)
    level = Level(s.intervals_ms[-1], 64, s.tokens, per)
    points: list[dict[str, float]] = [{"requests": 0, "rss_mb": round(rss_bytes(pid) / 2**20, 1)}]
    served = 0
    for _ in range(slices):
        result = run_load([url], level, {"router": pid}, max(s.max_seconds, 3600.0), warmup=False)
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


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("aiohttp", "uvicorn", "uvloop", "httptools", "sglang-router"):
        with contextlib.suppress(PackageNotFoundError):
            versions[pkg] = version(pkg)
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        here = Path(__file__).parent
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=here,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "../router"],
            capture_output=True,
            text=True,
            cwd=here,
            check=False,
        ).stdout.strip()
        if commit and dirty:
            commit += " (router/ with uncommitted changes)"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "commit": commit,
    }


# -- analysis -------------------------------------------------------------------------------------
def _med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _rng(values: Sequence[float | None]) -> list[float] | None:
    vals = [v for v in values if v is not None]
    return [min(vals), max(vals)] if vals else None


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (interval, C, tokens, target): medians over runs, ranges, ratios to direct."""
    keys: list[tuple[float, int, int, str]] = []
    for r in runs:
        k = (r["interval_ms"], r["concurrency"], r["tokens"], r["target"])
        if k not in keys:
            keys.append(k)
    rows: list[dict[str, Any]] = []
    for interval, c, tokens, target in keys:
        group = [
            r
            for r in runs
            if (r["interval_ms"], r["concurrency"], r["tokens"], r["target"])
            == (interval, c, tokens, target)
        ]
        direct = [
            r
            for r in runs
            if (r["interval_ms"], r["concurrency"], r["tokens"], r["target"])
            == (interval, c, tokens, "direct")
        ]
        rps = _med([r["requests_per_s"] for r in group])
        cps = _med([r["chunks_per_s"] for r in group])
        p50 = _med([r["ttft_ms"]["p50"] for r in group])
        p99 = _med([r["ttft_ms"]["p99"] for r in group])
        d_rps = _med([r["requests_per_s"] for r in direct])
        d_p50 = _med([r["ttft_ms"]["p50"] for r in direct])
        d_p99 = _med([r["ttft_ms"]["p99"] for r in direct])
        cpu_per_k = _med(
            [
                r["router_cpu_s"] / r["events"] * 1000
                if r.get("router_cpu_s") is not None and r["events"]
                else None
                for r in group
            ]
        )
        rows.append(
            {
                "interval_ms": interval,
                "concurrency": c,
                "tokens": tokens,
                "target": target,
                "runs": len(group),
                "requests_per_s": rps,
                "requests_per_s_range": _rng([r["requests_per_s"] for r in group]),
                "x_direct": round(rps / d_rps, 3) if rps is not None and d_rps else None,
                "chunks_per_s": cps,
                "ttft_p50_ms": p50,
                "ttft_p50_range": _rng([r["ttft_ms"]["p50"] for r in group]),
                "ttft_p99_ms": p99,
                "added_ttft_p50_ms": round(p50 - d_p50, 3)
                if p50 is not None and d_p50 is not None
                else None,
                "added_ttft_p99_ms": round(p99 - d_p99, 3)
                if p99 is not None and d_p99 is not None
                else None,
                "router_cpu_s_per_1k_chunks": round(cpu_per_k, 4)
                if cpu_per_k is not None
                else None,
                "bad_streams": sum(r["bad_streams"] for r in group),
                "failed": sum(r["requests_failed"] + r["requests_unfinished"] for r in group),
            }
        )
    return rows


def solve_cost(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least squares of ``cpu = chunks * a + requests * b`` over (chunks, requests, cpu) samples."""
    sxx = sum(x * x for x, _, _ in samples)
    syy = sum(y * y for _, y, _ in samples)
    sxy = sum(x * y for x, y, _ in samples)
    sxc = sum(x * c for x, _, c in samples)
    syc = sum(y * c for _, y, c in samples)
    det = sxx * syy - sxy * sxy
    # Two stream lengths make the system well posed; one length alone leaves it singular.
    if not samples or abs(det) <= 1e-9 * max(sxx * syy, 1e-300):
        return None
    a = (sxc * syy - syc * sxy) / det
    b = (syc * sxx - sxc * sxy) / det
    return a, b


def cost_model(runs: Sequence[dict[str, Any]], s: Settings) -> dict[str, Any]:
    """Per router: ``a`` (per chunk) and ``b`` (per request) from the cost-model runs.

    On a shared machine a single run can be far off, so the estimate uses, for each stream
    length, the median over runs of CPU per request and chunks per request, and solves the
    resulting equations (least squares when more than two lengths). ``*_range`` solves each set of
    same-numbered runs on its own, to show the noise.
    """
    out: dict[str, Any] = {}
    if len(set(s.cost_tokens)) < 2:
        return out  # one stream length cannot separate the two costs
    for target in s.targets:
        if target == "direct":
            continue
        picked = [
            r
            for r in runs
            if r["target"] == target
            and r["concurrency"] == s.cost_concurrency
            and r["interval_ms"] == s.cost_interval_ms
            and r["tokens"] in s.cost_tokens
            and r.get("router_cpu_s") is not None
            and r["requests_ok"] > 0
        ]
        by_len: dict[int, list[dict[str, Any]]] = {}
        for r in picked:
            by_len.setdefault(r["tokens"], []).append(r)

        def point(group: Sequence[dict[str, Any]]) -> tuple[float, float, float]:
            chunks = statistics.median(r["events"] / r["requests_ok"] for r in group)
            cpu = statistics.median(r["router_cpu_s"] / r["requests_ok"] for r in group)
            return (chunks, 1.0, cpu)

        solved = solve_cost([point(g) for g in by_len.values()]) if len(by_len) > 1 else None
        per_run: list[tuple[float, float]] = []
        for i in range(min((len(g) for g in by_len.values()), default=0)):
            one = solve_cost([point([g[i]]) for g in by_len.values()]) if len(by_len) > 1 else None
            if one is not None:
                per_run.append(one)
        out[target] = {
            "runs": len(picked),
            "chunk_us": round(solved[0] * 1e6, 2) if solved else None,
            "request_ms": round(solved[1] * 1e3, 4) if solved else None,
            "chunk_us_range": [
                round(min(a for a, _ in per_run) * 1e6, 2),
                round(max(a for a, _ in per_run) * 1e6, 2),
            ]
            if per_run
            else None,
            "request_ms_range": [
                round(min(b for _, b in per_run) * 1e3, 4),
                round(max(b for _, b in per_run) * 1e3, 4),
            ]
            if per_run
            else None,
            "samples": [
                {
                    "tokens": r["tokens"],
                    "chunks": r["events"],
                    "requests": r["requests_ok"],
                    "cpu_s": r["router_cpu_s"],
                }
                for r in picked
            ],
        }
    return out


# -- report ---------------------------------------------------------------------------------------
def _f(v: object, fmt: str = "{:.1f}") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return fmt.format(v)
    return str(v)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    st = result["settings"]
    lines = [
        "# Router hot-path overhead",
        "",
        f"Measured {result['date']} on {m['nproc']} x {m['cpu_model']}, Python {m['python']}, "
        f"{m['platform']}; commit {m['commit'] or '?'}; packages "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
        + ".",
        "",
        f"Closed loop, {st['runs']} runs per row (median; range in brackets), targets taking "
        f"turns. Streams of {st['tokens']} tokens unless stated; a chunk is {st['chunk']}. "
        "Load generator, two upstreams and each router are separate processes on one machine, "
        "so on a small machine wall-clock ratios also measure spare cores; router CPU is from "
        "/proc (all threads and children) over the measured window only.",
        "",
        "| interval | C | tokens | target | req/s | x direct | chunks/s | TTFT p50 ms | +p50 ms "
        "| TTFT p99 ms | +p99 ms | router CPU s / 1k chunks | bad / failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["summary"]:
        rr = r["requests_per_s_range"] or [None, None]
        direct = r["target"] == "direct"
        add50 = "" if direct else _f(r["added_ttft_p50_ms"], "{:+.2f}")
        add99 = "" if direct else _f(r["added_ttft_p99_ms"], "{:+.2f}")
        lines.append(
            f"| {r['interval_ms']:g} ms | {r['concurrency']} | {r['tokens']} | {r['target']} "
            f"| {_f(r['requests_per_s'])} [{_f(rr[0], '{:.0f}')}-{_f(rr[1], '{:.0f}')}] "
            f"| {_f(r['x_direct'], '{:.2f}')} | {_f(r['chunks_per_s'], '{:.0f}')} "
            f"| {_f(r['ttft_p50_ms'], '{:.2f}')} | {add50} "
            f"| {_f(r['ttft_p99_ms'], '{:.2f}')} | {add99} "
            f"| {_f(r['router_cpu_s_per_1k_chunks'], '{:.3f}')} "
            f"| {r['bad_streams']} / {r['failed']} |"
        )
    cm = result["cost_model"]
    if cm:
        lines += [
            "",
            f"## CPU cost model (C={st['cost_concurrency']}, {st['cost_interval_ms']:g} ms per "
            f"token, streams of {' and '.join(map(str, st['cost_tokens']))} tokens; medians per "
            "length of cpu per request = chunks per request x a + b; brackets: each run set alone)",
            "",
            "| router | runs | a: us per chunk | a / floor's a | b: ms per request "
            "| target a <= 25 us | target b <= 0.3 ms |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        # The floor's own a says what this machine charges for the bare relay (syscalls, loop);
        # the ratio to it travels between machines better than microseconds do.
        floor_a = cm.get("floor", {}).get("chunk_us")
        for name, c in cm.items():
            a, b = c["chunk_us"], c["request_ms"]
            ar = c.get("chunk_us_range") or [None, None]
            br = c.get("request_ms_range") or [None, None]
            ratio = f"{a / floor_a:.2f}" if a is not None and floor_a else "-"
            lines.append(
                f"| {name} | {c['runs']} | {_f(a)} [{_f(ar[0])} to {_f(ar[1])}] | {ratio} "
                f"| {_f(b, '{:.3f}')} [{_f(br[0], '{:.3f}')} to {_f(br[1], '{:.3f}')}] "
                f"| {'-' if a is None else ('met' if a <= 25 else 'not met')} "
                f"| {'-' if b is None else ('met' if b <= 0.3 else 'not met')} |"
            )
    targets = _target_checks(result)
    if targets:
        lines += [
            "",
            "## Targets at C=64",
            "",
            "| router | check | value | met |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {t} | {check} | {value} | {'yes' if ok else 'no'} |"
            for t, check, value, ok in targets
        ]
    mem = result["memory"]
    if mem:
        lines += [
            "",
            "## Router memory (RSS, MB)",
            "",
            "| router | measure | MB |",
            "| --- | --- | --- |",
        ]
        for name, vals in mem.items():
            for k, v in vals.items():
                if k == "soak":
                    points = ", ".join(f"{p['requests']:.0f}: {p['rss_mb']}" for p in v["points"])
                    lines.append(
                        f"| {name} | soak: growth after first slice (MB) "
                        f"| {v['growth_mb_after_first_slice']} (requests: MB {points}) |"
                    )
                else:
                    lines.append(f"| {name} | {k} | {v} |")
    command = result.get("command") or "python -m dynspec.bench.overhead"
    lines += ["", f"Reproduce: `{command}` (see `--help`).", ""]
    return "\n".join(lines)


def _target_checks(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    out: list[tuple[str, str, str, bool]] = []
    st = result["settings"]
    for r in result["summary"]:
        if r["target"] == "direct" or r["concurrency"] != 64 or r["tokens"] != st["tokens"]:
            continue
        label = f"{r['target']} ({r['interval_ms']:g} ms)"
        if r["x_direct"] is not None:
            out.append(
                (label, "req/s >= 0.95x direct", f"{r['x_direct']:.2f}x", r["x_direct"] >= 0.95)
            )
        if r["added_ttft_p50_ms"] is not None:
            out.append(
                (
                    label,
                    "added TTFT p50 <= 2 ms",
                    f"{r['added_ttft_p50_ms']:+.2f} ms",
                    r["added_ttft_p50_ms"] <= 2,
                )
            )
    return out


# -- command line ---------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _requests(text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for part in text.split(","):
        if part.strip():
            c, _, n = part.partition(":")
            out[int(c)] = int(n)
    return out


def build_parser(prog: str = "python -m dynspec.bench.overhead") -> FlagParser:
    p = FlagParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument(
        "--targets",
        default="direct,floor,floor-asgi,dynspec,sglang",
        help="comma list of direct, floor and floor-asgi (the cheapest Python relays, without and "
        "with an ASGI server: references, not routers), dynspec, sglang",
    )
    p.add_argument(
        "--intervals-ms", default="10,0", help="time between tokens of a stream, one phase each"
    )
    p.add_argument("--concurrency", default="1,64,256", help="closed-loop concurrency levels")
    p.add_argument("--tokens", type=int, default=16, help="tokens per stream in the main table")
    p.add_argument(
        "--cost-tokens",
        default="128,16",
        help="stream lengths for the CPU cost model ('' to skip it)",
    )
    p.add_argument(
        "--cost-concurrency", type=int, default=64, help="concurrency of the cost-model runs"
    )
    p.add_argument(
        "--cost-interval-ms", type=float, default=10.0, help="token interval of the cost-model runs"
    )
    p.add_argument("--runs", type=int, default=3, help="repeats of each configuration")
    p.add_argument(
        "--requests",
        default="1:30,64:1024,256:2048",
        help="requests per run for each concurrency, C:N,... (others: max(8C, 30); 0-ms phases "
        "at least 300); "
        "long streams get proportionally fewer",
    )
    p.add_argument(
        "--max-seconds", type=float, default=120.0, help="a run stops issuing requests after this"
    )
    p.add_argument("--threshold", type=int, default=8, help="dynspec-router --threshold")
    p.add_argument(
        "--stagger",
        default="auto",
        help="spread each run's first requests over this many ms; 'auto' is one stream's "
        "duration (steady state), 0 starts all C at once (lock-step bursts of C requests)",
    )
    p.add_argument(
        "--soak",
        type=int,
        default=0,
        help="after the last phase, serve this many requests (C=64) through each router, "
        "tracking its RSS (by hand, not in CI)",
    )
    p.add_argument("--out", default="bench/results/overhead", help="writes OUT.json and OUT.md")
    p.add_argument("--log-dir", default="", help="process logs (default: a temporary directory)")
    p.add_argument("--dynspec-args", default="", help="extra flags for dynspec-router, one string")
    p.add_argument("--sglang-args", default="", help="extra flags for SGLang's router, one string")
    add_log_level(p)
    return p


def settings_from(args: argparse.Namespace) -> tuple[Settings, list[str]]:
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise UsageError(
            f"--targets: unknown target {bad[0] if bad else '(none)'!r} "
            f"(choose from {', '.join(TARGETS)})"
        )
    skipped: list[str] = []
    for name, why in (("dynspec", dynspec_available()), ("sglang", sglang_available())):
        if name in targets and why:
            targets.remove(name)
            skipped.append(f"{name}: {why}")
    if "direct" not in targets:
        targets.insert(0, "direct")  # every ratio is against direct
    try:
        s = Settings(
            targets=targets,
            intervals_ms=_floats(args.intervals_ms),
            concurrency=_ints(args.concurrency),
            tokens=args.tokens,
            cost_tokens=_ints(args.cost_tokens),
            cost_concurrency=args.cost_concurrency,
            cost_interval_ms=args.cost_interval_ms,
            runs=args.runs,
            requests=_requests(args.requests),
            max_seconds=args.max_seconds,
            threshold=args.threshold,
            soak=args.soak,
            out=Path(args.out),
            log_dir=Path(args.log_dir)
            if args.log_dir
            else Path(tempfile.mkdtemp(prefix="dynspec-overhead-")),
            dynspec_args=shlex.split(args.dynspec_args),
            sglang_args=shlex.split(args.sglang_args),
            stagger_ms=None if args.stagger == "auto" else float(args.stagger),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if (
        not s.intervals_ms
        or not s.concurrency
        or min(s.concurrency) < 1
        or s.runs < 1
        or s.tokens < 1
    ):
        raise UsageError(
            "need at least one interval, concurrencies >= 1, --runs >= 1 and --tokens >= 1"
        )
    return s, skipped


def main(argv: Sequence[str] | None = None, prog: str = "python -m dynspec.bench.overhead") -> None:
    args = build_parser(prog).parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> None:
        if not Path("/proc/self/stat").exists():
            raise RuntimeError("needs Linux /proc to measure router CPU")
        s, skipped = settings_from(args)
        for why in skipped:
            log.warning("skipping %s", why)
        log.info("process logs in %s", s.log_dir)
        result = run_benchmark(s)
        result["skipped"] = skipped
        result["command"] = " ".join(
            shlex.quote(a)
            for a in ["python", "-m", "dynspec.bench.overhead", *(argv or sys.argv[1:])]
        )
        s.out.parent.mkdir(parents=True, exist_ok=True)
        s.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        s.out.with_suffix(".md").write_text(markdown(result))
        print(s.out.with_suffix(".md").read_text())
        if not args.log_dir:
            shutil.rmtree(s.log_dir, ignore_errors=True)

    run_main(prog, body, args.log_level)


if __name__ == "__main__":
    main()
