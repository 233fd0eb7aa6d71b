"""The router's own share of a level's TTFT (``steady.RouterDelay``): the histogram's sum and
count on made-up pages, the router-cost report's verdict on it, and the clock on real processes
(two ``dynspec-sim`` servers, a ``dynspec-router`` in front, the real ``openai`` client)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import openai
from utils import free_port, running

from dynspec.bench.gpu import steady, steadyreport

PAGE = """\
# TYPE dynspec_router_delay_seconds histogram
dynspec_router_delay_seconds_bucket{pool="eagle",le="0.001"} 1.0
dynspec_router_delay_seconds_sum{pool="eagle"} 0.5
dynspec_router_delay_seconds_count{pool="eagle"} 1.0
dynspec_router_delay_seconds_sum{pool="baseline"} 2.5
dynspec_router_delay_seconds_count{pool="baseline"} 4.0
dynspec_time_to_first_token_seconds_sum{pool="eagle"} 99.0
dynspec_time_to_first_token_seconds_count{pool="eagle"} 9.0
"""


def test_totals_add_up_every_series_of_the_histogram() -> None:
    assert steady.delay_totals(PAGE) == (3.0, 5.0)
    assert steady.delay_totals("sglang:time_to_first_token_seconds_count 3.0\n") is None


def test_a_level_gets_the_mean_over_the_level_and_nothing_from_the_silent() -> None:
    pages = {"http://r/metrics": PAGE}

    def fake(url: str) -> str:
        if url not in pages:
            raise OSError("refused")
        return pages[url]

    delay = steady.RouterDelay("http://r", fake)
    delay.start()
    pages["http://r/metrics"] = PAGE.replace("} 2.5", "} 4.5").replace("} 4.0", "} 8.0")
    # 4 more requests, 2.0 s more in all: 500 ms each.
    assert delay.read() == {"router_delay": {"ms": 500.0, "n": 4.0}}
    assert delay.read() == {"router_delay": {"ms": 500.0, "n": 4.0}}  # still from the start
    delay.start()
    assert delay.read() == {}  # nothing new since
    for silent in (steady.RouterDelay("http://x", fake), steady.RouterDelay(None, fake)):
        silent.start()
        assert silent.read() == {}


def test_the_router_cost_report_judges_the_routers_own_share_where_it_was_measured() -> None:
    def rec(target: str, c: int, rep: int, own: float | None) -> dict[str, Any]:
        seen = {"eagle": {"ms": 200.0, "n": 10}}
        if own is not None:
            seen["router_delay"] = {"ms": own, "n": 10}
        return {
            "target": target,
            "max_concurrency": c,
            "repeat": rep,
            "output_throughput": 100.0,
            "median_tpot_ms": 1.0,
            "median_ttft_ms": 250.0 + rep,
            "duration": 15.0,
            "first_token": seen,
        }

    rows = [
        rec(t, c, rep, own if t == "routed_eagle" else None)
        for c, own in ((16, 0.2), (256, 1.5))
        for rep in (1, 2, 3)
        for t in ("routed_eagle", "eagle")
    ]
    text = steadyreport.markdown(rows)
    assert "within +5 ms at every C: PASS (worst 1.50 ms)" in text
    assert (
        "| 256 | 1.000 | 1.000 (1.000-1.000) | 0.0 (0.0-0.0) | - | - | - | 1.50 (1.50-1.50) |"
        in text
    )
    rows[-2]["first_token"]["router_delay"]["ms"] = 9.0  # C=256 #3: one repeat of three
    assert "PASS (worst 1.50 ms)" in steadyreport.markdown(rows)  # the median holds
    rows[-4]["first_token"]["router_delay"]["ms"] = 8.0
    assert "within +5 ms at every C: MISS (worst 8.00 ms)" in steadyreport.markdown(rows)
    for r in rows:
        if r["max_concurrency"] == 16:
            r["first_token"].pop("router_delay", None)
    assert "INCOMPLETE: some C have none" in steadyreport.markdown(rows)
    # Runs from before it was recorded: no verdict on it.
    for r in rows:
        r["first_token"].pop("router_delay", None)
    assert "own share of TTFT" not in steadyreport.markdown(rows)


def test_the_clock_on_a_router_in_front_of_two_simulated_servers(tmp_path: Path) -> None:
    ports = {p: free_port() for p in ("router", "eagle", "baseline")}
    urls = {p: f"http://127.0.0.1:{port}" for p, port in ports.items()}
    with contextlib.ExitStack() as es:
        for pool in ("eagle", "baseline"):
            argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(ports[pool])]
            argv += ["--mode", pool, "--speed", "1", "--served-model-name", "m"]
            argv += ["--log-level", "warning"]
            log = tmp_path / f"{pool}.log"
            es.enter_context(running(argv, urls[pool] + "/health_generate", 60, log=log))
        argv = [sys.executable, "-m", "dynspec.router", "--host", "127.0.0.1"]
        argv += ["--port", str(ports["router"]), "--eagle-url", urls["eagle"]]
        argv += ["--baseline-url", urls["baseline"], "--threshold", "1000000"]
        argv += ["--log-level", "warning"]
        es.enter_context(running(argv, urls["router"] + "/health", 60, log=tmp_path / "r.log"))
        delay = steady.RouterDelay(urls["router"])
        delay.start()
        client = openai.OpenAI(base_url=urls["router"] + "/v1", api_key="x", timeout=30)
        for _ in range(5):
            stream = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi there"}],
                max_tokens=8,
                stream=True,
            )
            chunks = list(stream)  # read whole: the router records a request as it ends
            assert any(c.choices and c.choices[0].delta.content for c in chunks)
        seen = delay.read()
    # Every request went through the router: its own share of each, well under a second.
    assert seen["router_delay"]["n"] == 5, seen
    assert 0 < seen["router_delay"]["ms"] < 1000
