"""Helpers shared by the tests: free loopback ports and real processes that are always reaped.

The process helpers are the benchmarks' own (``dynspec.bench.procs``), so tests and benchmarks
start, wait for and stop their children the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dynspec.bench.procs import free_port, running, stop_group, wait_http

__all__ = [
    "BIN",
    "bench",
    "free_port",
    "kill_group",
    "rerendered",
    "running",
    "usage_error",
    "wait_http",
]

BIN = Path(sys.executable).parent


def kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    stop_group(proc, grace)


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``dynspec-bench ARGS`` in a child, without this process's ``DYNSPEC_*`` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    return subprocess.run(
        [sys.executable, "-m", "dynspec.bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def usage_error(*args: str) -> str:
    """The one line ``dynspec-bench ARGS`` writes on bad usage (exit 2); fails otherwise."""
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def rerendered(command: str, jsonl: Path) -> tuple[str, str]:
    """``dynspec-bench COMMAND --from-jsonl JSONL`` with the Markdown next to it removed first:
    the Markdown it wrote again, and its stdout."""
    md = jsonl.with_suffix(".md")
    md.unlink(missing_ok=True)
    r = bench(command, "--from-jsonl", str(jsonl))
    assert r.returncode == 0, r.stderr
    return md.read_text(), r.stdout
