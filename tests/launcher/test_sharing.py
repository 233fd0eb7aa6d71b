"""Both servers on one GPU: the memory arithmetic and what the launcher builds from it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from launch_cases import LLAMA_8B

from dynspec.launcher.config import load_config
from dynspec.launcher.facts import flag_facts
from dynspec.launcher.probe import model_config
from dynspec.launcher.sharing import (
    GIB,
    ModelShape,
    plan_shared_gpu,
    shape_from_config,
    shape_of,
)
from dynspec.launcher.spec import build_specs, shares_gpu


def test_llama_8b_shape_matches_its_published_size() -> None:
    shape = shape_from_config(LLAMA_8B)
    assert shape.params == 8_030_261_248  # Llama-3.1-8B: 8.03B parameters
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, bf16


def test_eagle3_draft_shape_counts_its_one_layer_and_small_head() -> None:
    full = shape_from_config({**LLAMA_8B, "num_hidden_layers": 1}, draft=True)
    small = shape_from_config(
        {**LLAMA_8B, "num_hidden_layers": 1, "draft_vocab_size": 32000}, draft=True
    )
    assert full.kv_bytes_per_token == 2 * 8 * 128 * 2
    assert full.params - small.params == (128256 - 32000) * 4096
    # One layer reading 2 x hidden, fc from three layers, lm_head: under a tenth of the target.
    assert 0.5e9 < full.params < 0.9e9


def test_plan_on_an_h200_sizes_both_kv_caches_alike() -> None:
    target = shape_from_config(LLAMA_8B)
    draft = shape_from_config({**LLAMA_8B, "num_hidden_layers": 1}, draft=True)
    gpu = 143771 / 1024
    plan = plan_shared_gpu(gpu, target, draft)
    assert plan.max_total_tokens is not None
    # The EAGLE server's static part: weights of both models, its KV, graphs: half the GPU
    # minus the activation reserve, as a fraction of the (whole) GPU free at its start.
    eagle_static = (
        target.weight_bytes
        + draft.weight_bytes
        + plan.max_total_tokens * (target.kv_bytes_per_token + draft.kv_bytes_per_token)
    ) / GIB + 3.0
    assert eagle_static <= plan.eagle_fraction * gpu
    assert eagle_static > plan.eagle_fraction * gpu - 1.0  # not much left unused
    # The baseline starts second and sees what the EAGLE server left.
    left = gpu - plan.eagle_fraction * gpu - 1.0
    assert plan.baseline_fraction * left == pytest.approx(plan.eagle_fraction * gpu, rel=0.01)
    assert plan.eagle_fraction + plan.baseline_fraction * (1 - plan.eagle_fraction) < 0.95


def test_plan_without_gpu_memory_or_model_sets_fractions_only() -> None:
    shape = shape_from_config(LLAMA_8B)
    for plan in (plan_shared_gpu(None, shape, None), plan_shared_gpu(80.0, None, None)):
        assert plan.max_total_tokens is None
        assert 0.3 < plan.eagle_fraction < 0.5 < plan.baseline_fraction < 0.95


def test_plan_when_the_model_cannot_fit_twice() -> None:
    plan = plan_shared_gpu(24.0, shape_from_config(LLAMA_8B), None)
    assert plan.max_total_tokens is None
    assert "does not fit" in plan.note


def read_model_shape(path: str | None) -> ModelShape | None:
    return shape_of(model_config(path))


def test_read_model_shape_only_from_a_local_readable_config(tmp_path: Path) -> None:
    assert read_model_shape(None) is None
    assert read_model_shape("meta-llama/Llama-3.1-8B-Instruct") is None
    (tmp_path / "config.json").write_text("{not json")
    assert read_model_shape(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert read_model_shape(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, "hidden_size": "big"}))
    assert read_model_shape(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    assert read_model_shape(str(tmp_path)) == ModelShape(8_030_261_248, 131072)


def flags(argv: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[arg] = "" if nxt.startswith("--") else nxt
    return out


GPU = ["--model-path", "org/m", "--draft-model-path", "org/d"]


def test_one_gpu_runs_both_servers_on_it_with_their_memory_shares() -> None:
    config = load_config([*GPU, "--gpus", "3"], environ={})
    assert shares_gpu(config)
    eagle, baseline, _ = build_specs(config)
    assert (
        dict(eagle.env)["CUDA_VISIBLE_DEVICES"] == "3" == dict(baseline.env)["CUDA_VISIBLE_DEVICES"]
    )
    assert eagle.prefix == "[eagle gpu3]" and baseline.prefix == "[baseline gpu3]"
    e, b = flags(eagle.argv), flags(baseline.argv)
    assert e["--tp-size"] == b["--tp-size"] == "1"
    assert float(e["--mem-fraction-static"]) < 0.5 < float(b["--mem-fraction-static"])
    assert "--max-total-tokens" not in e  # a hub id: no config.json to size the KV cache from


def test_one_gpu_sizes_the_kv_cache_from_a_local_model(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA_8B))
    config = load_config(
        ["--gpus", "0", "--model-path", str(tmp_path / "m"), "--draft-model-path", "org/d"],
        environ={},
    )
    sized = dataclasses.replace(
        flag_facts(config),
        gpu_memory_gib=140.0,
        target_config=model_config(str(tmp_path / "m")),
    )
    eagle, baseline, _ = build_specs(config, sized)
    tokens = flags(eagle.argv)["--max-total-tokens"]
    assert tokens == flags(baseline.argv)["--max-total-tokens"]
    assert int(tokens) > 100_000


def test_user_flags_replace_the_shares() -> None:
    config = load_config(
        [*GPU, "--gpus", "0", "--eagle-args", "--mem-fraction-static 0.3 --max-total-tokens 9000"],
        environ={},
    )
    eagle, baseline, _ = build_specs(config)
    assert eagle.argv.count("--mem-fraction-static") == 1
    assert flags(eagle.argv)["--mem-fraction-static"] == "0.3"
    assert flags(eagle.argv)["--max-total-tokens"] == "9000"
    assert flags(baseline.argv)["--mem-fraction-static"] != "0.3"


def test_eight_gpus_keep_their_layout_and_no_memory_flags() -> None:
    config = load_config([*GPU, "--gpus", "0-7"], environ={})
    assert not shares_gpu(config)
    for spec in build_specs(config)[:2]:
        assert "--mem-fraction-static" not in spec.argv
        assert flags(spec.argv)["--tp-size"] == "4"


def test_the_same_single_gpu_may_be_named_for_both_servers_but_no_other_overlap() -> None:
    ok = load_config([*GPU, "--eagle-gpus", "1", "--baseline-gpus", "1"], environ={})
    assert shares_gpu(ok)
    from dynspec.common.cli import UsageError

    with pytest.raises(UsageError, match="GPU 1 is given to both"):
        load_config([*GPU, "--eagle-gpus", "0,1", "--baseline-gpus", "1"], environ={})


def test_gpu_memory_is_found_by_index_or_uuid_and_none_otherwise() -> None:
    from dynspec.launcher.probe import gpu_memory_gib

    def smi(argv: object) -> str:
        return "0, GPU-aaaa, 143771\n1, GPU-bbbb, 81559\n"

    assert gpu_memory_gib("0", smi) == pytest.approx(143771 / 1024)
    assert gpu_memory_gib("GPU-bbbb", smi) == pytest.approx(81559 / 1024)
    assert gpu_memory_gib("MIG-cccc", smi) is None
    assert gpu_memory_gib("0", lambda argv: "0, GPU-aaaa, [N/A]\n") is None
