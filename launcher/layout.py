"""Pairs: which servers share which GPUs, and the ports each one listens on.

A pair is one EAGLE-3 server and one baseline server of the same model. In the ``split`` layout
the launch is one pair on separate GPU sets (the EAGLE server on the first half of ``--gpus``).
In the ``paired`` layout every GPU set of ``--tp`` GPUs holds a pair: both servers on the same
GPUs, the baseline started once EAGLE is healthy, each with half of the memory. Pair ``i``
listens on ``--eagle-port + 2i`` (EAGLE) and ``--baseline-port + 2i`` (baseline): with the
default ports 30001 and 30002, pair 0 is 30001/30002, pair 1 30003/30004, and so on.

Pure: built from the config alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.gpus import GpuSet, format_gpus


@dataclass(frozen=True)
class Pair:
    index: int
    eagle_gpus: GpuSet
    baseline_gpus: GpuSet
    eagle_port: int
    baseline_port: int
    shared: bool  # both servers on the same GPUs
    count: int  # pairs in the launch (names carry the index only when there are several)

    def port(self, pool: str) -> int:
        return self.eagle_port if pool == "eagle" else self.baseline_port

    def gpus(self, pool: str) -> GpuSet:
        return self.eagle_gpus if pool == "eagle" else self.baseline_gpus

    def name(self, pool: str) -> str:
        """``eagle`` for a launch of one pair, ``eagle0``, ``eagle1``... for several."""
        return pool if self.count == 1 else f"{pool}{self.index}"

    @property
    def tag(self) -> str:
        return "" if self.count == 1 else str(self.index)


def pairs_of(config: LaunchConfig) -> tuple[Pair, ...]:
    if config.layout == "split":
        return (
            Pair(
                0,
                config.eagle_gpus,
                config.baseline_gpus,
                config.eagle_port,
                config.baseline_port,
                shared=False,
                count=1,
            ),
        )
    n = len(config.pairs)
    return tuple(
        Pair(
            i,
            gpus,
            gpus,
            config.eagle_port + 2 * i,
            config.baseline_port + 2 * i,
            shared=not config.simulate,
            count=n,
        )
        for i, gpus in enumerate(config.pairs)
    )


def check_ports(config: LaunchConfig, pairs: tuple[Pair, ...]) -> None:
    """Every server port and the router's differ (several pairs: each pair's own two ports)."""
    seen: dict[int, str] = {} if config.no_router else {config.port: "--port (router)"}
    for pair in pairs:
        for pool in ("eagle", "baseline"):
            what = f"{pair.name(pool)} server"
            other = seen.get(pair.port(pool))
            if other is not None:
                raise UsageError(
                    f"port {pair.port(pool)} is both {other}'s and the {what}'s "
                    "(pair i listens on --eagle-port + 2i and --baseline-port + 2i: "
                    "move --port or the server ports apart)"
                )
            seen[pair.port(pool)] = f"the {what}"


def describe(pair: Pair, host: str) -> str:
    """One line for --dry-run and the banner: the pair's GPUs and URLs."""
    where = "simulated" if not pair.shared else "GPUs " + format_gpus(pair.eagle_gpus)
    return (
        f"pair {pair.index}: {where}, EAGLE http://{host}:{pair.eagle_port}, "
        f"baseline http://{host}:{pair.baseline_port}"
    )
