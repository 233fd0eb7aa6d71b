"""Where a level's first token waited (``bench/gpu/firsttoken.py``): the histograms' sums and
counts on made-up pages, and the three clocks on real processes (two ``dynspec-sim`` servers, a
``dynspec-router`` in front, the real ``openai`` client)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import openai
from utils import free_port, running

from dynspec.bench.gpu import firsttoken, steadyreport
from dynspec.bench.gpu.toolkit import fetch

L = 'model_name="m",engine_type="unified"'
SGLANG_PAGE = f"""\
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{{L},is_streaming="false",le="0.1"}} 1.0
sglang:time_to_first_token_seconds_sum{{{L},is_streaming="false"}} 0.5
sglang:time_to_first_token_seconds_count{{{L},is_streaming="false"}} 1.0
sglang:time_to_first_token_seconds_sum{{{L},is_streaming="true"}} 2.5
sglang:time_to_first_token_seconds_count{{{L},is_streaming="true"}} 4.0
sglang:time_to_first_token_seconds_created{{{L},is_streaming="true"}} 1.7e9
sglang:e2e_request_latency_seconds_sum{{{L},is_streaming="true"}} 99.0
sglang:e2e_request_latency_seconds_count{{{L},is_streaming="true"}} 9.0
"""


def test_totals_add_up_every_series_of_the_one_histogram() -> None:
    assert firsttoken.totals(SGLANG_PAGE, firsttoken.SERVER_TTFT) == (3.0, 5.0)
    assert firsttoken.totals(SGLANG_PAGE, "sglang:e2e_request_latency_seconds") == (99.0, 9.0)
    assert firsttoken.totals(SGLANG_PAGE, firsttoken.ROUTER_TTFT) is None
    router = 'dynspec_time_to_first_token_seconds_sum{pool="eagle"} 1.5\n'
    router += 'dynspec_time_to_first_token_seconds_count{pool="eagle"} 3.0\n'
    router += 'dynspec_time_to_first_token_seconds_sum{pool="baseline"} 0.0\n'
    router += 'dynspec_time_to_first_token_seconds_count{pool="baseline"} 0.0\n'
    assert firsttoken.totals(router, firsttoken.ROUTER_TTFT) == (1.5, 3.0)


def test_a_level_gets_each_sources_mean_over_the_level_and_leaves_out_the_silent() -> None:
    pages = {"http://r/metrics": SGLANG_PAGE}

    def fake(url: str) -> str:
        if url not in pages:
            raise OSError("refused")
        return pages[url]

    first = firsttoken.FirstTokens(
        {"eagle": ("http://r", firsttoken.SERVER_TTFT),
         "gone": ("http://x", firsttoken.SERVER_TTFT),
         "idle": ("http://r", firsttoken.ROUTER_TTFT)},
        fake,
    )  # fmt: skip
    first.start()
    more = SGLANG_PAGE.replace("} 2.5", "} 4.5").replace("} 4.0", "} 8.0")
    pages["http://r/metrics"] = more
    # 4 more first tokens, 2.0 s more in all: 500 ms each.
    assert first.read() == {"eagle": {"ms": 500.0, "n": 4.0}}
    assert first.read() == {"eagle": {"ms": 500.0, "n": 4.0}}  # still from the level's start
    first.start()
    assert first.read() == {}  # nothing new since


def test_the_report_shows_each_clock_where_the_records_have_them() -> None:
    rows: list[dict[str, Any]] = []
    for rep, ms in ((1, 40.0), (2, 50.0), (3, 45.0)):
        rows.append({"target": "routed_eagle", "max_concurrency": 16, "repeat": rep,
                     "output_throughput": 1.0, "median_tpot_ms": 1.0, "median_ttft_ms": ms,
                     "mean_ttft_ms": ms + 2,
                     "first_token": {"router": {"ms": ms, "n": 20},
                                     "eagle": {"ms": ms - 5, "n": 20}}})  # fmt: skip
    assert firsttoken.table(rows[:0]) == []
    text = steadyreport.markdown(rows)
    assert "Mean TTFT ms where it was seen" in text
    row = "| 16 | routed_eagle | 47.0 (42.0-52.0) | 45.0 (40.0-50.0) | - | 40.0 (35.0-45.0) | - |"
    assert row in text
    # The router's own delay, well under a millisecond, keeps its digits.
    for r, ms in zip(rows, (0.31, 0.42, 0.285), strict=True):
        r["first_token"]["router_delay"] = {"ms": ms, "n": 20}
    row = "| 16 | routed_eagle | 47.0 (42.0-52.0) | 45.0 (40.0-50.0) | 0.310 (0.285-0.420) |"
    assert row in steadyreport.markdown(rows)


def test_the_router_cost_report_judges_the_routers_own_share_where_it_was_measured() -> None:
    def rec(target: str, c: int, rep: int, own: float | None) -> dict[str, Any]:
        seen = {"eagle": {"ms": 200.0, "n": 10}}
        if own is not None:
            seen["router_delay"] = {"ms": own, "n": 10}
        return {"target": target, "max_concurrency": c, "repeat": rep, "output_throughput": 100.0,
                "median_tpot_ms": 1.0, "median_ttft_ms": 250.0 + rep, "duration": 15.0,
                "first_token": seen}  # fmt: skip

    rows = [rec(t, c, rep, own if t == "routed_eagle" else None)
            for c, own in ((16, 0.2), (256, 1.5)) for rep in (1, 2, 3)
            for t in ("routed_eagle", "eagle")]  # fmt: skip
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


def test_the_three_clocks_on_a_router_in_front_of_two_simulated_servers(tmp_path: Path) -> None:
    ports = {p: free_port() for p in ("router", "eagle", "baseline")}
    urls = {p: f"http://127.0.0.1:{port}" for p, port in ports.items()}
    with contextlib.ExitStack() as es:
        for pool in ("eagle", "baseline"):
            argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(ports[pool])]
            argv += ["--mode", pool, "--speed", "1", "--served-model-name", "m"]
            argv += ["--log-level", "warning"]
            es.enter_context(running(argv, urls[pool] + "/health_generate", 60,
                                     log=tmp_path / f"{pool}.log"))  # fmt: skip
        argv = [sys.executable, "-m", "dynspec.router", "--host", "127.0.0.1"]
        argv += ["--port", str(ports["router"]), "--eagle-url", urls["eagle"]]
        argv += ["--baseline-url", urls["baseline"], "--threshold", "1000000"]
        argv += ["--log-level", "warning"]
        es.enter_context(running(argv, urls["router"] + "/health", 60, log=tmp_path / "r.log"))
        # --speed 1: the simulator's histograms run on its simulated clock, here the real one.
        first = firsttoken.FirstTokens(firsttoken.sources(urls["router"], urls), fetch)
        first.start()
        client = openai.OpenAI(base_url=urls["router"] + "/v1", api_key="x", timeout=30)
        for _ in range(5):
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi there"}], max_tokens=8,
                stream=True,
            )  # fmt: skip
            chunks = list(stream)  # read whole: the router records a request as it ends
            assert any(c.choices and c.choices[0].delta.content for c in chunks)
        seen = first.read()
    # Every request went through the router to the EAGLE server: each saw the 5 first tokens, and
    # the router's clock started before the server's and stopped after it.
    assert set(seen) == {"router", "router_delay", "eagle"}, seen
    assert seen["router"]["n"] == seen["eagle"]["n"] == seen["router_delay"]["n"] == 5
    assert seen["router"]["ms"] >= seen["eagle"]["ms"] > 0
    # The router's own share is a part of its TTFT that ended before the server's clock began.
    assert 0 < seen["router_delay"]["ms"] < seen["router"]["ms"] - seen["eagle"]["ms"]
