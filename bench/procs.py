"""Child processes of the benchmarks and the tests: started in their own process groups, waited
for on loopback (no proxies), stopped group and all; /proc readers for processes others started.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from dynspec.launcher.process import stat_fields

logger = logging.getLogger(__name__)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def captured(
    argv: Sequence[str], *, check: bool = False, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end, its output captured as text."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, **kw)


def environment_without(prefixes: Sequence[str]) -> dict[str, str]:
    """This process's environment less the variables that start with one of ``prefixes``."""
    return {k: v for k, v in os.environ.items() if not k.startswith(tuple(prefixes))}


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank ("" where none is)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status ``url`` answers a GET with, or None when it does not answer."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except (OSError, ValueError, http.client.HTTPException):
        return None


def fetch(url: str, timeout: float = 10.0) -> str:
    """A loopback page's text (never through a proxy from the environment)."""
    with _OPENER.open(url, timeout=timeout) as r:
        return str(r.read().decode("utf-8", "replace"))


def wait_http(
    url: str,
    timeout: float = 30.0,
    status: int = 200,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    name: str = "",
    log: Path | None = None,
) -> None:
    """Poll ``url`` until it answers ``status`` (a refused connection is not yet). With
    ``proc``, its exit ends the wait (RuntimeError); the deadline raises TimeoutError."""
    who = name or url
    where = f" (log: {log})" if log else ""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{who} exited with {proc.returncode} before ready{where}")
        last = http_status(url, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
        if last == status:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"{who} did not answer {status} at {url} within {timeout:g}s "
                f"(last: {'no answer' if last is None else last}){where}"
            )
        time.sleep(0.05)


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


class Children:
    """Children in their own process groups, stopped last-started first when the block ends.
    Output goes to ``log``, else ``log_dir/NAME.log``, else nowhere; the environment is this
    process's without the variables that start with one of ``drop_env``, plus ``env``."""

    def __init__(
        self, log_dir: Path | None = None, *, drop_env: Sequence[str] = (), grace: float = 10.0
    ) -> None:
        self.log_dir = log_dir
        self.drop_env = tuple(drop_env)
        self.grace = grace
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path | None] = {}

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        append: bool = False,
    ) -> subprocess.Popen[bytes]:
        if log is None and self.log_dir is not None:
            log = self.log_dir / f"{name}.log"
        base = environment_without(self.drop_env)
        out: IO[bytes] | int = subprocess.DEVNULL
        if log is not None:
            out = open(log, "ab" if append else "wb")  # noqa: SIM115 - closed once the child has it
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**base, **(env or {})})  # fmt: skip
        finally:
            if not isinstance(out, int):
                out.close()
        self.procs.append(proc)
        self.logs[proc.pid] = log
        logger.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return proc

    def wait_ready(
        self,
        proc: subprocess.Popen[bytes],
        url: str,
        timeout: float = 30.0,
        *,
        name: str = "",
    ) -> None:
        wait_http(url, timeout, proc=proc, name=name, log=self.logs.get(proc.pid))

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            stop_group(proc, self.grace)


# -- /proc ---------------------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent, start time in clock ticks) of a process, None when there is none."""
    fields = stat_fields(pid)
    return (fields[0], int(fields[1]), int(fields[19])) if fields else None


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) and of its live descendants, in seconds; what
    is gone counts 0."""
    ticks = 0
    for p in (pid, *descendants(pid)):
        # utime and stime are fields 14 and 15; a process gone meanwhile has none.
        with contextlib.suppress(ValueError, IndexError):
            fields = stat_fields(p)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def alive(pid: int, started: int) -> bool:
    """The same process (not a later one with its number) still runs (a zombie does not)."""
    st = proc_stat(pid)
    return st is not None and st[0] != "Z" and st[2] == started


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children, ...)."""
    tree: dict[int, int] = {}  # pid -> parent
    for entry in Path("/proc").iterdir():
        st = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if st is not None and st[0] != "Z":
            tree[int(entry.name)] = st[1]
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in tree.items() if parent == pid]
        found += kids
        todo += kids
    return found


def rss_mib(pid: int) -> float | None:
    """A process's resident memory (``VmRSS``) in MiB; None once it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return None
