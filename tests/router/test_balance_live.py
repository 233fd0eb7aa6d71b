"""``--policy balance`` end to end: a router in front of two ``dynspec-sim`` servers (demo profile).

Alone, a request goes to EAGLE (the faster server at load 1); under load both pools serve, the
EAGLE server never past the running limit it reports; the counts return to zero (the autouse
check). With and without ``--speed-profile``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest
from routerkit import RouterProc, router, sim, wait_for

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "launcher/sim/profiles/demo.json")
EAGLE_LIMIT = 12
CONCURRENCY = 40
ROUNDS = 2  # requests per client under load: CONCURRENCY * ROUNDS in all


def chat(max_tokens: int) -> dict[str, object]:
    return {
        "model": "demo-model",
        "messages": [{"role": "user", "content": "count to a hundred"}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


def one_at_a_time(rp: RouterProc, n: int) -> Counter[str]:
    served: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            with client.stream("POST", rp.url + "/v1/chat/completions", json=chat(16)) as r:
                assert r.status_code == 200
                r.read()
                served[r.headers["x-dynspec-backend"]] += 1
    return served


async def _load(rp: RouterProc, peaks: list[int]) -> Counter[str]:
    served: Counter[str] = Counter()
    done = asyncio.Event()

    async def client_loop(client: httpx.AsyncClient) -> None:
        for _ in range(ROUNDS):
            async with client.stream("POST", rp.url + "/v1/chat/completions", json=chat(64)) as r:
                assert r.status_code == 200
                await r.aread()
                served[r.headers["x-dynspec-backend"]] += 1

    async def watch(client: httpx.AsyncClient) -> None:
        # The EAGLE server's in-flight count, sampled while the load runs.
        while not done.is_set():
            st = (await client.get(rp.url + "/status")).json()
            peaks.append(st["pools"]["eagle"]["in_flight"])
            await asyncio.sleep(0.05)

    limits = httpx.Limits(max_connections=CONCURRENCY + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        watcher = asyncio.create_task(watch(client))
        try:
            await asyncio.gather(*(client_loop(client) for _ in range(CONCURRENCY)))
        finally:
            done.set()
            await watcher
    return served


@pytest.mark.parametrize("profile", [True, False], ids=["profile", "learning-only"])
def test_balance_light_load_to_eagle_heavy_load_to_both(tmp_path: Path, profile: bool) -> None:
    with (
        sim(tmp_path, "eagle", "--max-running-requests", str(EAGLE_LIMIT)) as eagle,
        sim(tmp_path, "baseline") as baseline,
    ):
        args = ["--eagle-url", eagle, "--baseline-url", baseline, "--policy", "balance"]
        args += ["--metrics-interval", "0.2"]
        if profile:
            args += ["--speed-profile", DEMO]
        with router(tmp_path, *args) as rp:
            # The poller asks each server for its running limit first.
            assert wait_for(
                lambda: rp.status()["servers"][0]["running_limit"] == EAGLE_LIMIT, timeout=30
            )

            assert one_at_a_time(rp, 12) == {"eagle": 12}

            peaks: list[int] = []
            served = asyncio.run(_load(rp, peaks))
            assert sum(served.values()) == CONCURRENCY * ROUNDS
            assert served["eagle"] > 0 and served["baseline"] > 0, served
            assert peaks and max(peaks) <= EAGLE_LIMIT, peaks

            st = rp.status()
            assert st["policy"] == "balance"
            for s in st["servers"]:
                assert s["predicted_tpot_s"] > 0
                tpots = [t for _, t in s["curve"]]
                assert tpots == sorted(tpots)  # never faster at a higher load
            assert st["servers"][0]["spec_accept_length"] is not None
            decided = sum(
                rp.metric("dynspec_route_decisions_total", pool=p, reason=r)
                for p in ("eagle", "baseline")
                for r in ("only", "fastest", "tie", "explore", "full")
            )
            assert decided == 12 + CONCURRENCY * ROUNDS
            assert rp.metric("dynspec_predicted_tpot_seconds", pool="eagle", server=eagle) > 0
            assert rp.metric("dynspec_mode_switches_total", to="baseline") == 0


def test_balance_has_no_mode_and_health_generate_asks_any_server(
    tmp_path: Path, sims: tuple[str, str]
) -> None:
    eagle, baseline = sims
    args = ["--eagle-url", eagle, "--baseline-url", baseline, "--policy", "balance"]
    with router(tmp_path, *args, admin="adm") as rp:
        assert one_at_a_time(rp, 1) == {"eagle": 1}
        # The last request went to EAGLE: that is no mode and no active pool.
        st = rp.status()
        assert st["policy"] == "balance" and st["mode"] is None and st["active_pool"] is None
        text = rp.metrics()
        for pool in ("eagle", "baseline"):
            assert f'dynspec_active_pool{{pool="{pool}"}} 0.0' in text
        r = httpx.get(rp.url + "/health_generate", timeout=30)
        assert r.status_code == 200 and r.json()["pool"] in ("eagle", "baseline")
        # EAGLE drained: the baseline server answers, whichever pool served last.
        auth = {"Authorization": "Bearer adm"}
        assert httpx.post(rp.url + "/admin/drain/eagle", headers=auth).status_code == 200
        try:
            r = httpx.get(rp.url + "/health_generate", timeout=30)
            assert r.status_code == 200 and r.json()["pool"] == "baseline"
            assert rp.status()["active_pool"] is None
        finally:
            assert httpx.post(rp.url + "/admin/resume/eagle", headers=auth).status_code == 200
        assert rp.metric("dynspec_mode_switches_total", to="baseline") == 0
