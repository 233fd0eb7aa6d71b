"""The shared GPU of ``dynspec-sim --pair``: an EAGLE and a baseline server in one process.

Both engines run on one event loop and one clock (the process's monotonic clock times
``--speed``). While both are busy (requests running, or a prefill under way), each one's work
goes at its share of its alone speed (``ShareModel`` in the profile's ``sharing``, picked by
``--sharing``); while only one is, it has the GPU to itself.

The share is read again every ``SHARE_SLICE_S`` of a step's work (``Engine.run``), not once at
its start: a step's length is not known at its start when the other engine's load changes during
it. Read once, a baseline prefill of a wave's ~124 prompts (2 simulated seconds on
``h200-8b-accept2``) that began beside one EAGLE request ran all of it at the baseline's share,
1.9x as long, though that request ended 0.3 s in; and one that began while EAGLE was in its own
prefill (no request running yet) ran alone, and EAGLE's decode beside it too. Which of the two
happened depended on how long EAGLE's prefill was: `envelope --eight-gpus` at C=256 read
`paired-auto` (1-3 requests on EAGLE a wave) 0.82x `2x-baseline` and the same pairs at a
threshold of 8 (8 a wave) 1.00-1.05x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynspec.launcher.sim.profile import ShareModel

if TYPE_CHECKING:
    from dynspec.launcher.sim.engine import Engine

# Simulated seconds of a step's work after which the share is read again: decode steps are
# 5-60 ms (one to three reads), a prefill of a wave's prompts seconds.
SHARE_SLICE_S = 0.02


class SharedGpu:
    """The link between the two engines on one GPU; each asks it how slow its next step is."""

    def __init__(self, model: ShareModel, way: str) -> None:
        self.model = model
        self.way = way
        self.engines: dict[str, Engine] = {}

    def join(self, mode: str, engine: Engine) -> None:
        self.engines[mode] = engine

    def slowdown(self, mode: str) -> float:
        """What the work of ``mode``'s engine is slowed by now (1 while the other is idle): each
        engine counts as busy with its running requests and those in the prefill it runs."""
        eagle, baseline = self.engines.get("eagle"), self.engines.get("baseline")
        if eagle is None or baseline is None:
            return 1.0
        e, b = eagle.busy(), baseline.busy()
        if not e or not b:
            return 1.0
        return 1.0 / self.model.share(mode, e, b)
