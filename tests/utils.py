"""Helpers shared by the tests: free loopback ports and real processes that are always reaped.

The process helpers are the benchmarks' own (``dynspec.bench.procs``), so tests and benchmarks
start, wait for and stop their children the same way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dynspec.bench.procs import free_port, running, stop_group, wait_http

__all__ = ["BIN", "free_port", "kill_group", "running", "wait_http"]

BIN = Path(sys.executable).parent


def kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    stop_group(proc, grace)
