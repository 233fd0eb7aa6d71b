"""What a GPU run may leave on the machine, found and ended: the processes that carry the run's
tag in their environment (``TAG_VAR``: SGLang servers the launcher started in sessions of their
own, and their workers), and what ``nvidia-smi`` lists as running on the GPU."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from dynspec.bench.procs import captured

TAG_VAR = "GPU_RUN_TAG"


def tagged_pids(tag: str, proc: Path = Path("/proc")) -> list[int]:
    """Processes whose environment carries this run's tag (SGLang servers that the launcher
    started in sessions of their own, and their workers, included)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def kill_tagged(tag: str) -> list[int]:
    """SIGKILL what is left of this run (nothing, when every stop worked); returns those pids."""
    pids = tagged_pids(tag) if tag and Path("/proc").is_dir() else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def compute_apps(*, header: bool = True) -> tuple[bool, str]:
    """``nvidia-smi``'s compute processes (under MPS the servers run inside its server): whether
    it answered, and its text (else the reason it did not)."""
    fmt = "csv" if header else "csv,noheader"
    try:
        query = ["--query-compute-apps=pid,process_name,used_memory", f"--format={fmt}"]
        done = captured(["nvidia-smi", *query], timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"nvidia-smi: {exc}"
    if done.returncode != 0:
        return False, (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")
    return True, done.stdout.strip()
