"""The envelope experiment: does the routed pair follow the better of its two servers?

One command: start an EAGLE and a baseline ``dynspec-sim`` on free loopback ports, sweep each alone,
let ``suggest-threshold`` pick the router's threshold and hysteresis from those two sweeps, start a
``dynspec-router`` with them, sweep it, and compare at every concurrency the routed output tok/s
with the better server's (goal >= 0.95x) and the routed p50 TPOT with the better server's (goal
<= 1.05x).

Simulated time runs ``speed`` times faster than wall-clock time, so the reported figures are
converted back to model time (durations x speed, rates / speed); ratios do not depend on it. The
router's own cost is wall-clock and does not scale: a high speed inflates it in model time, and the
machine's CPU (client, router and both simulators share it) bounds the chunk rate that can be
measured. ``schedule`` in the table is the measured p50 TPOT over what the profile predicts for a
single server; near 1.00 means the simulator kept to its schedule and the client kept up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dynspec.bench import report, threshold
from dynspec.bench.load import Target
from dynspec.bench.report import Record
from dynspec.bench.sweep import ProgressLine, SweepConfig, sweep
from dynspec.launcher.sim.profile import Profile, load_profile

logger = logging.getLogger(__name__)

THROUGHPUT_GOAL = 0.95
TPOT_GOAL = 1.05
# Wall-clock durations (ms or s) and per-second rates in a record, converted to model time.
_TIME_KEYS = ("duration",)
_RATE_KEYS = ("request_throughput", "input_throughput", "output_throughput", "total_throughput")


@dataclass(frozen=True)
class EnvelopeConfig:
    profile: str
    speed: float
    sweep: SweepConfig
    out: Path
    threshold: int | None = None
    hysteresis: int | None = None
    seed: int = 0
    startup_timeout: float = 60.0
    extra_sim_args: Sequence[str] = ()
    extra_router_args: Sequence[str] = ()


@dataclass
class EnvelopeResult:
    records: list[Record]
    suggestion: threshold.Suggestion
    threshold: int
    hysteresis: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_seconds: float = 0.0


def model_time(rec: Record, speed: float) -> Record:
    """A copy of a level record in model time: durations x speed, rates / speed."""
    out = dict(rec)
    for k, v in rec.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if k.endswith("_ms") or k in _TIME_KEYS:
            out[k] = v * speed
        elif k in _RATE_KEYS:
            out[k] = v / speed
    return out


def expected_tpot_ms(profile: Profile, mode: str, c: int) -> float:
    """The p50 TPOT the profile predicts for one server at closed-loop concurrency ``c``."""
    m = profile.mode(mode)
    limit = m.max_running_requests or (48 if mode == "eagle" else 1024)
    b = min(c, limit)
    return 1000.0 * b / m.throughput_at(b)


def compare(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per concurrency: the routed target against the better single server, per metric."""
    by: dict[tuple[str, int], Record] = {
        (str(r["target"]), int(r["max_concurrency"])): r for r in records
    }
    rows: list[dict[str, Any]] = []
    for c in sorted({c for t, c in by if t == "routed"}):
        e, b, r = by.get(("eagle", c)), by.get(("baseline", c)), by[("routed", c)]
        if e is None or b is None:
            continue
        best_tp = max(e["output_throughput"], b["output_throughput"])
        best_tpot = min(e["median_tpot_ms"], b["median_tpot_ms"])
        tp_ratio = r["output_throughput"] / best_tp if best_tp > 0 else math.nan
        tpot_ratio = r["median_tpot_ms"] / best_tpot if best_tpot > 0 else math.nan
        share = r.get("backend_share") or {}
        rows.append(
            {
                "max_concurrency": c,
                "eagle_output_throughput": e["output_throughput"],
                "baseline_output_throughput": b["output_throughput"],
                "routed_output_throughput": r["output_throughput"],
                "throughput_ratio": tp_ratio,
                "eagle_median_tpot_ms": e["median_tpot_ms"],
                "baseline_median_tpot_ms": b["median_tpot_ms"],
                "routed_median_tpot_ms": r["median_tpot_ms"],
                "tpot_ratio": tpot_ratio,
                "eagle_share": float(share.get("eagle", 0.0)),
                "mode_switches": r.get("mode_switches"),
                "routed_concurrency": r["concurrency"],
                "throughput_ok": tp_ratio >= THROUGHPUT_GOAL,
                "tpot_ok": tpot_ratio <= TPOT_GOAL,
            }
        )
    return rows


