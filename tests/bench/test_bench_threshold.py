"""suggest-threshold on synthetic sweeps: crossover interpolation, "never" and "always"."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.bench.threshold import hysteresis_for, render, suggest

LEVELS = [1, 2, 4, 8, 16]


def sweep(target: str, tpots: list[float]) -> list[dict[str, object]]:
    return [
        {
            "target": target,
            "max_concurrency": c,
            "completed": 4 * c,
            "median_tpot_ms": tpot,
            "output_throughput": 1000.0 * c / tpot,
        }
        for c, tpot in zip(LEVELS, tpots, strict=True)
    ]


EAGLE = sweep("eagle", [10, 12, 16, 30, 60])
BASELINE = sweep("baseline", [20, 21, 22, 24, 28])


def write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_crossover_is_interpolated_in_log2_c() -> None:
    s = suggest(EAGLE, BASELINE)
    assert s.verdict == "crossover"
    # Speed ratios EAGLE/baseline: 22/16 at C=4, 24/30 at C=8. On log2 of both:
    # x = 2 + log2(1.375) / (log2(1.375) - log2(0.8)) = 2.58799..., C = 2**x = 6.012.
    assert s.crossover == pytest.approx(6.012, abs=0.002)
    assert s.threshold == 6
    assert s.hysteresis == 2
    assert "between C=4 and C=8" in s.message


def test_exact_tie_at_a_level_puts_the_crossover_there() -> None:
    s = suggest(sweep("e", [10, 12, 22, 30, 60]), BASELINE)
    assert s.crossover == pytest.approx(4.0)
    assert s.threshold == 4


def test_never_and_always() -> None:
    never = suggest(sweep("e", [25, 26, 30, 40, 80]), BASELINE)
    assert never.verdict == "never"
    assert (never.threshold, never.hysteresis) == (0, 0)
    assert "never wins" in never.message
    assert "Recommended: no EAGLE pool" in render(never)
    always = suggest(sweep("e", [5, 6, 7, 8, 9]), BASELINE)
    assert always.verdict == "always"
    assert always.threshold == 16
    assert "always wins" in always.message
    assert always.crossover is None


def test_a_second_win_above_the_crossover_is_reported() -> None:
    s = suggest(sweep("e", [10, 12, 16, 30, 20]), BASELINE)
    assert s.threshold == 6
    assert s.rewins == (16,)
    assert "faster again at C=16" in s.message


def test_hysteresis_lets_the_router_switch_back() -> None:
    # About a quarter of the threshold, at least 1 where that leaves room, none at 0 and 1.
    table = {0: 0, 1: 0, 2: 1, 3: 1, 5: 1, 6: 2, 8: 2, 12: 3, 16: 4, 64: 16, 100: 25, 256: 64}
    assert {t: hysteresis_for(t) for t in table} == table
    for t in range(1, 300):
        # Load counts the new request, so it is at least 1: switching back needs t - h >= 1.
        assert t - hysteresis_for(t) >= 1, t


def test_levels_missing_on_one_side_are_ignored() -> None:
    s = suggest(EAGLE[:4], BASELINE[1:])
    assert [lv.concurrency for lv in s.levels] == [2, 4, 8]
    with pytest.raises(ValueError, match="no concurrency level"):
        suggest(EAGLE[:1], BASELINE[1:])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynspec.bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_prints_evidence_and_recommendation(tmp_path: Path) -> None:
    e = write(tmp_path / "e.jsonl", EAGLE)
    b = write(tmp_path / "b.jsonl", BASELINE)
    r = run_cli("suggest-threshold", str(e), str(b))
    assert r.returncode == 0, r.stderr
    assert "Recommended: --threshold 6 --hysteresis 2" in r.stdout
    assert "| 8 | 30.00 | 24.00 |" in r.stdout
    r = run_cli("suggest-threshold", str(e), str(b), "--json")
    data = json.loads(r.stdout)
    assert data["verdict"] == "crossover"
    assert math.isclose(data["crossover"], 6.012, abs_tol=0.002)


def test_cli_multi_target_file_needs_a_name(tmp_path: Path) -> None:
    both = write(tmp_path / "both.jsonl", EAGLE + BASELINE)
    r = run_cli("suggest-threshold", str(both), str(both))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "name one" in r.stderr
    r = run_cli(
        "suggest-threshold",
        str(both),
        str(both),
        "--eagle-target",
        "eagle",
        "--baseline-target",
        "baseline",
    )
    assert r.returncode == 0, r.stderr
    assert "--threshold 6" in r.stdout


def test_queueing_eagle_uses_the_throughput_crossing() -> None:
    # EAGLE's TPOT stays lower (only its running requests decode; the rest queue), but its
    # output tok/s falls below the baseline's between C=4 and C=8.
    eagle = sweep("e", [10, 12, 16, 20, 22])
    for rec, tput in zip(eagle, [100.0, 160.0, 250.0, 300.0, 310.0], strict=True):
        rec["output_throughput"] = tput
    baseline = sweep("b", [20, 21, 22, 24, 28])
    for rec, tput in zip(baseline, [50.0, 95.0, 180.0, 330.0, 570.0], strict=True):
        rec["output_throughput"] = tput
    s = suggest(eagle, baseline)
    assert s.verdict == "crossover"
    # log2(250/180) = 0.47393, log2(300/330) = -0.13750: x = 2 + 0.47393 / 0.61143 = 2.77512.
    assert s.crossover == pytest.approx(6.845, abs=0.005)
    assert (s.threshold, s.hysteresis) == (6, 2)
    assert "output tok/s falls below" in s.message
    assert "requests queue" in s.message


def test_the_same_sweep_twice_is_no_difference_not_a_win() -> None:
    s = suggest(sweep("e", [20, 21, 22, 24, 28]), BASELINE)
    assert s.verdict == "tie"
    assert "No difference" in s.message and "always wins" not in s.message
    assert (s.threshold, s.hysteresis, s.crossover) == (0, 0, None)
    text = render(s)
    assert "always" not in text and "Recommended: no threshold to choose" in text
    assert "| same |" in text and "| EAGLE |" not in text


def test_within_the_tolerance_everywhere_is_a_tie_beyond_it_is_not() -> None:
    # 1% faster at every level: noise, not a win.
    close = sweep("e", [t / 1.01 for t in [20, 21, 22, 24, 28]])
    assert suggest(close, BASELINE).verdict == "tie"
    # 1% faster at most levels but 10% at one: EAGLE wins there.
    one_win = sweep(
        "e",
        [t / f for t, f in zip([20, 21, 22, 24, 28], [1.01, 1.01, 1.1, 1.01, 1.01], strict=True)],
    )
    assert suggest(one_win, BASELINE).verdict == "always"


def test_cli_same_file_twice_says_no_difference(tmp_path: Path) -> None:
    records = [*sweep("eagle", [20, 21, 22, 24, 28]), *sweep("baseline", [20, 21, 22, 24, 28])]
    path = write(tmp_path / "one.jsonl", records)
    for targets in (["--eagle-target", "eagle", "--baseline-target", "baseline"],
                    ["--eagle-target", "eagle", "--baseline-target", "eagle"]):  # fmt: skip
        r = subprocess.run(
            [sys.executable, "-m", "dynspec.bench", "suggest-threshold", str(path), str(path),
             *targets],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "No difference" in r.stdout and "always wins" not in r.stdout
