"""What every simulated experiment does around its load: simulators and routers on free loopback
ports, started, waited for and stopped, and the run metadata every record carries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib.util
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from dynspec.bench.procs import Children, captured, free_port
from dynspec.bench.ways import Router, Servers
from dynspec.launcher import config as launch_config
from dynspec.launcher import spec as launch_spec
from dynspec.launcher.facts import flag_facts
from dynspec.launcher.sim.profile import Profile

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def processes() -> Iterator[Children]:
    """The experiment's children, each logging to NAME.log in a fresh temporary folder (kept),
    all stopped at the end. They get no DYNSPEC_* variable: one meant for another run (a key, a
    port) must not leak into the experiment."""
    folder = Path(tempfile.mkdtemp(prefix="dynspec-envelope-"))
    logger.info("the servers' and routers' logs: %s", folder)
    with Children(folder, drop_env=("DYNSPEC_",)) as children:
        yield children


def machine() -> dict[str, Any]:
    """What the figures were measured on (the simulators, client and routers share it)."""
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _git(folder: Path, *args: str) -> str:
    return captured(["git", "-C", str(folder), *args], timeout=10, check=True).stdout.strip()


def code_commit() -> str:
    """The git commit of the router code the children run (``+dirty`` with local edits outside
    ``bench/results``: earlier results of the same session are data), or "unknown"."""
    spec = importlib.util.find_spec("dynspec.router")
    if spec is None or spec.origin is None:
        return "unknown"
    folder = Path(spec.origin).resolve().parent
    try:
        head = _git(folder, "rev-parse", "--short", "HEAD")
        dirty = _git(
            folder, "status", "--porcelain", "--untracked-files=no", "--", ":/",
            ":(exclude,top)bench/results",
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run_metadata(experiment: str, profile: str, speed: float, command: str) -> dict[str, Any]:
    """The fields every record of one run carries: what ran, where, on which code, since when."""
    return {
        "simulated": True,
        "profile": profile,
        "speed": speed,
        "command": command,
        "machine": machine(),
        "code_commit": code_commit(),
        "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "experiment": experiment,
    }


class SimSettings(Protocol):
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


def _start_sim(
    procs: Children, sim: SimSettings, name: str, flags: Sequence[str], urls: Sequence[str]
) -> None:
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--host", "127.0.0.1"]
    argv += ["--speed", repr(sim.speed), "--log-level", "warning", *flags]
    proc = procs.start(name, argv)
    for url in urls:
        procs.wait_ready(
            proc, url + "/health_generate", sim.startup_timeout, name=f"dynspec-sim ({name})"
        )


def start_servers(
    procs: Children,
    want: Mapping[str, int],
    sim: SimSettings,
    adaptive: str | None = None,
    owner: str = "",
    *,
    launch_intervals: bool = False,
) -> Servers:
    """The simulated servers ``want`` counts per kind (``Servers``' fields), once healthy; the
    k-th of a kind gets ``sim.seed + k``. ``launch_intervals``: stream as dynspec-launch's do."""
    every = str(launch_spec.BASELINE_STREAM_INTERVAL)
    interval = {"baseline": ["--stream-interval", every]} if launch_intervals else {}
    at = f"{owner}-" if owner else ""
    kinds = [("eagle", sim.profile, "eagle"), ("baseline", sim.profile, "baseline")]
    if adaptive:
        kinds.append(("adaptive", adaptive, "eagle"))
    got: dict[str, Any] = {}
    for kind, profile, mode in kinds:
        urls = []
        for k in range(want.get(kind, 0)):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            flags = ["--profile", profile, "--seed", str(sim.seed + k), "--port", str(port)]
            name = f"sim-{at}{kind}-{'ab'[k]}"
            flags += interval.get(kind, [])
            _start_sim(procs, sim, name, [*flags, "--mode", mode], urls[-1:])
        got[kind] = tuple(urls)
    shared = []
    for k in range(want.get("shared_gpus", 0)):
        eport, bport = free_port(), free_port()
        while bport == eport:
            bport = free_port()
        flags = ["--profile", sim.profile, "--seed", str(sim.seed + k), "--pair"]
        flags += ["--eagle-port", str(eport), "--baseline-port", str(bport)]
        if launch_intervals:
            flags += ["--baseline-stream-interval", every]
        pair = (f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{bport}")
        _start_sim(procs, sim, f"sim-{at}shared-{k}", [*flags, "--sharing", sim.sharing], pair)
        shared.append(pair)
    return Servers(**got, shared_gpus=tuple(shared))


def router_argv(router: Router, port: int) -> list[str]:
    """``router``'s command line on 127.0.0.1:``port``, by the launcher's own builder (one home
    for how settings become flags); the bench's server flags replace the launcher's (whose ports
    are placeholders): a launch has no layout of two servers of one kind in one pool."""
    launch = ["--simulate", "--port", str(port), "--eagle-port", "1", "--baseline-port", "2"]
    flags = [*launch, "--log-level", router.log_level, *router.settings]
    config = launch_config.load_config(flags, {})
    argv = list(launch_spec.build_router_spec(config).argv)
    own = launch_spec.backend_args(config, flag_facts(config))
    at = argv.index(own[0])
    argv[at : at + len(own)] = router.servers
    return argv


def _healthy(status: dict[str, Any]) -> int:
    """Healthy servers in a router's ``/status``: the pools' list, else the pairs' servers."""
    servers = list(status.get("servers") or [])
    if not servers:
        for pair in status.get("pairs") or []:
            if isinstance(pair, dict):
                servers += list(pair.get("servers") or [])
    return sum(1 for s in servers if isinstance(s, dict) and s.get("healthy"))


def start_router(
    procs: Children, name: str, router: Router, timeout: float
) -> tuple[str, subprocess.Popen[bytes]]:
    """A ``dynspec-router``, once its ``/status`` shows ``router.healthy`` healthy servers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = procs.start(name, router_argv(router, port))
    procs.wait_ready(proc, url + "/health", timeout, name=f"dynspec-router ({name})")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if _healthy(httpx.get(url + "/status", timeout=2.0).json()) >= router.healthy:
                return url, proc
        time.sleep(0.1)
    raise RuntimeError(
        f"dynspec-router ({name}) does not see its {router.healthy} servers healthy "
        f"(log: {procs.logs.get(proc.pid)})"
    )


def wall_clock_profile(profile: Profile, speed: float) -> Profile:
    """``profile`` as the router sees servers that run ``speed`` times faster than modelled: it
    measures on the wall clock, so its curve must say so too, or its profile and its own
    observations would disagree by that factor."""
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
    faster = f"time running {speed:g}x faster (dynspec-sim --speed {speed:g}): tok/s x {speed:g}"
    source = f"{profile.name} with {faster}. {profile.source}"
    return dataclasses.replace(
        profile, name=f"{profile.name}-x{speed:g}", source=source, modes=modes
    )


def router_profile(procs: Children, profile: Profile, speed: float) -> Path:
    """The ``--speed-profile`` file: ``profile`` at wall-clock speed, beside the children's logs."""
    folder = procs.log_dir or Path(tempfile.mkdtemp(prefix="dynspec-envelope-"))
    path = folder / f"{profile.name}-router.json"
    path.write_text(wall_clock_profile(profile, speed).dumps(), encoding="utf-8")
    return path
