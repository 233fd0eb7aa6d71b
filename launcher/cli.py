"""``dynspec-launch``: the command line, from flags to a supervised launch.

One way through: the flags (``config.py``), then what the launch finds (``facts.py``, once),
then the process specs (``spec.py``) and the calibration plan (``calibration.py``), the checks
(``preflight.py``), and the supervisor (``supervisor.py``); each step reads the config and the
facts, and none changes them.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from dynspec.common.cli import UsageError, configure_logging, env_name, run_main
from dynspec.launcher.calibration import plan_calibration
from dynspec.launcher.config import PROG, LaunchConfig, build_parser, load_config
from dynspec.launcher.facts import LaunchFacts, discover, flag_facts
from dynspec.launcher.mps import build_daemons
from dynspec.launcher.preflight import check_pair_fits, run_preflight, tp_warnings
from dynspec.launcher.printer import Printer
from dynspec.launcher.spec import build_specs, connect_host, with_speed_profile
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


def dry_run_notes(config: LaunchConfig, facts: LaunchFacts | None = None) -> list[str]:
    """Shell comments for --dry-run: the GPU sets ("pair i", as the router's --pair), their MPS
    daemons, the missing router."""
    facts = facts or flag_facts(config)
    notes = []
    if facts.layout == "paired":
        host = connect_host(config.backend_host)
        for gpu_set in facts.gpu_sets:
            notes.append(f"# {gpu_set.describe(host)}")
        if facts.shares_gpu:
            notes.append("# each pair's baseline server starts once its EAGLE server is healthy")
    for daemon in build_daemons(config, facts):
        notes.append(f"# MPS pair {daemon.gpu_set}, before its servers: {daemon.start_line()}")
        notes.append(f"# MPS pair {daemon.gpu_set}, after its servers: {daemon.stop_line()}")
    if config.no_router:
        notes.append("# --no-router: servers only, no router started")
    return notes


def launch(config: LaunchConfig) -> int:
    facts = discover(config)
    specs = build_specs(config, facts)
    calibration = plan_calibration(config, facts, specs)
    if calibration.action == "reuse" and not config.no_router:
        # A cached measurement for this very launch: the router takes it from its start.
        specs = (*specs[:-1], with_speed_profile(specs[-1], str(calibration.path)))
    note = check_pair_fits(config, facts)
    if note:
        print(f"{PROG}: {note}", file=sys.stderr)
    for warning in tp_warnings(config, facts):
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if config.dry_run:
        for line in dry_run_notes(config, facts):
            print(line)
        if calibration.note():
            print(f"# {calibration.note()}")
        for spec in specs:
            print(spec.command_line())
        return 0
    if config.preflight:
        run_preflight(config, facts=facts)
    printer = Printer(sys.stdout)
    supervisor = Supervisor(
        config,
        specs,
        printer,
        launcher_env_names(),
        build_daemons(config, facts),
        facts=facts,
        calibration=calibration,
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
