"""`dynspec-bench envelope --eight-gpus`: bad usage, and short real runs of the split and the
paired ways (loopback only)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from utils import bench

from dynspec.bench import envelope8, envelope8_report, harness, ways
from dynspec.bench.sweep import SweepConfig
from dynspec.bench.ways import Router

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("envelope", "--simulate", "--eight-gpus", "--ways", "3x-eagle"), "--ways"),
        # The four-way comparison is retired; its spelling went with it.
        (("envelope", "--simulate", "--four-way"), "unrecognized arguments: --four-way"),
        (("envelope", "--simulate", "--eight-gpus", "--sharing", "nvlink"), "--sharing"),
        (
            ("envelope", "--simulate", "--eight-gpus", "--metrics-interval", "1"),
            "unrecognized arguments: --metrics-interval",
        ),
        # Retired (in git history at 1a53ba8).
        (
            ("envelope", "--simulate", "--eight-gpus", "--append"),
            "unrecognized arguments: --append",
        ),
        (("envelope", "--eight-gpus"), "only --simulate"),
        (("envelope", "--simulate", "--eight-gpus", "--repeats", "0"), "--repeats"),
        (("envelope", "--simulate", "--repeats", "2"), "run --eight-gpus"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


TINY = (
    "--profile", "demo", "--speed", "10", "--concurrency", "1,16", "--requests", "16",
    "--output-len", "24", "--input-len", "32", "--pause", "0.2", "--no-progress",
)  # fmt: skip


def _run_ways(tmp_path: Path, chosen: str, *more: str) -> list[dict[str, Any]]:
    stem = tmp_path / "e8"
    r = bench(
        "envelope", "--simulate", "--eight-gpus", "--ways", chosen, *TINY, *more,
        "--out", str(stem), timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert stem.with_suffix(".md").read_text().startswith("# SIMULATED")
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    recs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    for x in recs:
        assert x["simulated"] and x["profile"] == "demo" and x["speed"] == 10.0
        assert x["completed"] == 16 and x["failed"] == 0, x
        assert x["total_output_tokens"] == 16 * 24
    return recs


def test_the_split_ways_run(tmp_path: Path) -> None:
    """Four sims and four routers at a tiny scale."""
    recs = _run_ways(tmp_path, "split-threshold,split-balance,2x-eagle,2x-baseline")
    run = ("split-threshold", "split-balance", "2x-eagle", "2x-baseline", "eagle", "baseline")
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (t, c) for t in run for c in (1, 16)
    }
    by = {(x["target"], x["max_concurrency"]): x for x in recs}
    assert by[("2x-eagle", 16)]["backend_share"] == {"eagle": 1.0}
    assert by[("2x-baseline", 16)]["backend_share"] == {"baseline": 1.0}
    assert by[("split-threshold", 1)]["backend_share"] == {"eagle": 1.0}
    # A lone request goes to EAGLE (demo: about 2x faster at C=1); where balance sends the rest
    # is its own tests' business (it learns, and explores now and then).
    assert by[("split-balance", 1)]["backend_share"].get("eagle", 0.0) >= 0.75
    assert set(by[("split-balance", 16)]["backend_share"]) <= {"eagle", "baseline"}
    # balance learns from its servers: they are its own; the others share the first EAGLE.
    used = by[("split-balance", 1)]["way_servers"]
    assert used["split-balance"]["set"] == "split-balance"
    assert {used[w]["set"] for w in run[:4] if w != "split-balance"} == {ways.SHARED}
    assert set(used["split-balance"]["urls"]).isdisjoint(
        u for w in run[:4] if w != "split-balance" for u in used[w]["urls"]
    )
    assert used["split-threshold"]["urls"][0] == used["2x-eagle"]["urls"][0]
    assert by[("eagle", 1)]["url"] == used["2x-eagle"]["urls"][0]


@pytest.mark.usefixtures("needs_pairs")
def test_the_paired_ways_run(tmp_path: Path) -> None:
    """Two shared-GPU sims behind --pair routers, tiny: both serve every request of both levels."""
    recs = _run_ways(
        tmp_path, "paired-threshold,paired-auto,2x-baseline", "--threshold", "4",
        "--hysteresis", "1", "--sharing", "mps",
    )  # fmt: skip
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (t, c) for t in ("paired-threshold", "paired-auto", "2x-baseline") for c in (1, 16)
    }
    by = {(x["target"], x["max_concurrency"]): x for x in recs}
    assert by[("paired-threshold", 1)]["sharing"] == "mps"
    # Below the threshold a lone request speculates; at C=16 > 4 both pairs are past it.
    assert by[("paired-threshold", 1)]["backend_share"] == {"eagle": 1.0}
    assert by[("paired-threshold", 16)]["backend_share"].get("baseline", 0.0) >= 0.5


def _flag_urls(argv: list[str]) -> set[str]:
    """The server URLs on a dynspec-router command line."""
    flags = ("--pair", "--eagle-url", "--baseline-url")
    pairs = itertools.pairwise(argv)
    return {u for flag, value in pairs if flag in flags for u in value.split(",")}


@pytest.mark.usefixtures("needs_pairs")
def test_paired_auto_learns_from_simulators_no_other_way_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paired-auto's router polls its servers' /metrics and learns from them: the servers
    paired-threshold loads must not be among them (they were, one set for all)."""
    started: dict[str, list[str]] = {}
    start_router = harness.start_router

    def spy(procs: Any, name: str, router: Router, timeout: float) -> Any:
        url, proc = start_router(procs, name, router, timeout)
        started[name.removeprefix("router-")] = [str(a) for a in proc.args]
        return url, proc

    monkeypatch.setattr(harness, "start_router", spy)
    level = SweepConfig(concurrencies=[1, 4], requests=8, input_len=32, output_len=16, pause=0.1)
    cfg = envelope8.EightGpusConfig(
        "demo", 10.0, level, tmp_path / "e8.jsonl", ways=["paired-threshold", "paired-auto"],
        threshold=2, hysteresis=1,
    )  # fmt: skip
    recs = envelope8.run(cfg)
    assert sorted(started) == ["paired-auto", "paired-threshold"]
    auto, fixed = _flag_urls(started["paired-auto"]), _flag_urls(started["paired-threshold"])
    assert len(auto) == len(fixed) == 4
    assert auto.isdisjoint(fixed), (auto, fixed)
    # Every record says so: the set and the URLs each way's router was pointed at.
    assert {(x["target"], x["max_concurrency"]) for x in recs} == {
        (w, c) for w in started for c in (1, 4)
    }
    for x in recs:
        assert x["failed"] == 0, x
        used = x["way_servers"]
        assert used["paired-auto"]["set"] == "paired-auto"
        assert set(used["paired-auto"]["urls"]) == auto
        assert used["paired-threshold"]["set"] == ways.SHARED
        assert set(used["paired-threshold"]["urls"]) == fixed
    md, _ = envelope8_report.write_report(cfg.out, recs)
    assert (
        "- Simulators of their own (no other way's load on what their routers learn from): "
        "`paired-auto`; the other ways shared theirs" in md.read_text()
    )


