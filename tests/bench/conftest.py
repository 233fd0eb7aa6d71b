"""The bench tests' shared skip: the shared-GPU pair ways need ``dynspec-sim --pair`` and
``dynspec-router --pair``, which land from other branches."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest


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
