"""``dynspec-bench gpu run`` on a CPU: a fake SGLang bundle whose servers are dynspec-sim.

The whole attempt runs as on the GPU machine (bundle unpacked, servers started by dynspec-launch
on "one GPU", router checks, sweeps, results, stop); bad input stops it with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_fake_site import fake_path, make_bundle, make_models
from utils import free_port

from dynspec.bench.gpu.leftovers import tagged_pids


def gpu_run(tmp: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = fake_path(tmp)
    ports = f"{free_port()},{free_port()},{free_port()}"
    argv = [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--out", str(tmp / "out")]
    # One short run per point: the plans' steady defaults (3 repeats, 15 s levels) are the GPU's.
    argv += ["--work", str(tmp / "work"), "--ports", ports, "--repeats", "1", "--min-seconds", "0"]
    argv += [*extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp, check=False
    )


def test_main_plan_launches_checks_sweeps_and_leaves_nothing_running(tmp_path: Path) -> None:
    bundle, models = make_bundle(tmp_path), make_models(tmp_path)
    done = gpu_run(
        tmp_path, "--bundle", str(bundle), "--models", str(models), "--levels", "1,8",
        "--threshold", "4", "--hysteresis", "1", "--budget", "200",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    meta = json.loads((out / "meta.json").read_text())
    assert [c["ok"] for c in meta["checks"]] == [True] * 8, meta["checks"]
    assert meta["versions"]["sglang"] == "0.5.17"
    # Both servers on GPU 0, one after the other, each with its share of the memory.
    eagle_cmd, baseline_cmd, _router = meta["commands"]
    for cmd in (eagle_cmd, baseline_cmd):
        assert cmd.startswith("CUDA_VISIBLE_DEVICES=0 ")
        assert "--tp-size 1" in cmd and "--mem-fraction-static" in cmd
        assert "--max-total-tokens" in cmd  # sized from the fake 143771 MiB and config.json
    launcher_out = (tmp_path / "work" / "logs" / "launcher.log").read_text()
    assert launcher_out.index("[eagle gpu0] healthy") < launcher_out.index(
        "[baseline gpu0] starting now"
    )
    rows = [json.loads(line) for line in (out / "sweep-main.jsonl").read_text().splitlines()]
    assert {(r["target"], r["max_concurrency"]) for r in rows} == {
        (t, c) for t in ("eagle", "baseline", "routed") for c in (1, 8)
    }
    assert all(r["failed"] == 0 for r in rows)
    assert (out / "sweep-main.md").exists() and (out / "sweep-main.png").exists()
    assert (out / "logs.tar.gz").exists()
    assert meta["launcher_exit"] == 130 and meta["leftovers_killed"] == []
    assert tagged_pids(meta.get("tag", "none")) == []


def one_line_failure(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()
    assert len(err) == 1, done.stderr
    assert err[0].startswith("dynspec-bench gpu run: error: ")
    for part in parts:
        assert part in err[0], err[0]


def test_missing_bundle_is_one_line(tmp_path: Path) -> None:
    done = gpu_run(tmp_path, "--bundle", str(tmp_path / "nope.tar.xz"), "--budget", "30")
    one_line_failure(done, "nope.tar.xz does not exist")


def test_broken_bundle_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.xz"
    bad.write_bytes(b"not an archive")
    done = gpu_run(tmp_path, "--bundle", str(bad), "--budget", "30")
    one_line_failure(done, "is broken")


def test_model_that_does_not_load_is_one_line(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path)
    (tmp_path / "empty").mkdir()
    done = gpu_run(tmp_path, "--bundle", str(bundle), "--models", str(tmp_path / "empty"))
    one_line_failure(done, "no readable config.json")


@pytest.mark.parametrize("plan", ["main", "levels"])
def test_server_that_dies_at_start_is_one_line_naming_its_log(tmp_path: Path, plan: str) -> None:
    bundle, models = make_bundle(tmp_path, crash=True), make_models(tmp_path)
    done = gpu_run(
        tmp_path,
        "--plan",
        plan,
        "--bundle",
        str(bundle),
        "--models",
        str(models),
        "--budget",
        "900",
    )
    log = "eagle.log" if plan == "main" else "eagle_adaptive.log"
    one_line_failure(done, "exited with code", str(tmp_path / "work" / "logs" / log))
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["leftovers_killed"] == []


def test_levels_plan_starts_each_eagle_server_in_turn_and_sweeps_it(tmp_path: Path) -> None:
    bundle, models = make_bundle(tmp_path), make_models(tmp_path)
    done = gpu_run(
        tmp_path, "--plan", "levels", "--servers", "eagle_adaptive,eagle_p81",
        "--bundle", str(bundle), "--models", str(models), "--levels", "1", "--budget", "900",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert list(meta["level_servers"]) == ["eagle_adaptive", "eagle_p81"]
    adaptive = meta["level_servers"]["eagle_adaptive"]["argv"]
    config = adaptive[adaptive.index("--speculative-adaptive-config") + 1]
    assert "--speculative-adaptive" in adaptive
    assert json.loads(Path(config).read_text())["64"]["candidate_steps"] == [0]
    rows = (tmp_path / "out" / "sweep-levels.jsonl").read_text().splitlines()
    assert [json.loads(r)["target"] for r in rows] == ["eagle_adaptive", "eagle_p81"]
    assert meta["leftovers_killed"] == []


def test_unknown_level_server_is_one_line(tmp_path: Path) -> None:
    done = gpu_run(
        tmp_path, "--plan", "levels", "--servers", "eagle_nope",
        "--bundle", str(make_bundle(tmp_path)), "--budget", "60",
    )  # fmt: skip
    one_line_failure(done, "--servers: unknown server 'eagle_nope'")
