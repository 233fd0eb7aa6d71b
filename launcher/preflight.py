"""Checks before anything starts: GPUs, free ports, model paths, SGLang itself.

Each failure is a ``UsageError`` (one line, exit 2): it is cheaper to be told now than after a
tp=4 server has spent three minutes loading weights.
"""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.util
import json
import logging
import re
import socket
from collections.abc import Sequence
from pathlib import Path

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts, flag_facts
from dynspec.launcher.gpus import format_gpus, tp_problems
from dynspec.launcher.probe import list_gpus, sglang_version
from dynspec.launcher.sharing import pair_shortfall_gib

log = logging.getLogger(__name__)

# A Hugging Face hub id: "org/name" (one slash, no path-like start).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_gpus(
    config: LaunchConfig, available: Sequence[int], facts: LaunchFacts | None = None
) -> None:
    """The launch's GPUs (``facts``: found, else the flags') are among ``available``."""
    sets = (facts or flag_facts(config)).gpu_sets
    wanted = [g for s in sets for g in s.eagle_gpus] + [g for s in sets for g in s.baseline_gpus]
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


def tp_warnings(config: LaunchConfig, facts: LaunchFacts | None = None) -> list[str]:
    """One line per odd tensor-parallel size: not a power of two, or not fitting the heads."""
    sets = (facts or flag_facts(config)).gpu_sets
    if config.simulate or not sets:
        return []
    heads, kv_heads = model_heads(config.model_path)
    sizes = {"EAGLE": len(sets[0].eagle_gpus), "baseline": len(sets[0].baseline_gpus)}
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


def check_pair_fits(config: LaunchConfig, facts: LaunchFacts | None = None) -> str | None:
    """Two copies of the target and the draft must leave KV room on each GPU of a GPU set: a
    usage error when not; a note (returned) when the check cannot be made. ``facts``: the
    launch's (None: the flags', which know no memory)."""
    facts = facts or flag_facts(config)
    if not facts.shares_gpu:
        return None
    target = facts.target_weight_bytes or (
        facts.target_shape.weight_bytes if facts.target_shape else None
    )
    draft = facts.draft_weight_bytes or (facts.draft_shape.weight_bytes if facts.draft_shape else 0)
    if target is None:
        return (
            f"note: --model-path {config.model_path} is not a local model directory: the check "
            "that two copies fit on each pair's GPUs is skipped"
        )
    if facts.gpu_memory_gib is None:
        return "note: GPU memory unknown (nvidia-smi): the check that two copies fit is skipped"
    tp = len(facts.gpu_sets[0].eagle_gpus)
    short, spelled = pair_shortfall_gib(facts.gpu_memory_gib, tp, target, draft)
    if short > 0:
        raise UsageError(
            f"--layout paired: each GPU ({facts.gpu_memory_gib:.0f} GiB) would need {spelled}: "
            f"{short:.1f} GiB short; use --layout split (one copy per GPU set) or a larger --tp"
        )
    return None


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


def run_preflight(
    config: LaunchConfig,
    available_gpus: Sequence[int] | None = None,
    facts: LaunchFacts | None = None,
) -> None:
    """Every check that applies to ``config`` and the launch's ``facts`` (None: the flags');
    GPUs, paths and SGLang only when not simulating."""
    facts = facts or flag_facts(config)
    if not config.simulate:
        if config.server_command is None:
            check_sglang_installed()
        check_gpus(config, list_gpus() if available_gpus is None else available_gpus, facts)
        check_model_path(config.model_path, "--model-path")
        check_model_path(config.draft_model_path, "--draft-model-path")
    if not config.no_router:
        check_port_free(config.host, config.port, "router")
    for gpu_set in facts.gpu_sets:
        for pool, what in (("eagle", "EAGLE"), ("baseline", "baseline")):
            tag = f" of pair {gpu_set.index}" if gpu_set.count > 1 else ""
            check_port_free(config.backend_host, gpu_set.port(pool), f"{what} server{tag}")
