"""The experiments' ways and variants: their names, the simulated servers each needs and the
router each runs (pure, and loading nothing heavy: the CLI validates ``--ways``, ``--layouts``
and ``--variants`` with them before the load modules are imported). ``harness.py`` starts what
they plan.

Which servers an eight-GPU way runs on is its server set (``server_set``, planned by
``plan_servers``): a way whose router learns from its servers (``LEARNING``) has servers of its
own, so no other way's load reaches the ``/metrics`` it polls, nor is left on them when its
level starts; the ways that learn nothing share one set (``SHARED``), one after the other.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# Eight GPUs, seven ways (bench/envelope8.py). Each simulated server stands for four GPUs; a
# shared-GPU simulator (dynspec-sim --pair) for four GPUs holding an EAGLE and a baseline server.
EIGHT_WAYS = (
    "split-threshold",  # one EAGLE + one baseline server on GPUs of their own, --threshold N
    "split-balance",  # the same layout (servers of its own), --policy balance --speed-profile
    "paired-threshold",  # two shared GPUs, router --pair ... --threshold N
    "paired-auto",  # the same layout (servers of its own), --threshold auto, no profile
    "2x-eagle",  # two EAGLE servers, one pool
    "2x-baseline",  # two baseline servers, one pool
    "2x-adaptive",  # two adaptive-EAGLE servers, where the profile has a measured counterpart
)
HOMOGENEOUS = ("2x-eagle", "2x-baseline", "2x-adaptive")
PAIRED = ("paired-threshold", "paired-auto")
# The ways whose router learns from the servers it polls (each server's /metrics, and its own
# requests' speeds): ``--threshold auto`` derives each pair's threshold from the learned curves,
# ``--policy balance`` routes every request by them. A set threshold (and one pool) only polls.
LEARNING = ("split-balance", "paired-auto")
SHARED = "shared"  # the server set of the ways that learn nothing
SHARING = ("timeslice", "mps")

# Several routers in front of the same servers (bench/replicas.py): the layouts, each run as the
# eight-GPU way of that layout with a set threshold, and the variants: how many router replicas
# and which load each compares with the threshold (``--load-signal``).
REPLICA_LAYOUTS = {"split": "split-threshold", "paired": "paired-threshold"}
REPLICA_VARIANTS = {"1-router": (1, "local"), "3-local": (3, "local"), "3-servers": (3, "servers")}
REPLICA_REFERENCE = "1-router"


def _some_of(text: str, known: tuple[str, ...]) -> list[str]:
    """Names from ``known``, comma-separated, in ``known``'s order."""
    names = [n for n in text.replace(" ", "").split(",") if n]
    if not names or any(n not in known for n in names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(known)}, got {text!r}")
    return [n for n in known if n in names]


def parse_ways(text: str) -> list[str]:
    """``--ways``: some of EIGHT_WAYS, run in EIGHT_WAYS' order."""
    return _some_of(text, EIGHT_WAYS)


def parse_layouts(text: str) -> list[str]:
    """``--layouts``: some of REPLICA_LAYOUTS, run in its order."""
    return _some_of(text, tuple(REPLICA_LAYOUTS))


def parse_replica_variants(text: str) -> list[str]:
    """``replicas --variants``: some of REPLICA_VARIANTS, run in its order (the reference
    first)."""
    return _some_of(text, tuple(REPLICA_VARIANTS))


# ---- what each way starts ------------------------------------------------------------------


@dataclass(frozen=True)
class Servers:
    """The simulated servers' URLs, by what they stand for (empty where no chosen way needs it)."""

    eagle: tuple[str, ...] = ()
    baseline: tuple[str, ...] = ()
    shared_gpus: tuple[tuple[str, str], ...] = ()  # (EAGLE URL, baseline URL) per shared GPU
    adaptive: tuple[str, ...] = ()


@dataclass(frozen=True)
class Router:
    """One ``dynspec-router`` to start: the servers it routes to (its own flags), its settings
    (``dynspec-launch`` flags, which the launcher's builder turns into the router's: see
    ``harness.router_argv``) and how many servers its ``/status`` must show healthy first."""

    servers: tuple[str, ...]
    settings: tuple[str, ...] = ()
    healthy: int = 2
    # Its --log-level: "info" writes each learned threshold and mode switch to its log.
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
    """The servers ``way`` runs on: its own (named after it) when its router learns from them,
    else ``SHARED``."""
    needs(way)  # an unknown way is refused here too
    return way if way in LEARNING else SHARED


