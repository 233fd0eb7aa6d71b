"""``dynspec-launch``: the command line, from flags to a supervised launch."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from dynspec.common.cli import UsageError, configure_logging, env_name, run_main
from dynspec.launcher.calibration import CalibrationPlan, plan_calibration, skip_reason
from dynspec.launcher.config import PROG, LaunchConfig, build_parser, load_config, split_pairs
from dynspec.launcher.gpus import split_halves, visible_devices
from dynspec.launcher.layout import describe, pairs_of
from dynspec.launcher.mps import build_daemons, find_mps_control
from dynspec.launcher.preflight import (
    gpu_memory_gib,
    gpu_names,
    installed_sglang,
    list_gpus,
    run_preflight,
    sglang_version,
    tp_warnings,
)
from dynspec.launcher.printer import Printer
from dynspec.launcher.sharing import pair_shortfall_gib, read_model_shape, weights_on_disk
from dynspec.launcher.sim.profile import ProfileError, load_profile
from dynspec.launcher.spec import (
    ProcessSpec,
    build_specs,
    connect_host,
    shares_gpu,
    with_speed_profile,
)
from dynspec.launcher.supervisor import Supervisor

log = logging.getLogger(__name__)


def launcher_env_names() -> frozenset[str]:
    """``DYNSPEC_*`` variables that set the launcher's own flags (not passed on to children)."""
    names = set()
    for action in build_parser()._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                names.add(env_name(opt))
    return frozenset(names)


def with_detected_gpus(config: LaunchConfig) -> LaunchConfig:
    """No --gpus: use every visible GPU (else every GPU nvidia-smi lists), split in halves (or
    in pairs of --tp GPUs with --layout paired)."""
    if config.simulate or (config.eagle_gpus and config.baseline_gpus):
        return config
    visible = config.visible_gpus
    try:
        found = list_gpus() if visible is None else tuple(range(len(visible)))
        if config.layout == "paired":
            pairs = split_pairs(found, config.tp)
            return dataclasses.replace(config, eagle_gpus=found, baseline_gpus=found, pairs=pairs)
        eagle, baseline = split_halves(found)
    except UsageError as exc:
        raise UsageError(f"no --gpus given, and {exc}") from None
    if eagle == baseline:  # one GPU found: a one-pair paired layout
        return dataclasses.replace(
            config, eagle_gpus=eagle, baseline_gpus=baseline, layout="paired", pairs=(eagle,)
        )
    return dataclasses.replace(config, eagle_gpus=eagle, baseline_gpus=baseline)


def with_shared_gpu_sizes(config: LaunchConfig) -> LaunchConfig:
    """Pairs on shared GPUs: read the GPUs' memory (the smallest) and the local models' shapes
    and sizes, to size each server's share and to check that two copies fit."""
    if not shares_gpu(config):
        return config
    sizes = [gpu_memory_gib(visible_devices((g,), config.visible_gpus)) for g in config.eagle_gpus]
    known = [m for m in sizes if m is not None]
    return dataclasses.replace(
        config,
        gpu_memory_gib=min(known) if known and len(known) == len(sizes) else None,
        target_shape=read_model_shape(config.model_path),
        draft_shape=read_model_shape(config.draft_model_path, draft=True),
        target_weight_bytes=weights_on_disk(config.model_path),
        draft_weight_bytes=weights_on_disk(config.draft_model_path),
    )


def check_pair_fits(config: LaunchConfig) -> str | None:
    """Two copies of the target and the draft must leave KV room on each GPU of a pair: a usage
    error when not; a note (returned) when the check cannot be made."""
    if not shares_gpu(config):
        return None
    target = config.target_weight_bytes or (
        config.target_shape.weight_bytes if config.target_shape else None
    )
    draft = config.draft_weight_bytes or (
        config.draft_shape.weight_bytes if config.draft_shape else 0
    )
    if target is None:
        return (
            f"note: --model-path {config.model_path} is not a local model directory: the check "
            "that two copies fit on each pair's GPUs is skipped"
        )
    if config.gpu_memory_gib is None:
        return "note: GPU memory unknown (nvidia-smi): the check that two copies fit is skipped"
    tp = len(config.pairs[0])
    short, spelled = pair_shortfall_gib(config.gpu_memory_gib, tp, target, draft)
    if short > 0:
        raise UsageError(
            f"--layout paired: each GPU ({config.gpu_memory_gib:.0f} GiB) would need {spelled}: "
            f"{short:.1f} GiB short; use --layout split (one copy per GPU set) or a larger --tp"
        )
    return None


