"""The eight-GPU ways: their names, the simulated servers each needs and the router each runs.
Pure and light: the CLI validates ``--ways`` with it before the load modules are imported.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Each simulated server stands for four GPUs; a shared-GPU simulator (dynspec-sim --pair) for
# four GPUs holding an EAGLE and a baseline server.
EIGHT_WAYS = (
    "split-threshold",  # one EAGLE + one baseline server on GPUs of their own, --threshold N
    "split-balance",  # the same layout, --policy balance --speed-profile
    "paired-threshold",  # two shared GPUs, router --pair ... --threshold N
    "paired-auto",  # the same layout, --threshold auto, no profile
    "2x-eagle",  # two EAGLE servers, one pool
    "2x-baseline",  # two baseline servers, one pool
    "2x-adaptive",  # two adaptive-EAGLE servers, where the profile has a measured counterpart
)
HOMOGENEOUS = ("2x-eagle", "2x-baseline", "2x-adaptive")
PAIRED = ("paired-threshold", "paired-auto")
# Routers that learn from the servers they poll run on servers of their own: no other way's load
# reaches the /metrics they read. The others share SHARED, one after the other.
LEARNING = ("split-balance", "paired-auto")
SHARED = "shared"  # the server set of the ways that learn nothing


def parse_ways(text: str) -> list[str]:
    """``--ways``: some of EIGHT_WAYS, run in EIGHT_WAYS' order."""
    names = [n for n in text.replace(" ", "").split(",") if n]
    if not names or any(n not in EIGHT_WAYS for n in names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(EIGHT_WAYS)}, got {text!r}")
    return [n for n in EIGHT_WAYS if n in names]


@dataclass(frozen=True)
class Servers:
    """The simulated servers' URLs, by what they stand for (empty where no chosen way needs it)."""

    eagle: tuple[str, ...] = ()
    baseline: tuple[str, ...] = ()
    shared_gpus: tuple[tuple[str, str], ...] = ()  # (EAGLE URL, baseline URL) per shared GPU
    adaptive: tuple[str, ...] = ()


@dataclass(frozen=True)
class Router:
    """One ``dynspec-router`` to start: its server flags, its settings (``dynspec-launch`` flags,
    turned into the router's by ``harness.router_argv``) and how many servers its ``/status``
    must show healthy first."""

    servers: tuple[str, ...]
    settings: tuple[str, ...] = ()
    healthy: int = 2
    log_level: str = "warning"

    def urls(self) -> tuple[str, ...]:
        """The server URLs its flags point it at, in their order."""
        values = self.servers[1::2]  # every server flag takes one value
        return tuple(u for v in values for u in v.split(","))


def needs(way: str) -> dict[str, int]:
    """How many servers of each kind (``Servers``' fields) a way uses."""
    if way in ("split-threshold", "split-balance"):
        return {"eagle": 1, "baseline": 1}
    if way in PAIRED:
        return {"shared_gpus": 2}
    if way in HOMOGENEOUS:
        return {way[3:]: 2}
    raise ValueError(f"unknown way {way!r} (known: {', '.join(EIGHT_WAYS)})")


def server_set(way: str) -> str:
    """The servers ``way`` runs on: its own (named after it) if it learns, else ``SHARED``."""
    needs(way)  # an unknown way is refused here too
    return way if way in LEARNING else SHARED


def plan_servers(
    run_ways: Sequence[str], shared: Mapping[str, int] | None = None
) -> dict[str, dict[str, int]]:
    """Per server set of ``run_ways``, how many servers of each kind it holds: the most any of
    its ways needs, ``SHARED`` at least ``shared`` (servers swept alone)."""
    plan: dict[str, dict[str, int]] = {SHARED: dict(shared)} if shared else {}
    for way in run_ways:
        want = plan.setdefault(server_set(way), {})
        for kind, n in needs(way).items():
            want[kind] = max(want.get(kind, 0), n)
    return plan


def _pairs(servers: Servers) -> tuple[str, ...]:
    return tuple(f for e, b in servers.shared_gpus[:2] for f in ("--pair", f"{e},{b}"))


def way_router(
    way: str,
    servers: Servers,
    *,
    threshold: int,
    hysteresis: int,
    speed_profile: Path | None = None,
    calibrated: bool = False,
) -> Router:
    """The router of one way. Threshold 0 ("EAGLE never wins") gives the threshold ways the
    baseline servers alone: ``--threshold 1`` would still send lone requests to EAGLE."""
    e, b = servers.eagle, servers.baseline
    split = ("--eagle-url", e[0], "--baseline-url", b[0]) if e and b else ()
    policy = ("--threshold", str(threshold), "--hysteresis", str(hysteresis))
    profile = ("--speed-profile", str(speed_profile)) if speed_profile is not None else ()
    if way == "split-threshold":
        if threshold <= 0:
            return Router(("--baseline-url", b[0]), healthy=1)
        return Router(split, policy)
    if way == "split-balance":
        return Router(split, ("--policy", "balance", *profile))
    if way == "paired-threshold" and threshold <= 0:
        return Router(("--baseline-url", ",".join(p[1] for p in servers.shared_gpus[:2])))
    if way == "paired-threshold":
        return Router(_pairs(servers), policy, healthy=4)
    if way == "paired-auto":
        if calibrated and speed_profile is None:
            raise ValueError("a calibrated paired-auto needs a speed profile")
        seed = profile if calibrated else ()
        return Router(_pairs(servers), ("--threshold", "auto", *seed), healthy=4)
    if way in HOMOGENEOUS:
        # An adaptive-EAGLE server is an EAGLE server: one pool, no switching.
        urls = {"2x-eagle": e, "2x-baseline": b, "2x-adaptive": servers.adaptive}[way]
        pool = "baseline" if way == "2x-baseline" else "eagle"
        return Router((f"--{pool}-url", ",".join(urls[:2])))
    raise ValueError(f"unknown way {way!r} (known: {', '.join(EIGHT_WAYS)})")
