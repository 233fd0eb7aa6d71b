"""Checks before anything starts: GPUs, free ports, model paths, SGLang itself, a pair that fits,
odd tp sizes.

Each failure is one line, exit 2: it is cheaper to be told now than after a tp=4 server has
spent three minutes loading weights. Pure: what the checks look at was found by
``facts.discover`` (the GPUs listed, SGLang, the model folders, the ports taken); the plan
(``plan.py``) calls them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts, flag_facts
from dynspec.launcher.gpus import format_gpus
from dynspec.launcher.sharing import pair_shortfall_gib

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


def check_model_path(value: str | None, flag: str, kind: str) -> None:
    """``kind``: what ``value`` names on this machine (``probe.path_kind``)."""
    if not value:
        raise UsageError(f"{flag} is required")
    if kind == "file":
        raise UsageError(f"{flag} {value}: is a file, expected a model directory")
    if kind == "dir":
        return
    looks_like_path = value.startswith(("/", ".", "~")) or value.count("/") != 1
    if looks_like_path or not _HUB_ID.match(value):
        raise UsageError(f"{flag} {value}: no such directory, and not a hub id like org/name")


def model_heads(cfg: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """Attention and key-value head counts from a model's config.json (None: unknown)."""
    if cfg is None:
        return None, None  # a hub id, or no readable config: SGLang will say what it needs
    # Multimodal models keep the language model's settings in a nested config.
    for section in (cfg, cfg.get("text_config"), cfg.get("llm_config")):
        if isinstance(section, dict) and isinstance(section.get("num_attention_heads"), int):
            kv = section.get("num_key_value_heads")
            return section["num_attention_heads"], kv if isinstance(kv, int) else None
    return None, None


def tp_problems(tp: int, heads: int | None = None, kv_heads: int | None = None) -> list[str]:
    """Why a tensor-parallel size may not work well, or at all; empty when nothing is odd.

    Attention heads are split evenly over the tp ranks, so tp must divide them; key-value heads
    are split too, or replicated when there are fewer than ranks (then they must divide tp).
    NCCL and the kernels are tuned for powers of two.
    """
    problems = []
    if tp & (tp - 1):
        problems.append("is not a power of two")
    if heads and heads % tp:
        problems.append(f"does not divide the model's {heads} attention heads")
    if kv_heads and kv_heads % tp and tp % kv_heads:
        problems.append(f"does not fit its {kv_heads} key-value heads")
    return problems


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def tp_warnings(config: LaunchConfig, facts: LaunchFacts | None = None) -> list[str]:
    """One line per odd tensor-parallel size: not a power of two, or not fitting the heads."""
    sets = (facts or flag_facts(config)).gpu_sets
    if config.simulate or not sets:
        return []
    heads, kv_heads = model_heads((facts or flag_facts(config)).target_config)
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


def _check_sglang(facts: LaunchFacts) -> str | None:
    """A usage error when SGLang is missing; the line to log when it is not the pinned one."""
    pin = facts.sglang_pin
    if not facts.sglang_importable:
        raise UsageError(
            f"SGLang is not installed in this Python: pip install 'dynspec[sglang]' (sglang=={pin})"
        )
    installed = facts.sglang_installed
    if installed is not None and installed != pin:
        return f"SGLang {installed} is installed; dynspec is tested with {pin}"
    return None


def run_preflight(config: LaunchConfig, facts: LaunchFacts) -> tuple[tuple[str, ...], str | None]:
    """Every check that applies to ``config`` and what ``facts`` found (looked at only for a
    launch that starts: ``facts.checked``), in the order the user fixes them (SGLang, GPUs,
    model paths, ports; GPUs, paths and SGLang only when not simulating): the lines to log (an
    SGLang other than the pinned one), and the first failure's one line (None: none failed)."""
    cautions: list[str] = []
    if not facts.checked:
        return (), None
    try:
        if not config.simulate:
            if config.server_command is None:
                caution = _check_sglang(facts)
                cautions += [caution] if caution else []
            if isinstance(facts.listed_gpus, str):
                raise UsageError(facts.listed_gpus)
            check_gpus(config, facts.listed_gpus, facts)
            check_model_path(config.model_path, "--model-path", facts.path_kinds[0])
            check_model_path(config.draft_model_path, "--draft-model-path", facts.path_kinds[1])
        if facts.ports_taken:
            raise UsageError(facts.ports_taken[0])
    except UsageError as exc:
        return tuple(cautions), str(exc)
    return tuple(cautions), None
