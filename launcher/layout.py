"""GPU sets: which servers run on which GPUs, and the ports each one listens on.

A GPU set holds one EAGLE-3 server and one baseline server of the same model (the router's
``--pair`` of them; the console and ``--dry-run`` say "pair"). In the ``split`` layout the
launch is one GPU set whose two servers have GPUs of their own (the EAGLE server on the first
half of ``--gpus``). In the ``paired`` layout every GPU set of ``--tp`` GPUs holds both servers
on the same GPUs, the baseline started once EAGLE is healthy, each with half of the memory. GPU
set ``i`` listens on ``--eagle-port + 2i`` (EAGLE) and ``--baseline-port + 2i`` (baseline): with
the default ports 30001 and 30002, set 0 is 30001/30002, set 1 30003/30004, and so on.

Pure: built once per launch (``facts.py``) from the config and the GPUs found.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.gpus import GpuIds, format_gpus


@dataclass(frozen=True)
class GpuSet:
    index: int
    eagle_gpus: GpuIds
    baseline_gpus: GpuIds
    eagle_port: int
    baseline_port: int
    shared: bool  # both servers on the same GPUs
    count: int  # GPU sets in the launch (names carry the index only when there are several)

    def port(self, pool: str) -> int:
        return self.eagle_port if pool == "eagle" else self.baseline_port

    def gpus(self, pool: str) -> GpuIds:
        return self.eagle_gpus if pool == "eagle" else self.baseline_gpus

    def name(self, pool: str) -> str:
        """``eagle`` for a launch of one GPU set, ``eagle0``, ``eagle1``... for several."""
        return pool if self.count == 1 else f"{pool}{self.index}"

    @property
    def tag(self) -> str:
        return "" if self.count == 1 else str(self.index)

    def describe(self, host: str) -> str:
        """One line for --dry-run: its GPUs and URLs (its servers are "pair i", as the router's
        ``--pair``)."""
        where = "simulated" if not self.shared else "GPUs " + format_gpus(self.eagle_gpus)
        return (
            f"pair {self.index}: {where}, EAGLE http://{host}:{self.eagle_port}, "
            f"baseline http://{host}:{self.baseline_port}"
        )


def gpu_sets_of(
    config: LaunchConfig,
    layout: str,
    eagle: GpuIds,
    baseline: GpuIds,
    paired: tuple[GpuIds, ...],
) -> tuple[GpuSet, ...]:
    """The GPU sets of a launch: ``split``, one of ``eagle`` and ``baseline`` GPUs; ``paired``,
    one per entry of ``paired`` (both servers on its GPUs, shared unless simulated). A usage
    error when two of their ports, or one and the router's, are the same."""
    if layout == "split":
        split = GpuSet(
            0, eagle, baseline, config.eagle_port, config.baseline_port, shared=False, count=1
        )
        check_ports(config, (split,))
        return (split,)
    n = len(paired)
    sets = tuple(
        GpuSet(
            i,
            gpus,
            gpus,
            config.eagle_port + 2 * i,
            config.baseline_port + 2 * i,
            shared=not config.simulate,
            count=n,
        )
        for i, gpus in enumerate(paired)
    )
    check_ports(config, sets)
    return sets


def check_ports(config: LaunchConfig, gpu_sets: tuple[GpuSet, ...]) -> None:
    """Every server port and the router's differ (several GPU sets: each set's two ports)."""
    seen: dict[int, str] = {} if config.no_router else {config.port: "--port (router)"}
    for gpu_set in gpu_sets:
        for pool in ("eagle", "baseline"):
            what = f"{gpu_set.name(pool)} server"
            other = seen.get(gpu_set.port(pool))
            if other is not None:
                raise UsageError(
                    f"port {gpu_set.port(pool)} is both {other}'s and the {what}'s "
                    "(pair i listens on --eagle-port + 2i and --baseline-port + 2i: "
                    "move --port or the server ports apart)"
                )
            seen[gpu_set.port(pool)] = f"the {what}"
