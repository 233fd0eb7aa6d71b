"""The one-pair plans (``pair-a``, ``pair-b``): their command lines, that each fits one device
command by the measured start-up and sweep times, the ratios their report computes, and a whole
``pair-a`` attempt on a CPU (fake SGLang bundle whose servers are dynspec-sim)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_fake_site import fake_path, make_bundle, make_models
from utils import free_port

from dynspec.bench.gpu import pair
from dynspec.bench.gpu.leftovers import tagged_pids
from dynspec.bench.gpu.run import FIXED_ENV, PAIR_LEVELS, Run


def measured() -> list[dict[str, object]]:
    rows = pair.read_rows([pair.MEASURED])
    assert rows, pair.MEASURED
    return [r for r in rows if r["target"] in pair.TIMED]


def levels() -> list[int]:
    return pair.parse_levels(PAIR_LEVELS)


@pytest.mark.parametrize("name", ["pair-a", "pair-b"])
def test_each_plan_fits_one_device_command_by_the_measured_times(name: str) -> None:
    parts = pair.plan_seconds(pair.PAIR_PLANS[name], measured(), levels())
    assert parts["total"] < pair.DEVICE_LIMIT_S, parts
    # Every sweep has its share under the plan's own per-sweep cap.
    assert all(parts[t.label] < 120 for t in pair.PAIR_PLANS[name].targets), parts
    assert levels()[-1] == 256


def test_both_starts_in_one_command_would_not_fit() -> None:
    a = pair.plan_seconds(pair.PAIR_PLANS["pair-a"], measured(), levels())
    b = pair.plan_seconds(pair.PAIR_PLANS["pair-b"], measured(), levels())
    assert a["total"] + b["total"] - pair.SETUP_S > pair.DEVICE_LIMIT_S


def test_sweep_seconds_counts_warmup_pause_and_scales_unmeasured_levels() -> None:
    recs = [{"max_concurrency": 128, "duration": 4.0, "num_prompts": 256, "warmup_requests": 128}]
    one = pair.sweep_seconds(recs, [128])
    assert one == pytest.approx(pair.SWEEP_START_S + 4.0 * 1.5 + pair.PAUSE_S)
    two = pair.sweep_seconds(recs, [128, 256])
    assert two - one == pytest.approx((4.0 * 1.5 + pair.PAUSE_S) * 2)
    with pytest.raises(ValueError):
        pair.sweep_seconds([], [1])


def fake_run(tmp: Path) -> Run:
    return Run(out=tmp, work=tmp, deadline=1e12, env=dict(FIXED_ENV), python="py")


def test_launch_lines_threshold_auto_and_mps_only_in_pair_b(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    a = pair.launch_argv(run, tmp_path, threshold="auto", mps=pair.PAIR_PLANS["pair-a"].mps)
    b = pair.launch_argv(run, tmp_path, threshold="auto", mps=pair.PAIR_PLANS["pair-b"].mps)
    for argv in (a, b):
        assert argv[argv.index("--gpus") + 1] == "0"
        assert argv[argv.index("--threshold") + 1] == "auto"
        assert "--speed-profile" not in argv
        assert argv[argv.index("--draft-model-path") + 1].endswith("eagle3-hi")
        assert "--cuda-graph-max-bs-decode 256" in argv  # the baseline swept to C=256
    assert "--mps" not in a and b[-1] == "--mps"
    labels = [t.label for t in pair.PAIR_PLANS["pair-b"].targets]
    assert labels[0] == "routed_auto_mps" and {"eagle_mps", "baseline_mps"} <= set(labels)


def row(target: str, c: int, tok_s: float) -> dict[str, object]:
    return {"target": target, "max_concurrency": c, "output_throughput": tok_s}


def test_ratios_take_the_better_server_at_each_level() -> None:
    rows = [
        row("eagle", 1, 500), row("baseline", 1, 200), row("routed_auto", 1, 450),
        row("eagle", 256, 9000), row("baseline", 256, 12000), row("routed_auto", 256, 12600),
        row("eagle_mps", 1, 480), row("baseline_mps", 1, 190), row("routed_auto_mps", 1, 480),
    ]  # fmt: skip
    found = pair.ratios(pair.tok_s(rows), ["routed_auto", "routed_auto_mps"], pair.ALONE_GROUPS)
    by = {(r["routed"], r["against"]): r for r in found}
    plain = by[("routed_auto", "timeslice")]
    assert plain["per_c"][1] == {"ratio": 0.9, "better": "eagle"}
    assert plain["per_c"][256] == {"ratio": 1.05, "better": "baseline"}
    assert plain["min"] == 0.9
    assert by[("routed_auto_mps", "mps")]["per_c"][1]["ratio"] == 1.0
    assert by[("routed_auto_mps", "timeslice")]["per_c"][1]["ratio"] == 0.96
    # Only levels both sides measured.
    assert 256 not in by[("routed_auto_mps", "timeslice")]["per_c"]
    table = pair.markdown(rows)
    assert "| 1 | 500 | 200 | 450 | 480 | 190 | 480 |" in table
    assert (
        "| routed_auto / best(eagle, baseline) | 0.90 (eagle) | 1.05 (baseline) | 0.90 |" in table
    )
    assert "| routed_auto_mps / best(eagle_mps, baseline_mps) | 1.00 (eagle_mps) | - | 1.00 |" in (
        table
    )


def test_learned_threshold_keeps_whatever_status_has() -> None:
    assert pair.learned_threshold({"policy": "threshold", "threshold": 8, "servers": []}) == {
        "policy": "threshold",
        "threshold": 8,
    }
    status = {"threshold": "auto", "threshold_auto": True, "pairs": [{"threshold": 61, "x": 1}]}
    assert pair.learned_threshold(status) == {
        "threshold": "auto",
        "threshold_auto": True,
        "pairs": [{"threshold": 61}],
    }
    assert pair.learned_threshold({"pairs": "odd"}) == {}


def gpu_run(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = fake_path(tmp)
    ports = f"{free_port()},{free_port()},{free_port()}"
    argv = [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--out", str(tmp / "out")]
    argv += ["--work", str(tmp / "work"), "--ports", ports, *extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=240, env=env, cwd=tmp, check=False
    )


def test_pair_a_sweeps_routed_then_each_server_and_writes_the_summary(tmp_path: Path) -> None:
    # --threshold auto, as on the GPU: the router learns it (the fake servers are dynspec-sim).
    done = gpu_run(
        tmp_path, "--plan", "pair-a", "--levels", "1,8", "--budget", "300",
        "--bundle", str(make_bundle(tmp_path)), "--models", str(make_models(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    rows = [json.loads(ln) for ln in (out / "sweep-pair-a.jsonl").read_text().splitlines()]
    order = list(dict.fromkeys(r["target"] for r in rows))
    assert order == ["routed_auto", "eagle", "baseline", "routed_auto_again"]
    assert all(r["failed"] == 0 for r in rows)
    meta = json.loads((out / "meta.json").read_text())
    assert set(meta["learned"]) == {"routed_auto", "routed_auto_again"}
    learned = meta["learned"]["routed_auto"]
    assert learned["threshold_auto"] is True, learned
    assert 1 <= learned["pairs"][0]["threshold"] <= 512, learned
    assert meta["expected_s"]["launch"] == pair.LAUNCH_S
    assert meta["launch_argv"][meta["launch_argv"].index("--threshold") + 1] == "auto"
    summary = json.loads((out / "pair-a-summary.json").read_text())
    assert [r["routed"] for r in summary["ratios"]] == ["routed_auto", "routed_auto_again"]
    assert set(summary["ratios"][0]["per_c"]) == {"1", "8"}
    assert meta["launcher_exit"] == 130 and meta["leftovers_killed"] == []
    assert tagged_pids(meta["tag"]) == []
    # Six files: under the eight the device tool brings back.
    assert len(list(out.iterdir())) <= 8


def test_bad_threshold_is_a_usage_error(tmp_path: Path) -> None:
    done = gpu_run(tmp_path, "--plan", "pair-a", "--threshold", "often")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_report_command_prints_the_tables(tmp_path: Path) -> None:
    f = tmp_path / "sweep-pair-a.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(r)
            for r in [row("eagle", 1, 400), row("baseline", 1, 200), row("routed_auto", 1, 396)]
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "gpu", "report", str(f)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "0.99 (eagle)" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "gpu", "report", str(tmp_path / "no.jsonl")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "no such file" in missing.stderr
