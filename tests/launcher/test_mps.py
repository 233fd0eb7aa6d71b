"""--mps with a fake ``nvidia-cuda-mps-control``: one daemon per pair, started before the servers
and quit after them on every exit path; none installed: one line, exit 2."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_run import alive, launched

FAKE_MPS = Path(__file__).parent / "fake_mps_control.py"
SHORT = ["--kill-grace", "1", "--drain-timeout", "2", "--no-router"]


def fake_mps_env(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_MPS} "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_MPS_LOG": str(tmp / "mps-calls.log")}


def calls(tmp: Path) -> list[str]:
    path = tmp / "mps-calls.log"
    return path.read_text().splitlines() if path.exists() else []


def daemon_pid(tmp: Path, pair: int = 0) -> int:
    return int((tmp / "logs" / f"mps{pair}" / "pipe" / "daemon.pid").read_text())


def test_each_pair_gets_a_daemon_before_its_servers_and_loses_it_after(tmp_path: Path) -> None:
    env = fake_mps_env(tmp_path)
    argv = [*SHORT, "--mps", "--gpus", "0-1", "--layout", "paired", "--tp", "1"]
    with launched(tmp_path, *argv, env=env) as (run, ports):
        run.wait_for(r"\[dynspec\] ready: servers only")
        out = run.out
        for pair in (0, 1):
            started = out.index(f"[dynspec] MPS control daemon for pair {pair} started")
            assert started < out.index(f"[eagle{pair} gpu{pair}] fake sglang eagle")
            assert alive(daemon_pid(tmp_path, pair))
            pipe = tmp_path.resolve() / "logs" / f"mps{pair}" / "pipe"
            # Both servers are its clients: the same pipe directory, GPUs renumbered from 0.
            for pool in ("eagle", "baseline"):
                header = (tmp_path / "logs" / f"{pool}{pair}.log").read_text().splitlines()[0]
                assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in header
                assert "CUDA_VISIBLE_DEVICES=0 " in header
        started_calls = [c for c in calls(tmp_path) if "args=-d" in c]
        assert len(started_calls) == 2
        assert "cvd=0 " in started_calls[0] or "cvd=0 " in started_calls[1]
        assert "cvd=1 " in started_calls[0] or "cvd=1 " in started_calls[1]
        # No router: the servers answer directly.
        assert f"serving at http://127.0.0.1:{ports['eagle']}" in out
        pids = [daemon_pid(tmp_path, p) for p in (0, 1)]
        run.send(signal.SIGINT)
        assert run.wait(30) == 130
        assert run.leftovers() == []
        assert not any(alive(p) for p in pids)
        out = run.out
        assert out.index("servers: SIGTERM") < out.index("MPS control daemon for pair 0 stopped")
        quits = [c for c in calls(tmp_path) if "stdin=quit" in c]
        assert len(quits) == 2


def test_daemon_is_quit_when_a_server_fails_at_start(tmp_path: Path) -> None:
    env = {**fake_mps_env(tmp_path), "FAKE_SGLANG_EAGLE": "crash-start"}
    with launched(tmp_path, *SHORT, "--mps", "--gpus", "0", env=env) as (run, _):
        assert run.wait(60) == 1
        pid = daemon_pid(tmp_path)
        assert not alive(pid)
        assert [c.split()[1] for c in calls(tmp_path)] == ["args=-d", "args=-"]
        assert run.leftovers() == []


def test_a_daemon_left_by_a_killed_launcher_is_quit_before_the_new_one(tmp_path: Path) -> None:
    env = fake_mps_env(tmp_path)
    with launched(tmp_path, *SHORT, "--mps", "--gpus", "0", env=env) as (run, _):
        run.wait_for(r"\[dynspec\] ready")
        first = daemon_pid(tmp_path)
        run.send(signal.SIGKILL)
        run.wait(10)
    assert alive(first)  # nothing could quit it
    (tmp_path / "starts.log").unlink()
    with launched(tmp_path, *SHORT, "--mps", "--gpus", "0", env=env) as (run, _):
        run.wait_for(r"\[dynspec\] ready")
        assert not alive(first) and alive(daemon_pid(tmp_path))
        run.send(signal.SIGTERM)
        assert run.wait(30) == 143
        assert not alive(daemon_pid(tmp_path))


@pytest.mark.skipif(
    Path("/usr/local/nvidia/bin/nvidia-cuda-mps-control").exists(),
    reason="this machine has MPS in /usr/local/nvidia/bin",
)
def test_no_mps_control_is_one_line_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", "--dry-run", "--gpus", "0", "--mps",
         "--model-path", "org/m", "--draft-model-path", "org/d"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PATH": str(empty)},
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert (
        "--mps: nvidia-cuda-mps-control is not on PATH or in /usr/local/nvidia/bin" in done.stderr
    )
