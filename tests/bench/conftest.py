"""The bench tests' shared skip: the shared-GPU pair ways need ``dynspec-sim --pair`` and
``dynspec-router --pair``, which land from other branches."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from utils import free_port, running


@functools.cache
def _has_pair_flag(module: str) -> bool:
    r = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "--pair" in r.stdout


@pytest.fixture
def needs_pairs() -> None:
    """Skip, saying why, unless both the simulator and the router take ``--pair``."""
    missing = [
        name
        for name, module in (
            ("dynspec-sim", "dynspec.launcher.sim"),
            ("dynspec-router", "dynspec.router"),
        )
        if not _has_pair_flag(module)
    ]
    if missing:
        pytest.skip(f"{' and '.join(missing)} --help lists no --pair (shared-GPU pairs not merged)")


@pytest.fixture
def eagle_sim(tmp_path: Path) -> Iterator[str]:
    """One ``dynspec-sim`` EAGLE server (``demo``, ten times real time), its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(port), "--mode", "eagle"]
    argv += ["--profile", "demo", "--speed", "10", "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with running(argv, url + "/health_generate", timeout=30, log=tmp_path / "sim.log"):
        yield url