def envelope_table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| C | EAGLE tok/s | baseline tok/s | routed tok/s | routed / best tok/s"
        " | EAGLE TPOT p50 ms | baseline TPOT p50 ms | routed TPOT p50 ms | routed / best TPOT"
        " | routed to EAGLE | switches | in envelope |"
    )
    lines = [head, "|" + " --- |" * 12]
    for w in rows:
        ok = w["throughput_ok"] and w["tpot_ok"]
        lines.append(
            f"| {w['max_concurrency']} | {w['eagle_output_throughput']:.1f}"
            f" | {w['baseline_output_throughput']:.1f} | {w['routed_output_throughput']:.1f}"
            f" | {w['throughput_ratio']:.3f} | {w['eagle_median_tpot_ms']:.2f}"
            f" | {w['baseline_median_tpot_ms']:.2f} | {w['routed_median_tpot_ms']:.2f}"
            f" | {w['tpot_ratio']:.3f} | {100 * w['eagle_share']:.0f}%"
            f" | {'-' if w['mode_switches'] is None else w['mode_switches']}"
            f" | {'yes' if ok else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def misses(rows: Sequence[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for w in rows:
        bits = []
        if not w["throughput_ok"]:
            bits.append(f"routed tok/s {w['throughput_ratio']:.3f}x the better server's")
        if not w["tpot_ok"]:
            bits.append(f"routed p50 TPOT {w['tpot_ratio']:.3f}x the better server's")
        if bits:
            bits.append(f"{100 * w['eagle_share']:.0f}% of requests went to EAGLE")
            out.append(f"C={w['max_concurrency']}: " + "; ".join(bits))
    return out


def schedule_table(records: Sequence[Record], profile: Profile) -> str:
    lines = [
        "| target | C | measured TPOT p50 ms | profile TPOT ms | measured / profile | achieved C |",
        "|" + " --- |" * 6,
    ]
    for r in records:
        if r["target"] not in ("eagle", "baseline"):
            continue
        want = expected_tpot_ms(profile, str(r["target"]), int(r["max_concurrency"]))
        lines.append(
            f"| {r['target']} | {r['max_concurrency']} | {r['median_tpot_ms']:.2f} | {want:.2f}"
            f" | {r['median_tpot_ms'] / want:.3f} | {r['concurrency']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(
    url: str, proc: subprocess.Popen[bytes], timeout: float, name: str, log: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before ready (log: {log})")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready at {url} within {timeout:.0f}s (log: {log})")


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace)


