"""Reduced sweeps against real dynspec-sim processes (and a real router), through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from utils import free_port, running

from dynspec.launcher.sim.profile import load_profile

BENCH = [sys.executable, "-m", "dynspec.bench"]
SPEED = 10.0  # simulated time 10x faster; figures below are converted back where compared
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    return subprocess.run(
        [*BENCH, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


@pytest.fixture
def eagle_sim(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(port), "--mode", "eagle"]
    argv += ["--profile", "demo", "--speed", str(SPEED), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with running(argv, url + "/health_generate", timeout=30, log=tmp_path / "sim.log"):
        yield url


def test_sweep_writes_jsonl_table_and_plot(eagle_sim: str, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    r = bench(
        "sweep",
        "--url",
        f"eagle={eagle_sim}",
        "--concurrency",
        "1,4",
        "--requests",
        "8",
        "--output-len",
        "24",
        "--input-len",
        "32",
        "--pause",
        "0.2",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["target"], x["max_concurrency"]) for x in recs] == [("eagle", 1), ("eagle", 4)]
    prof = load_profile("demo").mode("eagle")
    for rec in recs:
        c = rec["max_concurrency"]
        assert rec["completed"] == 8 and rec["failed"] == 0
        assert rec["prompt_pool"] == 0  # a new prompt for every request
        assert rec["total_output_tokens"] == 8 * 24  # from the usage chunk
        for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "output_throughput"):
            assert rec[key] > 0
        # Achieved concurrency in the steady window is the level's (fillers keep it up).
        assert c * 0.8 <= rec["concurrency"] <= c * 1.05
        # The simulator's EAGLE sends several tokens per chunk (one chunk per decode step).
        assert rec["mean_tokens_per_chunk"] > 1.5
        # TPOT in model time against the profile's schedule, with room for a busy machine.
        want_ms = 1000.0 * c / prof.throughput_at(c)
        assert 0.7 * want_ms <= rec["median_tpot_ms"] * SPEED <= 2.0 * want_ms
        # Throughput over the window agrees with what the per-request TPOT implies.
        assert rec["output_throughput"] == pytest.approx(
            1000.0 * c / rec["median_tpot_ms"], rel=0.35
        )
    table = out.with_suffix(".md").read_text()
    assert table.count("| eagle |") == 2
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    assert "| eagle | 4 |" in r.stdout


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sweep_ctrl_c_keeps_finished_levels(
    eagle_sim: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    out = tmp_path / "s.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    argv = [*BENCH, "sweep", "--url", f"e={eagle_sim}", "--concurrency", "1,2"]
    argv += ["--requests", "4", "--output-len", "400", "--out", str(out), "--pause", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the first level never finished"
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert "keeping the finished levels" in err.decode()
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["max_concurrency"] for x in recs] == [1]
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "missing command"),
        (("bogus",), "unknown command"),
        (("sweep",), "--url"),
        (("sweep", "--url", "http://127.0.0.1:9", "--concurrency", "0,2"), "--concurrency"),
        (("sweep", "--url", "http://127.0.0.1:9", "--concurrency", "a"), "--concurrency"),
        (("sweep", "--url", "nota-url"), "not a URL"),
        (("sweep", "--url", "http://127.0.0.1:9", "--dataset", "x.json"), "unrecognized"),
        (("suggest-threshold", "/nonexistent.jsonl"), "baseline"),
        (("suggest-threshold", "/nonexistent1", "/nonexistent2"), "no such file"),
        (("envelope",), "--simulate"),
        (("envelope", "--simulate", "--profile", "nosuch"), "unknown profile"),
        (("envelope", "--simulate", "--speed", "0"), "--speed"),
        (("envelope", "--simulate"), "is retired"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


def test_unreachable_target_is_one_line_and_exit_1(tmp_path: Path) -> None:
    r = bench(
        "sweep", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "x.jsonl")
    )
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot reach" in r.stderr


def test_env_layer_sets_flags(eagle_sim: str, tmp_path: Path) -> None:
    out = tmp_path / "env.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env |= {
        "DYNSPEC_URL": f"e={eagle_sim}",
        "DYNSPEC_CONCURRENCY": "2",
        "DYNSPEC_REQUESTS": "4",
        "DYNSPEC_OUTPUT_LEN": "8",
        "DYNSPEC_OUT": str(out),
        "DYNSPEC_PROMPT_POOL": "3",
    }
    r = subprocess.run(
        [*BENCH, "sweep"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert r.returncode == 0, r.stderr
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (rec["target"], rec["max_concurrency"], rec["completed"]) == ("e", 2, 4)
    assert rec["total_output_tokens"] == 4 * 8
    assert rec["prompt_pool"] == 3


def test_steady_levels_last_min_seconds_and_take_turns(eagle_sim: str, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    common = ["--url", f"a={eagle_sim}", "--url", f"b={eagle_sim}", "--concurrency", "1,4"]
    common += ["--requests-per-c", "2", "--min-requests", "2", "--output-len", "8"]
    common += ["--min-seconds", "0.6", "--pause", "0", "--no-progress", "--out", str(out)]
    first = bench("sweep", *common, "--warm-pass", "--repeats", "2")
    assert first.returncode == 0, first.stderr
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    # The targets take turns, repeat by repeat, at each level (A, B, A, B).
    points = [(r["target"], r["max_concurrency"], r["repeat"]) for r in rows]
    assert points == [(t, c, rep) for c in (1, 4) for rep in (1, 2) for t in ("a", "b")]
    for r in rows:
        # At least min-seconds, though the request count alone would end sooner.
        assert r["duration"] >= 0.6 and r["completed"] > 2 * r["max_concurrency"], r
        assert r["min_seconds"] == 0.6 and r["client_cpu_s"] > 0
    # An --out that holds results is not overwritten; the retired --resume is a usage error.
    again = bench("sweep", *common)
    assert again.returncode == 2 and "exists; give another --out" in again.stderr
    for retired in (["--resume"], ["--append"], ["--time-limit", "1"]):
        gone = bench("sweep", *common, *retired)
        assert gone.returncode == 2 and "unrecognized arguments" in gone.stderr, gone.stderr
    assert len(out.read_text().splitlines()) == len(rows)


def test_level_estimate_errs_long_from_the_level_below() -> None:
    from dynspec.bench.sweep import SweepConfig, estimate_seconds

    cfg = SweepConfig(concurrencies=[16, 64], requests_per_c=10, output_len=128, min_seconds=15,
                      pause=0.5)  # fmt: skip
    assert estimate_seconds(16, cfg, []) == 2 * 15 + 10 + 0.5  # nothing seen yet
    seen = [{"max_concurrency": 16, "output_throughput": 5000.0}]
    # 640 requests x 128 tokens at C=16's 5000 tok/s: 16.4 s, plus two rounds of 64 and the pause.
    expect = 640 * 128 / 5000 + 2 * 64 * 128 / 5000 + 0.5 + 1.0
    assert abs(estimate_seconds(64, cfg, seen) - expect) < 1e-9
    assert estimate_seconds(16, cfg, seen) == 15 + 2 * 16 * 128 / 5000 + 1.5  # min_seconds rules
