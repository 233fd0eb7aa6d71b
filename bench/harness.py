"""The one home of what every simulated experiment (envelope, eight GPUs, ramp, replicas) does
around its load: start ``dynspec-sim`` servers (alone, as a shared-GPU pair, or the set a way
needs) and ``dynspec-router``s on free loopback ports, wait until they are healthy, stop their
process groups, write the router's ``--speed-profile`` at the simulators' wall-clock speed, plan
the router flags of every way (the eight-GPU ways, the ramp's variants, the router replicas, and
the threshold-0 rule, once), and the run metadata (machine, code commit, command) every record
carries.

The low-level child handling (process groups, readiness polling) is ``bench/procs.py``, which the
tests use too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from dynspec.bench.procs import Children, free_port, stop_group
from dynspec.bench.ways import EIGHT_WAYS, HOMOGENEOUS, OLD_NAMES, PAIRED
from dynspec.launcher.sim.profile import Profile

__all__ = [
    "Children",
    "Servers",
    "SimSettings",
    "code_commit",
    "free_port",
    "load_average",
    "machine",
    "processes",
    "replica_flags",
    "router_profile",
    "run_metadata",
    "start_pair_sim",
    "start_router",
    "start_servers",
    "start_sim",
    "stop_group",
    "threshold_flags",
    "variant_flags",
    "wait_idle",
    "wall_clock_profile",
    "way_flags",
]


@contextlib.contextmanager
def processes() -> Iterator[Children]:
    """The experiment's children, logs in a fresh temporary folder, all stopped at the end.

    The children get their settings from argv only: a DYNSPEC_* variable meant for another run
    (an API key, a port) must not leak into the experiment.
    """
    folder = Path(tempfile.mkdtemp(prefix="dynspec-envelope-"))
    with Children(folder, drop_env=("DYNSPEC_",)) as children:
        yield children


# ---- run metadata ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the figures were measured on (the simulators, client and routers share it)."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def code_commit() -> str:
    """The git commit of the router code that the children run (``+dirty`` with local edits
    outside ``bench/results``), or "unknown" outside a git checkout."""
    # Where the router's code lies (the children run it), found without importing it.
    spec = importlib.util.find_spec("dynspec.router")
    if spec is None or spec.origin is None:
        return "unknown"
    folder = Path(spec.origin).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        # Results written by earlier runs of the same session are data, not code: they do not
        # make the code dirty (a series of runs on one commit would otherwise read "+dirty"
        # from its second run on).
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(folder),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":/",
                ":(exclude,top)bench/results",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run_metadata(
    experiment: str | None, profile: str, speed: float, command: str
) -> dict[str, Any]:
    """The fields every record of one run carries: what ran, where, on which code, since when."""
    meta: dict[str, Any] = {
        "simulated": True,
        "profile": profile,
        "speed": speed,
        "command": command,
        "machine": machine(),
        "code_commit": code_commit(),
        "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if experiment is not None:
        meta["experiment"] = experiment
    return meta


# ---- simulators and routers --------------------------------------------------------------------


def _sim_argv(profile: str, speed: float, seed: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dynspec.launcher.sim",
        "--host",
        "127.0.0.1",
        "--profile",
        profile,
        "--speed",
        repr(speed),
        "--seed",
        str(seed),
        "--log-level",
        "warning",
    ]


def start_sim(
    procs: Children,
    *,
    profile: str,
    speed: float,
    mode: str,
    name: str,
    seed: int,
    timeout: float,
    extra: Sequence[str] = (),
) -> str:
    """One ``dynspec-sim --mode MODE`` (a server on GPUs of its own); its URL once healthy."""
    port = free_port()
    argv = [*_sim_argv(profile, speed, seed), "--port", str(port), "--mode", mode, *extra]
    url = f"http://127.0.0.1:{port}"
    proc = procs.start(name, argv)
    procs.wait_ready(proc, url + "/health_generate", timeout, name=f"dynspec-sim ({name})")
    return url


def start_pair_sim(
    procs: Children,
    *,
    profile: str,
    speed: float,
    sharing: str,
    name: str,
    seed: int,
    timeout: float,
) -> tuple[str, str]:
    """``dynspec-sim --pair``: an EAGLE and a baseline server sharing one simulated GPU set, in one
    process; their URLs (EAGLE, baseline) once both are healthy."""
    eport, bport = free_port(), free_port()
    while bport == eport:
        bport = free_port()
    argv = [*_sim_argv(profile, speed, seed), "--pair", "--eagle-port", str(eport)]
    argv += ["--baseline-port", str(bport), "--sharing", sharing]
    eagle, baseline = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{bport}"
    proc = procs.start(name, argv)
    for url in (eagle, baseline):
        procs.wait_ready(proc, url + "/health_generate", timeout, name=f"dynspec-sim ({name})")
    return eagle, baseline


class SimSettings(Protocol):
    """What starting an experiment's simulators takes from its config."""

    @property
    def profile(self) -> str: ...
    @property
    def speed(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def startup_timeout(self) -> float: ...
    @property
    def sharing(self) -> str: ...


def start_servers(
    procs: Children, want: Mapping[str, int], sim: SimSettings, adaptive: str | None = None
) -> Servers:
    """The simulated servers ``want`` counts per kind (``Servers``' fields, as ``needs`` gives
    them): ``eagle`` / ``baseline`` servers of their own, ``adaptive`` ones (the ``adaptive``
    profile's eagle mode; none without it) and shared-GPU ``pairs`` (``sim.sharing``); the k-th
    of a kind gets ``sim.seed + k``."""
    kinds = [("eagle", sim.profile, "eagle"), ("baseline", sim.profile, "baseline")]
    if adaptive:
        kinds.append(("adaptive", adaptive, "eagle"))
    got: dict[str, Any] = {}
    for kind, profile, mode in kinds:
        got[kind] = tuple(
            start_sim(
                procs,
                profile=profile,
                mode=mode,
                name=f"sim-{kind}-{'ab'[k]}",
                seed=sim.seed + k,
                speed=sim.speed,
                timeout=sim.startup_timeout,
            )
            for k in range(want.get(kind, 0))
        )
    got["pairs"] = tuple(
        start_pair_sim(
            procs,
            profile=sim.profile,
            sharing=sim.sharing,
            name=f"sim-pair-{k}",
            seed=sim.seed + k,
            speed=sim.speed,
            timeout=sim.startup_timeout,
        )
        for k in range(want.get("pairs", 0))
    )
    return Servers(**got)


def _healthy(status: dict[str, Any]) -> int:
    """Healthy servers in a router's ``/status``: the pools' list, else the pairs' servers."""
    servers = list(status.get("servers") or [])
    if not servers:
        for pair in status.get("pairs") or []:
            if isinstance(pair, dict):
                servers += list(pair.get("servers") or [])
    return sum(1 for s in servers if isinstance(s, dict) and s.get("healthy"))


def start_router(
    procs: Children, name: str, flags: Sequence[str], timeout: float, servers: int
) -> tuple[str, subprocess.Popen[bytes]]:
    """A ``dynspec-router`` with ``flags``, once its ``/status`` shows ``servers`` healthy servers
    (``/health`` is 200 with one; the experiment needs them all)."""
    port = free_port()
    argv = [sys.executable, "-m", "dynspec.router", *flags]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    proc = procs.start(name, argv)
    procs.wait_ready(proc, url + "/health", timeout, name=f"dynspec-router ({name})")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if _healthy(httpx.get(url + "/status", timeout=2.0).json()) >= servers:
                return url, proc
        time.sleep(0.1)
    raise RuntimeError(
        f"dynspec-router ({name}) does not see its {servers} servers healthy "
        f"(log: {procs.logs.get(proc.pid)})"
    )


def wait_idle(urls: Sequence[str], timeout: float) -> bool:
    """Until every router's ``/status`` shows nothing in flight, by its own count and by the load
    its mode is switched by (``signal_load``: with ``--load-signal servers``, the servers' last
    readings); False at the deadline. Between two loads, so that the next does not start in the
    mode the last one left behind."""
    deadline = time.monotonic() + timeout
    while True:
        idle = 0
        for url in urls:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                st = httpx.get(url + "/status", timeout=2.0).json()
                idle += st.get("load") == 0 and st.get("signal_load") in (0, None)
        if idle == len(urls):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def threshold_flags(
    eagle: Sequence[str], baseline: Sequence[str], threshold: int, hysteresis: int
) -> list[str]:
    """The pool flags of a ``--policy threshold`` router over these servers (pure).

    Threshold 0 is suggest-threshold's "EAGLE never wins": the router gets no EAGLE pool (its
    threshold policy needs --threshold >= 1, which would still send lone requests to EAGLE).
    """
    if threshold <= 0:
        return ["--baseline-url", ",".join(baseline)]
    return [
        "--eagle-url",
        ",".join(eagle),
        "--baseline-url",
        ",".join(baseline),
        "--policy",
        "threshold",
        "--threshold",
        str(threshold),
        "--hysteresis",
        str(hysteresis),
    ]


# ---- router flags per way (pure) --------------------------------------------------------------


@dataclass(frozen=True)
class Servers:
    """The simulated servers' URLs, by what they stand for (empty where no chosen way needs it)."""

    eagle: tuple[str, ...] = ()
    baseline: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()  # (EAGLE URL, baseline URL) per shared-GPU pair
    adaptive: tuple[str, ...] = ()


def needs(way: str) -> dict[str, int]:
    """How many servers of each kind (``Servers``' fields) a way uses (pure)."""
    if way in ("split-threshold", "split-balance"):
        return {"eagle": 1, "baseline": 1}
    if way in PAIRED:
        return {"pairs": 2}
    if way in HOMOGENEOUS:
        return {way[3:]: 2}
    raise ValueError(f"unknown way {way!r} (known: {', '.join(EIGHT_WAYS)})")


def way_flags(
    way: str,
    servers: Servers,
    *,
    threshold: int,
    hysteresis: int,
    speed_profile: Path | None = None,
    metrics_interval: float | None = None,
) -> list[str]:
    """The ``dynspec-router`` server and policy flags of one way (pure)."""
    way = OLD_NAMES.get(way, way)
    e, b = servers.eagle, servers.baseline
    if way == "split-threshold":
        return threshold_flags(e[:1], b[:1], threshold, hysteresis)
    if way == "split-balance":
        flags = ["--eagle-url", e[0], "--baseline-url", b[0], "--policy", "balance"]
        if speed_profile is not None:
            flags += ["--speed-profile", str(speed_profile)]
        if metrics_interval is not None:
            flags += ["--metrics-interval", repr(metrics_interval)]
        return flags
    if way in PAIRED:
        if way == "paired-threshold" and threshold <= 0:
            # The same "EAGLE never wins" rule: the pairs' baseline servers only.
            return threshold_flags([], [p[1] for p in servers.pairs], 0, 0)
        flags = []
        for pe, pb in servers.pairs:
            flags += ["--pair", f"{pe},{pb}"]
        if way == "paired-auto":
            return [*flags, "--threshold", "auto"]
        return [*flags, "--threshold", str(threshold), "--hysteresis", str(hysteresis)]
    if way == "2x-eagle":
        return ["--eagle-url", ",".join(e[:2])]
    if way == "2x-baseline":
        return ["--baseline-url", ",".join(b[:2])]
    if way == "2x-adaptive":
        # An adaptive-EAGLE server is an EAGLE server: one pool, no switching.
        return ["--eagle-url", ",".join(servers.adaptive[:2])]
    raise ValueError(f"unknown way {way!r} (known: {', '.join(EIGHT_WAYS)})")


def replica_flags(
    way: str,
    servers: Servers,
    *,
    threshold: int,
    hysteresis: int,
    signal: str,
    load_interval: float | None = None,
) -> list[str]:
    """One of several router replicas in front of the same servers: the way's flags with a set
    threshold, and ``--load-signal`` (``--load-interval`` with ``servers``) (pure)."""
    flags = way_flags(way, servers, threshold=threshold, hysteresis=hysteresis)
    flags += ["--load-signal", signal]
    if signal == "servers" and load_interval is not None:
        flags += ["--load-interval", repr(load_interval)]
    return flags


def healthy_needed(way: str, thr: int) -> int:
    """How many healthy servers the way's router must see before its sweep (pure)."""
    if way == "split-threshold":
        return 2 if thr > 0 else 1
    if way == "paired-threshold" and thr <= 0:
        return 2
    return 4 if way in PAIRED else 2


def variant_flags(
    variant: str,
    eagle: str,
    baseline: str,
    pair: tuple[str, str] | None,
    *,
    profile: Path,
    metrics_interval: float | None = None,
) -> list[str]:
    """The router flags of one variant (pure): ``balance-*`` over the split servers,
    ``paired-auto*`` over the shared-GPU pair with ``--threshold auto``; ``-profile`` and
    ``-seeded`` add ``--speed-profile``."""
    if variant.startswith("paired-auto"):
        if pair is None:
            raise ValueError(f"{variant} needs a pair")
        flags = ["--pair", f"{pair[0]},{pair[1]}", "--threshold", "auto"]
    else:
        flags = ["--eagle-url", eagle, "--baseline-url", baseline, "--policy", "balance"]
    if variant in ("balance-profile", "paired-auto-seeded"):
        flags += ["--speed-profile", str(profile)]
    if metrics_interval is not None:
        flags += ["--metrics-interval", repr(metrics_interval)]
    return flags


def wall_clock_profile(profile: Profile, speed: float) -> Profile:
    """``profile`` as the router sees servers that run ``speed`` times faster than modelled.

    The router measures TPOT on the wall clock; a simulator at ``--speed 4`` serves four times the
    profile's tok/s per wall-clock second, so the curve the router is given must say so too, or its
    profile and its own observations would disagree by that factor.
    """
    if speed == 1.0:
        return profile
    modes = {
        name: dataclasses.replace(
            m,
            throughput=tuple((b, round(t * speed, 3)) for b, t in m.throughput),
            prefill_tokens_per_s=m.prefill_tokens_per_s * speed,
            prefill_overhead_s=m.prefill_overhead_s / speed,
        )
        for name, m in profile.modes.items()
    }
    return dataclasses.replace(
        profile,
        name=f"{profile.name}-x{speed:g}",
        source=f"{profile.name} with time running {speed:g}x faster (dynspec-sim --speed "
        f"{speed:g}): tok/s x {speed:g}. {profile.source}",
        modes=modes,
    )


def router_profile(procs: Children, profile: Profile, speed: float) -> Path:
    """The file given to ``--speed-profile``: ``profile`` at the simulators' wall-clock speed,
    next to the children's logs."""
    folder = procs.log_dir or Path(tempfile.mkdtemp(prefix="dynspec-envelope-"))
    path = folder / f"{profile.name}-router.json"
    path.write_text(wall_clock_profile(profile, speed).dumps(), encoding="utf-8")
    return path
