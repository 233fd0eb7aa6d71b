"""What `pip install dynspec` brings: the router, launcher and simulator need no bench extra."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
# Import name -> distribution name, where they differ.
DISTRIBUTION = {"prometheus_client": "prometheus-client", "tomli": "tomli"}
BENCH_ONLY = ("aiohttp", "matplotlib")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def _base() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return _names(data["project"]["dependencies"])


def _extra(name: str) -> set[str]:
    lines = (ROOT / name).read_text().splitlines()
    return _names([x for x in lines if x.strip() and not x.lstrip().startswith("#")])


def _third_party_imports(folder: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "dynspec":
                    found.add(DISTRIBUTION.get(top, top))
    return found


@pytest.mark.parametrize("folder", ["common", "router", "launcher"])
def test_every_import_of_the_runtime_is_a_base_dependency(folder: str) -> None:
    assert _third_party_imports(folder) <= _base()


def test_base_install_pulls_no_bench_extra() -> None:
    base = _base()
    assert not base & set(BENCH_ONLY)
    assert "starlette" in base  # the router imports it directly, not only through FastAPI
    # Building the GPU test models needs torch and the tokenizer libraries: they are where that
    # runs (a GPU machine), never installed by an extra.
    gpu_models = {"torch", "safetensors", "tokenizers", "transformers"}
    assert _third_party_imports("bench") <= base | _extra("bench/requirements.txt") | gpu_models
    # The tests need the benches' extra too: tests/requirements.txt pulls it in.
    assert "dynspec[bench]" in (ROOT / "tests" / "requirements.txt").read_text().split()


def _without_bench_extra(code: str) -> subprocess.CompletedProcess[str]:
    # As if aiohttp and matplotlib were not installed: importing either raises ImportError.
    blocker = f"import sys; sys.modules.update(dict.fromkeys({BENCH_ONLY!r})); "
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(
        [sys.executable, "-c", blocker + code],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("dynspec.router.cli", ["--help"]),
        ("dynspec.launcher.sim.cli", ["--help"]),
        ("dynspec.launcher.cli", ["--help"]),
        ("dynspec.launcher.cli", ["--simulate", "--dry-run"]),
        ("dynspec.bench.cli", ["--help"]),
    ],
)
def test_commands_run_without_the_bench_extra(module: str, argv: list[str]) -> None:
    r = _without_bench_extra(f"sys.argv = ['x', *{argv!r}]; from {module} import main; main()")
    assert r.returncode == 0, r.stderr
    assert r.stdout and not r.stderr


@pytest.mark.parametrize("command", ["sweep", "envelope", "traffic"])
def test_bench_command_without_its_extra_says_what_to_install(command: str) -> None:
    r = _without_bench_extra(
        f"sys.argv = ['x', {command!r}, '--url', 'http://127.0.0.1:9']; "
        "from dynspec.bench.cli import main; main()"
    )
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"dynspec-bench {command} needs the bench extra" in r.stderr
    assert "pip install 'dynspec[bench]'" in r.stderr


def test_bench_commands_that_read_files_run_without_the_extra() -> None:
    sweep = str(ROOT / "bench" / "results" / "h200" / "h200-8b.jsonl")
    argv = ["suggest-threshold", sweep, sweep, "--eagle-target", "eagle"]
    argv += ["--baseline-target", "baseline"]
    r = _without_bench_extra(
        f"sys.argv = ['x', *{argv!r}]; from dynspec.bench.cli import main; main()"
    )
    assert r.returncode == 0, r.stderr
    assert "--threshold" in r.stdout