class Processes:
    """Children in their own process groups, always stopped on exit (router first)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: Sequence[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.log_dir / f"{name}.log"
        # The children get their settings from argv only: a DYNSPEC_* variable meant for another
        # run (an API key, a port) must not leak into the experiment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        self.procs.append(proc)
        logger.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return proc, log

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)


@contextlib.contextmanager
def processes() -> Iterator[Processes]:
    log_dir = Path(tempfile.mkdtemp(prefix="dynspec-envelope-"))
    procs = Processes(log_dir)
    try:
        yield procs
    finally:
        procs.stop_all()


def _start_sim(procs: Processes, cfg: EnvelopeConfig, mode: str) -> str:
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "dynspec.launcher.sim",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--mode",
        mode,
        "--profile",
        cfg.profile,
        "--speed",
        repr(cfg.speed),
        "--seed",
        str(cfg.seed),
        "--log-level",
        "warning",
        *cfg.extra_sim_args,
    ]
    proc, log = procs.start(f"sim-{mode}", argv)
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url + "/health_generate", proc, cfg.startup_timeout, f"dynspec-sim {mode}", log)
    return url


def _start_router(
    procs: Processes, cfg: EnvelopeConfig, eagle: str, baseline: str, *, thr: int, hyst: int
) -> str:
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "dynspec.router",
        "--eagle-url",
        eagle,
        "--baseline-url",
        baseline,
        "--threshold",
        str(thr),
        "--hysteresis",
        str(hyst),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *cfg.extra_router_args,
    ]
    proc, log = procs.start("router", argv)
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url + "/health", proc, cfg.startup_timeout, "dynspec-router", log)
    # /health is 200 with one healthy server; the experiment needs both.
    deadline = time.monotonic() + cfg.startup_timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            status = httpx.get(url + "/status", timeout=2.0).json()
            servers = status.get("servers", [])
            if servers and all(s.get("healthy") for s in servers):
                return url
        time.sleep(0.1)
    raise RuntimeError(f"dynspec-router does not see both servers healthy (log: {log})")


def run(cfg: EnvelopeConfig, progress: ProgressLine | None = None) -> EnvelopeResult:
    """Run the experiment; level records are appended to ``cfg.out`` as they finish."""
    import asyncio

    started = time.monotonic()
    extra = {"simulated": True, "profile": cfg.profile, "speed": cfg.speed}
    scfg = dataclasses.replace(cfg.sweep, extra={**cfg.sweep.extra, **extra})
    cfg.out.write_text("", encoding="utf-8")
    with processes() as procs:
        eagle = _start_sim(procs, cfg, "eagle")
        baseline = _start_sim(procs, cfg, "baseline")
        singles = [Target("eagle", eagle), Target("baseline", baseline)]
        records = asyncio.run(sweep(singles, scfg, cfg.out, progress))
        suggestion = threshold.suggest(
            [r for r in records if r["target"] == "eagle"],
            [r for r in records if r["target"] == "baseline"],
        )
        thr = suggestion.threshold if cfg.threshold is None else cfg.threshold
        hyst = suggestion.hysteresis if cfg.hysteresis is None else cfg.hysteresis
        router = _start_router(procs, cfg, eagle, baseline, thr=thr, hyst=hyst)
        rcfg = dataclasses.replace(scfg, extra={**scfg.extra, "threshold": thr, "hysteresis": hyst})
        records += asyncio.run(sweep([Target("routed", router)], rcfg, cfg.out, progress))
    result = EnvelopeResult(records, suggestion, thr, hyst, compare(records))
    result.wall_seconds = time.monotonic() - started
    return result


def write_report(cfg: EnvelopeConfig, result: EnvelopeResult, command: str) -> tuple[Path, Path]:
    profile = load_profile(cfg.profile)
    model = [model_time(r, cfg.speed) for r in result.records]
    rows = compare(model)
    md, png = cfg.out.with_suffix(".md"), cfg.out.with_suffix(".png")
    title = f"SIMULATED envelope, profile {profile.name}"
    report.plot(model, png, f"{title} (dynspec-sim, model time, speed {cfg.speed:g})")
    s = cfg.sweep
    lengths = (
        f"ShareGPT prompts from {s.dataset}"
        if s.dataset
        else f"random prompts, {s.input_len} input / {s.output_len} output tokens"
    )
    miss = misses(rows)
    text = [
        f"# {title}",
        "",
        "SIMULATED: two `dynspec-sim` servers (no GPU, no model), profile "
        f"`{profile.name}`{' (ILLUSTRATIVE, not measured)' if profile.illustrative else ''}.",
        f"Profile source: {profile.source}",
        "",
        f"Reproduce: `{command}`",
        "",
        f"- Simulated time ran {cfg.speed:g}x wall-clock (`--speed {cfg.speed:g}`); all figures "
        "below are in model time (wall-clock durations x speed, rates / speed).",
        f"- Closed-loop clients, {lengths}; per level {s.requests_per_c} x C requests "
        f"(at least {s.min_requests}) after C warm-up requests; levels "
        f"{','.join(map(str, s.concurrencies))}.",
        f"- Router: `--threshold {result.threshold} --hysteresis {result.hysteresis}`"
        + (
            " (picked by `suggest-threshold` from the two single-server sweeps)."
            if cfg.threshold is None and cfg.hysteresis is None
            else " (set by hand; suggest-threshold picked "
            f"{result.suggestion.threshold}/{result.suggestion.hysteresis})."
        ),
        f"- Run time {result.wall_seconds / 60:.1f} min wall-clock.",
        "",
        f"## SIMULATED: routed vs the better single server (goal: tok/s >= {THROUGHPUT_GOAL}x, "
        f"p50 TPOT <= {TPOT_GOAL}x)",
        "",
        envelope_table(rows),
        "Outside the envelope: " + ("none." if not miss else ""),
        *[f"- {m}" for m in miss],
        "",
        "## SIMULATED: threshold suggestion from the single-server sweeps",
        "",
        threshold.render(
            threshold.suggest(
                [r for r in model if r["target"] == "eagle"],
                [r for r in model if r["target"] == "baseline"],
            )
        ),
        "## SIMULATED: did the simulators keep their schedule?",
        "",
        "Measured p50 TPOT of each server alone against the profile's prediction "
        "(batch = min(C, running-request limit), TPOT = batch / throughput(batch)).",
        "",
        schedule_table(model, profile),
        report.markdown_table(model, "SIMULATED: all levels (model time)"),
    ]
    md.write_text("\n".join(text), encoding="utf-8")
    return md, png


def summary(result: EnvelopeResult) -> str:
    lines = [envelope_table(result.rows)]
    miss = misses(result.rows)
    lines.append("All levels inside the envelope." if not miss else "Outside the envelope:")
    lines += [f"  {m}" for m in miss]
    return "\n".join(lines) + "\n"


def dumps_rows(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)
