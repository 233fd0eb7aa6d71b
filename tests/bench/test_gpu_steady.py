"""The steady-state plans (``pair-a``, ``pair-b``, ``router-cost``): their command lines, the
report's medians, spreads and goals, and a whole ``pair-a --router-cost`` run on a CPU over two
commands (fake SGLang bundle whose servers are dynspec-sim), the first keeping its launcher for
the second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_fake_site import fake_path, make_bundle, make_models
from utils import free_port

from dynspec.bench.gpu import steady, steadyreport
from dynspec.bench.gpu.fingerprint import code_sha256
from dynspec.bench.gpu.launch import launch_argv
from dynspec.bench.gpu.leftovers import tagged_pids
from dynspec.bench.gpu.toolkit import FIXED_ENV, Run


def fake_run(tmp: Path) -> Run:
    return Run(out=tmp, work=tmp, deadline=1e12, env=dict(FIXED_ENV), python="py")


def test_launch_lines_threshold_auto_and_mps_only_in_pair_b(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    plans = steady.STUDIES
    a = launch_argv(run, tmp_path, threshold=plans["pair-a"].threshold, mps=plans["pair-a"].mps)
    b = launch_argv(run, tmp_path, threshold=plans["pair-b"].threshold, mps=plans["pair-b"].mps)
    for argv in (a, b):
        assert argv[argv.index("--gpus") + 1] == "0"
        assert argv[argv.index("--threshold") + 1] == "auto"
        assert "--speed-profile" not in argv  # the launcher calibrates: --calibrate auto
        assert argv[argv.index("--draft-model-path") + 1].endswith("eagle3-hi")
        assert "--cuda-graph-max-bs-decode 256" in argv  # the baseline swept to C=256
    assert "--mps" not in a and b[-1] == "--mps"
    cost = plans["router-cost"]
    assert int(cost.threshold) > 256 * 100 and [t.what for t in cost.targets] == ["routed", "eagle"]


def test_baseline_limit_caps_the_baseline_server_only(tmp_path: Path) -> None:
    """--baseline-limit: on the H200 the uncapped baseline ran all 256 of C=256 at once and lost
    to EAGLE, which runs 128 and queues the rest; capped, the baseline queues past it too."""
    argv = launch_argv(fake_run(tmp_path), tmp_path, threshold="auto", baseline_limit=128)
    baseline = argv[argv.index("--baseline-args") + 1]
    assert baseline == "--cuda-graph-max-bs-decode 256 --max-running-requests 128"
    assert argv[argv.index("--eagle-args") + 1] == "--max-running-requests 128"
    plain = launch_argv(fake_run(tmp_path), tmp_path, threshold="auto")
    assert "--max-running-requests" not in plain[plain.index("--baseline-args") + 1]


def test_baseline_args_go_to_the_baseline_server_only_after_its_limit(tmp_path: Path) -> None:
    """--baseline-args: after the baseline's limit (pair-a-interval4 ran with
    ``--stream-interval 4`` here, before the launcher's default)."""
    run = fake_run(tmp_path)
    argv = launch_argv(run, tmp_path, threshold="auto", baseline_limit=128,
                       baseline_args="--stream-interval 4")  # fmt: skip
    assert argv[argv.index("--baseline-args") + 1] == (
        "--cuda-graph-max-bs-decode 256 --max-running-requests 128 --stream-interval 4"
    )
    assert argv[argv.index("--eagle-args") + 1] == "--max-running-requests 128"


def test_router_cost_target_sits_before_eagle_alone_from_c16_up() -> None:
    study = steady.with_router_cost(steady.STUDIES["pair-a"], [1, 4, 16, 64, 256])
    assert [t.label for t in study.targets] == ["routed", "routed_eagle", "eagle", "baseline"]
    assert study.targets[1].levels == (16, 64, 256)
    assert study.targets[1].what == "cost"


