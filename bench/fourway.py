"""Eight GPUs, seven ways: the same simulated GPUs behind the router setups that could use them.

``dynspec-bench envelope --eight-gpus`` (old spelling ``--four-way``) starts the ``dynspec-sim``
servers the chosen ways need (each stands for four GPUs) and one ``dynspec-router`` per way:

- ``split-threshold``: one EAGLE and one baseline server on GPUs of their own, ``--threshold``
  from ``suggest-threshold`` on single-server sweeps of the same profile;
- ``split-balance``: the same two servers, ``--policy balance --speed-profile`` (the profile);
- ``paired-threshold``: two shared-GPU pairs (``dynspec-sim --pair --sharing S``, each an EAGLE
  and a baseline server on the same four GPUs), ``--pair ... --threshold`` (the suggested one);
- ``paired-auto``: the same two pairs, ``--threshold auto``, no profile;
- ``2x-eagle`` / ``2x-baseline``: two servers of one kind in one pool (least in flight);
- ``2x-adaptive``: two adaptive-EAGLE servers, where the profile has an adaptive counterpart
  (``h200-8b-accept4`` -> ``h200-8b-adaptive``'s eagle mode) or ``--adaptive-profile`` names one.

Every level runs each way in turn (``sweep``'s order), so a drift of the machine spreads over all.
Servers are shared between ways that run one after the other (``split-*`` and ``2x-eagle`` use
the first EAGLE server). ``fourway_report.py`` holds the goals and the report. Everything is
SIMULATED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.bench import harness, threshold
from dynspec.bench.load import Target
from dynspec.bench.report import Record
from dynspec.bench.sweep import ProgressLine, SweepConfig, sweep
from dynspec.bench.ways import EIGHT_WAYS, OLD_NAMES
from dynspec.launcher.sim.profile import load_profile, shipped_profiles

logger = logging.getLogger(__name__)

WAYS = EIGHT_WAYS


def adaptive_profile(name: str) -> str | None:
    """The shipped profile whose eagle mode is ``name``'s adaptive-EAGLE counterpart, or None:
    ``X-adaptive`` for ``X-acceptN`` or ``X`` itself (pure but for the shipped list)."""
    base = re.sub(r"-(accept\d+|adaptive)$", "", name)
    want = f"{base}-adaptive"
    return want if want in shipped_profiles() else None


@dataclass(frozen=True)
class FourWayConfig:
    profile: str
    speed: float
    sweep: SweepConfig
    out: Path
    ways: Sequence[str] = WAYS
    threshold: int | None = None
    hysteresis: int | None = None
    metrics_interval: float | None = None
    sharing: str = "timeslice"
    adaptive_profile: str | None = None  # None: adaptive_profile(profile)
    seed: int = 0
    startup_timeout: float = 60.0
    append: bool = False
    command: str = ""


@dataclass
class FourWayResult:
    records: list[Record]
    threshold: int
    hysteresis: int
    wall_seconds: float = 0.0


def plan_ways(cfg: FourWayConfig) -> tuple[list[str], str | None, list[str]]:
    """The ways to run, the adaptive profile (if any) and one note per way left out (pure but
    for the shipped profiles' list)."""
    ways = [OLD_NAMES.get(w, w) for w in cfg.ways]
    adaptive = cfg.adaptive_profile
    if adaptive is None and "2x-adaptive" in ways:
        adaptive = adaptive_profile(load_profile(cfg.profile).name)
    notes = []
    if "2x-adaptive" in ways and adaptive is None:
        ways.remove("2x-adaptive")
        notes.append(f"2x-adaptive: profile {cfg.profile} has no adaptive counterpart")
    return ways, adaptive, notes


def _sweep_levels(
    targets: Sequence[Target], scfg: SweepConfig, out: Path, progress: ProgressLine | None
) -> list[Record]:
    """``sweep`` one level at a time, so each level's records carry the machine's load then."""
    records: list[Record] = []
    for c in scfg.concurrencies:
        extra = {**scfg.extra, "loadavg_1m": harness.load_average()}
        level = dataclasses.replace(scfg, concurrencies=[c], extra=extra)
        records += asyncio.run(sweep(targets, level, out, progress))
    return records


def _start_servers(
    procs: harness.Children,
    cfg: FourWayConfig,
    ways: Sequence[str],
    adaptive: str | None,
    singles: bool,
) -> harness.Servers:
    want: dict[str, int] = {"eagle": 1, "baseline": 1} if singles else {}
    for way in ways:
        for kind, n in harness.needs(way).items():
            want[kind] = max(want.get(kind, 0), n)
    return harness.start_servers(procs, want, cfg, adaptive)


def run(cfg: FourWayConfig, progress: ProgressLine | None = None) -> FourWayResult:
    """Run the comparison; each finished level is appended to ``cfg.out`` as it ends."""
    started = time.monotonic()
    prof = load_profile(cfg.profile)
    ways, adaptive, notes = plan_ways(cfg)
    for note in notes:
        logger.warning("not run: %s", note)
    extra: dict[str, Any] = {
        **harness.run_metadata("four-way", cfg.profile, cfg.speed, cfg.command),
        "requests_per_c": cfg.sweep.requests_per_c,
        "min_requests": cfg.sweep.min_requests,
        "sharing": cfg.sharing,
        "not_run": notes,
    }
    if adaptive is not None:
        extra["adaptive_profile"] = adaptive
    scfg = dataclasses.replace(cfg.sweep, extra={**cfg.sweep.extra, **extra})
    if not cfg.append:
        cfg.out.write_text("", encoding="utf-8")
    records: list[Record] = []
    thr, hyst = cfg.threshold, cfg.hysteresis
    with harness.processes() as procs:
        servers = _start_servers(procs, cfg, ways, adaptive, thr is None or hyst is None)
        crossover = None
        if thr is None or hyst is None:
            # As the envelope does: each server alone, then suggest-threshold on those sweeps.
            singles = [Target("eagle", servers.eagle[0]), Target("baseline", servers.baseline[0])]
            records += _sweep_levels(singles, scfg, cfg.out, progress)
            s = threshold.suggest(
                [r for r in records if r["target"] == "eagle"],
                [r for r in records if r["target"] == "baseline"],
            )
            thr = s.threshold if thr is None else thr
            hyst = s.hysteresis if hyst is None else hyst
            crossover = s.crossover
        profile_path = harness.router_profile(procs, prof, cfg.speed)
        targets: list[Target] = []
        for way in ways:
            flags = harness.way_flags(
                way,
                servers,
                threshold=thr,
                hysteresis=hyst,
                speed_profile=profile_path,
                metrics_interval=cfg.metrics_interval,
            )
            n = harness.healthy_needed(way, thr)
            url, _ = harness.start_router(procs, f"router-{way}", flags, cfg.startup_timeout, n)
            targets.append(Target(way, url))
        rextra = {**scfg.extra, "threshold": thr, "hysteresis": hyst, "crossover": crossover}
        if cfg.threshold is not None and cfg.hysteresis is not None:
            rextra["threshold_by_hand"] = True
        rcfg = dataclasses.replace(scfg, extra=rextra)
        records += _sweep_levels(targets, rcfg, cfg.out, progress)
    return FourWayResult(records, thr, hyst, time.monotonic() - started)
