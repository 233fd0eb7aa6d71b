"""Pairs and the learned speed end to end, in front of real ``dynspec-sim`` processes.

- Two pairs (two plain sims each, demo profile): requests go to the least loaded pair, each pair
  switches to its baseline server past its own threshold; /status and /metrics show each pair.
- A pair server that dies: health marks it down and its pair serves from the other server.
- ``balance`` (split layout), the real-H200 failure: the EAGLE server idle for 90 simulated
  seconds while the baseline serves; then light load must go back to EAGLE within 10 s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
from routerkit import RouterProc, router, sim, sim_proc, wait_for
from utils import kill_group

ADMIN = "pairs-admin"
SPEED = 10.0


def chat(max_tokens: int) -> dict[str, object]:
    return {
        "model": "demo-model",
        "messages": [{"role": "user", "content": "count to a hundred"}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


def one(client: httpx.Client, rp: RouterProc) -> str:
    with client.stream("POST", rp.url + "/v1/chat/completions", json=chat(16)) as r:
        assert r.status_code == 200
        r.read()
        return r.headers["x-dynspec-backend"]


async def together(rp: RouterProc, n: int, tokens: int) -> Counter[str]:
    served: Counter[str] = Counter()

    async def go(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", rp.url + "/v1/chat/completions", json=chat(tokens)) as r:
            assert r.status_code == 200
            await r.aread()
            served[r.headers["x-dynspec-backend"]] += 1

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n + 2)) as c:
        await asyncio.gather(*(go(c) for _ in range(n)))
    return served


def test_two_pairs_route_by_pair_load_and_switch_each_pair(tmp_path: Path) -> None:
    with (
        sim(tmp_path, "eagle", speed=SPEED) as e0,
        sim(tmp_path, "baseline", speed=SPEED) as b0,
        sim(tmp_path, "eagle", speed=SPEED) as e1,
        sim(tmp_path, "baseline", speed=SPEED) as b1,
    ):
        args = ["--pair", f"{e0},{b0}", "--pair", f"{e1},{b1}", "--threshold", "2"]
        args += ["--hysteresis", "1", "--metrics-interval", "0.2"]
        with router(tmp_path, *args, admin=ADMIN) as rp:
            with httpx.Client(timeout=30) as client:
                assert [one(client, rp) for _ in range(4)] == ["eagle"] * 4
            # Eight at once: two per pair on EAGLE (loads 1, 2), then each pair past 2.
            served = asyncio.run(together(rp, 8, 200))
            assert sum(served.values()) == 8 and served["baseline"] >= 4, served
            st = rp.status()
            assert [p["index"] for p in st["pairs"]] == [0, 1]
            assert [(p["eagle_url"], p["baseline_url"]) for p in st["pairs"]] == [
                (e0, b0),
                (e1, b1),
            ]
            assert all(p["switches"] >= 1 for p in st["pairs"]), st["pairs"]
            assert all(p["threshold"] == 2 and p["hysteresis"] == 1 for p in st["pairs"])
            assert st["threshold_auto"] is False and len(st["servers"]) == 4
            text = rp.metrics()
            for pair in ("0", "1"):
                assert rp.metric("dynspec_threshold", pair=pair) == 2
                assert rp.metric("dynspec_mode_switches_total", pair=pair, to="baseline") >= 1
                assert f'dynspec_pair_load{{pair="{pair}"}}' in text
                assert f'dynspec_pair_mode{{pair="{pair}",pool="eagle"}}' in text
            # The operator's threshold applies to every pair.
            r = httpx.put(
                rp.url + "/admin/threshold",
                json={"threshold": 5, "hysteresis": 1},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 200
            assert [p["threshold"] for p in rp.status()["pairs"]] == [5, 5]
            assert rp.wait_load(0)["load"] == 0


def test_a_dead_pair_server_and_its_pair_serves_from_the_other(tmp_path: Path) -> None:
    with (
        sim_proc(tmp_path, "eagle", speed=SPEED) as (e0, e0_proc),
        sim(tmp_path, "baseline", speed=SPEED) as b0,
    ):
        args = ["--pair", f"{e0},{b0}", "--health-interval", "0.2", "--metrics-interval", "0"]
        with router(tmp_path, *args) as rp:
            with httpx.Client(timeout=30) as client:
                assert one(client, rp) == "eagle"
                kill_group(e0_proc)
                assert wait_for(lambda: not rp.status()["servers"][0]["healthy"], timeout=10)
                assert [one(client, rp) for _ in range(3)] == ["baseline"] * 3
            assert (
                rp.metric("dynspec_route_decisions_total", pool="baseline", reason="fallback") == 3
            )
            st = rp.status()
            assert st["pairs"][0]["mode"] == "eagle" and st["pairs"][0]["active_pool"] == "baseline"
            assert rp.get("/health").status_code == 200
            # The pair's active server (its baseline now) passes its own /health_generate.
            r = httpx.get(rp.url + "/health_generate", timeout=30)
            assert r.status_code == 200 and r.json()["pool"] == "baseline", r.text


def test_balance_sends_light_load_back_to_an_eagle_server_idle_for_90_simulated_s(
    tmp_path: Path,
) -> None:
    with (
        sim(tmp_path, "eagle", speed=SPEED) as eagle,
        sim(tmp_path, "baseline", speed=SPEED) as base,
    ):
        args = ["--eagle-url", eagle, "--baseline-url", base, "--policy", "balance"]
        args += ["--metrics-interval", "0.2"]
        with router(tmp_path, *args, admin=ADMIN) as rp, httpx.Client(timeout=30) as client:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            assert Counter(one(client, rp) for _ in range(10))["eagle"] >= 9
            # EAGLE idle for 90 simulated seconds while the baseline serves (a drain does it).
            assert httpx.post(rp.url + "/admin/drain/eagle", headers=admin).status_code == 200
            idle_until = time.monotonic() + 90 / SPEED
            served = 0
            while time.monotonic() < idle_until and served < 2000:
                assert one(client, rp) == "baseline"
                served += 1
            assert httpx.post(rp.url + "/admin/resume/eagle", headers=admin).status_code == 200
            # Light load: within 10 s, EAGLE takes it again (five in a row), as before the idle.
            deadline = time.monotonic() + 10
            streak = 0
            while streak < 5 and time.monotonic() < deadline:
                streak = streak + 1 if one(client, rp) == "eagle" else 0
            assert streak == 5, (
                f"light load not back on EAGLE within 10 s\n{rp.log.read_text()[-3000:]}"
            )


def test_threshold_auto_starts_from_the_profile_s_crossover(tmp_path: Path) -> None:
    profile = str(
        Path(__file__).resolve().parents[2] / "launcher/sim/profiles/h200-8b-accept4.json"
    )
    with sim(tmp_path, "eagle", speed=SPEED) as e0, sim(tmp_path, "baseline", speed=SPEED) as b0:
        args = ["--pair", f"{e0},{b0}", "--threshold", "auto", "--speed-profile", profile]
        with router(tmp_path, *args, "--metrics-interval", "0") as rp:
            st = rp.status()
            # EAGLE's predicted TPOT is no worse than the baseline's up to load 30 in that profile.
            assert st["threshold_auto"] is True and st["pairs"][0]["threshold"] == 30
            assert rp.metric("dynspec_threshold", pair="0") == 30
