"""CUDA MPS for the paired layout: one control daemon per GPU set, both its servers its clients.

Under MPS the two servers of a GPU set run their kernels side by side instead of in time slices
(``pair-sharing.md``: 16-27% more total tok/s while both are busy). Each set's daemon has its own
``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` under the log directory and sees only
the set's GPUs; its servers get the same variables (``spec.mps_env`` makes them; the daemon
reads them off its EAGLE server's spec). The binary is found with the launch's facts
(``probe.find_mps_control``). The supervisor starts
the daemons before the servers and quits them after the servers are gone, on every exit path it
runs (a SIGKILLed launcher runs none: the next start quits a daemon left on the same directory).
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts
from dynspec.launcher.spec import ProcessSpec

STOP_TIMEOUT = 15.0


@dataclass(frozen=True)
class MpsDaemon:
    """One GPU set's control daemon: how to start it (``-d``) and stop it (``quit`` on stdin)."""

    gpu_set: int  # its index (the console calls it "pair i", as the router's --pair)
    binary: str
    env: tuple[tuple[str, str], ...]  # CUDA_VISIBLE_DEVICES and the two MPS directories

    @property
    def pipe_dir(self) -> Path:
        return Path(dict(self.env)["CUDA_MPS_PIPE_DIRECTORY"])

    def _env_text(self) -> str:
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)

    def start_line(self) -> str:
        return f"{self._env_text()} {shlex.quote(self.binary)} -d"

    def stop_line(self) -> str:
        return f"echo quit | {self._env_text()} {shlex.quote(self.binary)}"


def prepare_dirs(daemon: MpsDaemon) -> bool:
    """Make the daemon's directories; True when a daemon seems left on them (its control pipe)."""
    for key, value in daemon.env:
        if key.startswith("CUDA_MPS_"):
            Path(value).mkdir(parents=True, exist_ok=True)
    return (daemon.pipe_dir / "control").exists()


def build_daemons(
    config: LaunchConfig, facts: LaunchFacts, specs: Sequence[ProcessSpec]
) -> tuple[MpsDaemon, ...]:
    """One daemon per GPU set with --mps on real GPUs, on the MPS directories its servers'
    ``specs`` name; none otherwise (the simulator shares by itself: --mps is its ``--sharing
    mps``)."""
    if not config.mps or config.simulate or facts.layout != "paired":
        return ()
    assert facts.mps_control is not None
    by_key = {spec.key: spec for spec in specs}
    daemons = []
    for gpu_set in facts.gpu_sets:
        served = dict(by_key[gpu_set.name("eagle")].env)
        mps = tuple((k, v) for k, v in served.items() if k.startswith("CUDA_MPS_"))
        env = (("CUDA_VISIBLE_DEVICES", gpu_set.devices_of("eagle")), *mps)
        daemons.append(MpsDaemon(gpu_set.index, facts.mps_control, env))
    return tuple(daemons)


async def _run(daemon: MpsDaemon, args: Sequence[str], stdin: bytes | None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        daemon.binary,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **dict(daemon.env)},
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), STOP_TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return -9, f"no answer within {STOP_TIMEOUT:g}s"
    return proc.returncode or 0, out.decode("utf-8", "replace").strip()


async def start_daemon(daemon: MpsDaemon) -> None:
    """Start the daemon; one left on the same pipe directory (a killed launcher's) quits first."""
    if await asyncio.to_thread(prepare_dirs, daemon):
        await stop_daemon(daemon)
    code, out = await _run(daemon, ["-d"], None)
    if code != 0:
        raise RuntimeError(
            f"MPS control daemon of pair {daemon.gpu_set} did not start (exit {code}): "
            f"{out.splitlines()[-1] if out else 'no output'}"
        )


async def stop_daemon(daemon: MpsDaemon) -> str | None:
    """Quit the daemon; None when it went, else why not (for one line on the console)."""
    code, out = await _run(daemon, [], b"quit\n")
    return None if code == 0 else f"exit {code}: {out.splitlines()[-1] if out else 'no output'}"
