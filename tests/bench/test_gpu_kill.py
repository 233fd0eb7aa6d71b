"""The ``kill`` plan: its timing against one device command, which server each kill hits, how
requests are counted and attributed, ``--dry-run``, and a whole attempt on a CPU (fake SGLang
bundle whose servers are dynspec-sim, each with a worker child that dies with it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpu_fake_site import fake_path, make_bundle, make_models
from utils import free_port

from dynspec.bench.gpu import kill, killload, killreport
from dynspec.bench.gpu.leftovers import tagged_pids

DEVICE_LIMIT_S = 570.0  # one device command (the tool's limit is 600)


def test_three_kills_fit_one_device_command_by_the_measured_times() -> None:
    parts = kill.plan_seconds(kill.KILLS)
    assert parts["total"] < DEVICE_LIMIT_S, parts
    assert [k for k in parts if k.startswith("kill")] == [
        "kill1_eagle",
        "kill2_baseline",
        "kill3_eagle",
    ]
    # Each kill still has its time when it starts, with the stop kept in reserve.
    spent = parts["setup"] + parts["launch"]
    for name, server in (("kill1_eagle", "eagle"), ("kill2_baseline", "baseline")):
        assert kill.choose_server(server, 560 - spent) == server
        spent += parts[name]
    assert kill.choose_server("eagle", 560 - spent) == "eagle"


def test_a_kill_that_does_not_fit_falls_back_to_the_baseline_then_to_none() -> None:
    eagle, baseline = kill.need_seconds("eagle"), kill.need_seconds("baseline")
    assert baseline < eagle
    assert kill.choose_server("eagle", eagle) == "eagle"
    assert kill.choose_server("eagle", eagle - 1) == "baseline"
    assert kill.choose_server("eagle", baseline - 1) is None
    assert kill.choose_server("baseline", baseline - 1) is None


def test_steering_puts_a_closed_loop_on_either_pool() -> None:
    # Threshold policy: EAGLE while load <= threshold; baseline above it, back at <= t - h.
    for c in (8, 32):
        up = kill.steering("eagle", c)
        assert c + 1 <= up["threshold"] - up["hysteresis"]  # back to EAGLE at load c (+1)
        down = kill.steering("baseline", c)
        assert c - 1 > down["threshold"] - down["hysteresis"]  # stays on the baseline
        assert c > down["threshold"]
    assert kill.steering("eagle", 32) == {"threshold": 64, "hysteresis": 16}
    assert kill.steering("baseline", 32) == {"threshold": 16, "hysteresis": 8}


def rec(start: float, end: float, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"start": start, "end": end, "first_byte": start + 0.1, "status": 200}
    r.update(backend="eagle", done=True, ok=True, stopped=False)
    r.update(kw)
    return r


def test_requests_are_counted_and_attributed_around_the_kill() -> None:
    records = [
        rec(0.0, 1.0),  # before the kill, fine
        rec(9.5, 10.2, done=False, ok=False),  # cut on the killed server
        rec(9.9, 10.1, first_byte=None, done=False, ok=False),  # 200, no byte, cut
        rec(9.95, 10.1, first_byte=None, status=502, done=False, ok=False),  # the router's 502
        rec(9.9, 11.0, first_byte=10.5, backend="baseline"),  # held at the kill, retried
        rec(10.05, 10.9, backend="baseline"),  # after the kill: failover
        rec(12.0, 12.5, backend="baseline", done=False, ok=False),  # failed elsewhere
        rec(70.0, 71.0),  # back on the restarted server
        rec(70.5, 90.0, done=False, ok=False, stopped=True),  # cancelled by the generator
    ]
    found = killreport.kill_requests(records, server="eagle", killed_at=10.0, back_at=69.0)
    assert found["total"] == 9 and found["ok"] == 4
    assert (found["cut"], found["before_first_byte"], found["stopped"]) == (2, 2, 1)
    assert found["before_first_byte_status"] == {"200": 1, "502": 1}
    assert found["failed_on"] == {"killed": 3, "other": 1}
    assert found["retried_elsewhere"] == 1
    assert found["in_flight_at_kill"] == {"eagle": 3, "baseline": 1}
    assert found["back_on_server"] == 2 and found["failed_before_kill"] == 0
    checks = killreport.kill_checks({"requests": found, "after": {"zero_after_s": 0.0}})
    assert checks["failures_only_on_killed"] is False
    assert checks["no_error_before_first_byte"] is False  # the 502
    found["before_first_byte_status"] = {"200": 2}
    again = killreport.kill_checks({"requests": found, "after": {"zero_after_s": 0.0}})
    assert again["no_error_before_first_byte"] is True  # heads relayed, then cut: no error
    assert checks["load_zero_after"] is True and checks["healthy_again"] is False


def test_the_load_clock_offset_is_not_moved_by_a_pause_between_readings() -> None:
    """The load's records are put on the plan's clock by one offset; a pause between its clock
    readings (the process preempted on a busy machine) must not move every record by as much,
    which put streams the kill cut before the kill."""
    # perf_counter runs 100 s behind monotonic. Each try reads monotonic, perf_counter,
    # monotonic; the first pauses 5 ms after its first reading, the second does not.
    readings = iter([10.000, 10.005 - 100, 10.005, 10.006, 10.006 - 100, 10.006])

    def clock() -> float:
        return next(readings)

    offset = killload.plan_offset(1.0, monotonic=clock, perf_counter=clock, tries=2)
    assert abs(offset - (100 - 1.0)) < 1e-9, offset


def test_gpu_pids_and_counters_parse_what_the_tools_print() -> None:
    apps = "607, sglang::scheduler, 62312 MiB\n1178, sglang::scheduler, 1 MiB"
    assert killreport.gpu_pids(apps) == [607, 1178]
    assert killreport.gpu_pids("No running processes found") == []
    text = (
        'dynspec_upstream_errors_total{pool="eagle",kind="connect"} 3.0\n'
        'dynspec_upstream_errors_total{pool="eagle",kind="protocol"} 12.0\n'
        "dynspec_upstream_errors_created 1.0\n"
    )
    assert killreport.counters(text, "dynspec_upstream_errors_total") == {
        "kind=connect,pool=eagle": 3.0,
        "kind=protocol,pool=eagle": 12.0,
    }


def test_a_kill_cut_short_and_one_not_run_still_make_a_table_and_miss_their_checks() -> None:
    summary = {
        "versions": {"sglang": "0.5.17", "gpu": "NVIDIA H200"},
        "concurrency": 32,
        "planned": ["eagle", "baseline", "eagle"],
        # Stopped after its kill (the launcher exited): no requests, no checks.
        "kills": [{"kill": 1, "server": "eagle", "killed_at": 300.0, "restarted_s": 1.3}],
        "not_run": [{"kill": 2, "server": "baseline", "why": "kill 1: eagle was not healthy"}],
        "orphans": {
            "nvidia_smi_answered": True, "gpu_processes": ["607, sglang::scheduler, 1 MiB"],
            "processes_seen": 9, "survivors": [{"pid": 607, "name": "sglang::schedul"}],
            "tagged_alive": [], "launcher_exit": 130,
        },
    }  # fmt: skip
    checks = killreport.summary_checks(summary)
    assert checks["all_kills_made"] is False and checks["healthy_again"] is False
    assert checks["no_gpu_process_after_stop"] is False and checks["no_process_left"] is False
    table = killreport.markdown({**summary, "checks": checks})
    assert "MEASURED: SGLang 0.5.17, GPU NVIDIA H200" in table
    rows = [ln for ln in table.splitlines() if ln.startswith(("| 1 |", "| 2 |"))]
    width = len(killreport.COLUMNS) + 1
    assert [r.count("|") for r in rows] == [width, width]
    assert "| 1.3 |" in rows[0] and "not run (kill 1: eagle was not healthy)" in rows[1]
    assert "lists 607, sglang::scheduler, 1 MiB" in table and "left: 607 sglang::schedul" in table
    assert "| healthy_again | MISS |" in table


def gpu_run(tmp: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = fake_path(tmp)
    ports = f"{free_port()},{free_port()},{free_port()}"
    argv = [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--plan", "kill"]
    argv += ["--out", str(tmp / "out"), "--work", str(tmp / "work"), "--ports", ports, *extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp, check=False
    )


def test_dry_run_prints_the_launch_and_each_kill_and_starts_nothing(tmp_path: Path) -> None:
    done = gpu_run(tmp_path, "--dry-run", "--kills", "baseline,eagle", "--concurrency", "8")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    launch = next(ln for ln in lines if "dynspec.launcher" in ln)
    assert "--restart on-failure" in launch and "--gpus 0" in launch
    assert "--threshold 4 --hysteresis 2" in launch  # the first kill's: the load on the baseline
    assert "DYNSPEC_ADMIN_API_KEY=<random>" in launch
    kills = [ln for ln in lines if ln.startswith(("# kill 1:", "# kill 2:"))]
    assert ['"threshold": 4' in kills[0], '"threshold": 16' in kills[1]] == [True, True]
    assert sum("dynspec.bench.gpu.killload" in ln for ln in lines) == 2
    assert not (tmp_path / "out").exists()
    other = gpu_run(tmp_path, "--plan", "pair-a", "--dry-run")
    assert other.returncode == 2 and "only the eight, kill and traffic plans" in other.stderr


def test_bad_kills_are_a_usage_error(tmp_path: Path) -> None:
    done = gpu_run(tmp_path, "--kills", "eagle,router")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_budget_without_room_for_one_kill_stops_before_the_launch(tmp_path: Path) -> None:
    """The first attempt on the H200 spent its device time on a launch that could not be
    followed by a kill: a budget that short now stops at once, naming what it needs."""
    done = gpu_run(
        tmp_path, "--budget", "300",
        "--bundle", str(make_bundle(tmp_path, workers=True)),
        "--models", str(make_models(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "one kill need about" in done.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert "launch_argv" not in meta and meta["leftovers_killed"] == []


def test_kill_plan_restarts_each_killed_server_and_counts_what_failed(tmp_path: Path) -> None:
    done = gpu_run(
        tmp_path, "--concurrency", "8", "--budget", "400",
        "--bundle", str(make_bundle(tmp_path, workers=True)),
        "--models", str(make_models(tmp_path)),
    )  # fmt: skip
    out = tmp_path / "out"
    assert (out / "kill-summary.json").exists(), done.stdout[-3000:] + done.stderr[-2000:]
    summary = json.loads((out / "kill-summary.json").read_text())
    checks = summary["checks"]
    # A request whose server died before answering at all is moved to the other server by the
    # router, so no client gets an error status: every check holds, that one too.
    assert done.returncode == 0 and all(checks.values()), (checks, done.stderr[-2000:])
    assert [k["server"] for k in summary["kills"]] == ["eagle", "baseline", "eagle"]
    for k in summary["kills"]:
        assert k["before"]["steady"], k["before"]
        assert k["new_pid"] != k["pid"] and k["restarted_s"] < k["router_healthy_s"]
        assert [w["name"] for w in k["workers"]] == ["sglang::schedul"]
        # The worker died with its server (PR_SET_PDEATHSIG), before the launcher restarted it.
        assert len(k["workers_gone_s"]) == 1 and k["group_gone_s"] <= k["restarted_s"]
        assert any("was killed by SIGKILL" in ln["line"] for ln in k["launcher_lines"])
        assert k["launcher_healthy_s"] is not None
        # Its GPU process (the fake scheduler) was listed before and is gone after.
        assert k["gpu_pids_before_of_server"] and not set(k["gpu_pids_before_of_server"]) & set(
            k["gpu_pids_after"]
        )
        req = k["requests"]
        assert req["cut"] + req["before_first_byte"] >= 1, req  # C=8 were on it when it died
        assert set(req["failed_on"]) == {"killed"}, req
        assert req["back_on_server"] > 0 and req["ok"] > req["cut"]
        assert k["after"]["load"] == 0 and k["after"]["running"] == {"eagle": 0, "baseline": 0}
        assert all(k["checks"].values()), k["checks"]
    orphans = summary["orphans"]
    assert orphans["nvidia_smi_answered"] and orphans["gpu_processes"] == []
    assert orphans["survivors"] == [] and orphans["tagged_alive"] == []
    assert orphans["processes_seen"] >= 6 and orphans["launcher_exit"] == 130
    rows = [json.loads(ln) for ln in (out / "kill.jsonl").read_text().splitlines()]
    assert {r["kill"] for r in rows} == {1, 2, 3}
    assert all(r["backend"] in ("eagle", "baseline") for r in rows if r["status"] is not None)
    table = (out / "kill.md").read_text()
    assert "MEASURED" in table and table.count("\n| 1 | eagle |") == 1
    meta = json.loads((out / "meta.json").read_text())
    assert meta["expected_s"]["total"] == round(kill.plan_seconds(kill.KILLS)["total"])
    assert meta["launch_argv"][meta["launch_argv"].index("--restart") + 1] == "on-failure"
    assert meta["leftovers_killed"] == [] and tagged_pids(meta["tag"]) == []
    assert (out / "logs.tar.gz").exists() and len(list(out.iterdir())) <= 8
