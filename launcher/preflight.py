"""Checks before anything starts: GPUs, free ports, model paths, SGLang itself.

Each failure is a ``UsageError`` (one line, exit 2): it is cheaper to be told now than after a
tp=4 server has spent three minutes loading weights.
"""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.resources
import importlib.util
import json
import logging
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.gpus import format_gpus, tp_problems
from dynspec.launcher.layout import pairs_of

log = logging.getLogger(__name__)

# A Hugging Face hub id: "org/name" (one slash, no path-like start).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def check_gpus(config: LaunchConfig, available: Sequence[int]) -> None:
    wanted = [*config.eagle_gpus, *config.baseline_gpus]
    visible = config.visible_gpus
    if visible is not None:
        # nvidia-smi ignores CUDA_VISIBLE_DEVICES: compare the ids the indices stand for (UUIDs
        # and MIG names it does not list by index, so those are left to CUDA).
        if not all(visible[g].isdigit() for g in wanted):
            return
        wanted = [int(visible[g]) for g in wanted]
    missing = [g for g in wanted if g not in available]
    if missing:
        raise UsageError(
            f"GPU {missing[0]} is not on this machine: nvidia-smi lists {len(available)} GPU(s) "
            f"({format_gpus(sorted(available))}), the launch needs {format_gpus(wanted)}"
        )


def check_model_path(value: str | None, flag: str) -> None:
    if not value:
        raise UsageError(f"{flag} is required")
    path = Path(value).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{flag} {value}: is a file, expected a model directory")
        return
    looks_like_path = value.startswith(("/", ".", "~")) or value.count("/") != 1
    if looks_like_path or not _HUB_ID.match(value):
        raise UsageError(f"{flag} {value}: no such directory, and not a hub id like org/name")


def model_heads(model_path: str | None) -> tuple[int | None, int | None]:
    """Attention and key-value head counts from a local model's config.json (None: unknown)."""
    if not model_path:
        return None, None
    try:
        data = json.loads((Path(model_path).expanduser() / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None, None  # a hub id, or no readable config: SGLang will say what it needs
    if not isinstance(data, dict):
        return None, None
    # Multimodal models keep the language model's settings in a nested config.
    for section in (data, data.get("text_config"), data.get("llm_config")):
        if isinstance(section, dict) and isinstance(section.get("num_attention_heads"), int):
            kv = section.get("num_key_value_heads")
            return section["num_attention_heads"], kv if isinstance(kv, int) else None
    return None, None


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def tp_warnings(config: LaunchConfig) -> list[str]:
    """One line per odd tensor-parallel size: not a power of two, or not fitting the heads."""
    if config.simulate:
        return []
    heads, kv_heads = model_heads(config.model_path)
    if config.layout == "paired" and config.pairs:
        tp_pair = len(config.pairs[0])
        sizes = {"EAGLE": tp_pair, "baseline": tp_pair}
    else:
        sizes = {"EAGLE": len(config.eagle_gpus), "baseline": len(config.baseline_gpus)}
    lines = []
    for tp in sorted(set(sizes.values())):
        problems = tp_problems(tp, heads, kv_heads)
        if problems:
            who = [name for name, size in sizes.items() if size == tp]
            servers = "both servers" if len(who) == 2 else f"the {who[0]} server"
            lines.append(
                f"tp {tp} ({servers}) {_and(problems)}: SGLang may refuse it or run "
                "slower; 1, 2, 4 or 8 GPUs per server are the usual sizes"
            )
    return lines


def check_port_free(host: str, port: int, what: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = host.strip("[]") or "0.0.0.0"
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Same option uvicorn and SGLang set, so a port in TIME_WAIT is not reported as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} ({what}) is already in use on {host}") from None
            raise UsageError(f"cannot listen on {host}:{port} ({what}): {exc.strerror}") from None


def check_sglang_installed() -> None:
    pin = sglang_version()
    if importlib.util.find_spec("sglang") is None:
        raise UsageError(
            f"SGLang is not installed in this Python: pip install 'dynspec[sglang]' (sglang=={pin})"
        )
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return
    if installed != pin:
        log.warning("SGLang %s is installed; dynspec is tested with %s", installed, pin)


def run_preflight(config: LaunchConfig, available_gpus: Sequence[int] | None = None) -> None:
    """Every check that applies to ``config``; GPUs, paths and SGLang only when not simulating."""
    if not config.simulate:
        if config.server_command is None:
            check_sglang_installed()
        check_gpus(config, list_gpus() if available_gpus is None else available_gpus)
        check_model_path(config.model_path, "--model-path")
        check_model_path(config.draft_model_path, "--draft-model-path")
    if not config.no_router:
        check_port_free(config.host, config.port, "router")
    for pair in pairs_of(config):
        for pool, what in (("eagle", "EAGLE"), ("baseline", "baseline")):
            tag = f" of pair {pair.index}" if pair.count > 1 else ""
            check_port_free(config.backend_host, pair.port(pool), f"{what} server{tag}")
