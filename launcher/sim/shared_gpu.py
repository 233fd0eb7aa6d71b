"""The shared GPU of ``dynspec-sim --pair``: an EAGLE and a baseline server in one process.

Both engines run on one event loop and one clock (the process's monotonic clock times
``--speed``). While both have running requests, each one's step takes its alone time divided by
its share (``ShareModel`` in the profile's ``sharing``, picked by ``--sharing``); while only one
runs, it has the GPU to itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynspec.launcher.sim.profile import ShareModel

if TYPE_CHECKING:
    from dynspec.launcher.sim.engine import Engine


class SharedGpu:
    """The link between the two engines on one GPU; each asks it how slow its next step is."""

    def __init__(self, model: ShareModel, way: str) -> None:
        self.model = model
        self.way = way
        self.engines: dict[str, Engine] = {}

    def join(self, mode: str, engine: Engine) -> None:
        self.engines[mode] = engine

    def slowdown(self, mode: str) -> float:
        """What the step of ``mode``'s engine is multiplied by now (1 while the other is idle)."""
        eagle, baseline = self.engines.get("eagle"), self.engines.get("baseline")
        if eagle is None or baseline is None or not eagle.running or not baseline.running:
            return 1.0
        return 1.0 / self.model.share(mode, len(eagle.running), len(baseline.running))
