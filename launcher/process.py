"""One child process: started in its own session, output to its log file and the console.

The child is a process-group leader (``start_new_session=True``), so SGLang's scheduler and
detokenizer workers, which inherit the group, are signalled with it and none is left behind.

When the launcher dies without stopping them (SIGKILL, the OOM killer), each child gets SIGTERM
from the kernel (``PR_SET_PDEATHSIG``, set between fork and exec): SGLang's server takes its
scheduler and detokenizer down on it, the router and the simulator exit. The signal follows the
thread that forked the child, and asyncio forks from the event loop's thread, which lives as
long as the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from dynspec.launcher.printer import Printer
from dynspec.launcher.spec import ProcessSpec

_PROC = Path("/proc")
PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once before any fork (Linux only)."""
    if not _PROC.is_dir():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # libc is in the process already
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn``: SIGTERM this child when the process ``parent`` (the launcher) dies.

    Between fork and exec only async-signal-safe work: one prctl call and a check that the
    launcher did not die before it (then the signal would never come).
    """
    prctl = _PRCTL
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def child_environment(
    spec: ProcessSpec, base: Mapping[str, str], drop: Collection[str]
) -> dict[str, str]:
    """The launcher's environment without its own ``DYNSPEC_*`` settings, plus the spec's.

    The launcher's variables are dropped because the children read ``DYNSPEC_<FLAG>`` too: a
    ``DYNSPEC_PORT`` meant for the launcher must not move a server. What a child needs is passed
    explicitly in its argv or in ``spec.env``.
    """
    env = {k: v for k, v in base.items() if k not in drop}
    # Python children write through a pipe: without this their lines arrive in 8 KiB bursts.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(spec.env)
    return env


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    if not _PROC.is_dir():  # not Linux: ask the kernel whether the group still has members
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in _PROC.iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else []
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat``'s fields from the state on (field 3: state, ppid, pgrp, ...), [] when
    there is no such process (the bench's /proc readers use it too)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    return text[text.rfind(")") + 2 :].split()


class Child:
    """A running process from a ``ProcessSpec``; it can be started again after it exits."""

    def __init__(
        self,
        spec: ProcessSpec,
        printer: Printer,
        echo: Callable[[], bool],
        drop_env: Collection[str] = (),
    ) -> None:
        self.spec = spec
        self._printer = printer
        self._echo = echo
        self._drop_env = drop_env
        self._proc: asyncio.subprocess.Process | None = None
        self._log: BinaryIO | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiter: asyncio.Task[int] | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.started_at = 0.0
        self.latest_line = ""
        self.starts = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self.returncode is None

    async def start(self, argv: Sequence[str] | None = None) -> None:
        """Start (again); ``argv`` replaces the spec's (a restart beside a running partner)."""
        argv = self.spec.argv if argv is None else argv
        self.spec.log_file.parent.mkdir(parents=True, exist_ok=True)
        # A local file append: fast, and it must exist before the child writes into the pipe.
        self._log = open(self.spec.log_file, "ab")  # noqa: SIM115, ASYNC230
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._log.write(f"==> dynspec-launch {stamp}: {self.spec.command_line(argv)}\n".encode())
        self._log.flush()
        self.returncode = None
        self.latest_line = ""
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=child_environment(self.spec, os.environ, self._drop_env),
            start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),
        )
        self.pid = self._proc.pid
        self.started_at = time.monotonic()
        self.starts += 1
        self._reader = asyncio.create_task(self._read(self._proc, self._log))
        self._waiter = asyncio.create_task(self._wait(self._proc))

    async def _wait(self, proc: asyncio.subprocess.Process) -> int:
        code = await proc.wait()
        self.returncode = code
        return code

    async def _read(self, proc: asyncio.subprocess.Process, log: BinaryIO) -> None:
        assert proc.stdout is not None
        pending = b""
        while True:
            chunk = await proc.stdout.read(65536)
            if not chunk:
                break
            log.write(chunk)
            log.flush()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._show(raw)
            if b"\r" in pending:
                # A progress bar (weights loading) redraws with \r and no \n: keep its last state.
                *done, pending = pending.split(b"\r")
                self._note(done[-1])
        if pending:
            self._show(pending)

    def _note(self, raw: bytes) -> str:
        text = raw.rsplit(b"\r", 1)[-1].decode("utf-8", "replace").rstrip()
        if text.strip():
            self.latest_line = text.strip()
        return text

    def _show(self, raw: bytes) -> None:
        text = self._note(raw)
        if text and self._echo():
            self._printer.line(self.spec.prefix, text, self.spec.name)

    async def wait_exit(self) -> int:
        assert self._waiter is not None
        return await asyncio.shield(self._waiter)

    def signal_group(self, sig: signal.Signals) -> None:
        if self.pid is None:
            return
        # The group outlives its leader while workers remain, so signal it even after the exit.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def gone(self) -> bool:
        """Exited, and no process of its group is left."""
        if self.pid is None:
            return True
        return self.returncode is not None and not group_members(self.pid)

    async def wait_gone(self, timeout: float, interrupt: asyncio.Event | None = None) -> bool:
        deadline = time.monotonic() + timeout
        while not self.gone():
            if time.monotonic() >= deadline or (interrupt is not None and interrupt.is_set()):
                return False
            await asyncio.sleep(0.05)
        return True

    async def stop(self, grace: float, interrupt: asyncio.Event | None = None) -> None:
        """SIGTERM the group, SIGKILL it after ``grace`` (or at once when ``interrupt`` is set)."""
        if self.gone():
            await self.close()
            return
        self.signal_group(signal.SIGTERM)
        if not await self.wait_gone(grace, interrupt):
            self.signal_group(signal.SIGKILL)
            await self.wait_gone(10.0)
        await self.close()

    async def close(self) -> None:
        """After the process is gone: finish copying its output, close the log file."""
        if self._reader is not None:
            # A worker that escaped its group could hold the pipe open: do not wait for it long.
            try:
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
            except asyncio.TimeoutError:
                self._reader.cancel()
            self._reader = None
        if self._log is not None:
            self._log.close()
            self._log = None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def tail(path: Path, lines: int = 5) -> list[str]:
    """The last lines of a log file (for the error report when a server dies while hidden)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").replace("\r", "\n")
    kept = [ln.rstrip() for ln in text.split("\n") if ln.strip()]
    return kept[-lines:]
