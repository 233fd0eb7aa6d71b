"""The paired layout: pairs of GPU sets, their ports and names, the router's --pair flags,
--mps, --no-router, --threshold auto, and the check that two copies of the model fit (no process
started)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig, load_config
from dynspec.launcher.facts import LaunchFacts, discover, flag_facts
from dynspec.launcher.plan import plan
from dynspec.launcher.preflight import check_pair_fits
from dynspec.launcher.probe import weights_on_disk
from dynspec.launcher.sharing import GIB, pair_shortfall_gib
from dynspec.launcher.spec import build_specs

MODEL = ["--model-path", "org/m", "--draft-model-path", "org/d"]


def dry_run_notes(config: LaunchConfig, facts: LaunchFacts | None = None) -> tuple[str, ...]:
    """The comments --dry-run prints before the command lines."""
    return plan(config, facts or flag_facts(config)).notes


def flags(argv: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[arg] = "" if nxt.startswith("--") else nxt
    return out


def pair_args(argv: tuple[str, ...]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--pair"]


@pytest.mark.parametrize(("tp", "pairs"), [(4, 2), (2, 4), (1, 8)])
def test_eight_gpus_in_pairs_of_tp(tp: int, pairs: int) -> None:
    config = load_config(["--gpus", "0-7", "--layout", "paired", "--tp", str(tp), *MODEL], {})
    specs = build_specs(config)
    servers, router = specs[:-1], specs[-1]
    assert len(servers) == 2 * pairs and router.name == "router"
    for i in range(pairs):
        eagle, baseline = servers[2 * i], servers[2 * i + 1]
        gpus = ",".join(str(g) for g in range(i * tp, (i + 1) * tp))
        assert (
            dict(eagle.env)["CUDA_VISIBLE_DEVICES"]
            == gpus
            == dict(baseline.env)["CUDA_VISIBLE_DEVICES"]
        )
        assert (eagle.port, baseline.port) == (30001 + 2 * i, 30002 + 2 * i)
        assert eagle.prefix.startswith(f"[eagle{i} gpu") and baseline.key == f"baseline{i}"
        assert eagle.log_file.name == f"eagle{i}.log"
        # The baseline waits for its own pair's EAGLE server only; both get half the memory.
        assert eagle.after is None and baseline.after == f"eagle{i}"
        e, b = flags(eagle.argv), flags(baseline.argv)
        assert e["--tp-size"] == b["--tp-size"] == str(tp)
        assert float(e["--mem-fraction-static"]) < 0.5 < float(b["--mem-fraction-static"])
        assert "--speculative-algorithm" in e and "--speculative-algorithm" not in b
    assert pair_args(router.argv) == [
        f"http://127.0.0.1:{30001 + 2 * i},http://127.0.0.1:{30002 + 2 * i}" for i in range(pairs)
    ]
    assert "--eagle-url" not in router.argv and "--baseline-url" not in router.argv


def test_four_gpus_pairs_prefix_names_the_set() -> None:
    config = load_config(["--gpus", "0-7", "--layout", "paired", "--tp", "4", *MODEL], {})
    assert [s.prefix for s in build_specs(config)[:2]] == ["[eagle0 gpu0-3]", "[baseline0 gpu0-3]"]


def test_one_gpu_is_a_one_pair_paired_layout() -> None:
    for argv in (
        ["--gpus", "0"],
        ["--gpus", "0", "--layout", "paired"],
        ["--gpus", "0", "--layout", "split"],
    ):
        config = load_config([*argv, *MODEL], {})
        assert config.layout == "paired" and config.paired_gpus == ((0,),)
        eagle, baseline, router = build_specs(config)
        assert eagle.prefix == "[eagle gpu0]" and baseline.after == "eagle"
        assert pair_args(router.argv) == ["http://127.0.0.1:30001,http://127.0.0.1:30002"]


def test_split_stays_the_default_for_several_gpus() -> None:
    config = load_config(["--gpus", "0-7", *MODEL], {})
    assert config.layout == "split" and len(flag_facts(config).gpu_sets) == 1
    _, baseline, router = build_specs(config)
    assert "--eagle-url" in router.argv and "--pair" not in router.argv
    assert baseline.after is None


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--gpus", "0-7", "--layout", "paired", "--tp", "3"], "--tp 3 does not divide the 8"),
        (["--gpus", "0-7", "--tp", "2"], "--tp sets the GPUs of each pair"),
        (["--gpus", "0-7", "--mps"], "--mps shares a pair's GPUs"),
        (["--eagle-gpus", "0", "--baseline-gpus", "1", "--layout", "paired"], "takes --gpus"),
        (
            ["--gpus", "0-3", "--layout", "paired", "--baseline-port", "30003"],
            "port 30003 is both",
        ),
        (["--gpus", "0-1", "--layout", "paired", "--port", "30004"], "port 30004 is both"),
    ],
)
def test_bad_layouts_are_usage_errors(argv: list[str], reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        build_specs(load_config([*argv, *MODEL], {}))


def test_bad_tp_is_one_line_exit_2_from_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", "--dry-run", "--gpus", "0-7",
         "--layout", "paired", "--tp", "3", *MODEL],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--tp 3 does not divide" in done.stderr


def test_layout_flags_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "launch.toml"
    path.write_text('simulate = true\nlayout = "paired"\ngpus = "0-3"\ntp = 2\nmps = true\n')
    config = load_config(["--config", str(path)], {"DYNSPEC_NO_ROUTER": "true"})
    assert (config.layout, config.paired_gpus, config.mps, config.no_router) == (
        "paired", ((0, 1), (2, 3)), True, True,
    )  # fmt: skip
    env = {"DYNSPEC_LAYOUT": "paired", "DYNSPEC_TP": "4", "DYNSPEC_GPUS": "0-7"}
    assert len(load_config(MODEL, env).paired_gpus) == 2


def test_simulated_pair_is_one_simulator_process_with_both_ports() -> None:
    config = load_config(["--simulate", "--layout", "paired", "--mps"], {})
    (pair, router) = build_specs(config)
    f = flags(pair.argv)
    assert "--pair" in pair.argv and f["--sharing"] == "mps"
    assert (f["--eagle-port"], f["--baseline-port"]) == ("30001", "30002")
    assert pair.health_urls == (
        "http://127.0.0.1:30001/health_generate",
        "http://127.0.0.1:30002/health_generate",
    )
    assert pair_args(router.argv) == ["http://127.0.0.1:30001,http://127.0.0.1:30002"]
    # Each server streams as the launcher's real ones would: EAGLE token by token, the baseline
    # 4 tokens a chunk (the simulator takes SGLang's --stream-interval as its own flag).
    assert (f["--stream-interval"], f["--baseline-stream-interval"]) == ("1", "4")
    # Without --mps: CUDA time-slicing; no MPS daemon for a simulation either way.
    plain = build_specs(load_config(["--simulate", "--layout", "paired", "--gpus", "0-1"], {}))
    assert [flags(s.argv)["--sharing"] for s in plain[:2]] == ["timeslice", "timeslice"]
    assert not any(line.startswith("# MPS") for line in dry_run_notes(config))


def test_mps_servers_are_clients_of_their_pairs_daemon(tmp_path: Path) -> None:
    config = load_config(
        [
            "--gpus",
            "4-7",
            "--layout",
            "paired",
            "--tp",
            "2",
            "--mps",
            "--log-dir",
            str(tmp_path),
            *MODEL,
        ],
        {},
    )
    facts = dataclasses.replace(flag_facts(config), mps_control="/bin/mpsctl")
    specs = build_specs(config, facts)
    for i, pair in enumerate((specs[0:2], specs[2:4])):
        for spec in pair:
            env = dict(spec.env)
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path.resolve() / f"mps{i}" / "pipe")
            assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path.resolve() / f"mps{i}" / "log")
            # Clients see the daemon's GPUs renumbered from 0.
            assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    notes = dry_run_notes(config, facts)
    assert any("CUDA_VISIBLE_DEVICES=4,5" in n and n.endswith("/bin/mpsctl -d") for n in notes)
    assert any(n.startswith("# MPS pair 1, after its servers: echo quit | ") for n in notes)


def test_no_router_starts_servers_only() -> None:
    config = load_config(["--gpus", "0-1", "--no-router", *MODEL], {})
    specs = build_specs(config)
    assert [s.name for s in specs] == ["eagle", "baseline"]
    assert "# --no-router: servers only, no router started" in dry_run_notes(config)
    # The router's port is free for others to use: no clash with a server port.
    build_specs(load_config(["--gpus", "0-1", "--no-router", "--port", "30001", "--eagle-port",
                             "30005", *MODEL], {}))  # fmt: skip


def test_threshold_auto_reaches_the_router_and_sizes_eagle_at_sglangs_cap() -> None:
    config = load_config(["--gpus", "0", "--threshold", "auto", *MODEL], {})
    eagle, _, router = build_specs(config)
    assert flags(router.argv)["--threshold"] == "auto"
    assert flags(eagle.argv)["--max-running-requests"] == "48"
    with pytest.raises(SystemExit):
        load_config(["--gpus", "0", "--threshold", "sometimes", *MODEL], {})


LLAMA_70B = {
    "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
}  # fmt: skip


def test_weights_on_disk_sum_the_safetensors(tmp_path: Path) -> None:
    assert weights_on_disk("org/m") is None and weights_on_disk(str(tmp_path)) is None
    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 5)
    (tmp_path / "config.json").write_text("{}")
    assert weights_on_disk(str(tmp_path)) == 15


def test_pair_shortfall_arithmetic() -> None:
    short, spelled = pair_shortfall_gib(141.0, 1, 16 * GIB, 1 * GIB)
    assert short < 0 and "2 x 16.0 GiB" in spelled
    short, _ = pair_shortfall_gib(141.0, 1, 131 * GIB, 2 * GIB)
    assert short > 100
    # Four GPUs per pair hold a quarter each: 70B fits twice on four H200s.
    assert pair_shortfall_gib(141.0, 4, 131 * GIB, 2 * GIB)[0] < 0


def _sized(tmp_path: Path, cfg: dict[str, int], *argv: str) -> tuple[LaunchConfig, LaunchFacts]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(cfg))
    config = load_config([*argv, "--model-path", str(model), "--draft-model-path", "org/d"], {})
    return config, dataclasses.replace(flag_facts(config), gpu_memory_gib=141.0, target_config=cfg)


def test_too_large_for_a_pair_names_the_shortfall_and_suggests_split(tmp_path: Path) -> None:
    config = _sized(tmp_path, LLAMA_70B, "--gpus", "0-7", "--layout", "paired", "--tp", "1")
    with pytest.raises(UsageError) as info:
        check_pair_fits(*config)
    text = str(info.value)
    assert "GiB short" in text and "--layout split" in text and "\n" not in text
    fits = _sized(tmp_path, LLAMA_70B, "--gpus", "0-7", "--layout", "paired", "--tp", "4")
    assert check_pair_fits(*fits) is None


def test_weight_check_is_skipped_with_a_note_for_a_hub_model() -> None:
    config = load_config(["--gpus", "0", *MODEL], {})
    note = check_pair_fits(config)
    assert note is not None and "not a local model directory" in note
    assert check_pair_fits(load_config(["--gpus", "0-1", *MODEL], {})) is None  # split: no check


def test_a_deep_log_dir_moves_the_mps_directories_to_a_short_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    argv = ["--gpus", "0", "--mps", "--log-dir", str(deep), *MODEL]
    eagle, baseline, _ = build_specs(load_config(argv, {}))
    pipe = dict(eagle.env)["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe == dict(baseline.env)["CUDA_MPS_PIPE_DIRECTORY"]
    assert len(pipe) + len("/control_privileged") < 108 and "dynspec-mps-" in pipe


def test_detected_gpus_are_paired_by_tp(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynspec.launcher import probe

    monkeypatch.setattr(probe, "list_gpus", lambda: tuple(range(8)))
    found = discover(load_config(["--layout", "paired", "--tp", "4", *MODEL], {}))
    assert [s.eagle_gpus for s in found.gpu_sets] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    monkeypatch.setattr(probe, "list_gpus", lambda: (0,))
    one = discover(load_config(MODEL, {}))
    assert (one.layout, [s.eagle_gpus for s in one.gpu_sets]) == ("paired", [(0,)])
