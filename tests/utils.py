"""Helpers shared by the tests: free loopback ports and real processes that are always reaped."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from dynspec.bench.procs import free_port, stop_group

__all__ = ["BIN", "free_port", "kill_group", "running", "wait_http"]

BIN = Path(sys.executable).parent


def wait_http(url: str, timeout: float = 30.0, status: int = 200) -> None:
    """Poll ``url`` until it answers ``status`` (connection refused counts as not yet)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, timeout=2.0)
            if r.status_code == status:
                return
            last = r.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s (last: {last!r})")


def kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    stop_group(proc, grace)


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    ready_url: str | None = None,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` in its own process group; wait for ``ready_url`` to answer 200; reap."""
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        list(argv),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        if ready_url is not None:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{argv[0]} exited with {proc.returncode} before ready")
                try:
                    wait_http(ready_url, timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
        yield proc
    finally:
        kill_group(proc)
        if log and out is not subprocess.DEVNULL:
            out.close()  # type: ignore[union-attr]
