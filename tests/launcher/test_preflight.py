from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from utils import free_port

from dynspec.common.cli import UsageError
from dynspec.launcher.config import load_config
from dynspec.launcher.facts import discover
from dynspec.launcher.preflight import check_gpus, check_model_path, model_heads, run_preflight
from dynspec.launcher.probe import (
    list_gpus,
    model_config,
    path_kind,
    port_problem,
    sglang_requirement,
    sglang_version,
)


def test_pin_is_read_from_the_requirements_file() -> None:
    text = (Path(__file__).parents[2] / "launcher" / "sglang-requirements.txt").read_text()
    assert sglang_requirement() in text.splitlines()
    assert sglang_requirement() == f"sglang=={sglang_version()}"


def fake_smi(output: str) -> object:
    def run(argv: Sequence[str]) -> str:
        assert argv[0] == "nvidia-smi"
        return output

    return run


def test_list_gpus() -> None:
    assert list_gpus(fake_smi("0\n1\n2\n3\n")) == (0, 1, 2, 3)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="lists none"):
        list_gpus(fake_smi(""))  # type: ignore[arg-type]


def test_gpu_check() -> None:
    config = load_config(["--gpus", "0-7", "--model-path", "M", "--draft-model-path", "D"], {})
    check_gpus(config, range(8))
    with pytest.raises(UsageError, match=r"GPU 4 is not on this machine.*4 GPU\(s\) \(0-3\)"):
        check_gpus(config, range(4))


def check_path(value: str, flag: str) -> None:
    check_model_path(value, flag, path_kind(value))


def test_model_paths(tmp_path: Path) -> None:
    check_path(str(tmp_path), "--model-path")
    check_path("meta-llama/Llama-3.1-8B-Instruct", "--model-path")
    for bad in ("/no/such/model", "./model", "a/b/c", "just-a-name", "org/"):
        with pytest.raises(UsageError, match="not a hub id"):
            check_path(bad, "--model-path")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_path(str(tmp_path / "f"), "--draft-model-path")


def test_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        said = port_problem("127.0.0.1", port, "EAGLE server")
        assert said == f"port {port} (EAGLE server) is already in use on 127.0.0.1"
    assert port_problem("127.0.0.1", port, "EAGLE server") is None


def test_simulate_checks_ports_but_no_gpu() -> None:
    ports = [free_port() for _ in range(3)]
    argv = ["--simulate", "--host", "127.0.0.1", "--port", str(ports[0])]
    argv += ["--eagle-port", str(ports[1]), "--baseline-port", str(ports[2])]
    config = load_config(argv, {})
    assert run_preflight(config, discover(config)) == ((), None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[2]))
        s.listen()
        _, refusal = run_preflight(config, discover(config))
        assert refusal is not None and "baseline server" in refusal
    # Not looked at for --dry-run or --no-preflight.
    for off in ("--dry-run", "--no-preflight"):
        quiet = load_config([*argv, off], {})
        assert run_preflight(quiet, discover(quiet)) == ((), None)


def launch(tmp_path: Path, smi: str | None, *argv: str) -> subprocess.CompletedProcess[str]:
    """The real CLI with a fake nvidia-smi (or none) as the only thing on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\nprintf '{smi}'\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = str(bin_dir)
    fake = f"{sys.executable} -c pass"
    return subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", "--server-command", fake, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("smi", "argv", "reason"),
    [
        (None, ["--gpus", "0-7"], "nvidia-smi is not installed"),
        (None, [], "no --gpus given, and no NVIDIA GPU found"),
        ("", ["--gpus", "0-1"], "nvidia-smi lists none"),
        ("0\\n1\\n2\\n3\\n", ["--gpus", "0-7"], "GPU 4 is not on this machine"),
        ("0\\n1\\n2\\n", [], "3 GPUs cannot be split"),
        ("0\\n1\\n", ["--draft-model-path", "/nope"], "--draft-model-path /nope: no such"),
    ],
)
def test_preflight_failures_are_one_line_exit_2(
    tmp_path: Path, smi: str | None, argv: list[str], reason: str
) -> None:
    base = ["--model-path", "org/m", "--draft-model-path", "org/d", "--log-dir", str(tmp_path)]
    done = launch(tmp_path, smi, *base, *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and reason in done.stderr, done.stderr
    assert not (tmp_path / "eagle.log").exists()  # nothing was started


def test_check_gpus_compares_the_ids_the_visible_indices_stand_for() -> None:
    argv = ["--gpus", "0-1", "--model-path", "M", "--draft-model-path", "D"]
    config = load_config(argv, environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    check_gpus(config, [0, 1, 2, 3, 4, 5, 6, 7])
    with pytest.raises(UsageError, match="GPU 5 is not on this machine"):
        check_gpus(config, [0, 1, 2, 3, 4])
    uuids = load_config(argv, environ={"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    check_gpus(uuids, [0])  # nvidia-smi lists indices, not UUIDs: left to CUDA


def _model(tmp_path: Path, config: object) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_model_heads_from_a_local_config(tmp_path: Path) -> None:
    plain = _model(tmp_path, {"num_attention_heads": 32, "num_key_value_heads": 8})
    assert model_heads(model_config(str(plain))) == (32, 8)
    assert model_heads(model_config("org/model")) == (None, None)  # a hub id: nothing to read
    assert model_heads(model_config(str(tmp_path))) == (None, None)  # no config.json
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    assert model_heads(model_config(str(tmp_path / "bad"))) == (None, None)


def test_model_heads_of_a_multimodal_config(tmp_path: Path) -> None:
    folder = _model(tmp_path, {"text_config": {"num_attention_heads": 40}})
    assert model_heads(model_config(str(folder))) == (40, None)


def test_odd_tp_is_one_warning_line_in_dry_run(tmp_path: Path) -> None:
    folder = _model(tmp_path, {"num_attention_heads": 32, "num_key_value_heads": 8})
    argv = ["--model-path", str(folder), "--draft-model-path", "D", "--dry-run"]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dynspec.launcher", *argv, *extra],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    r = run("--gpus", "0-5")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, lines
    assert "warning: tp 3 (both servers)" in lines[0]
    assert "power of two" in lines[0] and "32 attention heads" in lines[0]
    assert len(r.stdout.splitlines()) == 3  # the commands themselves are all there
    r = run("--gpus", "0-7")
    assert (r.returncode, r.stderr) == (0, "")
    r = run("--eagle-gpus", "0-3", "--baseline-gpus", "4-9")
    assert "warning: tp 6 (the baseline server)" in r.stderr
    assert r.stderr.count("\n") == 1
