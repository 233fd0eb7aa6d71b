"""Child processes of the benchmarks: loopback ports for them, and stopping their process groups."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace)
