"""``python -m dynspec.router.replay`` on the committed pair-a-calibrated run's real logs: the
poll rule that drops an interval spanning an idle spell keeps the derived threshold above C=64,
where EAGLE alone served 8,812 tok/s against the baseline's 8,122 (the rule before read 20-32)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dynspec.router import replay

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
