from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.common.cli import UsageError, env_name
from dynspec.launcher.config import LaunchConfig, build_parser, load_config
from dynspec.launcher.router_flags import ROUTER_SETTINGS, RouterSetting

SIM = ["--simulate"]
SIM_DRY = ["--dry-run", "--model-path", "M", "--draft-model-path", "D"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dynspec.toml"
    path.write_text(text)
    return path


# key in the file, its value there, the DYNSPEC_ variable and value, the flag and value,
# the default, the config attribute, and how each layer's value reads on the config.
LAYERS = [
    ("threshold", "5", "DYNSPEC_THRESHOLD", "6", ["--threshold", "7"], 8, "threshold", (5, 6, 7)),
    (
        "eagle-port",
        "31001",
        "DYNSPEC_EAGLE_PORT",
        "31002",
        ["--eagle-port", "31003"],
        30001,
        "eagle_port",
        (31001, 31002, 31003),
    ),
    (
        "drain_timeout",
        "4.5",
        "DYNSPEC_DRAIN_TIMEOUT",
        "5",
        ["--drain-timeout", "6"],
        30.0,
        "drain_timeout",
        (4.5, 5.0, 6.0),
    ),
    (
        "restart",
        '"never"',
        "DYNSPEC_RESTART",
        "on-failure",
        ["--restart", "never"],
        "on-failure",
        "restart",
        ("never", "on-failure", "never"),
    ),
    (
        "sim-profile",
        '"seed"',
        "DYNSPEC_SIM_PROFILE",
        "eagle3-h100",
        ["--sim-profile", "demo"],
        "demo",
        "sim_profile",
        ("seed", "eagle3-h100", "demo"),
    ),
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda row: row[0])
def test_precedence_flag_then_env_then_file_then_default(
    tmp_path: Path, layer: tuple[object, ...]
) -> None:
    key, file_value, env_name, env_value, flag, default, attr, (from_file, from_env, from_flag) = (
        layer
    )
    assert isinstance(flag, list)
    path = write(tmp_path, f"{key} = {file_value}\nsimulate = true\n")
    cfg = ["--config", str(path)]
    env = {str(env_name): str(env_value)}

    def get(argv: list[str], environ: dict[str, str]) -> object:
        config: LaunchConfig = load_config(argv, environ=environ)
        return getattr(config, str(attr))

    assert get(SIM, {}) == default
    assert get(cfg, {}) == from_file
    assert get(cfg, env) == from_env
    assert get([*cfg, *flag], env) == from_flag
    assert get([*SIM, *flag], {}) == from_flag


def test_file_holds_every_kind_of_value(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
gpus = [0, 1, 2, 3]
model-path = "org/model"
draft_model_path = "org/draft"
eagle-args = ["--mem-fraction-static", "0.7"]
sglang-args = "--trust-remote-code"
dry-run = true
""",
    )
    config = load_config(["--config", str(path)], environ={})
    assert (config.eagle_gpus, config.baseline_gpus) == ((0, 1), (2, 3))
    assert config.model_path == "org/model"
    assert config.draft_model_path == "org/draft"
    assert config.eagle_args == ("--mem-fraction-static", "0.7")
    assert config.sglang_args == ("--trust-remote-code",)
    assert config.dry_run is True
    assert config.served_model_name == "model"


def test_config_path_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "simulate = true\nthreshold = 3\nhysteresis = 1\n")
    config = load_config([], environ={"DYNSPEC_CONFIG": str(path)})
    assert (config.simulate, config.threshold, config.hysteresis) == (True, 3, 1)


def test_env_switch_overrides_file_switch(tmp_path: Path) -> None:
    path = write(tmp_path, "simulate = true\ndry-run = true\n")
    config = load_config(["--config", str(path)], environ={"DYNSPEC_DRY_RUN": "false"})
    assert config.dry_run is False


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("thresold = 3\n", "unknown key 'thresold'"),
        ("threshold = 'many'\n", "invalid value"),
        ("threshold = \n", "not valid TOML"),
        ("[router]\nthreshold = 3\n", "is a table"),
        ("restart = 'always'\n", "invalid choice"),
    ],
)
def test_bad_files_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, reason: str
) -> None:
    path = write(tmp_path, "simulate = true\n" + text)
    try:
        load_config(["--config", str(path)], environ={})
    except UsageError as exc:
        assert reason in str(exc)
    except SystemExit as exc:
        assert exc.code == 2
        err = capsys.readouterr().err
        assert reason in err and err.count("\n") == 1
    else:
        pytest.fail("a bad config file was accepted")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_config(["--config", str(tmp_path / "nope.toml")], environ={})


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--gpus", "0-7"], "--model-path is required"),
        (["--gpus", "0-7", "--model-path", "M"], "--draft-model-path is required"),
        ([*SIM, "--gpus", "0-6"], "equal halves"),
        ([*SIM, "--eagle-gpus", "0-3", "--baseline-gpus", "3-5"], "GPU 3 is given to both"),
        ([*SIM, "--eagle-gpus", "0-3"], "no GPUs left"),
        ([*SIM, "--speculative-eagle-topk", "2"], "need --speculative-num-steps"),
        ([*SIM, "--threshold", "4", "--hysteresis", "4"], "must be below --threshold"),
        ([*SIM, "--eagle-port", "8000"], "must differ"),
    ],
)
def test_bad_combinations(argv: list[str], reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        load_config(argv, environ={})


def test_gpu_overrides() -> None:
    config = load_config([*SIM, "--gpus", "0-7", "--baseline-gpus", "6,7"], environ={})
    assert (config.eagle_gpus, config.baseline_gpus) == ((0, 1, 2, 3, 4, 5), (6, 7))


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    return subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_help_names_each_flags_variable() -> None:
    parser = build_parser()
    shown = [a for a in parser._actions if a.help != argparse.SUPPRESS]
    flags = [a for a in shown if "--help" not in a.option_strings]
    assert len(flags) > 30
    # What --help prints, flags of argument groups included (a wide terminal: one line each).
    text = " ".join(parser.format_help().split())
    for action in flags:
        long = next(o for o in action.option_strings if o.startswith("--"))
        assert f"[env {env_name(long)}]" in text, long


def test_dry_run_of_the_issue_prints_three_pasteable_lines() -> None:
    done = run_cli("--dry-run", "--gpus", "0-7", "--model-path", "M", "--draft-model-path", "D")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    eagle, baseline, router = lines
    sglang = f"{sys.executable} -m sglang.launch_server "
    assert eagle.startswith(f"CUDA_VISIBLE_DEVICES=0,1,2,3 {sglang}")
    assert baseline.startswith(f"CUDA_VISIBLE_DEVICES=4,5,6,7 {sglang}")
    for line in (eagle, baseline):
        assert " --tp-size 4 " in line and " --enable-metrics" in line
    assert " --speculative-algorithm EAGLE3 --speculative-draft-model-path D" in eagle
    assert " --max-running-requests 12 --cuda-graph-max-bs-decode 12" in eagle
    assert "--speculative" not in baseline and "--cuda-graph-max-bs-decode 512" in baseline
    assert " --stream-interval 4" in baseline and "--stream-interval" not in eagle
    assert router.startswith(f"{sys.executable} -m dynspec.router --eagle-url ")


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--dry-run", "--gpus", "0-6", "--model-path", "M", "--draft-model-path", "D"], "halves"),
        (["--dry-run", "--threshold", "zero"], "--threshold"),
        (["--dry-run", "--gpus", "0-7", "--model-path", "M"], "--draft"),
        ([*SIM_DRY, "--gpus", "0-7", "--eagle-args", "--port 1"], "--eagle-port"),
        (["--no-such-flag"], "unrecognized"),
        ([*SIM, "--dry-run", "--speed-profile", "/nonexistent/p.json"], "--speed-profile"),
        ([*SIM, "--dry-run", "--metrics-interval", "-1"], "--metrics-interval"),
    ],
)
def test_cli_usage_errors_are_one_line_exit_2(argv: list[str], reason: str) -> None:
    done = run_cli(*argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and reason in done.stderr
    assert done.stderr.startswith("dynspec-launch: error: ")


@pytest.mark.parametrize(
    ("key", "values", "read"),
    [
        ("max-concurrency", ("5", "6", "7"), int),
        ("request_timeout", ("50", "60", "70"), float),
        ("admin-api-key", ('"from-file"', "from-env", "from-flag"), str),
    ],
)
def test_router_settings_layer_like_every_flag(
    tmp_path: Path, key: str, values: tuple[str, str, str], read: type
) -> None:
    file_value, env_value, flag_value = values
    flag = "--" + key.replace("_", "-")
    path = write(tmp_path, f"{key} = {file_value}\nsimulate = true\n")
    cfg = ["--config", str(path)]
    env = {env_name(flag): env_value}

    def get(argv: list[str], environ: dict[str, str]) -> object:
        return load_config(argv, environ=environ).router_setting(flag)

    assert get(SIM, {}) is None  # the router's default: nothing passed
    assert get(cfg, {}) == read(file_value.strip('"'))
    assert get(cfg, env) == read(env_value)
    assert get([*cfg, flag, flag_value], env) == read(flag_value)


def test_router_setting_out_of_range_is_one_usage_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "dynspec.launcher", "--simulate", "--dry-run",
         "--request-timeout", "-1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--request-timeout" in r.stderr


def _router_actions() -> dict[str, argparse.Action]:
    from dynspec.router.config import build_parser as router_parser

    return {a.option_strings[-1]: a for a in router_parser()._actions if a.option_strings}


# Router flags that are launcher flags of their own (the launcher builds on them or sets them).
LAUNCHER_OWN = {"--eagle-url", "--baseline-url", "--host", "--port", "--policy", "--threshold"}
LAUNCHER_OWN |= {"--hysteresis", "--drain-timeout", "--log-level", "--help", "--speed-profile"}
LAUNCHER_OWN |= {"--pair"}  # built from the launcher's own layout (one per pair)
# An action, not a setting: check the settings and exit (the launcher's own is --dry-run).
NOT_SETTINGS = {"--check"}


def test_every_router_setting_is_a_launcher_flag() -> None:
    passed = {s.flag for s in ROUTER_SETTINGS}
    missing = sorted(set(_router_actions()) - passed - LAUNCHER_OWN - NOT_SETTINGS)
    assert not missing, f"add a row to launcher.config.ROUTER_SETTINGS for {missing}"


@pytest.mark.parametrize("setting", ROUTER_SETTINGS, ids=lambda s: s.flag)
def test_router_setting_checks_and_defaults_are_the_routers(setting: RouterSetting) -> None:
    action = _router_actions()[setting.flag]
    assert action.default == setting.default
    if setting.switch:
        assert isinstance(action, argparse._StoreTrueAction)
    else:
        assert (action.type or str) is setting.type
        assert tuple(action.choices or ()) == (setting.choices or ())


def test_router_switch_and_file_reach_the_router_command() -> None:
    from dynspec.launcher.spec import build_router_spec

    argv = [*SIM, "--no-direct-relay", "--upstream-ca", "/etc/ca.pem"]
    spec = build_router_spec(load_config(argv, environ={}))
    assert "--no-direct-relay" in spec.argv
    assert spec.argv[spec.argv.index("--upstream-ca") + 1] == "/etc/ca.pem"
    assert "--no-direct-relay" not in build_router_spec(load_config(SIM, environ={})).argv


def test_drain_timeout_is_checked_as_the_router_checks_it() -> None:
    ours = next(a for a in build_parser()._actions if "--drain-timeout" in a.option_strings)
    assert ours.type is _router_actions()["--drain-timeout"].type


def test_router_listens_on_loopback_by_default() -> None:
    """As SGLang and its router do: other machines only when asked (--host 0.0.0.0)."""
    assert load_config(SIM, environ={}).host == "127.0.0.1"
    assert load_config([*SIM, "--host", "0.0.0.0"], environ={}).host == "0.0.0.0"


def test_balance_settings_from_the_file_and_the_dry_run(tmp_path: Path) -> None:
    profile = Path(__file__).resolve().parents[2] / "launcher/sim/profiles/demo.json"
    path = write(
        tmp_path,
        f'policy = "balance"\nspeed-profile = "{profile}"\nmetrics_interval = 0.5\n',
    )
    done = run_cli("--simulate", "--dry-run", "--config", str(path))
    assert done.returncode == 0, done.stderr
    eagle, _, router = done.stdout.splitlines()
    assert " --max-running-requests 33 " in eagle
    assert " --policy balance " in router
    assert " --metrics-interval 0.5 " in router and f" --speed-profile {profile}" in router
