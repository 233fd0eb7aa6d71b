"""dynspec-bench profile: a sweep becomes a profile that the simulator's own loader accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.bench.profile_export import build_profile
from dynspec.common.levels import fill_levels
from dynspec.launcher.sim.profile import load_profile


def level(target: str, c: int, tok_s: float, per_chunk: float, max_chunk: int) -> dict[str, object]:
    return {
        "target": target,
        "model": "org/M",
        "max_concurrency": c,
        "completed": 8,
        "output_throughput": tok_s,
        "median_tpot_ms": 1000.0 * c / tok_s,
        "median_ttft_ms": 40.0,
        "total_input_tokens": 8 * 256,
        "mean_tokens_per_chunk": per_chunk,
        "max_tokens_per_chunk": max_chunk,
    }


RECORDS = [
    level("eagle-h100", 1, 120.0, 2.6, 4),
    level("eagle-h100", 4, 300.0, 2.5, 4),
    level("eagle-h100", 16, 500.0, 2.4, 4),
    level("baseline-h100", 1, 60.0, 1.0, 1),
    level("baseline-h100", 4, 220.0, 1.0, 1),
    level("baseline-h100", 16, 700.0, 1.0, 1),
    # A routed target is not a server: it must not be taken for one.
    {**level("routed", 1, 118.0, 2.6, 4), "backend_share": {"eagle": 1.0}},
]


def test_round_trip_through_the_sim_loader(tmp_path: Path) -> None:
    prof = build_profile(RECORDS, [Path("sweep.jsonl")], name="mine")
    path = tmp_path / "mine.json"
    path.write_text(prof.dumps())
    loaded = load_profile(str(path))
    assert loaded.name == "mine"
    assert loaded.model == "org/M"
    assert not loaded.illustrative
    assert "sweep.jsonl" in loaded.source
    e, b = loaded.mode("eagle"), loaded.mode("baseline")
    assert e.throughput == ((1, 120.0), (4, 300.0), (16, 500.0))
    assert b.throughput == ((1, 60.0), (4, 220.0), (16, 700.0))
    assert e.accept_length == pytest.approx(2.6)
    assert e.max_accept_length == 4
    assert (b.accept_length, b.max_accept_length) == (1.0, 1)
    # The profile reproduces the sweep: TPOT = C / throughput(C) in the simulator's model.
    assert e.step_time(4) / e.accept_length == pytest.approx(4 / 300.0)


def test_sweep_without_c1_or_unknown_targets_is_refused() -> None:
    with pytest.raises(ValueError, match="C=1"):
        build_profile(RECORDS[1:3], [Path("s.jsonl")], name="x")
    odd = [{**r, "target": "server-a"} for r in RECORDS[:3]]
    with pytest.raises(ValueError, match="--eagle-target"):
        build_profile(odd, [Path("s.jsonl")], name="x")
    prof = build_profile(odd, [Path("s.jsonl")], name="x", eagle_target="server-a")
    assert set(prof.modes) == {"eagle"}


def test_cli_writes_a_loadable_profile(tmp_path: Path) -> None:
    sweep = tmp_path / "h100.jsonl"
    sweep.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "h100.json"
    r = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "profile", str(sweep), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    loaded = load_profile(str(out))
    assert loaded.name == "h100"
    assert str(sweep) in loaded.source
    r = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "profile", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1


def test_a_simulated_sweep_at_speed_is_converted_to_model_time() -> None:
    fast = [{**r, "simulated": True, "speed": 4.0} for r in RECORDS]
    prof = build_profile(fast, [Path("sim.jsonl")], name="x")
    # Time ran 4x faster: 4x the tok/s on the wall clock is the profile's own tok/s.
    assert prof.mode("eagle").throughput == ((1, 30.0), (4, 75.0), (16, 125.0))
    assert "SIMULATED" in prof.source


@pytest.mark.parametrize(
    ("points", "filled"),
    [
        # Nothing between neighbours that are already powers of two apart by one step.
        (((1, 100.0), (2, 180.0)), ((1, 100.0), (2, 180.0))),
        # TPOT 10 ms at C=4 and 40 ms at C=64: linear in C gives 12 ms at 8 (667 tok/s),
        # 16 ms at 16 (1000 tok/s), 24 ms at 32 (1333.3 tok/s).
        (
            ((1, 100.0), (4, 400.0), (64, 1600.0)),
            (
                (1, 100.0),
                (2, 200.0),
                (4, 400.0),
                (8, 666.7),
                (16, 1000.0),
                (32, 1333.3),
                (64, 1600.0),
            ),
        ),
        # A measured level that is not a power of two stays; nothing is added past the last one.
        (((1, 50.0), (6, 240.0)), ((1, 50.0), (2, 95.2), (4, 173.9), (6, 240.0))),
    ],
)
def test_fill_levels_interpolates_tpot_linearly(
    points: tuple[tuple[int, float], ...], filled: tuple[tuple[int, float], ...]
) -> None:
    assert fill_levels(points) == filled


def test_interpolated_points_and_limits_are_labelled() -> None:
    prof = build_profile(
        RECORDS,
        [Path("s.jsonl")],
        name="x",
        interpolate=True,
        max_running={"eagle": 64},
        note="Measured on a test bench.",
    )
    e, b = prof.mode("eagle"), prof.mode("baseline")
    assert [c for c, _ in e.throughput] == [1, 2, 4, 8, 16]
    assert dict(e.throughput)[4] == 300.0  # measured points are kept as measured
    assert e.max_running_requests == 64 and b.max_running_requests is None
    assert "measured C=1,4,16; estimated C=2,8" in e.source
    assert "max_running_requests 64" in e.source
    assert prof.source.endswith("Measured on a test bench.")


H200 = Path(__file__).parents[2] / "bench/results/h200/sweep8b-2026-12-01.jsonl"


@pytest.mark.parametrize(
    ("name", "eagle"), [("h200-8b-accept4", "eagle_hi"), ("h200-8b-accept1", "eagle_lo")]
)
def test_shipped_h200_profiles_come_from_the_copied_sweep(name: str, eagle: str) -> None:
    """The shipped profiles are what `dynspec-bench profile` makes of the sweep in the repo."""
    shipped = load_profile(name)
    records = [json.loads(line) for line in H200.read_text().splitlines()]
    again = build_profile(
        records,
        [Path("bench/results/h200/sweep8b-2026-12-01.jsonl")],
        name=name,
        eagle_target=eagle,
        baseline_target="baseline",
        interpolate=True,
        max_running={"eagle": 64},
    )
    assert shipped.modes == again.modes
    measured = {
        (r["target"], r["max_concurrency"]): round(r["output_throughput"], 1) for r in records
    }
    for mode, target in (("eagle", eagle), ("baseline", "baseline")):
        pts = dict(shipped.mode(mode).throughput)
        for c in (1, 4, 16, 64):
            assert pts[c] == measured[(target, c)]
    for word in ("H200", "RANDOM weights", "FORCED", "SGLang 0.5.17", "sweep8b-2026-12-01.jsonl"):
        assert word in shipped.source
