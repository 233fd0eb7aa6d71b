"""GET /v1/loads: SGLang's shape, from a snapshot published as SGLang publishes it (stale)."""

from __future__ import annotations

import asyncio

import httpx
from simkit import SimFactory

from dynspec.launcher.sim.engine import LOAD_PUBLISH_EVERY, Engine, SimRequest
from dynspec.launcher.sim.metrics import Metrics
from dynspec.launcher.sim.profile import load_profile
from dynspec.router.loadsignal import parse_loads


def _request(rid: str, tokens: int) -> SimRequest:
    return SimRequest(
        rid=rid,
        prompt_tokens=8,
        max_new_tokens=tokens,
        limit=4096,
        stream=False,
        seed=1,
        prompt_key=rid,
        ignore_eos=True,
    )


async def test_snapshot_after_prefill_every_15_decodes_and_on_idle() -> None:
    profile = load_profile("eagle3-h100").mode("baseline")
    engine = Engine(
        mode_profile=profile,
        speculative=False,
        max_running=8,
        speed=1000.0,
        seed=1,
        metrics=Metrics("m", False),
        max_total_tokens=100_000,
    )
    published: list[tuple[int, tuple[int, int], int]] = []
    publish = engine.publish_load
    idle = asyncio.Event()

    def record() -> None:
        publish()
        published.append((engine.stats.steps, engine.load_snapshot, len(engine.running)))
        if engine.load_snapshot == (0, 0) and long.done:
            idle.set()

    engine.publish_load = record  # type: ignore[method-assign]
    short, long = _request("a", 2), _request("b", 40)
    engine.submit(short)
    engine.submit(long)
    task = asyncio.create_task(engine.run())
    engine.open()
    try:
        async with asyncio.timeout(20):
            await idle.wait()
    finally:
        task.cancel()
    # Step 1 prefills both; the short one ends at the first decode (step 2) but the snapshot
    # says 2 until decode 15; the long one ends at decode 39 (step 40) and the idle loop
    # publishes 0 at once.
    assert published == [
        (1, (2, 0), 2),
        (1 + LOAD_PUBLISH_EVERY, (1, 0), 1),
        (1 + 2 * LOAD_PUBLISH_EVERY, (1, 0), 1),
        (40, (0, 0), 0),
    ]


def test_v1_loads_is_sglangs_shape(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "baseline", "--speed", "50")
    r = httpx.get(sim.url + "/v1/loads?include=core", timeout=5)
    assert r.status_code == 200
    body = r.json()
    assert body["dp_rank_count"] == 1 and body["loads"][0]["dp_rank"] == 0
    reading = parse_loads(r.content)
    assert (reading.running, reading.queued) == (0, 0)
