"""Every SGLang command the launcher builds must pass the pinned SGLang release's own parser.

SGLang's parser lives in a separate venv (.ci/install-sglang-parser makes .venv-sglang without the
GPU stack); its python is found through DYNSPEC_SGLANG_PYTHON or at .venv-sglang/bin/python. All
argvs are parsed in one subprocess, because importing sglang.srt.server_args takes seconds.
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
from dynspec.launcher.preflight import sglang_version
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


def sglang_python() -> Path | None:
    explicit = os.environ.get("DYNSPEC_SGLANG_PYTHON")
    path = Path(explicit) if explicit else ROOT / ".venv-sglang" / "bin" / "python"
    return path if path.exists() else None


@pytest.fixture(scope="module")
def parse() -> Any:
    python = sglang_python()
    if python is None:
        reason = "SGLang's parser is not installed: run `bash .ci/install-sglang-parser`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must install it)")
        pytest.skip(reason)

    def run(argvs: list[list[str]]) -> dict[str, Any]:
        done = subprocess.run(
            [str(python), "-c", PARSE],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        result: dict[str, Any] = json.loads(done.stdout)
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
    # The flag 0.5.23 removed must be rejected, or this check proves nothing.
    argvs.append(["--model-path", "m", "--cuda-graph-max-bs", "8"])
    result = parse(argvs)

    assert result["version"] == sglang_version()
    *parsed, removed = result["parsed"]
    for (case, pool, expect), argv, got in zip(jobs, argvs[:-1], parsed, strict=True):
        assert got["ok"], f"{case} / {pool}: SGLang rejected {argv}: {got['stderr']}"
        for attr, value in expect.items():
            assert got["values"][attr] == value, (case, pool, attr)
    assert not removed["ok"] and removed["code"] == 2
    assert "--cuda-graph-max-bs" in removed["stderr"]
