"""By hand: N endless streams against one dynspec-sim; its CPU per chunk from /proc.

    python tests/sim/sim_stress.py --profile eagle3-h100 --mode baseline --speed 1 --streams 256

Prints one JSON line: chunks/s seen by the client, simulated tok/s, the simulator's share of a core
and CPU microseconds per chunk, and how far its scheduler fell behind (late steps, worst lag,
lag written off). The client is this process (aiohttp, counting events only); on a busy machine
both compete for CPU, so read the lag figures next to the load average it also prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


async def generated(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("sglang:generation_tokens_total") and 'is_streaming="true"' in line:
            return float(line.split()[-1])
    return 0.0


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/sim/stats") as r:
        return await r.json()  # type: ignore[no-any-return]


async def measure(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Go on."}],
        "stream": True,
        "ignore_eos": True,  # with no max_tokens: run to the context length
    }
    counting = False
    events = 0

    async def stream(http: aiohttp.ClientSession) -> None:
        nonlocal events
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
            async for data in r.content.iter_any():
                if counting:
                    events += data.count(b"data: ")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.create_task(stream(http)) for _ in range(args.streams)]
        await asyncio.sleep(args.warmup)
        st0, g0 = await stats(http, url), await generated(http, url)
        c0, t0, w0 = cpu_seconds(pid), time.monotonic(), runqueue_wait_s(pid)
        counting = True
        await asyncio.sleep(args.window)
        counting = False
        c1, t1, w1 = cpu_seconds(pid), time.monotonic(), runqueue_wait_s(pid)
        st1, g1 = await stats(http, url), await generated(http, url)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    el = t1 - t0
    return {
        "profile": args.profile,
        "mode": args.mode,
        "speed": args.speed,
        "streams": args.streams,
        "running": st1["running"],
        "chunks_per_s": round(events / el),
        "sim_tok_per_s": round((g1 - g0) / el / args.speed, 1),
        "sim_core_share": round((c1 - c0) / el, 3),
        "us_per_chunk": round((c1 - c0) / max(events, 1) * 1e6, 1),
        "sim_runqueue_wait_share": round((w1 - w0) / el, 3),
        "late_steps": st1["late_steps"] - st0["late_steps"],
        "max_lag_ms": round(st1["max_lag_s"] * 1e3, 1),
        "dropped_s": round(st1["dropped_s"] - st0["dropped_s"], 3),
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--profile", default="eagle3-h100")
    p.add_argument("--mode", default="baseline", choices=("eagle", "baseline"))
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--window", type=float, default=5.0)
    args = p.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(port)]
    argv += ["--profile", args.profile, "--mode", args.mode, "--speed", str(args.speed)]
    if args.max_running_requests:
        argv += ["--max-running-requests", str(args.max_running_requests)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        print(json.dumps(asyncio.run(measure(args, url, proc.pid))))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
