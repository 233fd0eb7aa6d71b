"""``dynspec-sim`` as a command: help, usage errors (exit 2), runtime errors (exit 1), env flags."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from simkit import SimFactory
from utils import BIN, free_port

from dynspec.launcher.sim.profile import load_profile

SIM = [sys.executable, "-m", "dynspec.launcher.sim"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SIM, *args], capture_output=True, text=True, timeout=30, env=env, check=False
    )


def test_help_explains_every_flag() -> None:
    r = run("--help")
    assert r.returncode == 0
    for flag in (
        "--port",
        "--host",
        "--mode",
        "--profile",
        "--served-model-name",
        "--max-running-requests",
        "--startup-delay",
        "--speed",
        "--seed",
        "--log-level",
    ):
        assert flag in r.stdout
    assert "DYNSPEC_SPEED" in r.stdout


def test_console_script_is_installed() -> None:
    exe = BIN / "dynspec-sim"
    assert exe.exists()
    r = subprocess.run(
        [str(exe), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert r.returncode == 0 and "simulated SGLang" in r.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "turbo"], "invalid choice"),
        (["--speed", "0"], "--speed"),
        (["--speed", "fast"], "--speed"),
        (["--max-running-requests", "0"], "--max-running-requests"),
        (["--startup-delay", "-1"], "--startup-delay"),
        (["--stream-interval", "0"], "--stream-interval"),
        (["--baseline-stream-interval", "4"], "--baseline-stream-interval needs --pair"),
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--profile", "/nonexistent/p.json"], "cannot read profile"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], needle: str) -> None:
    r = run("--port", str(free_port()), *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert lines[0].startswith("dynspec-sim: error:")


def test_bad_profile_file_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"schema": 1, "name": "b", "source": "x", "modes": {}}))
    r = run("--port", str(free_port()), "--profile", str(f))
    assert r.returncode == 2 and "modes" in r.stderr


def test_port_in_use_exits_1() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = run("--port", str(s.getsockname()[1]))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_flags_from_environment_and_profile_file(sim_factory: SimFactory, tmp_path: Path) -> None:
    p = load_profile("demo").to_dict()
    p["name"] = "mine"
    p["model"] = "my-model"
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(p))
    env = {"DYNSPEC_MODE": "baseline", "DYNSPEC_PROFILE": str(f), "DYNSPEC_SEED": "4"}
    sim = sim_factory(env=env)
    info = httpx.get(sim.url + "/server_info").json()
    assert info["speculative_algorithm"] is None
    assert info["served_model_name"] == "my-model"
    assert info["random_seed"] == 4
    assert info["simulated"]["profile"] == "mine"
