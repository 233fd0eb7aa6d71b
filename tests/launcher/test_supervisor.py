"""Supervision with a fake SGLang: slow start, crashes, restarts, stubborn processes, workers."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from launcher_run import launched, router_takes_pairs

SHORT = ["--kill-grace", "1", "--drain-timeout", "2"]


def chat(port: int) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=10.0,
    )


def test_slow_start_waits_for_health_then_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_EAGLE": "slow,fork", "FAKE_SGLANG_REFUSE": "1.5", "FAKE_SGLANG_WARM": "1"}
    with launched(tmp_path, *SHORT, "--progress-every", "0.3", env=env) as (run, ports):
        ready = run.wait_for(r"\[dynspec\] ready: .*\n")
        out = run.out
        healthy = run.wait_for(r"\[eagle gpu0\] healthy after (\d+)s")
        # Refused for 1.5 s, then 503 for 1 s: healthy only after both.
        assert int(healthy.group(1)) >= 2
        assert out.index("[eagle gpu0] healthy after") < ready.start()
        assert "[baseline gpu1] healthy after" in out
        assert f"curl -s http://127.0.0.1:{ports['router']}/v1/chat/completions" in out
        assert f"http://127.0.0.1:{ports['router']}/metrics" in out
        assert "loading weights" in (tmp_path / "logs" / "eagle.log").read_text()
        # Not a terminal: plain progress lines, and the servers' own lines with their prefix.
        assert re.search(r"\[eagle gpu0\] waiting \d+s: loading \(port not open yet\)\n", out)
        assert re.search(r"\[eagle gpu0\] waiting \d+s: warming up \(HTTP 503\)\n", out)
        assert "[eagle gpu0] loading weights" in out

        r = chat(ports["router"])
        assert r.status_code == 200
        assert r.headers["x-dynspec-backend"] == "eagle"

        run.send(signal.SIGINT)
        assert run.wait(30) == 130
        assert run.leftovers() == []
        assert len(run.seen) >= 5  # router, two servers, two workers
        assert "all processes stopped" in run.out


def test_crash_at_start_stops_everything_with_one_line(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_EAGLE": "crash-start", "FAKE_SGLANG_BASELINE": "fork"}
    with launched(tmp_path, *SHORT, env=env) as (run, _):
        assert run.wait(60) == 1
        err = run.err.strip().splitlines()
        assert len(err) == 1, run.err
        log = tmp_path / "logs" / "eagle.log"
        assert err[0] == (
            "dynspec-launch: error: eagle server [eagle gpu0] exited with code 1 during "
            f"start-up; see its log: {log}"
        )
        assert "CUDA out of memory (fake)" in log.read_text()
        assert "[router]" not in run.out
        assert run.leftovers() == []


def test_startup_timeout_names_the_late_server(tmp_path: Path) -> None:
    # The baseline server would refuse connections for an hour: only the 2 s start-up timeout can
    # end the launch before the wait below gives up.
    env = {"FAKE_SGLANG_BASELINE": "slow", "FAKE_SGLANG_REFUSE": "3600"}
    with launched(tmp_path, *SHORT, "--startup-timeout", "2", env=env) as (run, _):
        assert run.wait(60) == 1
        assert "baseline server [baseline gpu1] did not answer /health_generate within 2s" in (
            run.err
        )
        assert str(tmp_path / "logs" / "baseline.log") in run.err
        assert run.leftovers() == []


def test_server_that_dies_later_is_restarted_while_the_other_pool_serves(tmp_path: Path) -> None:
    # The test decides when the EAGLE server crashes (first start only) and when its restart may
    # listen again, so the requests in between find it down however slow the machine is.
    env = {"FAKE_SGLANG_EAGLE": "crash-later,hold-restart"}
    with launched(tmp_path, *SHORT, env=env) as (run, ports):
        run.wait_for(r"\[dynspec\] ready")
        (tmp_path / "crash-eagle").touch()
        run.wait_for(r"\[eagle gpu0\] exited with code 3; restarting in 1s")
        backends = []
        for _ in range(3):
            r = chat(ports["router"])
            assert r.status_code == 200
            backends.append(r.headers["x-dynspec-backend"])
        assert backends == ["baseline"] * 3
        run.wait_for(r"\[eagle gpu0\] restarted \(start 2\)")
        (tmp_path / "release-eagle").touch()
        run.wait_for(r"\[eagle gpu0\] healthy again after \d+s")
        starts = (tmp_path / "starts.log").read_text().splitlines()
        assert [line.split()[0] for line in starts].count("eagle") == 2
        run.send(signal.SIGTERM)
        assert run.wait(30) == 143
        assert run.leftovers() == []


def test_restart_never_stops_everything(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_BASELINE": "crash-later"}
    with launched(tmp_path, *SHORT, "--restart", "never", env=env) as (run, _):
        run.wait_for(r"\[dynspec\] ready")
        (tmp_path / "crash-baseline").touch()
        assert run.wait(60) == 1
        err = run.err.strip().splitlines()
        assert len(err) == 1
        assert "baseline server [baseline gpu1] exited with code 3 (--restart never" in err[0]
        assert run.leftovers() == []


def test_server_ignoring_sigterm_and_its_workers_are_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    env = {"FAKE_SGLANG_EAGLE": "ignore-term,fork", "FAKE_SGLANG_BASELINE": "fork"}
    with launched(tmp_path, "--kill-grace", "1.5", "--drain-timeout", "2", env=env) as (run, _):
        run.wait_for(r"\[dynspec\] ready")
        sent = time.monotonic()
        run.send(signal.SIGTERM)
        assert run.wait(30) == 143
        took = time.monotonic() - sent
        assert took >= 1.5  # the stubborn server had its grace period before SIGKILL
        assert run.leftovers() == []
        starts = (tmp_path / "starts.log").read_text().splitlines()
        assert sum(len(line.split()) - 2 for line in starts) == 4  # four workers, all gone


def test_second_ctrl_c_kills_at_once(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_EAGLE": "ignore-term,fork"}
    with launched(tmp_path, "--kill-grace", "60", "--drain-timeout", "2", env=env) as (run, _):
        run.wait_for(r"\[dynspec\] ready")
        run.send(signal.SIGINT)
        run.wait_for(r"servers: SIGTERM to each process group")
        run.send(signal.SIGINT)
        # The wait's deadline is half the grace: an exit before it is the second Ctrl-C's doing.
        assert run.wait(30) == 130
        assert run.leftovers() == []


def test_hangup_stops_everything_too(tmp_path: Path) -> None:
    # The children are in their own sessions: a closed terminal's SIGHUP reaches only the
    # launcher, which must take them down with it.
    with launched(tmp_path, *SHORT, env={"FAKE_SGLANG_BASELINE": "fork"}) as (run, _):
        run.wait_for(r"\[dynspec\] ready")
        run.send(signal.SIGHUP)
        assert run.wait(30) == 129
        assert run.leftovers() == []


@pytest.mark.skipif(not router_takes_pairs(), reason="needs the router's --pair flag")
def test_one_gpu_starts_the_baseline_only_after_the_eagle_server_is_healthy(
    tmp_path: Path,
) -> None:
    env = {"FAKE_SGLANG_EAGLE": "slow", "FAKE_SGLANG_REFUSE": "1.5", "FAKE_SGLANG_WARM": "1"}
    with launched(tmp_path, *SHORT, "--gpus", "0", env=env) as (run, ports):
        run.wait_for(r"\[dynspec\] ready: .*\n")
        out = run.out
        healthy = out.index("[eagle gpu0] healthy after")
        assert healthy < out.index("[baseline gpu0] starting now (shares its GPU")
        assert out.index("[baseline gpu0] healthy after") > healthy
        starts = (tmp_path / "starts.log").read_text().split()
        assert starts[0] == "eagle" and "baseline" in starts
        assert chat(ports["router"]).status_code == 200
        run.send(signal.SIGINT)
        assert run.wait(30) == 130
        assert run.leftovers() == []


def test_one_gpu_first_server_crash_stops_before_the_second_starts(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_EAGLE": "crash-start"}
    with launched(tmp_path, *SHORT, "--gpus", "0", env=env) as (run, _):
        assert run.wait(60) == 1
        assert "eagle server [eagle gpu0] exited with code 1 during start-up" in run.err
        assert "baseline" not in (tmp_path / "starts.log").read_text()
        assert run.leftovers() == []
