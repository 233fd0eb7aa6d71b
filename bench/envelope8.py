"""Eight GPUs, seven ways (``dynspec-bench envelope --eight-gpus``): each level runs each way in
turn, ``--repeats`` times afresh. The ways and why: docs/benchmarks.md, "Eight GPUs seven ways".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.bench import harness, threshold, ways
from dynspec.bench.load import Target
from dynspec.bench.report import Record
from dynspec.bench.sweep import Say, SweepConfig, sweep
from dynspec.launcher.sim.profile import Profile, load_profile, shipped_profiles

logger = logging.getLogger(__name__)

EXPERIMENT = "four-way"  # the records' "experiment" since it had four ways; --from-jsonl reads it
# An adaptive-EAGLE curve stands in for another profile's only at the same draft acceptance: a
# ceiling measured at another acceptance is not that profile's.
SAME_ACCEPT = 0.1


def adaptive_counterpart(profile: Profile) -> tuple[str | None, str]:
    """The shipped ``X-adaptive`` profile for ``X-acceptN`` measured at the same acceptance, or
    None and why there is none."""
    want = re.sub(r"-(accept\d+|adaptive)$", "", profile.name) + "-adaptive"
    if want not in shipped_profiles():
        return None, f"profile {profile.name} has no adaptive counterpart"
    theirs = load_profile(want).mode("eagle").accept_length
    ours = profile.mode("eagle").accept_length
    if abs(theirs - ours) > SAME_ACCEPT:
        return None, (
            f"no adaptive-EAGLE curve was measured at profile {profile.name}'s acceptance "
            f"({want} ran drafts of accept length {theirs:.2f}, {profile.name}'s EAGLE {ours:.2f})"
        )
    return want, ""


@dataclass(frozen=True)
class EightGpusConfig:
    profile: str
    speed: float
    sweep: SweepConfig
    out: Path
    ways: Sequence[str] = ways.EIGHT_WAYS
    threshold: int | None = None
    hysteresis: int | None = None
    sharing: str = "timeslice"
    seed: int = 0
    startup_timeout: float = 60.0
    router_log_level: str = "warning"
    command: str = ""
    repeats: int = 1
    calibrated: bool = False  # paired-auto starts from the profile (a launch's --calibrate)


def plan_ways(cfg: EightGpusConfig) -> tuple[list[str], str | None, list[str]]:
    """The ways to run, the adaptive profile (if any) and one note per way left out."""
    run = list(cfg.ways)
    if "2x-adaptive" not in run:
        return run, None, []
    adaptive, why = adaptive_counterpart(load_profile(cfg.profile))
    if adaptive is None:
        run.remove("2x-adaptive")
        return run, None, [f"2x-adaptive: {why}"]
    return run, adaptive, []


def _sweep_levels(
    targets: Sequence[Target], scfg: SweepConfig, out: Path, say: Say | None, repeat: int = 1
) -> list[Record]:
    """``sweep`` one level at a time, so each level's records carry the machine's load then."""
    records: list[Record] = []

    def mark(rec: Record) -> None:
        rec["repeat"] = repeat

    for c in scfg.concurrencies:
        extra = {**scfg.extra, "loadavg_1m": harness.load_average()}
        level = dataclasses.replace(scfg, concurrencies=[c], extra=extra)
        records += asyncio.run(sweep(targets, level, out, say, on_record=mark))
    return records


def run(cfg: EightGpusConfig, say: Say | None = None) -> list[Record]:
    """Run the comparison ``cfg.repeats`` times; each finished level is appended to ``cfg.out``."""
    run_ways, adaptive, notes = plan_ways(cfg)
    for note in notes:
        logger.warning("not run: %s", note)
    extra: dict[str, Any] = {
        **harness.run_metadata(EXPERIMENT, cfg.profile, cfg.speed, cfg.command),
        **{k: getattr(cfg.sweep, k) for k in ("requests_per_c", "min_requests")},
        "sharing": cfg.sharing,
        "not_run": notes,
        "repeats": cfg.repeats,
        "calibrated": cfg.calibrated,
    }
    if adaptive is not None:
        extra["adaptive_profile"] = adaptive
    cfg.out.write_text("", encoding="utf-8")
    records: list[Record] = []
    for rep in range(1, cfg.repeats + 1):
        # Repeat r: seeds + r - 1 (repeat 1 is a run without repeats), nothing left of the last.
        sweep_cfg = dataclasses.replace(
            cfg.sweep, seed=cfg.sweep.seed + rep - 1, extra={**cfg.sweep.extra, **extra}
        )
        rcfg = dataclasses.replace(cfg, seed=cfg.seed + rep - 1, sweep=sweep_cfg)
        records += _one_run(rcfg, run_ways, adaptive, rep, say)
    return records


def _one_run(
    cfg: EightGpusConfig,
    run_ways: Sequence[str],
    adaptive: str | None,
    repeat: int,
    say: Say | None,
) -> list[Record]:
    """One repeat: every server and router started afresh, each level's ways in turn."""
    prof = load_profile(cfg.profile)
    scfg = cfg.sweep
    records: list[Record] = []
    thr, hyst = cfg.threshold, cfg.hysteresis
    singles = thr is None or hyst is None
    plan = ways.plan_servers(run_ways, {"eagle": 1, "baseline": 1} if singles else None)
    with harness.processes() as procs:
        sets = {
            name: harness.start_servers(
                procs, want, cfg, adaptive, owner="" if name == ways.SHARED else name
            )
            for name, want in plan.items()
        }
        crossover = None
        if thr is None or hyst is None:
            # Each server alone, then suggest-threshold on those sweeps.
            shared = sets[ways.SHARED]
            alone = [Target("eagle", shared.eagle[0]), Target("baseline", shared.baseline[0])]
            records += _sweep_levels(alone, scfg, cfg.out, say, repeat)
            s = threshold.suggest(
                [r for r in records if r["target"] == "eagle"],
                [r for r in records if r["target"] == "baseline"],
            )
            thr = s.threshold if thr is None else thr
            hyst = s.hysteresis if hyst is None else hyst
            crossover = s.crossover
        profile_path = harness.router_profile(procs, prof, cfg.speed)
        targets: list[Target] = []
        used: dict[str, dict[str, Any]] = {}
        for way in run_ways:
            servers = sets[ways.server_set(way)]
            router = ways.way_router(way, servers, threshold=thr, hysteresis=hyst,
                                     speed_profile=profile_path,
                                     calibrated=cfg.calibrated)  # fmt: skip
            router = dataclasses.replace(router, log_level=cfg.router_log_level)
            url, _ = harness.start_router(procs, f"router-{way}", router, cfg.startup_timeout)
            targets.append(Target(way, url))
            used[way] = {"set": ways.server_set(way), "urls": list(router.urls())}
        rextra = {**scfg.extra, "threshold": thr, "hysteresis": hyst, "crossover": crossover}
        rextra["way_servers"] = used
        if not singles:
            rextra["threshold_by_hand"] = True
        rcfg = dataclasses.replace(scfg, extra=rextra)
        records += _sweep_levels(targets, rcfg, cfg.out, say, repeat)
    return records
