"""What a launch finds apart from its flags (``facts.py``): asked once, only what the launch needs,
and what the flags alone say without asking anything."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from launch_cases import LLAMA_8B

from dynspec.launcher import probe
from dynspec.launcher.config import load_config
from dynspec.launcher.facts import discover, flag_facts

# --no-preflight: the checks before a start are their own questions (see the last test).
MODEL = ["--model-path", "org/m", "--draft-model-path", "org/d", "--no-preflight"]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The machine as four H200s; each question asked is noted."""
    calls: list[str] = []

    def memory(device: str) -> float:
        calls.append(f"memory {device}")
        return 140.0

    def names(devices: Sequence[str]) -> list[str]:
        calls.append(f"names {','.join(devices)}")
        return ["NVIDIA H200"]

    def gpus() -> tuple[int, ...]:
        calls.append("list")
        return (0, 1, 2, 3)

    monkeypatch.setattr(probe, "gpu_memory_gib", memory)
    monkeypatch.setattr(probe, "gpu_names", names)
    monkeypatch.setattr(probe, "list_gpus", gpus)
    monkeypatch.setattr(probe, "installed_sglang", lambda: "0.5.23")
    return calls


def test_split_gpus_given_asks_nothing(asked: list[str]) -> None:
    found = discover(load_config(["--gpus", "0-3", *MODEL], {}))
    assert asked == []
    assert found == flag_facts(load_config(["--gpus", "0-3", *MODEL], {}))
    (only,) = found.gpu_sets
    assert (only.eagle_gpus, only.baseline_gpus, found.shares_gpu) == ((0, 1), (2, 3), False)


def test_shared_gpus_read_memory_and_the_local_model(tmp_path: Path, asked: list[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "w.safetensors").write_bytes(b"x" * 100)
    argv = ["--gpus", "0-1", "--layout", "paired", "--model-path", str(tmp_path), "--no-preflight"]
    found = discover(load_config([*argv, "--draft-model-path", "org/d"], {}))
    assert asked == ["memory 0", "memory 1"]
    assert found.shares_gpu and found.gpu_memory_gib == 140.0
    assert found.target_shape is not None and found.target_weight_bytes == 100
    assert found.draft_shape is None and found.sglang_version is None  # no calibration here


def test_no_gpus_given_finds_them_and_a_calibration_names_them(asked: list[str]) -> None:
    found = discover(load_config(["--threshold", "auto", *MODEL], {}))
    assert asked == ["list", "names 0,1,2,3"]
    (only,) = found.gpu_sets
    assert (only.eagle_gpus, only.baseline_gpus) == ((0, 1), (2, 3))
    assert (found.sglang_version, found.gpu_name) == ("SGLang 0.5.23", "NVIDIA H200")
    asked.clear()
    never = discover(load_config(["--threshold", "auto", "--calibrate", "never", *MODEL], {}))
    assert asked == ["list"] and never.gpu_name is None


def test_simulated_launch_keys_its_calibration_by_the_profile(asked: list[str]) -> None:
    found = discover(load_config(["--simulate", "--threshold", "auto"], {}))
    assert asked == []
    assert found.sglang_version is not None and found.sglang_version.startswith("dynspec-sim ")
    assert found.gpu_name is not None and found.gpu_name.startswith("simulated (profile demo, ")
    other = discover(
        load_config(["--simulate", "--threshold", "auto", "--sim-profile", "seed"], {})
    )
    assert other.gpu_name != found.gpu_name


def test_a_launch_that_starts_asks_the_checks_questions_once(
    tmp_path: Path, asked: list[str]
) -> None:
    argv = ["--model-path", str(tmp_path), "--draft-model-path", "org/d", "--gpus", "0-3"]
    found = discover(load_config([*argv, "--port", "1", "--eagle-port", "2"], {}))
    assert asked == ["list"]  # nvidia-smi's list, for the GPU check
    assert found.checked and found.listed_gpus == (0, 1, 2, 3)
    assert found.path_kinds == ("dir", "none")
    asked.clear()
    detected = discover(load_config(argv[:4], {}))
    assert asked == ["list"]  # the GPUs found are the ones checked: asked once
    assert detected.listed_gpus == (0, 1, 2, 3)
    dry = discover(load_config([*argv, "--dry-run"], {}))
    assert not dry.checked and dry.ports_taken == ()