def test_each_repeat_starts_every_server_and_router_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--repeats 2: two harness.processes() blocks, the simulators seeded seed + r - 1, every
    record naming its repeat and the servers of that repeat."""
    blocks: list[int] = []
    seeds: list[int] = []
    processes, start_servers = harness.processes, harness.start_servers

    def count() -> Any:
        blocks.append(len(blocks) + 1)
        return processes()

    def spy(procs: Any, want: Any, sim: Any, *a: Any, **k: Any) -> Any:
        seeds.append(sim.seed)
        return start_servers(procs, want, sim, *a, **k)

    monkeypatch.setattr(harness, "processes", count)
    monkeypatch.setattr(harness, "start_servers", spy)
    level = SweepConfig(concurrencies=[1, 4], requests=8, input_len=32, output_len=16, pause=0.1)
    cfg = envelope8.EightGpusConfig(
        "demo", 10.0, level, tmp_path / "e8.jsonl", ways=["split-balance", "2x-eagle"],
        threshold=2, hysteresis=1, seed=5, repeats=2,
    )  # fmt: skip
    recs = envelope8.run(cfg)
    assert blocks == [1, 2]
    assert sorted(seeds) == [5, 5, 6, 6]  # two server sets a repeat
    got = {(x["target"], x["max_concurrency"], x["repeat"]) for x in recs}
    assert got == {(w, c, r) for w in ("split-balance", "2x-eagle") for c in (1, 4) for r in (1, 2)}
    assert all(x["failed"] == 0 and x["repeats"] == 2 for x in recs)
    urls = {r: {u for x in recs if x["repeat"] == r for s in x["way_servers"].values()
                for u in s["urls"]} for r in (1, 2)}  # fmt: skip
    assert urls[1].isdisjoint(urls[2])
    assert [json.loads(line)["repeat"] for line in cfg.out.read_text().splitlines()] == [
        x["repeat"] for x in recs
    ]


def test_the_repeats_flag_reaches_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynspec.bench import cli

    got: list[envelope8.EightGpusConfig] = []

    def capture(cfg: envelope8.EightGpusConfig, progress: object = None) -> None:
        got.append(cfg)
        raise KeyboardInterrupt  # run_then_report keeps what finished (nothing), exits 130

    monkeypatch.setattr(envelope8, "run", capture)
    for flags, want in (([], 1), (["--repeats", "3"], 3)):
        with pytest.raises(SystemExit):
            cli.main(["envelope", "--simulate", "--eight-gpus", "--no-progress", *flags])
        assert got[-1].repeats == want and not got[-1].calibrated
        assert got[-1].out.name == "envelope8-demo.jsonl"
    with pytest.raises(SystemExit):
        cli.main(["envelope", "--simulate", "--eight-gpus", "--calibrated", "--sharing", "mps"])
    assert got[-1].calibrated and got[-1].out.name == "envelope8-demo-mps-calibrated.jsonl"
