"""``--calibrate`` end to end: ``dynspec-launch --simulate`` with real dynspec-sim servers and the
real router. A first start measures and the router gets the profile; the next start with the
same key reuses it; ``always`` measures again; ``never`` and a given ``--speed-profile`` measure
nothing; a server that dies mid-calibration is one line and the router starts without a profile;
Ctrl-C mid-calibration stops everything. The simulators run 10x fast and each level's window is
at most 0.5 s, so a calibration takes seconds."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import httpx
import pytest
from launcher_run import LauncherRun, launched, router_takes_pairs, sim_serves_pairs

FAST = ["--simulate", "--threshold", "auto", "--sim-speed", "10", "--calibrate-seconds", "0.5"]
FAST += ["--calibrate-passes", "2"]
FAST += ["--drain-timeout", "5", "--kill-grace", "2"]
READY = r"\[dynspec\] threshold auto: the router learns"
LEVELS = (1, 4, 16, 32, 48)
DEMO = str(Path(__file__).parents[2] / "launcher/sim/profiles/demo.json")


def router_argv(tmp: Path) -> str:
    """The command line of the router's latest start (its log's last ``==>`` line)."""
    lines = (tmp / "logs" / "router.log").read_text().splitlines()
    return [ln for ln in lines if ln.startswith("==> dynspec-launch")][-1]


def cached(tmp: Path) -> list[Path]:
    folder = tmp / "logs" / "calibration"
    return sorted(folder.iterdir()) if folder.exists() else []


def stop(run: LauncherRun) -> None:
    run.send(signal.SIGINT)
    assert run.wait(60) == 130
    assert run.leftovers() == []


def measured_lines(out: str, label: str) -> list[int]:
    return [int(c) for c in re.findall(rf"\[dynspec\] calibrate {label} C=(\d+): \d+ tok/s", out)]


def test_first_start_measures_next_start_reuses_always_measures_never_skips(
    tmp_path: Path,
) -> None:
    with launched(tmp_path, *FAST, fake=False) as (run, _):
        run.wait_for(READY, 120)
        out = run.out
        assert measured_lines(out, "eagle sim") == list(LEVELS) * 2
        assert measured_lines(out, "baseline sim") == list(LEVELS) * 2
        assert "(SIMULATED)" in out
        # A warm-up level each, then each server alone a pass at a time, taking turns.
        turns = re.findall(r"\[dynspec\] calibrate (\w+) sim(:| C=)", out)
        assert [who for who, _ in turns] == ["eagle", "baseline"] + (
            ["eagle"] * 5 + ["baseline"] * 5
        ) * 2
        assert "calibrate eagle sim: a warm-up level at C=48, not kept" in out
        assert "calibration pass 2 of 2" in out
        (path,) = cached(tmp_path)
        assert re.search(rf"calibration: wrote {re.escape(str(path))} in \d+s; the router", out)
        assert f"--speed-profile {path}" in router_argv(tmp_path)
        stop(run)
    first = json.loads(path.read_text())
    assert first["source"].startswith("SIMULATED") and "the median of 2 passes" in first["source"]
    assert first["calibration"]["key"]["passes"] == 2
    # Each level the median (of two: their mean) of the passes kept beside it.
    for label, mode in (("eagle sim", "eagle"), ("baseline sim", "baseline")):
        passes = first["calibration"]["servers"][label]["passes"]
        assert [c for c, _ in passes] == list(LEVELS) and all(len(xs) == 2 for _, xs in passes)
        measured = dict(map(tuple, first["modes"][mode]["throughput"]))
        for c, xs in passes:
            assert abs(measured[c] - sum(xs) / 2) < 0.2, (label, c)
    assert first["calibration"]["key"]["sglang"].startswith("dynspec-sim ")
    eagle, baseline = (dict(map(tuple, first["modes"][m]["throughput"])) for m in first["modes"])
    # The demo profile: the baseline passes EAGLE between C=4 and C=16 (wall clock, 10x fast).
    assert eagle[1] > baseline[1] and eagle[48] < baseline[48]

    with launched(tmp_path, *FAST, fake=False) as (run, _):
        run.wait_for(READY, 120)
        out = run.out
        when = first["calibration"]["measured_at"]
        assert f"[dynspec] calibration: reusing {path} (measured {when})" in out
        assert "calibrate eagle" not in out and "calibrate baseline" not in out
        assert f"--speed-profile {path}" in router_argv(tmp_path)
        stop(run)
    assert cached(tmp_path) == [path] and json.loads(path.read_text()) == first

    with launched(tmp_path, *FAST, "--calibrate", "always", fake=False) as (run, _):
        run.wait_for(READY, 120)
        assert measured_lines(run.out, "eagle sim") == list(LEVELS) * 2
        assert "(--calibrate always)" in run.out
        stop(run)
    again = json.loads(path.read_text())
    assert (
        cached(tmp_path) == [path]
        and again["calibration"]["servers"] != first["calibration"]["servers"]
    )

    for extra in (["--calibrate", "never"], ["--speed-profile", DEMO]):
        with launched(tmp_path, *FAST, *extra, fake=False) as (run, _):
            run.wait_for(READY, 120)
            assert "[dynspec] calibrat" not in run.out
            argv = router_argv(tmp_path)
            assert (f"--speed-profile {DEMO}" in argv) == (extra[0] == "--speed-profile")
            assert str(path) not in argv
            stop(run)


async def test_a_server_that_dies_mid_calibration_is_one_line_and_the_router_starts(
    tmp_path: Path,
) -> None:
    with launched(tmp_path, *FAST, fake=False) as (run, ports):
        await asyncio.to_thread(run.wait_for, r"calibrate eagle sim C=1:", 120)
        # The baseline is measured after EAGLE: it exits abruptly three stream chunks into it.
        async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
            r = await http.post(
                f"http://127.0.0.1:{ports['baseline']}/sim/faults", json={"exit_after_chunks": 3}
            )
            assert r.status_code == 200, r.text
            await asyncio.to_thread(run.wait_for, READY, 120)
            out = run.out
            failed = [ln for ln in out.splitlines() if "calibration failed" in ln]
            assert len(failed) == 1, out
            assert re.fullmatch(
                r"\[dynspec\] calibration failed \(.*baseline.*\); the router starts without a "
                r"speed profile",
                failed[0],
            ), failed
            assert "--speed-profile" not in router_argv(tmp_path)
            assert cached(tmp_path) == []  # nothing written, not even half a file
            health = await http.get(f"http://127.0.0.1:{ports['router']}/health")
            assert health.status_code == 200
            # The dead server is restarted as at any other time.
            await asyncio.to_thread(run.wait_for, r"\[baseline sim\] healthy again after", 60)
        await asyncio.to_thread(stop, run)


def test_ctrl_c_mid_calibration_stops_everything_and_writes_nothing(tmp_path: Path) -> None:
    with launched(tmp_path, *FAST, fake=False) as (run, _):
        run.wait_for(r"calibrate eagle sim C=4:", 120)
        stop(run)
        out = run.out
        assert "[dynspec] SIGINT: stopping" in out and "[dynspec] all processes stopped" in out
        assert "[router]" not in out and "calibration: wrote" not in out
        assert cached(tmp_path) == []


@pytest.mark.skipif(
    not (router_takes_pairs() and sim_serves_pairs()),
    reason="needs dynspec-sim --pair and the router's --pair flag",
)
def test_two_gpu_sets_are_measured_at_once_into_one_profile(tmp_path: Path) -> None:
    argv = [*FAST, "--layout", "paired", "--gpus", "0-1"]
    with launched(tmp_path, *argv, fake=False) as (run, _):
        run.wait_for(READY, 120)
        out = run.out
        for label in ("eagle0 sim", "eagle1 sim", "baseline0 sim", "baseline1 sim"):
            assert measured_lines(out, label) == list(LEVELS) * 2, label
        (path,) = cached(tmp_path)
        assert f"--speed-profile {path}" in router_argv(tmp_path)
        stop(run)
    profile = json.loads(path.read_text())
    assert "2 GPU sets measured at once, each level the median" in profile["source"]
    assert profile["calibration"]["key"]["sharing"] == "timeslice"
    assert set(profile["calibration"]["servers"]) == {
        "eagle0 sim", "eagle1 sim", "baseline0 sim", "baseline1 sim"
    }  # fmt: skip
