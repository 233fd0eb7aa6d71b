"""``dynspec-launch``: the command line, from flags to a supervised launch.

One way through, four stages, each run once and each reading only the records of the stages
before it: the flags (``config.load_config``: ``LaunchConfig``), what the launch finds
(``facts.discover``: ``LaunchFacts``, the only stage that asks the machine), the plan
(``plan.plan``: ``LaunchPlan``, a pure function of the two), and the supervisor
(``supervisor.Supervisor``). No stage calls back into an earlier one.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from dynspec.common.cli import UsageError, configure_logging, run_main
from dynspec.launcher.config import PROG, LaunchConfig, load_config
from dynspec.launcher.facts import discover
from dynspec.launcher.plan import plan
from dynspec.launcher.printer import Printer
from dynspec.launcher.supervisor import Supervisor

log = logging.getLogger(__name__)


def launch(config: LaunchConfig) -> int:
    facts = discover(config)
    launch_plan = plan(config, facts)
    if launch_plan.pair_note:
        print(f"{PROG}: {launch_plan.pair_note}", file=sys.stderr)
    for warning in launch_plan.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if config.dry_run:
        for line in launch_plan.notes:
            print(line)
        for spec in launch_plan.specs:
            print(spec.command_line())
        return 0
    for caution in launch_plan.cautions:
        log.warning("%s", caution)
    if launch_plan.refusal is not None:
        raise UsageError(launch_plan.refusal)
    supervisor = Supervisor(config, launch_plan, Printer(sys.stdout), facts=facts)
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
