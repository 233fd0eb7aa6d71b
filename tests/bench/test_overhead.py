"""The overhead harness: its mock upstream, its /proc accounting and one tiny end-to-end run.

Benchmarks are never timed tests: these check what was counted, never how fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import openai
import pytest
from utils import free_port, running

from dynspec.bench.host import cpu_seconds, rss_bytes
from dynspec.bench.overhead_analysis import solve_cost
from dynspec.bench.overhead_load import expected_events

PY = sys.executable


def test_solve_cost_recovers_per_chunk_and_per_request_cost() -> None:
    a, b = 30e-6, 0.2e-3
    samples = [
        (float(ch), float(rq), ch * a + rq * b) for ch, rq in ((33_000, 250), (20_000, 1000))
    ]
    solved = solve_cost(samples)
    assert solved is not None
    assert solved[0] == pytest.approx(a, rel=1e-6)
    assert solved[1] == pytest.approx(b, rel=1e-6)
    # One stream length alone cannot separate the two costs.
    assert solve_cost([(2000.0, 100.0, 0.1), (4000.0, 200.0, 0.2)]) is None


_BURN = """
import subprocess, sys, time
if sys.argv[1] == "parent":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
    child.wait()
else:
    while time.process_time() < 0.4:
        pass
    time.sleep(60)
"""


def test_cpu_seconds_counts_child_processes() -> None:
    # The parent only waits; all CPU is burnt by its child, which must be counted.
    proc = subprocess.Popen([PY, "-c", _BURN, "parent", _BURN], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        seen = 0.0
        while time.monotonic() < deadline:
            seen = cpu_seconds(proc.pid)
            if seen >= 0.3:
                break
            time.sleep(0.1)
        assert seen >= 0.3, f"child CPU not counted: {seen}"
        assert rss_bytes(proc.pid) > 1_000_000
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_upstream_speaks_sglang_streams_to_the_openai_client() -> None:
    port = free_port()
    argv = [PY, "-m", "dynspec.bench.overhead_upstream", "--port", str(port), "--interval-ms", "0"]
    with running(argv, f"http://127.0.0.1:{port}/health"):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["bench-model"]
        stream = client.chat.completions.create(
            model="bench-model",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == " tok" * 5
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 5
        # role + 5 tokens + finish + usage, then [DONE] (which the client swallows).
        assert len(chunks) + 1 == expected_events(5)
        full = client.chat.completions.create(
            model="bench-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert full.choices[0].message.content == " tok" * 3


def test_tiny_run_counts_every_chunk(tmp_path: Path) -> None:
    targets = ["direct", "floor", "floor-asgi", "dynspec"]
    targets += ["sglang"] if find_spec("sglang_router") else []
    out = tmp_path / "overhead"
    argv = [
        PY, "-m", "dynspec.bench.overhead",
        "--targets", ",".join(targets),
        "--intervals-ms", "1",
        "--concurrency", "4",
        "--tokens", "4",
        "--requests", "4:12",
        "--cost-tokens", "8,4",
        "--cost-concurrency", "4",
        "--cost-interval-ms", "1",
        "--runs", "1",
        "--max-seconds", "30",
        "--out", str(out),
        "--log-dir", str(tmp_path / "logs"),
        "--log-level", "warning",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["settings"]["targets"] == targets
    assert result["skipped"] == []
    assert result["machine"]["nproc"] >= 1 and result["machine"]["python"]

    runs = result["runs"]
    # Two levels (4 and 8 tokens at C=4), one run each, every target.
    assert sorted((r["tokens"], r["target"]) for r in runs) == sorted(
        (t, name) for t in (4, 8) for name in targets
    )
    # Every run measures the CPU of exactly the relays and the two upstreams of its phase.
    watched = {*targets[1:], "upstream1-1ms", "upstream2-1ms"}
    for r in runs:
        n = r["requests_planned"]
        assert r["requests_ok"] == n and r["requests_failed"] == 0, r
        assert r["bad_streams"] == 0, r
        assert r["content_chunks"] == n * r["tokens"], r
        assert r["events"] == n * expected_events(r["tokens"]), r
        assert r["ttft_ms"]["p50"] is not None, r
        assert r["ttft_ms"]["p50"] <= r["latency_ms"]["p50"]
        assert set(r["cpu_s"]) == watched, r
        assert all(isinstance(v, float) for v in r["cpu_s"].values()), r
        if r["target"] == "direct":
            assert r["router_cpu_s"] is None
        else:
            assert r["router_cpu_s"] == r["cpu_s"][r["target"]]
            assert r["rss_peak_mb"][r["target"]] > 0
    # One run may take less than a clock tick of a relay's CPU, but all of them together cannot
    # have cost the relays and the upstreams nothing.
    assert sum(v for r in runs for v in r["cpu_s"].values()) > 0

    rows = {(row["tokens"], row["target"]): row for row in result["summary"]}
    assert rows[(4, "direct")]["x_direct"] == 1.0
    for name in targets[1:]:
        assert rows[(4, name)]["x_direct"] is not None
        assert rows[(4, name)]["added_ttft_p50_ms"] is not None
        assert result["cost_model"][name]["runs"] == 2
        assert result["memory"][name]["idle_mb_1ms"] > 0

    md = out.with_suffix(".md").read_text()
    assert "| interval | C | tokens | target |" in md
    assert f"{result['machine']['nproc']} x" in md
    assert "## CPU cost model" in md
