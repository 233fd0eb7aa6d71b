"""What the speed tests share: a learner on a chosen clock, and observations fed to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynspec.router.learning import SpeedLearner
from dynspec.router.speed import profile_from_json

REPO = Path(__file__).resolve().parents[2]
DEMO = json.loads((REPO / "launcher/sim/profiles/demo.json").read_text())
E, B = "http://e", "http://b"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def learner(profile: Any = None, **kwargs: Any) -> tuple[SpeedLearner, Clock]:
    clock = Clock()
    sp = profile_from_json(profile) if profile is not None else None
    return SpeedLearner([(E, "eagle"), (B, "baseline")], sp, clock=clock, **kwargs), clock


def feed(
    lr: SpeedLearner,
    clock: Clock,
    url: str,
    load: float,
    tpot: float,
    *,
    n: int,
    every: float = 0.1,
) -> None:
    """``n`` finished requests of 10 tokens at ``load``, ``every`` seconds apart, each a stay of
    ``tpot`` a token."""
    for _ in range(n):
        clock.now += every
        lr.finished(url, load, stay=10 * tpot, output_tokens=10)
    lr.rebuild()


def polls(
    lr: SpeedLearner,
    clock: Clock,
    url: str,
    load: float,
    per_token: float,
    *,
    n: int,
    every: float = 0.25,
) -> None:
    """``n`` steady polls (the gauges move a little each time) of ``load`` running and none
    queued at ``per_token`` seconds a token, ``every`` seconds apart (no rebuild)."""
    for i in range(n):
        clock.now += every
        lr.polled(url, running=load, queued=0, gen_throughput=load / per_token + i % 2 / 1e6)
