"""Output whose reader leaves early (``| head -1``) ends a command quietly, as it ends ``cat``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.common.cli import READER_GONE

ROOT = Path(__file__).parents[1]
SWEEP = str(ROOT / "bench" / "results" / "h200" / "h200-8b.jsonl")
PYTHON = [sys.executable, "-m"]

COMMANDS = {
    "launch dry-run": [*PYTHON, "dynspec.launcher", "--simulate", "--dry-run"],
    "launch paired dry-run": [
        *PYTHON,
        "dynspec.launcher",
        "--simulate",
        "--layout",
        "paired",
        "--gpus",
        "0-3",
        "--tp",
        "2",
        "--no-router",
        "--dry-run",
    ],
    "launch help": [*PYTHON, "dynspec.launcher", "--help"],
    "router help": [*PYTHON, "dynspec.router", "--help"],
    "sim help": [*PYTHON, "dynspec.launcher.sim", "--help"],
    "bench help": [*PYTHON, "dynspec.bench", "--help"],
    "bench table": [
        *PYTHON,
        "dynspec.bench",
        "suggest-threshold",
        SWEEP,
        SWEEP,
        "--eagle-target",
        "eagle",
        "--baseline-target",
        "baseline",
    ],
}


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("argv", COMMANDS.values(), ids=COMMANDS.keys())
def test_reader_that_left_ends_the_command_quietly(argv: list[str], unbuffered: str) -> None:
    # A pipe whose reading end is closed before the command writes: its first write fails,
    # every time (| head -1 closes the same way, only at a moment that varies).
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        proc = subprocess.run(
            argv, stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60, check=False
        )
    finally:
        os.close(write_end)
    assert proc.stderr == b""
    assert proc.returncode == READER_GONE


def test_head_one_of_a_dry_run_is_the_first_command(tmp_path: Path) -> None:
    # The shell pipeline itself: the first line comes out, nothing else is said.
    argv = " ".join(COMMANDS["launch dry-run"])
    r = subprocess.run(
        ["bash", "-c", f"PYTHONUNBUFFERED=1 {argv} | head -1"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0
    assert r.stderr == ""
    assert r.stdout.count("\n") == 1 and "dynspec.launcher.sim" in r.stdout
