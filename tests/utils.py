"""Helpers shared by the tests: free loopback ports and real processes that are always reaped.

The process helpers are built on the benchmarks' own (``dynspec.bench.procs``), so tests and
benchmarks start, wait for and stop their children the same way.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from dynspec.bench.procs import Children, free_port, stop_group, wait_http

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


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    ready_url: str | None = None,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    *,
    grace: float = 5.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """One child in its own process group: ready once ``ready_url`` answers 200, always stopped."""
    name = _label(argv)
    with Children(grace=grace) as children:
        proc = children.start(name, argv, env=env, log=log)
        if ready_url is not None:
            children.wait_ready(proc, ready_url, timeout, name=name)
        yield proc


def _label(argv: Sequence[str]) -> str:
    """A short name for a child: the module of ``python -m MODULE``, else the script or program."""
    if len(argv) > 2 and argv[1] == "-m":
        return argv[2]
    if len(argv) > 1 and Path(argv[0]).name.startswith("python"):
        return Path(argv[1]).name
    return Path(argv[0]).name