def test_the_flags_make_the_study_and_its_levels() -> None:
    from dynspec.bench.gpu.cli import run_parser

    def study(*flags: str) -> tuple[steady.Study, list[int]]:
        return steady.study_of(run_parser().parse_args(["--out", "o", *flags]))

    cost, levels = study("--plan", "router-cost", "--threshold", "8")
    assert cost == steady.STUDIES["router-cost"] and levels == list(steady.COST_LEVELS)
    flags = ["--router-cost", "--baseline-from", "64", "--baseline-limit", "96"]
    pair, levels = study("--plan", "pair-b", "--threshold", "8", *flags)
    assert levels == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert (pair.threshold, pair.mps, pair.baseline_limit) == ("8", True, 96)
    targets = {t.label: t.levels for t in pair.targets}
    assert targets["routed_eagle"] == (16, 32, 64, 128, 256)
    assert targets["baseline"] == (64, 128, 256)


def test_baseline_from_keeps_the_baseline_alone_to_the_levels_from_there_up() -> None:
    study = steady.with_router_cost(steady.STUDIES["pair-a"], [1, 16, 64, 256])
    study = steady.baseline_from(study, [1, 16, 64, 256], 64)
    assert [(t.label, t.levels) for t in study.targets] == [
        ("routed", None), ("routed_eagle", (16, 64, 256)), ("eagle", None),
        ("baseline", (64, 256)),
    ]  # fmt: skip
    # The report then compares routed with EAGLE alone where the baseline was not measured.
    rows = [rec("routed", 1, 1, 460), rec("eagle", 1, 1, 470), rec("routed", 64, 1, 8000),
            rec("eagle", 64, 1, 8300), rec("baseline", 64, 1, 8500)]  # fmt: skip
    ratios = steadyreport.pair_ratios(rows)
    assert ratios[1]["better"] == "eagle" and ratios[64]["better"] == "baseline"


def test_cost_router_is_the_launchers_router_with_the_threshold_above_any_load() -> None:
    commands = [
        "CUDA_VISIBLE_DEVICES=0 py -m sglang.launch_server --port 30001",
        "py -m dynspec.router --pair http://a,http://b --port 8000 --threshold auto "
        "--speed-profile /logs/calibration/x.json --hysteresis 2",
    ]
    argv = steady.cost_router_argv(commands, 8123)
    assert argv[:4] == ["py", "-m", "dynspec.router", "--pair"]
    assert "--speed-profile" not in argv and argv.count("--port") == argv.count("--threshold") == 1
    assert argv[-4:] == ["--port", "8123", "--threshold", str(steady.ABOVE_ANY_LOAD)]
    assert "--hysteresis" in argv


def test_learned_keeps_whatever_status_has() -> None:
    assert steady.learned({"policy": "threshold", "threshold": 8, "servers": []}) == {
        "policy": "threshold",
        "threshold": 8,
        "servers": [],
    }
    status = {"threshold": "auto", "threshold_auto": True, "pairs": [{"threshold": 61, "x": 1}]}
    assert steady.learned(status) == {
        "threshold": "auto",
        "threshold_auto": True,
        "pairs": [{"threshold": 61}],
    }
    assert steady.learned({"pairs": "odd"}) == {}
    server = {"url": "u", "pool": "eagle", "curve": [[1, 0.01]], "running_limit": 128, "x": 2}
    assert steady.learned({"servers": [server, "odd"]}) == {
        "servers": [{"pool": "eagle", "curve": [[1, 0.01]], "running_limit": 128}]
    }


def rec(target: str, c: int, rep: int, tok: float, **kw: object) -> dict[str, object]:
    return {"target": target, "max_concurrency": c, "repeat": rep, "output_throughput": tok,
            "median_tpot_ms": 1000 * c / tok, **kw}  # fmt: skip


def test_report_judges_medians_and_shows_the_spread_repeat_by_repeat() -> None:
    rows = []
    for rep, (r, e, b) in enumerate([(450, 500, 200), (470, 480, 210), (1000, 490, 190)], 1):
        rows += [rec("routed", 1, rep, r), rec("eagle", 1, rep, e), rec("baseline", 1, rep, b)]
    rows += [rec("routed", 64, 1, 7000), rec("eagle", 64, 1, 8000), rec("baseline", 64, 1, 7400)]
    ratios = steadyreport.pair_ratios(rows)
    # Medians: routed 470 over EAGLE's 490 (the better by median); one wild repeat moves no median.
    assert ratios[1]["better"] == "eagle" and round(ratios[1]["ratio"], 3) == round(470 / 490, 3)
    per = ratios[1]["per_repeat"]
    assert per.n == 3 and round(per.lo, 2) == 0.90 and round(per.hi, 2) == 2.04
    assert ratios[64]["better"] == "eagle" and ratios[64]["per_repeat"].n == 1
    text = steadyreport.markdown(rows)
    assert "| 1 | 470 (450-1,000) | 490 (480-500) | 200 (190-210) |" in text
    assert "MISS (worst 0.88)" in text  # 7000 / 8000 at C=64
    # One repeat of a point reads as a plain figure.
    assert "| 64 | 7,000 | 8,000 | 7,400 |" in text


