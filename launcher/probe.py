"""What the machine has, asked once per launch (``facts.py``): the GPUs ``nvidia-smi`` lists, their
memory and names, the SGLang installed in this Python and the one the launcher pins, and the
CUDA MPS control binary. Each reader takes the command runner as an argument, for tests.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from dynspec.common.cli import UsageError

MPS_CONTROL = "nvidia-cuda-mps-control"
# Where NVIDIA's container toolkit mounts the driver's tools when they are not on PATH.
NVIDIA_BIN = Path("/usr/local/nvidia/bin")


def sglang_requirement() -> str:
    """The pinned SGLang requirement (``sglang==X``), read from the one file that holds it."""
    text = (
        importlib.resources.files("dynspec.launcher")
        .joinpath("sglang-requirements.txt")
        .read_text(encoding="utf-8")
    )
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("sglang"):
            return line
    raise RuntimeError("sglang-requirements.txt names no sglang release")


def sglang_version() -> str:
    return sglang_requirement().split("==", 1)[1].strip()


def list_gpus(run: Callable[[Sequence[str]], str] | None = None) -> tuple[int, ...]:
    """GPU indices that ``nvidia-smi`` lists; a UsageError when there is no driver or no GPU."""
    if run is None:
        if shutil.which("nvidia-smi") is None:
            raise UsageError(
                "no NVIDIA GPU found: nvidia-smi is not installed "
                "(use --simulate to run without GPUs)"
            )
        run = _run_nvidia_smi
    out = run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"])
    gpus = tuple(int(line) for line in out.split() if line.strip().isdigit())
    if not gpus:
        raise UsageError("no NVIDIA GPU found: nvidia-smi lists none (use --simulate)")
    return gpus


def gpu_memory_gib(device: str, run: Callable[[Sequence[str]], str] | None = None) -> float | None:
    """Total memory of a GPU (its nvidia-smi index or UUID, as CUDA_VISIBLE_DEVICES names it);
    None where nvidia-smi cannot tell (none installed, a MIG slice, an unknown name)."""
    if run is None:
        if shutil.which("nvidia-smi") is None:
            return None
        run = _run_nvidia_smi
    query = ["--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = run(["nvidia-smi", *query])
    except UsageError:
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and device in fields[:2]:
            try:
                return float(fields[2]) / 1024.0
            except ValueError:
                return None
    return None


def gpu_names(
    devices: Sequence[str], run: Callable[[Sequence[str]], str] | None = None
) -> list[str]:
    """The product names of these GPUs (nvidia-smi indices or UUIDs, as CUDA_VISIBLE_DEVICES
    names them), each name once, in the order found; empty where nvidia-smi cannot tell."""
    if run is None:
        if shutil.which("nvidia-smi") is None:
            return []
        run = _run_nvidia_smi
    try:
        out = run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"])
    except UsageError:
        return []
    names: list[str] = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",", 2)]
        if (
            len(fields) == 3
            and fields[2]
            and fields[2] not in names
            and (fields[0] in devices or fields[1] in devices)
        ):
            names.append(fields[2])
    return names


def installed_sglang() -> str | None:
    """The version of the SGLang installed in this Python, None when there is none."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_nvidia_smi(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"nvidia-smi failed: {exc}") from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(
            f"nvidia-smi failed (exit {done.returncode}): {reason[0] if reason else 'no output'}"
        )
    return done.stdout


def find_mps_control(path: str | None = None) -> str:
    """The control binary: on PATH, else in /usr/local/nvidia/bin; else a usage error."""
    found = shutil.which(MPS_CONTROL, path=path)
    if found:
        return found
    fallback = NVIDIA_BIN / MPS_CONTROL
    if fallback.is_file() and os.access(fallback, os.X_OK):
        return str(fallback)
    raise UsageError(
        f"--mps: {MPS_CONTROL} is not on PATH or in {NVIDIA_BIN} "
        "(it comes with the NVIDIA driver; or run without --mps)"
    )
