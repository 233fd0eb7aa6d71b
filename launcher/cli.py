"""``dynspec-launch``: the command line, from flags to a supervised launch."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from dynspec.common.cli import UsageError, configure_logging, env_name, run_main
from dynspec.launcher.config import PROG, LaunchConfig, build_parser, load_config
from dynspec.launcher.gpus import split_halves, visible_devices
from dynspec.launcher.preflight import gpu_memory_gib, list_gpus, run_preflight, tp_warnings
from dynspec.launcher.printer import Printer
from dynspec.launcher.sharing import read_model_shape
from dynspec.launcher.spec import build_specs, shares_gpu
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
    """No --gpus: use every visible GPU (else every GPU nvidia-smi lists), split in halves."""
    if config.simulate or (config.eagle_gpus and config.baseline_gpus):
        return config
    visible = config.visible_gpus
    try:
        eagle, baseline = split_halves(
            list_gpus() if visible is None else tuple(range(len(visible)))
        )
    except UsageError as exc:
        raise UsageError(f"no --gpus given, and {exc}") from None
    return dataclasses.replace(config, eagle_gpus=eagle, baseline_gpus=baseline)


def with_shared_gpu_sizes(config: LaunchConfig) -> LaunchConfig:
    """Both servers on one GPU: read its memory and the local models' shapes to size each share."""
    if not shares_gpu(config):
        return config
    return dataclasses.replace(
        config,
        gpu_memory_gib=gpu_memory_gib(visible_devices(config.eagle_gpus, config.visible_gpus)),
        target_shape=read_model_shape(config.model_path),
        draft_shape=read_model_shape(config.draft_model_path, draft=True),
    )


def launch(config: LaunchConfig) -> int:
    config = with_shared_gpu_sizes(with_detected_gpus(config))
    specs = build_specs(config)
    for warning in tp_warnings(config):
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if config.dry_run:
        for spec in specs:
            print(spec.command_line())
        return 0
    if config.preflight:
        run_preflight(config)
    printer = Printer(sys.stdout)
    supervisor = Supervisor(config, specs, printer, launcher_env_names())
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
