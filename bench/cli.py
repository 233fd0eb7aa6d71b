"""``dynspec-bench``: only dispatches to command modules (``DESCRIPTION``, ``add_arguments``,
``run``), each given a ``FlagParser``, ``--log-level`` and ``args.command_line`` for the records.
"""

from __future__ import annotations

import importlib
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from dynspec.common.cli import FlagParser, add_log_level, configure_logging, run_main, write_stdout

PROG = "dynspec-bench"


@dataclass(frozen=True)
class Command:
    help: str
    module: str  # dynspec.bench.MODULE
    # Commands that load servers or draw plots need the bench extra (aiohttp, matplotlib).
    needs_extra: bool = False


COMMANDS = {
    "sweep": Command("closed-loop concurrency sweep of servers or routers", "cli_sweep", True),
    "suggest-threshold": Command("where EAGLE stops paying, from 2 sweeps", "cli_threshold"),
    "profile": Command("turn a measured sweep into a dynspec-sim profile", "cli_profile"),
    "envelope": Command("simulated: eight GPUs seven ways (--eight-gpus)", "cli_envelope", True),
    "traffic": Command("open-loop traffic, routed vs each server alone", "cli_traffic", True),
    "gpu": Command("real SGLang on a GPU: bundle, models, plans, reports", "gpu.cli"),
}
EXTRA_MODULES = ("aiohttp", "matplotlib")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _usage() -> str:
    lines = [f"usage: {PROG} {{{','.join(COMMANDS)}}} [flags]  ({PROG} COMMAND --help)", ""]
    lines += [f"  {name:<18} {c.help}" for name, c in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def _error(text: str, code: int) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {text}\n")
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    for noisy in ("matplotlib", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args:
        _error(f"missing command (choose from {', '.join(COMMANDS)})", 2)
    if args[0] in ("-h", "--help"):
        write_stdout(_usage())
        sys.exit(0)
    name, rest = args[0], args[1:]
    command = COMMANDS.get(name)
    if command is None:
        _error(f"unknown command {name!r} (choose from {', '.join(COMMANDS)})", 2)
    if command.needs_extra:
        missing = [m for m in EXTRA_MODULES if not _importable(m)]
        if missing:
            _error(
                f"{PROG} {name} needs the bench extra ({', '.join(missing)} not installed): "
                "pip install 'dynspec[bench]'",
                1,
            )
    module = importlib.import_module(f"dynspec.bench.{command.module}")
    if name == "gpu":
        module.main(rest)
        return
    parser = FlagParser(prog=f"{PROG} {name}", description=module.DESCRIPTION)
    module.add_arguments(parser)
    add_log_level(parser)
    ns = parser.parse_layered(rest)
    configure_logging(ns.log_level)
    ns.command_line = f"{PROG} {name} " + shlex.join(rest)
    run_main(PROG, lambda: module.run(ns), ns.log_level)


if __name__ == "__main__":
    main()
