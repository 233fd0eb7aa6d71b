"""Every SGLang command the launcher builds must pass SGLang's own parser, in two releases.

The pinned release (launcher/sglang-requirements.txt) and 0.5.17, the newest release built for
torch 2.11 (what some GPU images carry; the measured H200 run used it): every flag the launcher
writes exists in both, so the commands are the same. Each parser lives in a separate venv without
the GPU stack (.ci/install-sglang-parser [VERSION] makes .venv-sglang and .venv-sglang-0.5.17);
its python is found through DYNSPEC_SGLANG_PYTHON / DYNSPEC_SGLANG_0_5_17_PYTHON or in the venv.
All argvs are parsed in one subprocess, because importing sglang.srt.server_args takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from launch_cases import CASES

from dynspec.launcher.config import load_config
from dynspec.launcher.probe import sglang_version
from dynspec.launcher.spec import SGLANG_MODULE, build_specs

ROOT = Path(__file__).resolve().parents[2]

PARSE = r"""
import argparse, contextlib, io, json, sys
import sglang
from sglang.srt.server_args import ServerArgs

results = {"version": sglang.__version__, "parsed": []}
for argv in json.load(sys.stdin):
    p = argparse.ArgumentParser(prog="sglang")
    ServerArgs.add_cli_args(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
        results["parsed"].append({"ok": True, "values": {k: v for k, v in vars(ns).items()
                                  if isinstance(v, (int, float, str, bool, type(None)))}})
    except SystemExit as exc:
        results["parsed"].append({"ok": False, "code": exc.code, "stderr": err.getvalue()})
json.dump(results, sys.stdout)
"""


OLDER = "0.5.17"


def sglang_python(release: str) -> Path | None:
    if release == "pinned":
        explicit = os.environ.get("DYNSPEC_SGLANG_PYTHON")
        venv = ".venv-sglang"
    else:
        explicit = os.environ.get(f"DYNSPEC_SGLANG_{release.replace('.', '_')}_PYTHON")
        venv = f".venv-sglang-{release}"
    path = Path(explicit) if explicit else ROOT / venv / "bin" / "python"
    return path if path.exists() else None


@pytest.fixture(scope="module", params=["pinned", OLDER])
def parse(request: pytest.FixtureRequest) -> Any:
    release: str = request.param
    python = sglang_python(release)
    if python is None:
        what = "" if release == "pinned" else f" {release}"
        reason = (
            f"SGLang{what}'s parser is not installed: run `bash .ci/install-sglang-parser{what}`"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must install it)")
        pytest.skip(reason)

    def run(argvs: list[list[str]]) -> dict[str, Any]:
        done = subprocess.run(
            [str(python), "-c", PARSE],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        result: dict[str, Any] = json.loads(done.stdout)
        result["release"] = release
        return result

    return run


def sglang_argv(argv: tuple[str, ...]) -> list[str]:
    i = argv.index(SGLANG_MODULE)
    return list(argv[i + 1 :])


def test_every_built_command_parses_with_the_meant_values(parse: Any) -> None:
    jobs: list[tuple[str, str, dict[str, object]]] = []
    argvs: list[list[str]] = []
    for case in CASES:
        for spec in build_specs(load_config(case.argv, environ={}))[:2]:
            jobs.append((case.name, spec.name, case.expect.get(spec.name, {})))
            argvs.append(sglang_argv(spec.argv))
    # A flag the release does not have must be rejected, or this check proves nothing: the pinned
    # release removed --cuda-graph-max-bs (0.5.17 still takes it, as an alias).
    result = parse([*argvs, ["--model-path", "m", "--cuda-graph-max-bs", "8"]])
    pinned = result["release"] == "pinned"
    assert result["version"] == (sglang_version() if pinned else OLDER)
    *parsed, old_flag = result["parsed"]
    for (case, pool, expect), argv, got in zip(jobs, argvs, parsed, strict=True):
        assert got["ok"], (
            f"{case} / {pool}: SGLang {result['version']} rejected {argv}: {got['stderr']}"
        )
        for attr, value in expect.items():
            assert got["values"][attr] == value, (case, pool, attr, result["version"])
    if pinned:
        assert not old_flag["ok"] and old_flag["code"] == 2
        assert "--cuda-graph-max-bs" in old_flag["stderr"]
    else:
        assert old_flag["ok"] and old_flag["values"]["cuda_graph_max_bs_decode"] == 8
        unknown = parse([["--model-path", "m", "--no-such-flag"]])["parsed"][0]
        assert not unknown["ok"] and unknown["code"] == 2
