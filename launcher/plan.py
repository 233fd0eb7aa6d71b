"""The plan of a launch: a pure function of the config and the facts to everything it will start.

``plan(config, facts)`` is the third stage of ``dynspec-launch`` (``cli.py``: flags, facts, plan,
supervisor). It asks the machine nothing (``facts.discover`` did) and changes no record; it calls
its helpers once each, in this order, and none of them calls back into an earlier stage:
``preflight.py`` (the tp warnings, the verdict of the checks before a start, whether a pair
fits), ``sharing.py`` (each server's share of GPUs both hold, through the facts), ``spec.py``
(every process's spec, in start order), ``calibration.py`` (skip, reuse or measure), ``mps.py``
(the MPS daemons). The ``LaunchPlan`` holds all of it, with the lines ``--dry-run`` prints and
the lines to say before a start; the supervisor reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynspec.launcher.calibration import CalibrationPlan, plan_calibration
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts
from dynspec.launcher.mps import MpsDaemon, build_daemons
from dynspec.launcher.preflight import check_pair_fits, run_preflight, tp_warnings
from dynspec.launcher.spec import ProcessSpec, build_specs


@dataclass(frozen=True)
class LaunchPlan:
    specs: tuple[ProcessSpec, ...]  # in start order: each GPU set's servers, the router last
    calibration: CalibrationPlan
    daemons: tuple[MpsDaemon, ...] = ()  # --mps: one per GPU set, started before its servers
    # --dry-run's comments before the command lines: the GPU sets, the MPS daemons, the
    # calibration.
    notes: tuple[str, ...] = ()
    pair_note: str | None = None  # why the check that a pair fits was skipped
    warnings: tuple[str, ...] = ()  # odd tp sizes
    # The checks before a start (not with --dry-run or --no-preflight): lines to log, and the
    # first failure's one line (None: nothing failed; the launch may start).
    cautions: tuple[str, ...] = ()
    refusal: str | None = None

    @property
    def servers(self) -> tuple[ProcessSpec, ...]:
        return tuple(s for s in self.specs if s.is_server)

    @property
    def router(self) -> ProcessSpec | None:
        return next((s for s in self.specs if not s.is_server), None)


def dry_run_notes(
    config: LaunchConfig,
    facts: LaunchFacts,
    daemons: tuple[MpsDaemon, ...] = (),
    calibration: CalibrationPlan | None = None,
) -> list[str]:
    """Shell comments for --dry-run: the GPU sets ("pair i", as the router's --pair), their MPS
    daemons, the missing router, the calibration."""
    notes = []
    if facts.layout == "paired":
        for gpu_set in facts.gpu_sets:
            notes.append(f"# {gpu_set.describe()}")
        if facts.shares_gpu:
            notes.append("# each pair's baseline server starts once its EAGLE server is healthy")
    for daemon in daemons:
        notes.append(f"# MPS pair {daemon.gpu_set}, before its servers: {daemon.start_line()}")
        notes.append(f"# MPS pair {daemon.gpu_set}, after its servers: {daemon.stop_line()}")
    if config.no_router:
        notes.append("# --no-router: servers only, no router started")
    said = calibration.note() if calibration is not None else None
    if said:
        notes.append(f"# {said}")
    return notes


def plan(config: LaunchConfig, facts: LaunchFacts) -> LaunchPlan:
    """Everything the launch will start, from its flags and what it found; a usage error (one
    line) where they cannot make a launch (a pair that does not fit, a server flag the launcher
    owns, ...)."""
    warnings = tuple(tp_warnings(config, facts))
    cautions, refusal = run_preflight(config, facts)
    pair_note = check_pair_fits(config, facts)
    specs = build_specs(config, facts, facts.shared_gpu_plan())
    calibration = plan_calibration(config, facts, specs)
    if calibration.action == "reuse" and not config.no_router:
        # A cached measurement for this very launch: the router takes it from its start.
        assert calibration.path is not None
        specs = (*specs[:-1], specs[-1].with_speed_profile(str(calibration.path)))
    daemons = build_daemons(config, facts, specs)
    return LaunchPlan(
        specs,
        calibration,
        daemons,
        notes=tuple(dry_run_notes(config, facts, daemons, calibration)),
        pair_note=pair_note,
        warnings=warnings,
        cautions=cautions,
        refusal=refusal,
    )
