from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from launch_cases import CASES, DEMO_PROFILE, Case

from dynspec.common.cli import UsageError
from dynspec.launcher.config import build_parser, connect_host, load_config
from dynspec.launcher.facts import discover
from dynspec.launcher.sim.profile import load_profile
from dynspec.launcher.spec import (
    ProcessSpec,
    balance_eagle_limit,
    build_specs,
    eagle_max_running_requests,
)

BASE_ARGS = ("--gpus", "0-7", "--model-path", "org/model", "--draft-model-path", "org/draft")


def specs(*argv: str) -> tuple[ProcessSpec, ProcessSpec, ProcessSpec]:
    return build_specs(load_config(list(argv), environ={}))


def option(argv: tuple[str, ...], flag: str) -> list[str]:
    """Every value given to ``flag`` (``--flag V`` or ``--flag=V``; "" for a bare switch)."""
    values = []
    for i, arg in enumerate(argv):
        if arg == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else "--"
            values.append("" if nxt.startswith("--") else nxt)
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


# The launcher's own choices: given once, the user's value replacing the launcher's.
TUNED = {
    "--max-running-requests",
    "--cuda-graph-max-bs-decode",
    "--stream-interval",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_tuned_flag_given_once_with_the_meant_value(case: Case) -> None:
    servers = [s for s in specs(*case.argv) if s.is_server]
    assert len(servers) >= 2
    for spec in servers:
        assert spec.argv[:3] == (sys.executable, "-m", "sglang.launch_server")
        for attr, value in case.expect.get(spec.name, {}).items():
            flag = "--" + attr.replace("_", "-")
            given = option(spec.argv, flag)
            if value is None:
                assert given == [], (spec.name, flag)
            elif value is True:
                assert given == [""], (spec.name, flag)
            elif flag in TUNED:
                assert given == [str(value)], (spec.name, flag, spec.argv)
            else:  # argparse: the last one wins (the role's args come after --sglang-args)
                assert given[-1] == str(value), (spec.name, flag, spec.argv)


def test_default_split_names_prefixes_env_and_health() -> None:
    eagle, baseline, router = specs("--gpus", "0-7", "--model-path", "M", "--draft-model-path", "D")
    assert (eagle.prefix, baseline.prefix, router.prefix) == (
        "[eagle gpu0-3]",
        "[baseline gpu4-7]",
        "[router]",
    )
    assert eagle.env == (("CUDA_VISIBLE_DEVICES", "0,1,2,3"),)
    assert baseline.env == (("CUDA_VISIBLE_DEVICES", "4,5,6,7"),)
    assert eagle.health_url == "http://127.0.0.1:30001/health_generate"
    assert baseline.health_url == "http://127.0.0.1:30002/health_generate"
    assert router.health_url == "http://127.0.0.1:8000/health"
    assert [s.log_file.name for s in (eagle, baseline, router)] == [
        "eagle.log",
        "baseline.log",
        "router.log",
    ]
    assert router.argv[:3] == (sys.executable, "-m", "dynspec.router")
    assert option(router.argv, "--eagle-url") == ["http://127.0.0.1:30001"]
    assert option(router.argv, "--baseline-url") == ["http://127.0.0.1:30002"]
    assert option(router.argv, "--drain-timeout") == ["30"]


def test_command_line_is_env_first_and_pasteable() -> None:
    eagle, _, _ = specs(
        "--gpus", "0-3,6,7", "--model-path", "/m/with space", "--draft-model-path", "D"
    )
    line = eagle.command_line()
    assert line.startswith("CUDA_VISIBLE_DEVICES=0,1,2 ")
    assert shlex.split(line) == ["CUDA_VISIBLE_DEVICES=0,1,2", *eagle.argv]


def test_api_key_goes_through_env_and_is_never_printed() -> None:
    *_, router = specs("--simulate", "--api-key", "sk-secret-123")
    assert ("DYNSPEC_API_KEY", "sk-secret-123") in router.env
    assert "sk-secret-123" not in " ".join(router.argv)
    line = router.command_line()
    assert "sk-secret-123" not in line
    assert line.startswith('DYNSPEC_API_KEY="$DYNSPEC_API_KEY" ')


def test_simulate_runs_dynspec_sim_without_gpus() -> None:
    eagle, baseline, _ = specs(
        "--simulate", "--sim-profile", "seed", "--sim-speed", "4", "--threshold", "10"
    )
    for spec, mode in ((eagle, "eagle"), (baseline, "baseline")):
        assert spec.argv[:3] == (sys.executable, "-m", "dynspec.launcher.sim")
        assert spec.env == ()
        assert option(spec.argv, "--mode") == [mode]
        assert option(spec.argv, "--profile") == ["seed"]
        assert option(spec.argv, "--speed") == ["4"]
        assert option(spec.argv, "--served-model-name") == ["dynspec-sim"]
    assert option(eagle.argv, "--max-running-requests") == ["15"]
    assert option(baseline.argv, "--max-running-requests") == []
    assert eagle.prefix == "[eagle sim]"
    # SGLang's --stream-interval as the real servers get it: the baseline 4, EAGLE SGLang's 1.
    assert option(eagle.argv, "--stream-interval") == ["1"]
    assert option(baseline.argv, "--stream-interval") == ["4"]


def test_a_users_stream_interval_reaches_the_simulator_and_a_bad_one_is_a_usage_error() -> None:
    eagle, baseline, _ = specs("--simulate", "--baseline-args", "--stream-interval 2")
    assert option(baseline.argv, "--stream-interval") == ["2"]
    assert option(eagle.argv, "--stream-interval") == ["1"]
    eagle, baseline, _ = specs("--simulate", "--sglang-args", "--stream-interval=8")
    assert option(eagle.argv, "--stream-interval") == option(baseline.argv, "--stream-interval")
    assert option(eagle.argv, "--stream-interval") == ["8"]
    with pytest.raises(UsageError, match=r"--baseline-args: --stream-interval '0' is not a posi"):
        specs("--simulate", "--baseline-args", "--stream-interval 0")


def test_server_command_replaces_sglang() -> None:
    eagle, _, _ = specs(
        "--gpus",
        "0,1",
        "--model-path",
        "M",
        "--draft-model-path",
        "D",
        "--server-command",
        "python3 fake.py --x",
    )
    assert eagle.argv[:3] == ("python3", "fake.py", "--x")
    assert option(eagle.argv, "--tp-size") == ["1"]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--eagle-args", "--port 1"], "--eagle-port"),
        (["--sglang-args", "--tp-size 2"], "--gpus"),
        (["--baseline-args", "--model /x"], "--model-path"),
        (["--eagle-args", "--speculative-draft-model-path x"], "--draft-model-path"),
        (["--baseline-args", "--speculative-num-steps 3"], "baseline"),
        (["--sglang-args", "--cuda-graph-max-bs 8"], "--cuda-graph-max-bs-decode"),
        (["--eagle-args", "--unclosed 'quote"], "cannot split"),
    ],
)
def test_bad_extra_args(extra: list[str], reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        specs("--gpus", "0-7", "--model-path", "M", "--draft-model-path", "D", *extra)


@pytest.mark.parametrize(("threshold", "cap"), [(1, 5), (8, 12), (16, 24), (32, 48), (64, 96)])
def test_eagle_cap_is_a_margin_above_the_threshold(threshold: int, cap: int) -> None:
    assert eagle_max_running_requests(threshold) == cap


@pytest.mark.parametrize(
    ("host", "connect"),
    [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]")],
)
def test_connect_host(host: str, connect: str) -> None:
    assert connect_host(host) == connect


# Each router setting the launcher passes through: the flag, a value, and how the router gets it.
PASSED_THROUGH = [
    ("--max-concurrency", "64", "64"),
    ("--request-timeout", "120", "120"),
    ("--connect-timeout", "2.5", "2.5"),
    ("--max-body-bytes", "1048576", "1048576"),
    ("--health-interval", "0.5", "0.5"),
    ("--metrics-interval", "0.5", "0.5"),
]


@pytest.mark.parametrize(("flag", "value", "argv_value"), PASSED_THROUGH)
def test_router_setting_reaches_the_router(flag: str, value: str, argv_value: str) -> None:
    *_, router = specs("--simulate", flag, value)
    assert option(router.argv, flag) == [argv_value]
    assert flag in router.command_line()
    *_, router = specs("--simulate")
    assert option(router.argv, flag) == []  # not given: the router's own default holds


@pytest.mark.parametrize("flag", ["--api-key", "--admin-api-key", "--backend-api-key"])
def test_router_keys_go_through_env_and_are_never_printed(flag: str) -> None:
    var = "DYNSPEC_" + flag[2:].upper().replace("-", "_")
    *_, router = specs("--simulate", flag, "sk-secret-456")
    assert (var, "sk-secret-456") in router.env
    assert "sk-secret-456" not in " ".join(router.argv)
    line = router.command_line()
    assert "sk-secret-456" not in line
    assert f'{var}="${var}"' in line


def test_backend_key_reaches_both_sglang_servers_and_is_never_printed() -> None:
    eagle, baseline, router = specs(
        "--gpus", "0-1", "--model-path", "M", "--draft-model-path", "D",
        "--backend-api-key", "sk-backend",
    )  # fmt: skip
    for spec in (eagle, baseline):
        assert option(spec.argv, "--api-key") == ["sk-backend"]
        line = spec.command_line()
        assert "sk-backend" not in line
        assert '--api-key "$DYNSPEC_BACKEND_API_KEY"' in line
    assert ("DYNSPEC_BACKEND_API_KEY", "sk-backend") in router.env


def test_sglang_api_key_in_extra_args_points_to_backend_api_key() -> None:
    with pytest.raises(UsageError, match="--backend-api-key"):
        specs("--gpus", "0-1", "--model-path", "M", "--draft-model-path", "D",
              "--sglang-args", "--api-key k")  # fmt: skip


def test_drain_timeout_the_router_refuses_is_a_launcher_usage_error() -> None:
    # The router takes only a drain timeout above 0; the launcher checks the same, not later.
    with pytest.raises(SystemExit) as exc:
        specs("--simulate", "--drain-timeout", "0")
    assert exc.value.code == 2
    *_, router = specs("--simulate", "--drain-timeout", "7.5")
    assert option(router.argv, "--drain-timeout") == ["7.5"]


GPU_ARGS = ["--model-path", "M", "--draft-model-path", "D", "--dry-run"]


@pytest.mark.parametrize(
    ("visible", "gpus", "eagle_env", "baseline_env"),
    [
        ("4,5", "0-1", "4", "5"),
        ("6,7,2,3", "0-3", "6,7", "2,3"),
        ("GPU-aa,GPU-bb", "1,0", "GPU-bb", "GPU-aa"),
        (None, "0-1", "0", "1"),
    ],
)
def test_gpus_index_the_visible_set(
    visible: str | None, gpus: str, eagle_env: str, baseline_env: str
) -> None:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    eagle, baseline, _ = build_specs(load_config(["--gpus", gpus, *GPU_ARGS], environ=environ))
    assert eagle.env == (("CUDA_VISIBLE_DEVICES", eagle_env),)
    assert baseline.env == (("CUDA_VISIBLE_DEVICES", baseline_env),)


def test_gpu_outside_the_visible_set_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"GPU 2 is not visible: CUDA_VISIBLE_DEVICES=4,5"):
        load_config(["--gpus", "0-3", *GPU_ARGS], environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    with pytest.raises(UsageError, match="not visible"):
        load_config(
            ["--eagle-gpus", "0", "--baseline-gpus", "1", *GPU_ARGS],
            environ={"CUDA_VISIBLE_DEVICES": ""},
        )


def test_gpu_outside_the_visible_set_exits_2_with_one_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", "--gpus", "0-3", *GPU_ARGS],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "4,5"},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "CUDA_VISIBLE_DEVICES=4,5" in r.stderr


def test_help_says_gpus_index_the_visible_set() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "CUDA_VISIBLE_DEVICES=4,5" in text and "--gpus 0-1 means GPUs 4 and 5" in text


def test_no_gpus_given_uses_every_visible_gpu() -> None:
    config = load_config(GPU_ARGS, environ={"CUDA_VISIBLE_DEVICES": "3,1"})
    eagle, baseline, _ = build_specs(config, discover(config))
    assert (eagle.env, baseline.env) == (
        (("CUDA_VISIBLE_DEVICES", "3"),),
        (("CUDA_VISIBLE_DEVICES", "1"),),
    )


def test_router_gets_the_speed_profile() -> None:
    *_, rt = specs(*BASE_ARGS, "--policy", "balance", "--speed-profile", DEMO_PROFILE)
    assert option(rt.argv, "--policy") == ["balance"]
    assert option(rt.argv, "--speed-profile") == [DEMO_PROFILE]
    *_, rt = specs(*BASE_ARGS)
    assert option(rt.argv, "--speed-profile") == []


def test_simulated_eagle_server_sized_from_the_profile() -> None:
    eagle, baseline, _ = specs("--simulate", "--policy", "balance", "--speed-profile", DEMO_PROFILE)
    assert option(eagle.argv, "--max-running-requests") == ["33"]
    assert option(baseline.argv, "--max-running-requests") == []


@pytest.mark.parametrize(
    ("name", "limit"),
    # eagle3-h100: EAGLE's time per token stays below the baseline's everywhere: SGLang's cap.
    [("demo", 33), ("eagle3-h100", 48), ("seed", 20)],
)
def test_balance_eagle_limit_of_the_shipped_profiles(name: str, limit: int) -> None:
    profile = load_profile(name)
    got = balance_eagle_limit(profile)
    assert got == limit
    eagle, base = profile.mode("eagle"), profile.mode("baseline")
    base_batch = base.throughput[-1][0]
    worst_base = base_batch / base.throughput_at(base_batch)
    assert got / eagle.throughput_at(got) <= worst_base
    if got < 48:
        assert (got + 1) / eagle.throughput_at(got + 1) > worst_base


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{oops", "invalid JSON"),
        ('{"schema": 1, "name": "x", "source": "y", "modes": {"eagle": '
         '{"throughput": [[1, 10.0]]}}}', "no 'baseline' mode"),
    ],
)  # fmt: skip
def test_bad_speed_profile_is_a_usage_error(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=reason):
        specs(*BASE_ARGS, "--speed-profile", str(path))
