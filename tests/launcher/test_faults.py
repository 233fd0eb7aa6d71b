"""Faults that must not strand the children (issue 17): a console whose reader is gone, and the
launcher's own death. Real router and simulated servers on loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher_run import alive, children, launched
from utils import free_port


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(check: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return bool(check())  # type: ignore[operator]


def test_a_console_that_goes_away_still_lets_shutdown_stop_everything(tmp_path: Path) -> None:
    # `dynspec-launch --simulate 2>&1 | tee log`, then Ctrl-C: tee dies of the same SIGINT, and
    # the launcher's first shutdown line meets a pipe with no reader.
    ports = {name: free_port() for name in ("router", "eagle", "baseline")}
    argv = [
        sys.executable, "-m", "dynspec.launcher", "--simulate", "--host", "127.0.0.1",
        "--port", str(ports["router"]), "--eagle-port", str(ports["eagle"]),
        "--baseline-port", str(ports["baseline"]), "--log-dir", str(tmp_path / "logs"),
        "--drain-timeout", "5", "--kill-grace", "2",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    seen: set[int] = set()
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if b"[dynspec] policy threshold" in line:
                break
        assert lines and b"[dynspec] policy threshold" in lines[-1], b"".join(lines)
        seen.update(children(proc.pid))
        assert len(seen) == 3  # router and two simulated servers
        proc.stdout.close()  # the reader is gone
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert wait_until(lambda: not any(alive(p) for p in seen), 10)
        assert all(port_free(p) for p in ports.values())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_children_end_on_their_own_when_the_launcher_is_killed(tmp_path: Path) -> None:
    with launched(tmp_path, "--simulate", fake=False) as (run, ports):
        run.wait_for(r"\[dynspec\] policy threshold", 90)
        run.note_processes()
        kids = set(run.seen)
        assert len(kids) == 3
        run.send(signal.SIGKILL)
        assert run.wait(10) == -signal.SIGKILL
        # SIGTERM from the kernel (PR_SET_PDEATHSIG): no survivor within 10 s, every port free.
        assert wait_until(lambda: not any(alive(p) for p in kids), 10), [
            p for p in kids if alive(p)
        ]
        assert wait_until(lambda: all(port_free(p) for p in ports.values()), 5)


def test_fake_sglang_servers_end_too_when_the_launcher_is_killed(tmp_path: Path) -> None:
    # The GPU path: SGLang's own server process gets the SIGTERM (and takes its workers down).
    with launched(tmp_path, "--kill-grace", "1", "--no-router") as (run, ports):
        run.wait_for(r"\[dynspec\] ready")
        run.note_processes()
        kids = set(children(run.proc.pid))
        assert len(kids) == 2
        run.send(signal.SIGKILL)
        run.wait(10)
        assert wait_until(lambda: not any(alive(p) for p in kids), 10)
        assert wait_until(lambda: port_free(ports["eagle"]) and port_free(ports["baseline"]), 5)


def test_eagle_restarted_beside_its_running_baseline_takes_the_second_share(
    tmp_path: Path,
) -> None:
    # One GPU, one pair: the EAGLE server dies while its baseline holds half of the memory. Its
    # first --mem-fraction-static was of an empty GPU; restarted, it sees only the other half free.
    env = {"FAKE_SGLANG_EAGLE": "crash-later"}
    with launched(tmp_path, "--kill-grace", "1", "--no-router", "--gpus", "0", env=env) as (
        run,
        _,
    ):
        run.wait_for(r"\[dynspec\] ready")
        (tmp_path / "crash-eagle").touch()
        run.wait_for(r"\[eagle gpu0\] healthy again after")
        headers = [
            line
            for line in (tmp_path / "logs" / "eagle.log").read_text().splitlines()
            if line.startswith("==> dynspec-launch")
        ]
        baseline = (tmp_path / "logs" / "baseline.log").read_text().splitlines()[0]
        assert len(headers) == 2
        assert "--mem-fraction-static 0.44" in headers[0]
        assert (
            "--mem-fraction-static 0.804" in headers[1]
            and "--mem-fraction-static 0.804" in baseline
        )
        run.send(signal.SIGINT)
        assert run.wait(30) == 130
        assert run.leftovers() == []
