"""Run the real ``dynspec-launch`` in a subprocess, read its output, find every process it made."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from utils import free_port

FAKE_SGLANG = Path(__file__).parent.parent / "fake_sglang.py"


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


class LauncherRun:
    def __init__(self, tmp: Path, argv: list[str], env: dict[str, str]) -> None:
        self.tmp = tmp
        self.out_path = tmp / "stdout.txt"
        self.err_path = tmp / "stderr.txt"
        self.seen: set[int] = set()
        self._out = open(self.out_path, "wb")  # noqa: SIM115
        self._err = open(self.err_path, "wb")  # noqa: SIM115
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DYNSPEC_", "FAKE_"))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynspec.launcher", *argv],
            stdout=self._out,
            stderr=self._err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**base, **env},
            cwd=tmp,
        )

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.note_processes()
            match = re.search(pattern, self.out)
            if match:
                return match
            if self.proc.poll() is not None:
                match = re.search(pattern, self.out)
                if match:
                    return match
                raise AssertionError(
                    f"launcher exited {self.proc.returncode} before {pattern!r}\n"
                    f"stdout:\n{self.out[-3000:]}\nstderr:\n{self.err[-2000:]}"
                )
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout}s\nstdout:\n{self.out[-3000:]}")

    def note_processes(self) -> None:
        """Remember the launcher's children and the fake servers' workers (to check at the end)."""
        if self.proc.poll() is None:
            self.seen.update(children(self.proc.pid))
        starts = self.tmp / "starts.log"
        if starts.exists():
            for line in starts.read_text().splitlines():
                self.seen.update(int(p) for p in line.split()[1:])

    def send(self, sig: signal.Signals) -> None:
        self.note_processes()
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def leftovers(self) -> list[int]:
        self.note_processes()
        return sorted(p for p in self.seen if alive(p))

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._out.close()
        self._err.close()


@contextlib.contextmanager
def launched(
    tmp: Path, *extra: str, env: dict[str, str] | None = None, fake: bool = True
) -> Iterator[tuple[LauncherRun, dict[str, int]]]:
    """The launcher on free loopback ports, with the fake SGLang unless ``fake`` is False."""
    ports = {"router": free_port(), "eagle": free_port(), "baseline": free_port()}
    argv = [
        "--host",
        "127.0.0.1",
        "--port",
        str(ports["router"]),
        "--eagle-port",
        str(ports["eagle"]),
        "--baseline-port",
        str(ports["baseline"]),
        "--log-dir",
        str(tmp / "logs"),
    ]
    if fake:
        argv += ["--gpus", "0-1", "--model-path", "org/m", "--draft-model-path", "org/d"]
        argv += ["--server-command", f"{sys.executable} {FAKE_SGLANG}", "--no-preflight"]
    run = LauncherRun(tmp, [*argv, *extra], {"FAKE_SGLANG_STATE": str(tmp), **(env or {})})
    try:
        yield run, ports
    finally:
        run.cleanup()


def _has_flag(build_parser: object, flag: str) -> bool:
    actions = build_parser()._actions  # type: ignore[operator]
    return any(flag in a.option_strings for a in actions)


def router_takes_pairs() -> bool:
    """The router's ``--pair E,B`` (the paired layout's router flags; the router's own work)."""
    from dynspec.router.config import build_parser

    return _has_flag(build_parser, "--pair")


def sim_serves_pairs() -> bool:
    """``dynspec-sim --pair`` (one process serving both servers of a pair; the simulator's work)."""
    from dynspec.launcher.sim.cli import build_parser

    return _has_flag(build_parser, "--pair")
