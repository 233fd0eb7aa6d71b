"""The measured H200 run as a test (off by default): real SGLang on one GPU, through the launcher.

Run by hand where a GPU and torch are (its results are committed in bench/results/h200/):

    DYNSPEC_TEST_BUNDLE=.gpu/sgl-site.tar.xz pytest -m gpu tests/bench/test_gpu_real.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_one_gpu_launch_passes_the_router_checks_and_sweeps(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--plan", "main"]
    argv += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    argv += ["--levels", "1,16,64"]
    bundle = os.environ.get("DYNSPEC_TEST_BUNDLE")
    if bundle:
        argv += ["--bundle", bundle]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert all(c["ok"] for c in meta["checks"]), meta["checks"]
    assert meta["accept_main"]["spec_accept_length"] == pytest.approx(4.0, abs=0.05)
    rows = (tmp_path / "out" / "sweep-main.jsonl").read_text().splitlines()
    assert {json.loads(r)["target"] for r in rows} == {"eagle", "baseline", "routed"}
    assert meta["leftovers_killed"] == []
