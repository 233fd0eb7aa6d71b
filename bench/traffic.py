"""``dynspec-bench traffic``'s plan: each run is one target under one schedule's arrivals, on
targets that are up (``run_live``) or on fresh simulators (``run_simulated``); a run already in
the JSONL is skipped. The plan: docs/benchmarks.md, "Open-loop traffic".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from dynspec.bench import arrivals, harness, load, openloop, slo
from dynspec.bench.arrivals import Arrival, Schedule
from dynspec.bench.load import Target
from dynspec.bench.procs import Children, rss_mib
from dynspec.bench.report import Record, append_jsonl, load_jsonl
from dynspec.bench.ways import Router
from dynspec.launcher import spec as launch_spec
from dynspec.launcher.sim.profile import load_profile

logger = logging.getLogger(__name__)

TARGETS = ("routed", "eagle", "baseline")
LENGTHS = ("input_len", "output_len", "range_ratio")  # the random dataset's, as bench_serving's


@dataclass(frozen=True)
class TrafficConfig:
    """What every run of one traffic experiment shares (times in model seconds)."""

    schedules: tuple[tuple[str, Schedule], ...]
    burstiness: float = 1.0
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 1.0
    trace: arrivals.Trace | None = None  # replayed instead of synthetic arrivals
    slo_ttft_ms: float = 1000.0
    slo_tpot_ms: float = 50.0
    window_s: float = 10.0
    repeats: int = 3
    seed: int = 0
    speed: float = 1.0  # simulators' time factor; 1 on real servers
    drain_s: float = 30.0  # wall seconds the open requests get after the last arrival
    request_timeout: float = 600.0
    command: str = ""

    def arrivals_of(self, schedule: Schedule, repeat: int) -> list[Arrival]:
        if self.trace is not None:
            return list(self.trace.arrivals)
        return arrivals.synthetic(
            schedule, burstiness=self.burstiness, input_len=self.input_len,
            output_len=self.output_len, range_ratio=self.range_ratio, seed=self.seed + repeat,
        )  # fmt: skip

    def meta(self) -> Record:
        """The fields every record carries: how the load was made and judged."""
        names = "burstiness slo_ttft_ms slo_tpot_ms window_s speed seed drain_s command"
        out: Record = {"experiment": "traffic", **{k: getattr(self, k) for k in names.split()}}
        if self.trace is not None:
            out["trace"], out["trace_skipped"] = self.trace.source, self.trace.skipped
        else:
            out.update({f"random_{k}": getattr(self, k) for k in LENGTHS})
        return out


class Run(NamedTuple):
    """One run of the plan."""

    repeat: int
    schedule: str
    target: str


def plan(cfg: TrafficConfig, labels: Sequence[str]) -> list[Run]:
    """Every run in order: repeats, then schedules, then the targets rotated by the repeat."""
    out = []
    n = len(labels)
    for r in range(1, cfg.repeats + 1):
        order = [labels[(i + r - 1) % n] for i in range(n)]
        out += [Run(r, name, label) for name, _ in cfg.schedules for label in order]
    return out


def runs_left(cfg: TrafficConfig, labels: Sequence[str], out: Path) -> list[Run]:
    """The plan's runs whose whole-run record ``out`` does not hold yet (a run appends its records
    as it ends: it is in ``out`` whole or not at all), in order."""
    runs = [r for r in load_jsonl(out) if r.get("scope") == "run"] if out.is_file() else []
    done = {(int(r["repeat"]), str(r["schedule"]), str(r["target"])) for r in runs}
    return [run for run in plan(cfg, labels) if run not in done]


# A run's body: the target, its arrivals and prompt key in; the run and extra fields out.
RunBody = Callable[[Run, Sequence[Arrival], str], tuple[openloop.OpenLoopRun, Record]]


def _each(
    cfg: TrafficConfig,
    labels: Sequence[str],
    out: Path,
    body: RunBody,
    *,
    extra: Mapping[str, Any],
    deadline: float | None,
    own_prompts: bool,
) -> list[Record]:
    """Every run of the plan not in ``out`` yet, through ``body``. ``own_prompts``: each target
    gets prompt words of its own (the prompt key names it), else every target of a repeat and
    schedule gets the same prompts as well as the same arrivals."""
    schedules = dict(cfg.schedules)
    records: list[Record] = []
    for run in runs_left(cfg, labels, out):
        sched = schedules[run.schedule]
        length = sched.duration / cfg.speed + cfg.drain_s + 15.0
        if deadline is not None and time.monotonic() + length > deadline:
            logger.warning("traffic: stopping before %s: it would not end by the deadline", run)
            break
        got = cfg.arrivals_of(sched, run.repeat)
        logger.info(
            "traffic: repeat %d, %s, %s: %d requests over %.0f s",
            run.repeat, run.schedule, run.target, len(got), sched.duration,
        )  # fmt: skip
        key = f"{cfg.seed}:{run.repeat}:{run.schedule}"
        if own_prompts:
            key += f":{run.target}"
        result, more = body(run, got, key)
        stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        head: Record = {
            "target": run.target,
            "schedule": run.schedule,
            "schedule_text": sched.text,
            "repeat": run.repeat,
            **cfg.meta(),
            **extra,
            **more,
            "timestamp": stamp,
        }
        recs = slo.records(result, sched, head=head, window_s=cfg.window_s,
                           slo_ttft_ms=cfg.slo_ttft_ms, slo_tpot_ms=cfg.slo_tpot_ms)  # fmt: skip
        for rec in recs:
            append_jsonl(out, rec)
        records += recs
    return records


async def _drive(
    target: Target,
    got: Sequence[Arrival],
    key: str,
    cfg: TrafficConfig,
    probe: openloop.Probe | None,
) -> openloop.OpenLoopRun:
    async with load.make_session(cfg.request_timeout) as session:
        model = await load.model_name(session, target)
        return await openloop.replay(
            session, target, model, got, key=key, drain_s=cfg.drain_s, speed=cfg.speed, probe=probe
        )


def router_probe(url: str, pid: int | None = None) -> openloop.Probe:
    """A probe of a router: its mode switches so far, its threshold (the lowest group's) and the
    requests it holds in flight (``/metrics``, ``/status``); with ``pid`` its memory in MiB."""

    async def probe(session: aiohttp.ClientSession) -> dict[str, float]:
        got: dict[str, float] = {}
        text = await load.fetch_text(session, url + "/metrics", timeout=2.0)
        if (switches := load.mode_switches(text or "")) is not None:
            got["switches"] = float(switches)
        if levels := load.thresholds(text or ""):
            got["threshold"] = min(levels)
        status = await load.fetch_text(session, url + "/status", timeout=2.0)
        if status:  # the router's JSON object; ``load`` is what it holds in flight
            got["in_flight"] = float(json.loads(status).get("load") or 0)
        if pid is not None and (rss := rss_mib(pid)) is not None:
            got["rss_mib"] = rss
        return got

    return probe


def run_live(
    targets: Sequence[Target],
    cfg: TrafficConfig,
    out: Path,
    *,
    watch: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    fields: Mapping[str, Record] | None = None,
) -> list[Record]:
    """Every run of the plan against ``targets`` (up already), appended to ``out``; ``watch``:
    label -> the router URL sampled in its runs; ``fields``: label -> more fields of its records
    (a variant's ``router``, as ``run_simulated``'s); no run starts that would end past
    ``deadline``.
    Each target gets prompts of its own: targets that are up may share servers, and a prefix
    cache warmed by one target's prompts would serve another's."""
    by_label = {t.label: t for t in targets}
    watched = dict(watch or {})

    def body(run: Run, got: Sequence[Arrival], key: str) -> tuple[openloop.OpenLoopRun, Record]:
        url = watched.get(run.target)
        probe = router_probe(url) if url else None
        target = by_label[run.target]
        more = {"url": target.base_url, **(fields or {}).get(run.target, {})}
        return asyncio.run(_drive(target, got, key, cfg, probe)), more

    return _each(
        cfg, list(by_label), out, body, extra=dict(extra or {}), deadline=deadline, own_prompts=True
    )


# ---- simulated ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimTraffic:
    """The simulated side of a traffic experiment: what to start for each run."""

    profile: str
    layout: str = "split"  # split: servers of their own; paired: one shared simulated GPU
    targets: tuple[str, ...] = TARGETS
    # The routed target's router flags; with ``calibrated`` the profile as --speed-profile too.
    router_settings: tuple[str, ...] = ("--threshold", "auto")
    # More routed targets (in ``targets`` too): a name and the flags its router gets after those.
    variants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    calibrated: bool = False
    sharing: str = "timeslice"
    startup_timeout: float = 60.0
    router_log_level: str = "info"
    # What harness.start_servers reads (SimSettings), with the fields above.
    speed: float = 1.0
    seed: int = 0


def _sim_target(
    procs: Children, sim: SimTraffic, label: str, seed: int
) -> tuple[Target, openloop.Probe | None, Record]:
    """Start what ``label`` runs on, fresh: a server alone, or servers and a router in front."""
    variants = dict(sim.variants)
    routed = label == "routed" or label in variants
    want = {"eagle": 1, "baseline": 1} if routed else {label: 1}
    if routed and sim.layout == "paired":
        want = {"shared_gpus": 1}
    settings = replace(sim, seed=seed)  # the run's own seed
    servers = harness.start_servers(procs, want, settings, owner=label, launch_intervals=True)
    if not routed:
        return Target(label, getattr(servers, label)[0]), None, {}
    if servers.shared_gpus:
        e, b = servers.shared_gpus[0]
        flags: tuple[str, ...] = ("--pair", f"{e},{b}")
    else:
        flags = ("--eagle-url", servers.eagle[0], "--baseline-url", servers.baseline[0])
    settings_flags = sim.router_settings + variants.get(label, ())
    if sim.calibrated:
        path = harness.router_profile(procs, load_profile(sim.profile), sim.speed)
        settings_flags += ("--speed-profile", str(path))
    router = Router(flags, settings_flags, healthy=2, log_level=sim.router_log_level)
    url, proc = harness.start_router(procs, f"router-{label}", router, sim.startup_timeout)
    return Target(label, url), router_probe(url, proc.pid), {"router": " ".join(settings_flags)}


def run_simulated(cfg: TrafficConfig, sim: SimTraffic, out: Path) -> list[Record]:
    """Every run of the plan, each on simulators (and a router) started for it alone. Every target
    of a repeat gets the same prompts: a simulator draws a request's accept lengths from its seed
    and prompt, so with prompts of their own EAGLE alone and routed-to-EAGLE drew different ones
    (h200-8b-accept2 at 1 req/s, ~10 requests: p50 TPOT 1.000x-1.106x by repeat from the draws
    alone). No simulator serves two runs, so no cache carries one target's prompts to another."""
    extra: Record = {
        **harness.run_metadata("traffic", sim.profile, cfg.speed, cfg.command),
        "layout": sim.layout,
        "sharing": sim.sharing,
        # Each server streams as dynspec-launch makes its real one stream (harness).
        "baseline_stream_interval": launch_spec.BASELINE_STREAM_INTERVAL,
        "calibrated": sim.calibrated,
    }

    def body(run: Run, got: Sequence[Arrival], key: str) -> tuple[openloop.OpenLoopRun, Record]:
        with harness.processes() as procs:
            target, probe, more = _sim_target(procs, sim, run.target, cfg.seed + run.repeat)
            more["loadavg_1m"] = harness.load_average()
            result = asyncio.run(_drive(target, got, key, cfg, probe))
        return result, more

    return _each(cfg, sim.targets, out, body, extra=extra, deadline=None, own_prompts=False)