def test_report_does_not_pass_a_goal_it_could_not_judge_at_every_c() -> None:
    """The H200's partial pair-a (launch 1 at 4109b72): C=1 and 16 with 3 runs each, routed at
    C=64 once with no server alone beside it; the report said PASS. It says what it could not
    judge, and that the verdict holds only at the C it judged."""
    rows = []
    for rep in (1, 2, 3):
        rows += [rec("routed", 1, rep, 476), rec("eagle", 1, rep, 481)]
        rows += [rec("routed", 16, rep, 4700), rec("eagle", 16, rep, 4831)]
    whole = steadyreport.markdown(rows)
    assert ": PASS (worst 0.97)" in whole and "INCOMPLETE" not in whole
    rows += [rec("routed", 64, 1, 8443), rec("routed", 128, 1, 9100), rec("eagle", 128, 1, 9500)]
    text = steadyreport.markdown(rows)
    assert (
        ": INCOMPLETE: PASS (worst 0.96) at the C judged; not judged (no server alone): C=64; "
        "fewer than 3 runs: C=128"
    ) in text


def test_router_cost_rows_ttft_added_and_cpu_per_second() -> None:
    rows = []
    for rep in (1, 2, 3):
        rows.append(rec("routed_eagle", 64, rep, 8600 + rep, median_ttft_ms=30.0 + rep,
                        router_cpu_s=3.0, client_cpu_s=6.0, duration=15.0))  # fmt: skip
        rows.append(rec("eagle", 64, rep, 9000, median_ttft_ms=29.0, client_cpu_s=4.5,
                        duration=15.0))  # fmt: skip
    cost = steadyreport.cost_rows(rows)[64]
    assert round(cost["ratio"], 4) == round(8602 / 9000, 4)
    assert cost["ttft_added_ms"].median == 3.0 and cost["ttft_added_ms"].hi == 4.0
    assert cost["router_cpu"].median == 0.2 and cost["client_cpu"].median == 0.4
    assert cost["client_cpu_direct"].median == 0.3
    text = steadyreport.markdown(rows)
    assert "TTFT p50 within +5 ms" in text and ": MISS" in text  # 0.956 < 0.97
    ok = [dict(r, output_throughput=9000) for r in rows]
    assert ": PASS" in steadyreport.markdown(ok)


