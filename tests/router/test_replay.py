"""``python -m dynspec.router.replay`` on the committed pair-a-calibrated run's real logs: the
poll rule that drops an interval spanning an idle spell keeps the derived threshold above C=64,
where EAGLE alone served 8,812 tok/s against the baseline's 8,122 (the rule before read 20-32)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.router import learning, replay, speed

RUN = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200" / "pair-a-calibrated"
PROFILE = RUN / "calibration-llama8b-random-45e2ab5788a2fde3.json"


def test_the_h200_runs_derived_threshold_stays_above_64_after_the_idle_spell() -> None:
    logs = replay.read_logs(RUN / "logs.tar.xz")
    derived = list(replay.replay(logs, replay.load_profile_json(PROFILE)))
    # The router started at 11:09:52 (router.log's header); the replay starts there.
    assert derived[0].second == replay.seconds("2026-12-03 11:09:52")
    after = [d.threshold for d in derived if d.second >= replay.seconds("2026-12-03 11:14:00")]
    assert len(after) > 600 and min(after) >= 64, sorted(set(after))[:5]
    # The gauges that did it under the old rule are in the replayed series.
    eagle = replay.gauges(logs["eagle.log"])
    assert (56.0, 231.27, 0.0) in eagle.values()


def test_gauges_keep_the_last_line_of_each_second_and_skip_other_lines() -> None:
    lines = [
        "[2026-12-03 11:14:05] Decode batch, #running-req: 56, #token: 1, token usage: 0.04, "
        "accept len: 4.00, cuda graph: True, gen throughput (token/s): 231.27, #queue-req: 0",
        "[2026-12-03 11:14:05] Decode batch, #running-req: 64, #token: 2, token usage: 0.04, "
        "cuda graph: True, gen throughput (token/s): 8582.13, #queue-req: 3",
        "[2026-12-03 11:14:06] Prefill batch, #new-seq: 8, #new-token: 2048",
    ]
    assert replay.gauges(lines) == {replay.seconds("2026-12-03 11:14:05"): (64.0, 8582.13, 3.0)}


def test_the_command_prints_the_changes_and_refuses_bad_input(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "dynspec.router.replay", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    done = cli(str(RUN / "logs.tar.xz"), "--profile", str(PROFILE), "--since",
               "2026-12-03 11:14:00")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(" threshold " in ln and "eagle" in ln for ln in lines)
    empty = tmp_path / "logs"
    empty.mkdir()
    for args in (
        [str(tmp_path / "nope")],
        [str(empty)],
        [str(RUN / "logs.tar.xz"), "--since", "x"],
    ):
        bad = cli(*args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


DAY = Path(__file__).resolve().parents[2] / "bench" / "results" / "h100" / "traffic-day-delay5"
DAY_PROFILE = DAY / "calibration-llama8b-random-2f973cb3fa6cafa4.json"
LOGGED = re.compile(r"(eagle|baseline) \{([^}]*)\}")


def test_observations_replay_the_h100_days_learner_exactly_and_the_anchor_holds_its_ramp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The H100 day's router ran at --log-level debug (f9cbcc9, before the profile counted as
    observations, and before a load's ratio of the two sources stopped reaching every load):
    replayed under its rules, every derivation's curves are the ones it logged (to the
    rebuilds' timing), and the threshold reached 512 in the first routed run's ramp (it
    held up to 141 in flight on EAGLE). Under speed.PROFILE_FIT_WEIGHT the same observations
    keep it at 50-80."""
    lines = replay.read_logs(DAY / "logs.tar.gz")["router.log"]
    profile = replay.load_profile_json(DAY_PROFILE)
    logged = [LOGGED.findall(ln) for ln in lines if "DEBUG dynspec.router.pool: pair 0: at" in ln]
    ramp = (replay.seconds("2026-12-05 21:46:45"), replay.seconds("2026-12-05 21:48:00"))

    def thresholds(steps: list[replay.Logged]) -> list[int]:
        return [s.threshold for s in steps if ramp[0] <= s.at < ramp[1]]

    with monkeypatch.context() as m:
        m.setattr(learning, "PROFILE_FIT_WEIGHT", 0.0)
        m.setattr(speed, "_RATIO_REACH_LOG", math.inf)  # the nearest ratio at any distance then
        before = list(replay.replay_observations(lines, profile))
    assert len(before) == len(logged) > 80
    errors = []
    for step, pools in zip(before, logged, strict=True):
        for pool, text in pools:
            for pair in text.split(", "):
                load, ms = pair.split(": ")
                errors.append(abs(step.curves[pool][int(load)] / float(ms) - 1))
    # The router rebuilds its curves at most every learning.REBUILD_S, the replay at each
    # derivation: most points agree to the log's rounding, none by more than 6%.
    assert max(errors) < 0.06 and sum(e < 0.01 for e in errors) > 0.8 * len(errors)
    assert max(thresholds(before)) == 512
    after = thresholds(list(replay.replay_observations(lines, profile)))
    assert len(after) > 20 and min(after) >= 50 and max(after) <= 80, sorted(set(after))


