"""GPU sets: which servers run on which GPUs, and the ports each one listens on.

A GPU set holds one EAGLE-3 server and one baseline server of the same model (the router's
``--pair`` of them; the console and ``--dry-run`` say "pair"). In the ``split`` layout the
launch is one GPU set whose two servers have GPUs of their own (the EAGLE server on the first
half of ``--gpus``). In the ``paired`` layout every GPU set of ``--tp`` GPUs holds both servers
on the same GPUs, the baseline started once EAGLE is healthy, each with half of the memory. GPU
set ``i`` listens on ``--eagle-port + 2i`` (EAGLE) and ``--baseline-port + 2i`` (baseline): with
the default ports 30001 and 30002, set 0 is 30001/30002, set 1 30003/30004, and so on.

Pure: built once per launch (``facts.discover``) from the config and the GPUs found, with what
every later step reads of a set (its servers' names, GPU labels, ``CUDA_VISIBLE_DEVICES`` and
URLs), so none of them works it out again.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.gpus import (
    GpuIds,
    format_gpus,
    split_gpu_sets,
    split_halves,
    visible_devices,
)


@dataclass(frozen=True)
class GpuSet:
    index: int
    eagle_gpus: GpuIds
    baseline_gpus: GpuIds
    eagle_port: int
    baseline_port: int
    shared: bool  # both servers on the same GPUs
    count: int  # GPU sets in the launch (names carry the index only when there are several)
    # (EAGLE, baseline): the console's GPU label ("gpu0-3", "sim"), their CUDA_VISIBLE_DEVICES
    # (the launcher's own visible set taken into account), their base URLs.
    labels: tuple[str, str] = ("", "")
    devices: tuple[str, str] = ("", "")
    urls: tuple[str, str] = ("", "")

    def _of(self, pool: str) -> int:
        return 0 if pool == "eagle" else 1

    def port(self, pool: str) -> int:
        return self.eagle_port if pool == "eagle" else self.baseline_port

    def gpus(self, pool: str) -> GpuIds:
        return self.eagle_gpus if pool == "eagle" else self.baseline_gpus

    def label(self, pool: str) -> str:
        return self.labels[self._of(pool)]

    def devices_of(self, pool: str) -> str:
        return self.devices[self._of(pool)]

    def url(self, pool: str) -> str:
        return self.urls[self._of(pool)]

    def name(self, pool: str) -> str:
        """``eagle`` for a launch of one GPU set, ``eagle0``, ``eagle1``... for several."""
        return pool if self.count == 1 else f"{pool}{self.index}"

    @property
    def tag(self) -> str:
        return "" if self.count == 1 else str(self.index)

    def describe(self) -> str:
        """One line for --dry-run: its GPUs and URLs (its servers are "pair i", as the router's
        ``--pair``)."""
        where = "GPUs " + self.labels[0].removeprefix("gpu") if self.shared else "simulated"
        return f"pair {self.index}: {where}, EAGLE {self.urls[0]}, baseline {self.urls[1]}"


def place(config: LaunchConfig, found: GpuIds | None = None) -> tuple[str, tuple[GpuSet, ...]]:
    """The layout and GPU sets of a launch: the flags', or (``found``: no --gpus named any) the
    GPUs found, split in halves (or in sets of --tp GPUs with --layout paired; one GPU found
    holds both servers)."""
    if found is None:
        layout, eagle, baseline = config.layout, config.eagle_gpus, config.baseline_gpus
        return layout, gpu_sets_of(config, layout, eagle, baseline, config.paired_gpus)
    try:
        if config.layout == "paired":
            layout, eagle, baseline, paired = (
                "paired",
                found,
                found,
                split_gpu_sets(found, config.tp),
            )
        else:
            eagle, baseline = split_halves(found)
            # One GPU found: a one-set paired layout.
            layout, paired = ("paired", (eagle,)) if eagle == baseline else ("split", ())
    except UsageError as exc:
        raise UsageError(f"no --gpus given, and {exc}") from None
    return layout, gpu_sets_of(config, layout, eagle, baseline, paired)


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
        sets: tuple[GpuSet, ...] = (_gpu_set(config, 0, eagle, baseline, shared=False, count=1),)
    else:
        sets = tuple(
            _gpu_set(config, i, gpus, gpus, shared=not config.simulate, count=len(paired))
            for i, gpus in enumerate(paired)
        )
    check_ports(config, sets)
    return sets


def _gpu_set(
    config: LaunchConfig, index: int, eagle: GpuIds, baseline: GpuIds, *, shared: bool, count: int
) -> GpuSet:
    ports = (config.eagle_port + 2 * index, config.baseline_port + 2 * index)
    host = config.server_host
    if config.simulate:
        labels, devices = ("sim", "sim"), ("", "")
    else:
        labels = (f"gpu{format_gpus(eagle)}", f"gpu{format_gpus(baseline)}")
        visible = config.visible_gpus
        devices = (visible_devices(eagle, visible), visible_devices(baseline, visible))
    return GpuSet(
        index,
        eagle,
        baseline,
        ports[0],
        ports[1],
        shared=shared,
        count=count,
        labels=labels,
        devices=devices,
        urls=(f"http://{host}:{ports[0]}", f"http://{host}:{ports[1]}"),
    )


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