def with_mps_control(config: LaunchConfig) -> LaunchConfig:
    if not config.mps or config.simulate:
        return config
    return dataclasses.replace(config, mps_control=find_mps_control())


def calibration_facts(config: LaunchConfig) -> tuple[str, str]:
    """The SGLang version and the GPU name the calibration is keyed by (simulated: dynspec-sim's
    version and its profile's name and content stand in)."""
    if config.simulate:
        try:
            content = load_profile(config.sim_profile).dumps().encode()
            digest = hashlib.sha256(content).hexdigest()[:12]
        except ProfileError:
            digest = "unreadable"
        version = importlib.metadata.version("dynspec")
        return f"dynspec-sim {version}", f"simulated (profile {config.sim_profile}, {digest})"
    installed = installed_sglang()
    sglang = (
        f"SGLang {installed}"
        if installed
        else f"SGLang (not installed here; pinned {sglang_version()})"
    )
    gpus = sorted({g for pair in pairs_of(config) for g in (*pair.eagle_gpus, *pair.baseline_gpus)})
    names = gpu_names([visible_devices((g,), config.visible_gpus) for g in gpus])
    return sglang, " + ".join(names) or "an unknown GPU (nvidia-smi named none)"


def calibration_plan(config: LaunchConfig, specs: tuple[ProcessSpec, ...]) -> CalibrationPlan:
    why = skip_reason(config)
    if why is not None:
        return CalibrationPlan("skip", why)
    return plan_calibration(config, specs, *calibration_facts(config))


def dry_run_notes(config: LaunchConfig) -> list[str]:
    """Shell comments for --dry-run: the pairs, their MPS daemons, the missing router."""
    notes = []
    if config.layout == "paired":
        host = connect_host(config.backend_host)
        for pair in pairs_of(config):
            notes.append(f"# {describe(pair, host)}")
        if shares_gpu(config):
            notes.append("# each pair's baseline server starts once its EAGLE server is healthy")
    for daemon in build_daemons(config):
        notes.append(f"# MPS pair {daemon.pair}, before its servers: {daemon.start_line()}")
        notes.append(f"# MPS pair {daemon.pair}, after its servers: {daemon.stop_line()}")
    if config.no_router:
        notes.append("# --no-router: servers only, no router started")
    return notes


def launch(config: LaunchConfig) -> int:
    config = with_mps_control(with_shared_gpu_sizes(with_detected_gpus(config)))
    specs = build_specs(config)
    calibration = calibration_plan(config, specs)
    if calibration.action == "reuse" and not config.no_router:
        # A cached measurement for this very launch: the router takes it from its start.
        specs = (*specs[:-1], with_speed_profile(specs[-1], str(calibration.path)))
    note = check_pair_fits(config)
    if note:
        print(f"{PROG}: {note}", file=sys.stderr)
    for warning in tp_warnings(config):
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if config.dry_run:
        for line in dry_run_notes(config):
            print(line)
        if calibration.note():
            print(f"# {calibration.note()}")
        for spec in specs:
            print(spec.command_line())
        return 0
    if config.preflight:
        run_preflight(config)
    printer = Printer(sys.stdout)
    daemons = build_daemons(config)
    supervisor = Supervisor(
        config, specs, printer, launcher_env_names(), daemons, calibration=calibration
    )
    return asyncio.run(supervisor.run())


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        config = load_config(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    configure_logging(config.log_level)
    if config.log_level != "debug":
        # One line per health check and /status poll would drown the children's output.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    run_main(PROG, lambda: launch(config), config.log_level)
