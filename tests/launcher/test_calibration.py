"""``--calibrate`` without processes: when a launch calibrates, its levels and cache key, the
cache's reuse rules, the profile it makes (read back by the router's own reader), the file
written whole or not at all, and the flag's layers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.common.cli import UsageError
from dynspec.launcher.calibration import (
    CalibrationPlan,
    ServerResult,
    Target,
    build_profile,
    calibration_key,
    keyed_flags,
    levels_up_to,
    median_levels,
    plan_calibration,
    write_profile,
)
from dynspec.launcher.config import LaunchConfig, load_config
from dynspec.launcher.facts import LaunchFacts, cached_profiles, flag_facts
from dynspec.launcher.loadgen import CalibrationError, Level, event_counts, gauge
from dynspec.launcher.sim.profile import load_profile
from dynspec.launcher.spec import build_specs
from dynspec.router.config import read_speed_profile

SIM = ["--simulate", "--threshold", "auto"]
DEMO = str(Path(__file__).parents[2] / "launcher/sim/profiles/demo.json")


def facts_for(config: LaunchConfig, sglang: str = "v", gpu: str = "gpu") -> LaunchFacts:
    """The flags' facts, with the key's versions and what is cached (as ``discover`` finds)."""
    return dataclasses.replace(
        flag_facts(config),
        sglang_version=sglang,
        gpu_name=gpu,
        sim_profile=load_profile(config.sim_profile) if config.simulate else None,
        cached=cached_profiles(config.log_dir),
    )


def plan_for(tmp: Path, *argv: str) -> object:
    config = load_config([*argv, "--log-dir", str(tmp / "logs")], {})
    return plan_calibration(config, facts_for(config), build_specs(config))


@pytest.mark.parametrize(
    ("limit", "levels"),
    [(48, (1, 4, 16, 32, 48)), (64, (1, 4, 16, 32, 64)), (12, (1, 4, 12)), (4, (1, 4)), (1, (1,))],
)
def test_levels_go_up_to_the_eagle_servers_running_limit(limit: int, levels: tuple[int]) -> None:
    assert levels_up_to(limit) == levels


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (SIM, None),
        (["--simulate", "--policy", "balance"], None),
        # A fixed threshold reads no profile: nothing to measure, nothing to say.
        (["--simulate"], ""),
        ([*SIM, "--no-router"], ""),
        ([*SIM, "--calibrate", "never"], "--calibrate never"),
        ([*SIM, "--speed-profile", DEMO], ""),
        (["--simulate", "--calibrate", "always"], None),
        (["--simulate", "--no-router", "--calibrate", "always"], None),
    ],
)
def test_when_a_launch_calibrates(argv: list[str], why: str | None) -> None:
    assert load_config(argv, {}).calibration_off() == why


def test_always_with_a_given_profile_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--calibrate always"):
        load_config([*SIM, "--calibrate", "always", "--speed-profile", DEMO], {})


def test_the_key_leaves_out_where_servers_listen_and_what_they_log() -> None:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", "M", "--host", "0.0.0.0"]
    argv += ["--port=30001", "--api-key", "secret", "--log-level", "debug", "--tp-size", "4"]
    assert keyed_flags(argv) == [
        "-m",
        "sglang.launch_server",
        "--model-path",
        "M",
        "--tp-size",
        "4",
    ]


def test_the_key_follows_the_servers_flags_not_their_ports(tmp_path: Path) -> None:
    def key(*argv: str) -> dict[str, object]:
        config = load_config([*SIM, *argv], {})
        return calibration_key(config, facts_for(config), build_specs(config))

    assert key("--eagle-port", "31001", "--baseline-port", "31002") == key()
    assert key("--sim-speed", "4") != key()  # the servers run 4x faster: other figures
    assert key("--sim-profile", "eagle3-h100") != key()
    real = ["--gpus", "0-1", "--model-path", "M", "--draft-model-path", "D", "--threshold", "auto"]
    config = load_config(real, {})
    facts = facts_for(config, "SGLang 0.5.23", "NVIDIA H200")
    fields = calibration_key(config, facts, build_specs(config))
    assert (fields["model_path"], fields["draft_model_path"]) == ("M", "D")
    assert fields["sglang"] == "SGLang 0.5.23" and fields["gpu"] == "NVIDIA H200"
    assert fields["sharing"] == "none"
    eagle = next(s for s in fields["servers"] if "--speculative-algorithm" in s)  # type: ignore[attr-defined]
    assert "--port" not in eagle and "--max-running-requests" in eagle


def _result(target: Target, tok_s: list[float], gauge_value: float | None = None) -> ServerResult:
    levels = tuple(
        Level(
            c,
            t,
            0.05,
            3.0 if target.mode == "eagle" else 1.0,
            4 if target.mode == "eagle" else 1,
            250.0,
        )
        for c, t in zip((1, 4, 16), tok_s, strict=True)
    )
    return ServerResult(target, levels, gauge_value)


def _plan(sets: int) -> CalibrationPlan:
    targets = tuple(
        Target(f"{mode}{i} gpu{i}", mode, f"http://127.0.0.1:{30001 + 2 * i}", i)
        for i in range(sets)
        for mode in ("eagle", "baseline")
    )
    return CalibrationPlan(
        "measure",
        "none cached",
        Path("/x.json"),
        {"gpu": "NVIDIA H200", "sglang": "SGLang 0.5.23"},
        targets=targets,
        levels=(1, 4, 16),
        running_limits={"eagle": 16, "baseline": None},
        served_model_name="m",
    )


def test_two_gpu_sets_make_one_profile_of_their_medians(tmp_path: Path) -> None:
    plan = _plan(2)
    e0, b0, e1, b1 = plan.targets
    results = [
        _result(e0, [100.0, 300.0, 600.0], 2.9),
        _result(b0, [50.0, 180.0, 640.0]),
        _result(e1, [110.0, 320.0, 580.0], 3.1),
        _result(b1, [54.0, 190.0, 660.0]),
    ]
    profile = build_profile(plan, results, "2026-12-03 12:00:00")
    path = tmp_path / "p.json"
    write_profile(path, profile)
    # The simulator's loader and the router's --speed-profile reader take it as it is.
    loaded = load_profile(str(path))
    read_speed_profile(str(path))
    eagle, baseline = loaded.mode("eagle"), loaded.mode("baseline")
    assert dict(eagle.throughput)[1] == 105.0 and dict(eagle.throughput)[16] == 590.0
    assert dict(baseline.throughput)[4] == 185.0
    assert [c for c, _ in eagle.throughput] == [1, 2, 4, 8, 16]  # 2 and 8 estimated, and said so
    assert "estimated C=2,8" in eagle.source and "median per level" in eagle.source
    assert eagle.accept_length == 3.0 and eagle.max_accept_length == 4
    assert (eagle.max_running_requests, baseline.max_running_requests) == (16, None)
    assert (baseline.accept_length, baseline.max_accept_length) == (1.0, 1)
    assert "2 GPU sets measured at once, each level the median" in loaded.source
    assert "prefill NOT measured" in loaded.source and "SIMULATED" not in loaded.source
    assert loaded.calibration is not None
    assert loaded.calibration["servers"]["eagle1 gpu1"]["levels"] == [
        [1, 110.0],
        [4, 320.0],
        [16, 580.0],
    ]
    assert loaded.calibration["measured_at"] == "2026-12-03 12:00:00"
    # Without the gauge, EAGLE's accept length is its tokens per stream event at C=1.
    one = _plan(1)
    alone = build_profile(
        one, [_result(one.targets[0], [1, 2, 3]), _result(one.targets[1], [1, 2, 3])], "t"
    )
    assert alone.mode("eagle").accept_length == 3.0


def test_each_level_is_the_median_of_its_passes_with_that_passs_other_figures() -> None:
    def level(c: int, tok_s: float, ttft: float) -> Level:
        return Level(c, tok_s, ttft, 1.0, 1, 250.0)

    passes = [
        [level(1, 100.0, 0.1), level(128, 5265.0, 0.9)],  # a disturbed top level
        [level(1, 90.0, 0.2), level(128, 8824.0, 0.5)],
        [level(1, 120.0, 0.3), level(128, 9714.0, 0.4)],
    ]
    one, top = median_levels(passes)
    assert (one.tok_s, one.ttft_s) == (100.0, 0.1) and (top.tok_s, top.ttft_s) == (8824.0, 0.5)
    # An even count: the median is the middle two's mean, the other figures the lower one's.
    (two,) = median_levels([[level(1, 100.0, 0.1)], [level(1, 80.0, 0.2)]])
    assert (two.tok_s, two.ttft_s) == (90.0, 0.2)


def test_a_cached_profile_is_reused_only_for_its_own_key(tmp_path: Path) -> None:
    first = plan_for(tmp_path, *SIM)
    assert isinstance(first, CalibrationPlan)
    assert first.action == "measure" and first.why == "none cached"
    assert first.levels == (1, 4, 16, 32, 48)
    assert first.path is not None and first.path.parent == (tmp_path / "logs/calibration").resolve()
    assert [t.label for t in first.targets] == ["eagle sim", "baseline sim"]
    results = [_result(t, [10.0, 20.0, 30.0]) for t in first.targets]
    measured = build_profile(_plan(1), results, "2026-12-03 12:00:00")
    recorded = {"key": dict(first.key), "measured_at": "2026-12-03 12:00:00"}
    write_profile(first.path, dataclasses.replace(measured, calibration=recorded))
    again = plan_for(tmp_path, *SIM)
    assert isinstance(again, CalibrationPlan)
    assert (again.action, again.path, again.measured_at) == (
        "reuse",
        first.path,
        "2026-12-03 12:00:00",
    )
    assert again.note() == f"calibration: reusing {first.path} (measured 2026-12-03 12:00:00)"
    forced = plan_for(tmp_path, *SIM, "--calibrate", "always")
    assert isinstance(forced, CalibrationPlan)
    assert (forced.action, forced.why) == ("measure", "--calibrate always")
    other = plan_for(tmp_path, *SIM, "--sim-speed", "2")
    assert (
        isinstance(other, CalibrationPlan)
        and other.action == "measure"
        and other.path != first.path
    )
    # A file measured the way calibrations were before (no "load" in its key: SGLang's native
    # /generate, which ran the baseline slow) is measured again, not reused.
    data = json.loads(first.path.read_text())
    assert data["calibration"]["key"]["load"].startswith("POST /v1/completions streamed")
    del data["calibration"]["key"]["load"]
    first.path.write_text(json.dumps(data))
    older = plan_for(tmp_path, *SIM)
    assert isinstance(older, CalibrationPlan)
    assert (older.action, older.why) == ("measure", "the cached file was measured for another key")
    # Another key in the file of this one (edited by hand, say) is not this launch's figures.
    data = json.loads(first.path.read_text())
    data["calibration"]["key"]["gpu"] = "another GPU"
    first.path.write_text(json.dumps(data))
    stale = plan_for(tmp_path, *SIM)
    assert isinstance(stale, CalibrationPlan)
    assert (stale.action, stale.why) == ("measure", "the cached file was measured for another key")
    first.path.write_text("{ not json")
    broken = plan_for(tmp_path, *SIM)
    assert isinstance(broken, CalibrationPlan) and broken.action == "measure"
    assert broken.why.startswith("the cached file is unreadable")


def test_a_failed_write_leaves_no_file_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(1)
    profile = build_profile(plan, [_result(t, [1.0, 2.0, 3.0]) for t in plan.targets], "t")
    path = tmp_path / "calibration" / "p.json"

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_profile(path, profile)
    assert list(path.parent.iterdir()) == []


def test_gauges_sum_their_label_sets() -> None:
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="0"} 3.0\n'
        'sglang:num_running_reqs{tp_rank="1"} 2.0\n'
        "sglang:num_running_reqs_total 99\n"
        "sglang:spec_accept_length 2.5\n"
    )
    assert gauge(text, "sglang:num_running_reqs") == 5.0
    assert gauge(text, "sglang:spec_accept_length") == 2.5
    assert gauge(text, "sglang:num_queue_reqs") is None


def run_launch(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    return subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, **(env or {})},
        cwd=cwd,
    )


def test_the_flag_its_variable_its_toml_key_help_and_dry_run(tmp_path: Path) -> None:
    done = run_launch("--help")
    assert (
        "--calibrate {auto,always,never}" in done.stdout
        and "[env DYNSPEC_CALIBRATE]" in done.stdout
    )
    assert load_config(SIM, {"DYNSPEC_CALIBRATE": "never"}).calibrate == "never"
    toml = tmp_path / "l.toml"
    toml.write_text('simulate = true\ncalibrate = "always"\n')
    assert load_config(["--config", str(toml)], {}).calibrate == "always"
    bad = run_launch(*SIM, "--calibrate", "sometimes", "--dry-run")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    dry = run_launch(*SIM, "--dry-run", "--log-dir", str(tmp_path / "logs"))
    assert dry.returncode == 0, dry.stderr
    note = dry.stdout.splitlines()[0]
    assert note.startswith(
        "# calibration: each server measured alone at C=1,4,16,32,48 (3 passes after a "
        "warm-up level) once"
    )
    assert load_config([*SIM, "--calibrate-passes", "1"], {}).calibrate_passes == 1
    assert run_launch(*SIM, "--calibrate-passes", "0", "--dry-run").returncode == 2
    assert "(none cached)" in note and str((tmp_path / "logs/calibration").resolve()) in note
    assert "--speed-profile" not in dry.stdout.splitlines()[-1]
    never = run_launch(*SIM, "--dry-run", "--calibrate", "never")
    assert never.stdout.splitlines()[0] == "# calibration: off (--calibrate never)"
    assert not list((tmp_path / "logs").glob("**/*.json"))  # a dry run measures and writes nothing


def test_an_event_is_counted_by_its_usage_and_one_without_usage_fails_the_level() -> None:
    chunk = b'{"object":"text_completion","choices":[{"index":0,"text":"a b"}],"usage":%s}'
    usage = b'{"prompt_tokens":201,"completion_tokens":7,"total_tokens":208}'
    assert event_counts(chunk % usage) == (7, 201)
    with pytest.raises(CalibrationError, match="continuous_usage_stats"):
        event_counts(chunk % b"null")  # a server that ignores stream_options: no exact count
    with pytest.raises(CalibrationError, match=r"the server sent an error: .*too long"):
        event_counts(b'{"object":"error","message":"the prompt is too long","code":400}')
    with pytest.raises(CalibrationError, match="not JSON"):
        event_counts(b"{ not json")