def test_observations_need_a_debug_log(tmp_path: Path) -> None:
    (tmp_path / "router.log").write_text("2026-12-05 21:46:18,761 INFO dynspec.router.pool: x\n")
    with pytest.raises(ValueError, match="--log-level debug"):
        list(replay.replay_observations(replay.read_logs(tmp_path)["router.log"], None))


def test_a_bench_runs_router_log_is_found_by_its_name(tmp_path: Path) -> None:
    """A bench run's folder names its router's log router-WAY.log: --observations reads the one
    there is."""
    lines = replay.read_logs(DAY / "logs.tar.gz")["router.log"]
    (tmp_path / "router-routed.log").write_text("\n".join(lines[:4000]) + "\n")
    assert replay.router_log(tmp_path)[:3] == lines[:3]
    (tmp_path / "router-other.log").write_text("")
    assert replay.router_log(tmp_path) == []  # two: which one is not guessed


DAY3 = Path(__file__).resolve().parents[2] / "bench" / "results" / "h100" / "traffic-day-624866c"


def test_a_light_load_ratio_of_the_sources_does_not_rescale_the_busy_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The H100 day at 624866c (debug log): in the second routed run EAGLE's polls at 2 in flight
    read 5.5 ms a token against its requests' 3.0. Once that bucket's ratio (0.54) was known it
    was the nearest to every load above, halved EAGLE's curve at 32-256 and took the threshold
    to 512 for 7 s (03:22:34). Within speed.RATIO_REACH of its load only, the clocks' pooled
    ratio beyond: the same observations keep it at 55-90 from there to the day's end."""
    lines = replay.read_logs(DAY3 / "logs.tar.gz")["router.log"]
    profile = replay.load_profile_json(DAY3 / "calibration-llama8b-random-2f973cb3fa6cafa4.json")
    second_run = replay.seconds("2026-12-06 03:22:00")

    def thresholds(steps: list[replay.Logged]) -> list[int]:
        return [s.threshold for s in steps if s.at >= second_run]

    with monkeypatch.context() as m:
        m.setattr(speed, "_RATIO_REACH_LOG", math.inf)
        before = thresholds(list(replay.replay_observations(lines, profile)))
    assert max(before) == 512
    after = thresholds(list(replay.replay_observations(lines, profile)))
    assert len(after) > 20 and min(after) >= 55 and max(after) <= 90, sorted(set(after))


def test_a_switch_margin_keeps_the_middle_draft_s_threshold_down() -> None:
    """The H100 p54 day under MPS (1a53ba8, debug log): its curves lie within 2% of each other
    from 32 to 64 in flight, and a third of the derivations put the threshold above 40 (up to
    110; the pair once left EAGLE with 66 requests in flight). Derived with a 10% switch margin
    from the same observations, fewer than a tenth do."""
    run = Path(__file__).resolve().parents[2] / "bench" / "results" / "h100" / "traffic-p54-1a53ba8"
    lines = replay.read_logs(run / "logs.tar.gz")["router.log"]
    profile = replay.load_profile_json(run / "calibration-llama8b-random-1b966a78f1d337f4.json")

    def above_40(margin: float) -> float:
        found = [s.threshold for s in replay.replay_observations(lines, profile, margin)]
        assert len(found) > 100
        return sum(t > 40 for t in found) / len(found)

    assert above_40(0.0) > 0.3 and above_40(0.1) < 0.1
