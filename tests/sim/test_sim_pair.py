"""``dynspec-sim --pair``: both servers of a pair on one simulated GPU, held to measured shares.

The measured points are those of ``shared/data/h200-real/pair-sharing.md`` section 1 (one H200,
real SGLang 0.5.17, the project's 8B-shaped model, ``dynspec-launch --gpus 0``): the table below
copies its "share" columns (the raw lines are ``pair-sharing-timeslice.jsonl`` and
``pair-sharing-mps.jsonl`` there; CI may not have that folder, so the numbers live here).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from simkit import metric_value
from utils import free_port, running, wait_http

# (e, b) -> (EAGLE share, baseline share), measured: pair-sharing.md section 1, both tables.
MEASURED: dict[str, dict[tuple[int, int], tuple[float, float]]] = {
    "timeslice": {
        (4, 16): (0.56, 0.53),
        (4, 64): (0.55, 0.53),
        (16, 16): (0.59, 0.53),
        (16, 64): (0.61, 0.67),
        (32, 32): (0.50, 0.59),
    },
    "mps": {
        (4, 64): (0.58, 0.69),
        (16, 16): (0.84, 0.56),
        (16, 64): (0.84, 0.73),
        (32, 32): (0.82, 0.43),
    },
}
PROFILE = "h200-8b-chat"  # made from bench/results/h200/h200-8b.jsonl, the same kind of run
SPEED = 5.0
WINDOW_S = 1.0  # wall seconds per measurement (5 simulated seconds at SPEED)
PROMPT = " ".join(["word"] * 256)
MAX_TOKENS = 2048  # long requests: the closed loop's refills (prefills) are a small part


@contextlib.contextmanager
def start_pair(tmp_path: Path, *flags: str) -> Iterator[tuple[str, str]]:
    e, b = free_port(), free_port()
    argv = [
        sys.executable,
        "-m",
        "dynspec.launcher.sim",
        "--pair",
        "--eagle-port",
        str(e),
        "--baseline-port",
        str(b),
        *flags,
    ]
    eagle, baseline = f"http://127.0.0.1:{e}", f"http://127.0.0.1:{b}"
    with running(argv, ready_url=eagle + "/health", log=tmp_path / "pair.log", timeout=30) as p:
        wait_http(baseline + "/health", proc=p)
        yield eagle, baseline


async def _client(http: httpx.AsyncClient, url: str, stop: asyncio.Event) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
    }
    while not stop.is_set():
        await http.post(url + "/v1/chat/completions", json=body, timeout=60)


async def _reading(http: httpx.AsyncClient, url: str) -> tuple[float, float, float]:
    """(generated tokens, simulated seconds, running requests) of one server now."""
    text = (await http.get(url + "/metrics")).text
    stats = (await http.get(url + "/sim/stats")).json()
    tokens = metric_value(text, "sglang:generation_tokens_total")
    return tokens, stats["sim_time_s"], metric_value(text, "sglang:num_running_reqs")


async def _rates(loads: dict[str, int]) -> dict[str, float]:
    """Simulated output tok/s of each loaded server under closed loops of ``loads`` clients."""
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        tasks = [
            asyncio.create_task(_client(http, url, stop))
            for url, n in loads.items()
            for _ in range(n)
        ]
        # Wait (bounded) until every server runs its full load (each side's /metrics counts its
        # own running requests only), then measure one window.
        for _ in range(100):
            now = {url: await _reading(http, url) for url in loads}
            if all(now[url][2] == n for url, n in loads.items()):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the load never reached {loads}: {now}")
        await asyncio.sleep(0.2)  # past the first prefills
        first = {url: await _reading(http, url) for url in loads}
        await asyncio.sleep(WINDOW_S)
        last = {url: await _reading(http, url) for url in loads}
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for url in loads:
            # The cancelled clients' requests: end them before the next measurement starts.
            await http.post(url + "/abort_request", json={"abort_all": True})
    return {url: (last[url][0] - first[url][0]) / (last[url][1] - first[url][1]) for url in loads}


@pytest.mark.parametrize("sharing", ["timeslice", "mps"])
def test_pair_keeps_the_measured_shares(tmp_path: Path, sharing: str) -> None:
    """At each measured mix (e + b), each server's simulated tok/s in the mix over its simulated
    tok/s alone is within 0.1 of the share measured on the real H200."""
    points = MEASURED[sharing]
    flags = ("--profile", PROFILE, "--speed", str(SPEED), "--seed", "3", "--sharing", sharing)
    with start_pair(tmp_path, *flags) as (eagle, baseline):
        alone_e = {e: asyncio.run(_rates({eagle: e}))[eagle] for e in {e for e, _ in points}}
        alone_b = {b: asyncio.run(_rates({baseline: b}))[baseline] for b in {b for _, b in points}}
        got = {}
        for e, b in points:
            mix = asyncio.run(_rates({eagle: e, baseline: b}))
            got[(e, b)] = (mix[eagle] / alone_e[e], mix[baseline] / alone_b[b])
        for (e, b), (share_e, share_b) in points.items():
            sim_e, sim_b = got[(e, b)]
            assert abs(sim_e - share_e) <= 0.1, (sharing, e, b, "eagle", sim_e, share_e, got)
            assert abs(sim_b - share_b) <= 0.1, (sharing, e, b, "baseline", sim_b, share_b, got)
        # Sanity: alone, the profile's own speeds (the real run's), not the shared ones.
        assert alone_e[16] > alone_b[16]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--pair", "--eagle-port", "1"], "needs both"),
        (["--pair", "--eagle-port", "1", "--baseline-port", "2", "--port", "3"], "drop --port"),
        (["--pair", "--eagle-port", "1", "--baseline-port", "2", "--mode", "eagle"], "--mode"),
        (["--eagle-port", "1"], "need --pair"),
        (["--pair", "--eagle-port", "1", "--baseline-port", "2", "--sharing", "x"], "sharing"),
    ],
)
def test_pair_usage_errors(flags: list[str], needle: str) -> None:
    argv = [sys.executable, "-m", "dynspec.launcher.sim", *flags]
    out = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    lines = out.stderr.decode().strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


# -- the one profile reader, as both of its users see it ------------------------------------------

BASE: dict[str, object] = {
    "schema": 1,
    "name": "x",
    "source": "test",
    "modes": {"baseline": {"throughput": [[1, 10.0], [4, 30.0]]}},
}


def test_both_readers_take_the_sharing_key_and_reject_unknown_ones() -> None:
    from dynspec.launcher.sim.profile import DEFAULT_SHARING, ProfileError, profile_from_dict
    from dynspec.router.speed import ProfileError as RouterProfileError
    from dynspec.router.speed import profile_from_json

    shared = {**BASE, "sharing": {"mps": {"eagle": 0.8, "baseline": 0.5}}}
    p = profile_from_dict(shared)
    assert p.share_model("mps").share("eagle", 3, 3) == 0.8
    assert p.share_model("timeslice") == DEFAULT_SHARING["timeslice"]  # none given: measured
    assert profile_from_json(shared).modes["baseline"].limit == 1024
    for bad, needle in [
        ({**BASE, "speed": 2}, "unknown profile key 'speed'"),
        ({**BASE, "sharing": {"nvlink": {}}}, "unknown sharing 'nvlink'"),
        ({**BASE, "sharing": {"mps": {"eagle": 0.8}}}, "lacks 'baseline'"),
        ({**BASE, "sharing": {"mps": {"eagle": 1.5, "baseline": 0.5}}}, r"\(0, 1\]"),
        ({**BASE, "sharing": {"mps": {"eagle": 1, "baseline": 1, "x": 1}}}, "unknown key 'x'"),
    ]:
        with pytest.raises(ProfileError, match=needle):
            profile_from_dict(bad)
        with pytest.raises(RouterProfileError, match=needle):
            profile_from_json(bad)


def test_nearest_measured_point_gives_the_share() -> None:
    from dynspec.launcher.sim.profile import load_profile

    mps = load_profile(PROFILE).share_model("mps")
    assert mps.share("eagle", 4, 64) == 0.58 and mps.share("baseline", 32, 32) == 0.43
    assert mps.share("eagle", 17, 15) == 0.84  # nearest: 16 + 16
    assert "h200-8b.jsonl" in load_profile(PROFILE).source


def test_sigterm_stops_both_servers(tmp_path: Path) -> None:
    e, b = free_port(), free_port()
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--pair"]
    argv += ["--eagle-port", str(e), "--baseline-port", str(b)]
    with running(argv, ready_url=f"http://127.0.0.1:{e}/health", log=tmp_path / "p.log") as p:
        wait_http(f"http://127.0.0.1:{b}/health", proc=p)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=15)  # both uvicorn servers stop, so the process ends
        for port in (e, b):
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


# -- the share over a step's length, not at its start ----------------------------------------------


async def _wave(eagle_requests: int, *, after_first: bool) -> tuple[float, float]:
    """One shared GPU (``h200-8b-accept2``, timeslice) at the turn of a closed loop's wave:
    ``eagle_requests`` go to EAGLE, then the baseline gets one prompt and, once that one runs
    (``after_first``: and EAGLE's too), 123 more, as a wave's sends trickle in. The simulated
    seconds until EAGLE's last and the baseline's last request end."""
    from dynspec.launcher.sim.engine import Engine, SimRequest
    from dynspec.launcher.sim.metrics import Metrics
    from dynspec.launcher.sim.profile import load_profile
    from dynspec.launcher.sim.shared_gpu import SharedGpu

    profile = load_profile("h200-8b-accept2")
    shared = SharedGpu(profile.share_model("timeslice"), "timeslice")
    engines: dict[str, Engine] = {}
    for mode in ("eagle", "baseline"):
        engine = Engine(
            mode_profile=profile.mode(mode),
            speculative=mode == "eagle",
            max_running=1024,
            speed=4.0,
            seed=1,
            metrics=Metrics("m", mode == "eagle"),
            max_total_tokens=10**7,
            shared=shared,
        )
        shared.join(mode, engine)
        engine.open()
        engines[mode] = engine
    tasks = [asyncio.create_task(e.run()) for e in engines.values()]

    def request(mode: str, i: int) -> SimRequest:
        key = f"{mode}{i}"
        return SimRequest(
            rid=key, prompt_tokens=256, max_new_tokens=64, limit=64, stream=False, seed=1,
            prompt_key=key, ignore_eos=True,
        )  # fmt: skip

    async def until(done: Callable[[], bool]) -> None:
        for _ in range(2000):
            if done():
                return
            await asyncio.sleep(0.002)
        raise AssertionError("the simulated GPU never got there")

    eagle, baseline = engines["eagle"], engines["baseline"]
    try:
        ours = [request("eagle", i) for i in range(eagle_requests)]
        for r in ours:
            eagle.submit(r)
        first = request("baseline", 0)
        baseline.submit(first)
        await until(lambda: bool(baseline.running) and (not after_first or bool(eagle.running)))
        wave = [first] + [request("baseline", i) for i in range(1, 124)]
        for r in wave[1:]:
            baseline.submit(r)
        await until(lambda: all(r.done for r in ours + wave))
        return max((r.finished_at for r in ours), default=0.0), max(r.finished_at for r in wave)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_long_step_is_slowed_while_its_mate_runs_not_for_all_of_it() -> None:
    """A baseline prefill of a wave's 123 prompts (2 simulated seconds) that starts beside one
    EAGLE request (0.3 s) is slowed while that request runs, not for the whole step: the share
    was once read at a step's start only, and the wave took 1.6x as long (simulated `paired-auto`
    at C=256 on `h200-8b-accept2`, 0.82x `2x-baseline`). The request beside it still costs."""
    _, alone = await _wave(0, after_first=False)
    eagle_end, wave_end = await _wave(1, after_first=True)
    assert eagle_end < 0.2 * alone
    assert alone < wave_end < 1.15 * alone, (alone, wave_end)


async def test_a_prefill_counts_as_busy_for_its_mate() -> None:
    """EAGLE requests beside the baseline's prefill of a wave (no baseline request running yet)
    share the GPU with it: they were once counted alone, and so was the prefill, so sending a
    wave's first 4-8 requests to EAGLE cost nothing (the same pairs at threshold 8: 1.00-1.05x
    `2x-baseline` at C=256)."""
    _, alone = await _wave(0, after_first=False)
    _, wave_end = await _wave(4, after_first=False)
    assert 1.05 * alone < wave_end, (alone, wave_end)