def plan_servers(
    run_ways: Sequence[str], shared: Mapping[str, int] | None = None
) -> dict[str, dict[str, int]]:
    """Per server set of ``run_ways``, how many servers of each kind it holds: the most any of
    its ways needs (``needs``), ``SHARED`` at least ``shared`` (servers swept alone). A set none
    of them needs is not planned."""
    plan: dict[str, dict[str, int]] = {SHARED: dict(shared)} if shared else {}
    for way in run_ways:
        want = plan.setdefault(server_set(way), {})
        for kind, n in needs(way).items():
            want[kind] = max(want.get(kind, 0), n)
    return plan


def _split(eagle: str, baseline: str) -> tuple[str, ...]:
    return ("--eagle-url", eagle, "--baseline-url", baseline)


def _shared(servers: Servers, count: int = 2) -> tuple[str, ...]:
    flags: tuple[str, ...] = ()
    for e, b in servers.shared_gpus[:count]:
        flags += ("--pair", f"{e},{b}")
    return flags


def _policy(threshold: int, hysteresis: int) -> tuple[str, ...]:
    return ("--threshold", str(threshold), "--hysteresis", str(hysteresis))


def _options(speed_profile: Path | None, metrics_interval: float | None) -> tuple[str, ...]:
    flags: tuple[str, ...] = ()
    if speed_profile is not None:
        flags += ("--speed-profile", str(speed_profile))
    if metrics_interval is not None:
        flags += ("--metrics-interval", repr(metrics_interval))
    return flags


def way_router(
    way: str,
    servers: Servers,
    *,
    threshold: int,
    hysteresis: int,
    speed_profile: Path | None = None,
    metrics_interval: float | None = None,
    calibrated: bool = False,
) -> Router:
    """The router of one eight-GPU way. Threshold 0 is suggest-threshold's "EAGLE never wins":
    the threshold ways then get the baseline servers alone (the threshold policy needs
    --threshold >= 1, which would still send lone requests to EAGLE). ``calibrated``:
    ``paired-auto`` starts from ``speed_profile``, as a launch's ``--calibrate`` starts it."""
    e, b = servers.eagle, servers.baseline
    if way == "split-threshold":
        if threshold <= 0:
            return Router(("--baseline-url", b[0]), healthy=1)
        return Router(_split(e[0], b[0]), _policy(threshold, hysteresis))
    if way == "split-balance":
        return Router(
            _split(e[0], b[0]), ("--policy", "balance", *_options(speed_profile, metrics_interval))
        )
    if way == "paired-threshold" and threshold <= 0:
        return Router(("--baseline-url", ",".join(p[1] for p in servers.shared_gpus[:2])))
    if way == "paired-threshold":
        return Router(_shared(servers), _policy(threshold, hysteresis), healthy=4)
    if way == "paired-auto":
        # Uncalibrated, no profile whatever the run has: auto learns from nothing.
        seed = speed_profile if calibrated else None
        if calibrated and seed is None:
            raise ValueError("a calibrated paired-auto needs a speed profile")
        return Router(_shared(servers), ("--threshold", "auto", *_options(seed, None)), healthy=4)
    if way in HOMOGENEOUS:
        # An adaptive-EAGLE server is an EAGLE server: one pool, no switching.
        urls = {"2x-eagle": e, "2x-baseline": b, "2x-adaptive": servers.adaptive}[way]
        pool = "baseline" if way == "2x-baseline" else "eagle"
        return Router((f"--{pool}-url", ",".join(urls[:2])))
    raise ValueError(f"unknown way {way!r} (known: {', '.join(EIGHT_WAYS)})")


def replica_router(
    way: str,
    servers: Servers,
    *,
    threshold: int,
    hysteresis: int,
    signal: str,
    load_interval: float | None = None,
) -> Router:
    """One of several router replicas in front of the same servers: the way's router with a set
    threshold, and ``--load-signal`` (``--load-interval`` with ``servers``)."""
    r = way_router(way, servers, threshold=threshold, hysteresis=hysteresis)
    # No return delay (a pair's router default is 1 s since cad4789): the ramp measures the
    # switch up from EAGLE mode, which a level before it left in baseline mode would hide, as
    # the committed runs (with none) measured it.
    more: tuple[str, ...] = ("--load-signal", signal)
    if signal == "servers" and load_interval is not None:
        more += ("--load-interval", repr(load_interval))
    return replace(r, settings=r.settings + more + ("--return-delay", "0"))
