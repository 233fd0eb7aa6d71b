"""``plan(config, facts)``: a table of command lines and fake facts in, the plan's key fields out.

Nothing here asks the machine: the facts are the flags' (``flag_facts``) with what a launch
would have found laid on top, as ``discover`` would have made them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from launch_cases import LLAMA_8B

from dynspec.common.cli import UsageError
from dynspec.launcher.config import load_config
from dynspec.launcher.facts import LaunchFacts, flag_facts
from dynspec.launcher.plan import LaunchPlan, plan
from dynspec.launcher.sim.profile import load_profile
from dynspec.launcher.spec import ProcessSpec

MODEL = ["--model-path", "org/m", "--draft-model-path", "org/d"]
H200 = {"gpu_memory_gib": 140.0, "target_config": LLAMA_8B, "target_weight_bytes": 16 << 30}


def _flag(spec: ProcessSpec, flag: str) -> str | None:
    return spec.option(flag)


def summary(launch: LaunchPlan) -> dict[str, Any]:
    """The fields the table checks, by spec key."""
    router = launch.router
    return {
        "keys": [s.key for s in launch.specs],
        "after": {s.key: s.after for s in launch.specs if s.after},
        "devices": {s.key: dict(s.env).get("CUDA_VISIBLE_DEVICES") for s in launch.servers},
        "ports": {s.key: s.port for s in launch.specs},
        "tp": {s.key: _flag(s, "--tp-size") for s in launch.servers if s.name != "pair"},
        "mem": {s.key: _flag(s, "--mem-fraction-static") for s in launch.servers},
        "kv": {s.key: _flag(s, "--max-total-tokens") for s in launch.servers},
        "restart_mem": {s.key: s.second_argv != () for s in launch.servers if s.partner},
        "eagle_limit": next(
            (_flag(s, "--max-running-requests") for s in launch.servers if s.name == "eagle"), None
        ),
        "router": None if router is None else [a for a in router.argv if a.startswith("http")],
        "profile": None if router is None else _flag(router, "--speed-profile"),
        "calibration": launch.calibration.action,
        "daemons": [d.gpu_set for d in launch.daemons],
        "mps_dirs": {
            s.key: dict(s.env).get("CUDA_MPS_PIPE_DIRECTORY", "").rsplit("/", 2)[-2:-1]
            for s in launch.servers
        },
        "notes": [n.split(":")[0] for n in launch.notes],
        "pair_note": launch.pair_note is not None,
        "warnings": len(launch.warnings),
        "refusal": launch.refusal,
    }


@dataclass(frozen=True)
class Row:
    name: str
    argv: list[str]
    found: dict[str, Any]  # the facts a launch would have found, over the flags' own
    expect: dict[str, Any] = field(default_factory=dict)


ROWS = [
    Row(
        "simulated split: two simulators, the router last",
        ["--simulate"],
        {},
        {
            "keys": ["eagle", "baseline", "router"],
            "after": {},
            "devices": {"eagle": None, "baseline": None},
            "ports": {"eagle": 30001, "baseline": 30002, "router": 8000},
            "router": ["http://127.0.0.1:30001", "http://127.0.0.1:30002"],
            "calibration": "skip",
            "daemons": [],
            "notes": [],
        },
    ),
    Row(
        "simulated pairs: one simulator per GPU set",
        ["--simulate", "--layout", "paired", "--gpus", "0-1", "--mps"],
        {},
        {
            "keys": ["pair0", "pair1", "router"],
            "ports": {"pair0": 30001, "pair1": 30003, "router": 8000},
            "daemons": [],  # the simulator shares by itself
            "notes": ["# pair 0", "# pair 1"],
        },
    ),
    Row(
        "eight GPUs split: tp 4 each, no memory shares",
        ["--gpus", "0-7", *MODEL],
        {},
        {
            "keys": ["eagle", "baseline", "router"],
            "devices": {"eagle": "0,1,2,3", "baseline": "4,5,6,7"},
            "tp": {"eagle": "4", "baseline": "4"},
            "mem": {"eagle": None, "baseline": None},
            "eagle_limit": "12",
            "calibration": "skip",
            "pair_note": False,
        },
    ),
    Row(
        "the launcher's own CUDA_VISIBLE_DEVICES: indices count within it",
        ["--gpus", "0-1", *MODEL],
        {"visible": ("4", "5")},
        {"devices": {"eagle": "4", "baseline": "5"}},
    ),
    Row(
        "two pairs of tp 4 on H200s: halves of each GPU, KV sized, baseline after EAGLE",
        ["--gpus", "0-7", "--layout", "paired", "--tp", "4", *MODEL],
        H200,
        {
            "keys": ["eagle0", "baseline0", "eagle1", "baseline1", "router"],
            "after": {"baseline0": "eagle0", "baseline1": "eagle1"},
            "devices": {
                "eagle0": "0,1,2,3",
                "baseline0": "0,1,2,3",
                "eagle1": "4,5,6,7",
                "baseline1": "4,5,6,7",
            },
            "ports": {
                "eagle0": 30001,
                "baseline0": 30002,
                "eagle1": 30003,
                "baseline1": 30004,
                "router": 8000,
            },
            "mem": {"eagle0": "0.44", "baseline0": "0.796", "eagle1": "0.44", "baseline1": "0.796"},
            "kv": {
                "eagle0": "1789000",
                "baseline0": "1789000",
                "eagle1": "1789000",
                "baseline1": "1789000",
            },
            "restart_mem": {"eagle0": True, "eagle1": True},
            "router": [
                "http://127.0.0.1:30001,http://127.0.0.1:30002",
                "http://127.0.0.1:30003,http://127.0.0.1:30004",
            ],
            "notes": [
                "# pair 0",
                "# pair 1",
                "# each pair's baseline server starts once its EAGLE server is healthy",
            ],
            "pair_note": False,
        },
    ),
    Row(
        "one GPU of unknown memory: fractions only, the pair check skipped with a note",
        ["--gpus", "0", *MODEL],
        {},
        {
            "keys": ["eagle", "baseline", "router"],
            "after": {"baseline": "eagle"},
            "kv": {"eagle": None, "baseline": None},
            "mem": {"eagle": "0.44", "baseline": "0.804"},
            "pair_note": True,
        },
    ),
    Row(
        "one GPU, threshold auto: measured before the router starts, EAGLE at SGLang's cap",
        ["--gpus", "0", "--threshold", "auto", *MODEL],
        {**H200, "sglang_version": "SGLang 0.5.23", "gpu_name": "NVIDIA H200"},
        {"calibration": "measure", "eagle_limit": "48", "profile": None},
    ),
    Row(
        "--mps on real GPUs: one daemon per pair, its servers its clients",
        ["--gpus", "0-3", "--layout", "paired", "--tp", "2", "--mps", *MODEL],
        {**H200, "mps_control": "/usr/bin/nvidia-cuda-mps-control"},
        {
            "daemons": [0, 1],
            "devices": {"eagle0": "0,1", "baseline0": "0,1", "eagle1": "0,1", "baseline1": "0,1"},
            "mps_dirs": {
                "eagle0": ["mps0"],
                "baseline0": ["mps0"],
                "eagle1": ["mps1"],
                "baseline1": ["mps1"],
            },
            "notes": [
                "# pair 0",
                "# pair 1",
                "# each pair's baseline server starts once its EAGLE server is healthy",
                "# MPS pair 0, before its servers",
                "# MPS pair 0, after its servers",
                "# MPS pair 1, before its servers",
                "# MPS pair 1, after its servers",
            ],
        },
    ),
    Row(
        "--no-router: servers only",
        ["--gpus", "0-1", "--no-router", *MODEL],
        {},
        {"keys": ["eagle", "baseline"], "router": None, "notes": ["# --no-router"]},
    ),
    Row(
        "odd tp: one warning",
        ["--gpus", "0-5", *MODEL],
        {"target_config": LLAMA_8B},
        {"tp": {"eagle": "3", "baseline": "3"}, "warnings": 1},
    ),
    Row(
        "the checks' findings: the first failure is the refusal",
        ["--gpus", "0-1", *MODEL],
        {"checked": True, "listed_gpus": (0, 1), "path_kinds": ("none", "none")},
        {"refusal": None},
    ),
    Row(
        "a GPU the machine does not have",
        ["--gpus", "0-3", *MODEL],
        {"checked": True, "listed_gpus": (0, 1), "path_kinds": ("none", "none")},
        {
            "refusal": "GPU 2 is not on this machine: nvidia-smi lists 2 GPU(s) (0,1), the launch "
            "needs 0-3"
        },
    ),
    Row(
        "a port taken, after every other check passed",
        ["--gpus", "0-1", *MODEL],
        {
            "checked": True,
            "listed_gpus": (0, 1),
            "path_kinds": ("none", "none"),
            "ports_taken": ("port 8000 (router) is already in use on 127.0.0.1",),
        },
        {"refusal": "port 8000 (router) is already in use on 127.0.0.1"},
    ),
]


def facts_of(argv: list[str], found: dict[str, Any], tmp: Path) -> tuple[Any, LaunchFacts]:
    found = dict(found)
    visible = found.pop("visible", None)
    config = load_config([*argv, "--log-dir", str(tmp)], {})
    if visible is not None:
        config = dataclasses.replace(config, visible_gpus=visible)
    facts = flag_facts(config)
    if config.simulate and config.calibration_off() is None:
        found.setdefault("sim_profile", load_profile(config.sim_profile))
    return config, dataclasses.replace(facts, **found)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_plan(row: Row, tmp_path: Path) -> None:
    config, facts = facts_of(row.argv, row.found, tmp_path)
    got = summary(plan(config, facts))
    assert {k: got[k] for k in row.expect} == row.expect


def test_plan_is_a_function_of_its_records(tmp_path: Path) -> None:
    """The same records in, the same plan out, and neither record changed."""
    config, facts = facts_of(["--gpus", "0-3", "--layout", "paired", "--mps", *MODEL],
                             {**H200, "mps_control": "/bin/mps"}, tmp_path)  # fmt: skip
    before = (dataclasses.replace(config), dataclasses.replace(facts))
    assert plan(config, facts) == plan(config, facts)
    assert (config, facts) == before


def test_a_cached_calibration_gives_the_router_its_profile(tmp_path: Path) -> None:
    argv = ["--simulate", "--threshold", "auto"]
    config, facts = facts_of(argv, {"sglang_version": "v", "gpu_name": "g"}, tmp_path)
    first = plan(config, facts)
    assert first.calibration.action == "measure" and first.calibration.path is not None
    cached = dataclasses.replace(
        load_profile("demo"),
        calibration={"key": dict(first.calibration.key), "measured_at": "then"},
    )
    again = plan(
        config, dataclasses.replace(facts, cached=((first.calibration.path.name, cached),))
    )
    assert again.calibration.action == "reuse"
    assert again.router is not None
    assert again.router.option("--speed-profile") == str(first.calibration.path)
    assert again.notes[-1] == f"# calibration: reusing {first.calibration.path} (measured then)"


def test_a_pair_too_large_for_its_gpus_is_a_usage_error(tmp_path: Path) -> None:
    big = {**H200, "gpu_memory_gib": 24.0}
    config, facts = facts_of(["--gpus", "0", *MODEL], big, tmp_path)
    with pytest.raises(UsageError, match="GiB short"):
        plan(config, facts)
