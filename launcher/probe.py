"""What the machine has, asked once per launch (``facts.discover``, the only caller): the GPUs
``nvidia-smi`` lists, their memory and names, the SGLang installed in this Python and the one the
launcher pins, the CUDA MPS control binary, the model folders (``config.json``, the weights'
size), and whether a port is free. Each ``nvidia-smi`` reader takes the command runner as an
argument, for tests.
"""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def sglang_importable() -> bool:
    """Whether this Python can import SGLang at all."""
    return importlib.util.find_spec("sglang") is not None


def path_kind(value: str | None) -> str:
    """What a model flag names here: "dir", "file" or "none" (nothing there, or no value)."""
    if not value:
        return "none"
    path = Path(value).expanduser()
    if path.is_dir():
        return "dir"
    return "file" if path.exists() else "none"


def model_config(path: str | None) -> dict[str, Any] | None:
    """A LOCAL model folder's ``config.json``; None for a hub id or an unreadable one."""
    if not path:
        return None
    try:
        cfg = json.loads((Path(path).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def weights_on_disk(path: str | None) -> int | None:
    """Bytes of a LOCAL model's ``*.safetensors`` files; None for a hub id or no such files."""
    if not path:
        return None
    folder = Path(path).expanduser()
    try:
        sizes = [f.stat().st_size for f in folder.glob("*.safetensors") if f.is_file()]
    except OSError:
        return None
    return sum(sizes) or None


def port_problem(host: str, port: int, what: str) -> str | None:
    """Why ``what`` could not listen on ``host:port`` now (one line), or None: it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = host.strip("[]") or "0.0.0.0"
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Same option uvicorn and SGLang set, so a port in TIME_WAIT is not reported as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} ({what}) is already in use on {host}"
            return f"cannot listen on {host}:{port} ({what}): {exc.strerror}"
    return None