def gpu_run(tmp: Path, ports: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = fake_path(tmp)
    argv = [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--work", str(tmp / "work")]
    argv += ["--ports", ports, "--commit", "abc1234", *extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=240, env=env, cwd=tmp, check=False
    )


# The launch calibrates its two simulated servers in three passes (657cab5): 150-170 s of this
# test alone on 2 cores, past the suite's 180 s beside a CPU-bound process (CI runs one).
@pytest.mark.timeout(360)
def test_pair_a_over_two_commands_keeps_its_launcher_and_resumes_the_sweep(tmp_path: Path) -> None:
    ports = f"{free_port()},{free_port()},{free_port()}"
    bundle, models = make_bundle(tmp_path), make_models(tmp_path)
    common = ["--plan", "pair-a", "--router-cost", "--levels", "1,16", "--repeats", "2",
              "--min-seconds", "0.3", "--output-len", "16", "--keep",
              "--bundle", str(bundle), "--models", str(models)]  # fmt: skip
    # The first command sweeps nothing (--sweep-seconds 0): it launches, warms and keeps.
    first = gpu_run(tmp_path, ports, *common, "--budget", "200", "--sweep-seconds", "0",
                    "--out", str(tmp_path / "o1"))  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "kept running for the next command: launcher, cost_router" in first.stdout
    session = json.loads((tmp_path / "work" / "session.json").read_text())
    meta1 = json.loads((tmp_path / "o1" / "meta.json").read_text())
    assert meta1["commit"] == "abc1234" and meta1["warm_s"]
    assert tagged_pids(session["tag"])  # the launcher and its servers still run

    second = gpu_run(tmp_path, ports, *common, "--budget", "200", "--out", str(tmp_path / "o2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "resuming the session kept by the last command" in second.stdout
    out = tmp_path / "o2"
    rows = [json.loads(ln) for ln in (out / "sweep-pair-a.jsonl").read_text().splitlines()]
    order = [(r["target"], r["max_concurrency"], r["repeat"]) for r in rows]
    expected = [("routed", 1, 1), ("eagle", 1, 1), ("baseline", 1, 1)]
    expected += [("routed", 1, 2), ("eagle", 1, 2), ("baseline", 1, 2)]
    for rep in (1, 2):
        expected += [(t, 16, rep) for t in ("routed", "routed_eagle", "eagle", "baseline")]
    assert order == expected
    assert all(r["failed"] == 0 and r["duration"] >= 0.3 for r in rows)
    assert all(r["completed"] >= 10 * r["max_concurrency"] for r in rows)
    routed = [r for r in rows if r["target"] in ("routed", "routed_eagle")]
    assert all("router" in r and r["router_cpu_s"] > 0 for r in routed), routed[0]
    assert {r["router"]["threshold"] for r in rows if r["target"] == "routed_eagle"} == {
        steady.ABOVE_ANY_LOAD
    }
    # Each level through a router has the router's own share of its TTFT (steady.RouterDelay);
    # one straight to a server has none.
    for r in rows:
        seen = r.get("first_token", {})
        assert ("router_delay" in seen) == (r["target"] in ("routed", "routed_eagle")), r
        assert seen.get("router_delay", {"n": r["completed"]})["n"] >= r["completed"]
    meta = json.loads((out / "meta.json").read_text())
    assert [c["resumed"] for c in meta["device_commands"]] == [False, True]
    # Each command names the code it ran (fingerprint.py), beside its --commit.
    assert {(c["commit"], c["code_sha256"]) for c in meta["device_commands"]} == {
        (meta["commit"], code_sha256())
    }
    assert meta["launcher_exit"] == "stopped" and meta["leftovers_killed"] == []
    assert tagged_pids(session["tag"]) == []
    assert not (tmp_path / "work" / "session.json").exists()
    report = (out / "sweep-pair-a.md").read_text()
    assert "routed over the better of eagle, baseline" in report
    assert "The router over the EAGLE server's own port" in report
    assert "The router's own share of TTFT" in report
    summary = json.loads((out / "sweep-pair-a-summary.json").read_text())
    assert set(summary["router_cost"]) == {"16"}
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back


def test_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    ports = f"{free_port()},{free_port()},{free_port()}"
    bad = [["--plan", "pair-a", "--threshold", "often"], ["--plan", "router-cost", "--router-cost"]]
    bad += [
        ["--plan", "router-cost", "--baseline-from", "64"],
        ["--plan", "pair-a", "--baseline-from", "0"],
        ["--plan", "router-cost", "--baseline-limit", "128"],
        ["--plan", "pair-b", "--baseline-limit", "0"],
        ["--plan", "router-cost", "--baseline-args", "--stream-interval 4"],
        ["--plan", "pair-a", "--baseline-args", "stream-interval 4"],
        ["--plan", "pair-a", "--baseline-args", "--stream-interval 'four"],
    ]
    for extra in bad:
        done = gpu_run(tmp_path, ports, *extra, "--out", str(tmp_path / "o"))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_retired_flags_are_usage_errors(tmp_path: Path) -> None:
    """``--resume-from`` (in git history at 1a53ba8): argparse's one line, exit 2."""
    ports = f"{free_port()},{free_port()},{free_port()}"
    done = gpu_run(
        tmp_path, ports, "--plan", "pair-a", "--resume-from", str(tmp_path), "--out", "o"
    )
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "unrecognized arguments" in err[0], err


def test_report_command_prints_the_tables(tmp_path: Path) -> None:
    f = tmp_path / "sweep-pair-a.jsonl"
    rows = [rec("eagle", 1, 1, 400), rec("baseline", 1, 1, 200), rec("routed", 1, 1, 396)]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    done = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "gpu", "report", str(f)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| 1 | 0.99 | 0.99 | eagle |" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "gpu", "report", str(tmp_path / "no.jsonl")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "no such file" in missing.stderr
