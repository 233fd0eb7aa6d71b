"""``dynspec-bench gpu run`` on a CPU: a fake SGLang bundle whose servers are dynspec-sim.

The attempt's set-up runs as on the GPU machine (bundle unpacked, models checked, servers started
by dynspec-launch on "one GPU"); bad input stops it with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpu_fake_site import fake_path, make_bundle, make_models
from utils import free_port


def gpu_run(tmp: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = fake_path(tmp)
    ports = f"{free_port()},{free_port()},{free_port()}"
    argv = [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--out", str(tmp / "out")]
    # One short run per point: the plans' steady defaults (3 repeats, 15 s levels) are the GPU's.
    argv += ["--work", str(tmp / "work"), "--ports", ports, "--repeats", "1", "--min-seconds", "0"]
    argv += ["--plan", "pair-a", *extra]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp, check=False
    )


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


def test_server_that_dies_at_start_is_one_line_naming_its_log(tmp_path: Path) -> None:
    bundle, models = make_bundle(tmp_path, crash=True), make_models(tmp_path)
    done = gpu_run(tmp_path, "--bundle", str(bundle), "--models", str(models), "--budget", "900")
    one_line_failure(done, "exited with code", str(tmp_path / "work" / "logs" / "eagle.log"))
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["leftovers_killed"] == []
