"""The eight-GPU plan without a GPU: ``--dry-run``'s commands for every layout, the 70B-shaped
model's shards and size, and the paired-against-the-rest ratios its report computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.bench.gpu import eight, models70b
from dynspec.bench.gpu.eight import LAYOUTS as EIGHT_LAYOUTS
from dynspec.bench.report import stats

MULTICAST_OFF = (
    "NCCL_NVLS_ENABLE=0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
    "NVSHMEM_DISABLE_NVLS=1",
)


def gpu_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--plan", "eight", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def sections(tmp: Path) -> dict[str, list[str]]:
    done = gpu_run("--layout", "all", "--dry-run", "--out", str(tmp / "o"), "--work", str(tmp))
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("# ") and not line.startswith("# then"):
            current = found.setdefault(line[2:], [])
        elif not line.startswith("#"):
            current.append(line)
    return found


def test_dry_run_prints_every_layout_and_starts_nothing(tmp_path: Path) -> None:
    found = sections(tmp_path)
    assert list(found) == list(EIGHT_LAYOUTS)
    assert not (tmp_path / "o").exists() and not (tmp_path / "models").exists()


def test_every_server_runs_with_nvlink_multicast_off_at_tp_4(tmp_path: Path) -> None:
    found = sections(tmp_path)
    servers = [
        ln for layout, lines in found.items() if layout != "build" for ln in lines
        if "sglang.launch_server" in ln or "dynspec.launcher" in ln
    ]  # fmt: skip
    assert len(servers) == 3 + 2 * 3
    for line in servers:
        assert all(v in line.split() for v in MULTICAST_OFF), line
        if "sglang.launch_server" in line:
            assert "--tp-size 4" in line
            assert line.startswith(
                ("CUDA_VISIBLE_DEVICES=0,1,2,3 ", "CUDA_VISIBLE_DEVICES=4,5,6,7 ")
            )


def test_layouts_use_the_launcher_layout_flags_and_the_router_pools(tmp_path: Path) -> None:
    found = sections(tmp_path)
    (split,) = found["split"]
    (paired,) = found["paired"]
    (mps,) = found["paired-mps"]
    assert "--gpus 0-7 --layout split " in split and "--threshold auto" in split
    assert "--layout paired --tp 4 " in paired and "--threshold auto" in paired
    assert "--mps" not in paired.split() and mps.split()[-1] == "--mps"
    assert all("llama70b" in ln for ln in (split, paired, mps))
    for layout, pool in (("2x-eagle", "--eagle-url"), ("2x-baseline", "--baseline-url")):
        *servers, router = found[layout]
        assert len(servers) == 2 and "dynspec.router" in router and f"{pool} " in router
    assert all("EAGLE3" not in ln for ln in found["2x-baseline"])
    adaptive = found["2x-adaptive"][:2]
    assert all("--speculative-adaptive " in ln and "EAGLE3" in ln for ln in adaptive)
    # Eight writers side by side (one per GPU), then the drafts.
    assert sum("build_shards" in ln for ln in found["build"]) == 8
    assert "hi p54" in found["build"][-1]


def test_bad_layouts_are_usage_errors(tmp_path: Path) -> None:
    for args in (["--layout", "all"], ["--layout", "triple", "--dry-run"]):
        done = gpu_run(*args, "--out", str(tmp_path / "o"))
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_70b_shards_cover_every_tensor_once_and_split_between_writers() -> None:
    index = models70b.shard_names()
    assert len(index) == 2 + 9 * models70b.LAYERS + 1
    files = set(index.values())
    assert len(files) == models70b.LAYERS + 2
    parts = [set(models70b.shards_of(w, 8)) for w in range(8)]
    assert set().union(*parts) == files
    assert sum(len(p) for p in parts) == len(files)  # disjoint
    assert 135e9 < models70b.target_bytes() < 145e9  # Llama-3.1-70B in bf16: about 141 GB


def test_the_70b_configs_have_llama_3_1_70b_shapes() -> None:
    cfg = models70b.target_config()
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (
        8192,
        80,
        28672,
    )
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (64, 8)
    draft = models70b.draft_config(1024)
    aux = draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert all(0 <= i < cfg["num_hidden_layers"] for i in aux)
    assert draft["draft_vocab_size"] == 1024 and draft["num_hidden_layers"] == 1


@pytest.mark.parametrize("paired", [13000.0, 9000.0])
def test_eight_report_compares_paired_with_the_best_other_layout(
    tmp_path: Path, paired: float
) -> None:
    rows = [
        {"target": t, "max_concurrency": 64, "output_throughput": v}
        for t, v in (("split", 8000.0), ("2x-eagle", 9500.0), ("2x-baseline", 12000.0),
                     ("2x-adaptive", 7000.0), ("paired", paired))
    ]  # fmt: skip
    path = tmp_path / "sweep-eight.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    text = eight.eight_markdown([path])
    ratio = f"{paired / 12000:.2f}"
    assert f"| 64 | {ratio} | {ratio} | 2x-baseline |" in text
    assert set(stats(rows, "output_throughput")) == {
        "split",
        "2x-eagle",
        "2x-baseline",
        "2x-adaptive",
        "paired",
    }


def test_a_two_server_layout_starts_both_sweeps_its_router_and_stops_all(tmp_path: Path) -> None:
    from gpu_fake_site import fake_path, make_bundle, make_models
    from utils import free_port

    from dynspec.bench.gpu.leftovers import tagged_pids

    models = make_models(tmp_path)
    (models / models70b.TARGET).mkdir()
    (models / models70b.TARGET / ".done").write_text("")  # built: no torch on this machine
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["PATH"] = fake_path(tmp_path)
    ports = f"{free_port()},{free_port()},{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "dynspec.bench", "gpu", "run", "--plan", "eight",
         "--layout", "2x-eagle", "--levels", "1,8", "--bundle", str(make_bundle(tmp_path)),
         "--models", str(models), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
         "--ports", ports, "--budget", "200", "--repeats", "1", "--min-seconds", "0"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert set(meta["ready_s"]) == {"eagle0", "eagle1", "router"}
    assert sum(ln.startswith("CUDA_VISIBLE_DEVICES=") for ln in meta["commands"]) == 2
    rows = (tmp_path / "out" / "sweep-eight.jsonl").read_text().splitlines()
    assert {json.loads(r)["target"] for r in rows} == {"2x-eagle"} and len(rows) == 2
    assert "2x-eagle" in meta["learned"]
    assert meta["leftovers_killed"] == [] and tagged_pids(meta["tag"]) == []
