"""The machine a benchmark runs on: what it is (CPU, Python, packages, commit) and what its
processes cost (CPU seconds and RSS of whole process trees, read from Linux /proc)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc/<pid>/task/<tid>/children."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) and of its live descendants, plus their reaped
    children, in seconds."""
    total = 0
    for p in _descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = _stat_fields(p)
            # After the name: state is field 3, so utime (14), stime (15), cutime (16), cstime (17)
            # sit at offsets 11..14.
            total += sum(int(x) for x in fields[11:15])
    return total / CLK_TCK


def rss_bytes(pid: int) -> int:
    total = 0
    for p in _descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{p}/statm") as f:
            total += int(f.read().split()[1]) * PAGE
    return total


class RssSampler:
    """Largest RSS of some processes while a block runs, sampled by a thread."""

    def __init__(self, pids: dict[str, int], period: float = 0.2) -> None:
        self.pids = pids
        self.period = period
        self.peak: dict[str, int] = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            self.peak[name] = max(self.peak[name], rss_bytes(pid))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    for pkg in ("aiohttp", "uvicorn", "uvloop", "httptools", "sglang-router"):
        with contextlib.suppress(PackageNotFoundError):
            versions[pkg] = version(pkg)
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        here = Path(__file__).parent
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=here,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "../router"],
            capture_output=True,
            text=True,
            cwd=here,
            check=False,
        ).stdout.strip()
        if commit and dirty:
            commit += " (router/ with uncommitted changes)"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "commit": commit,
    }
