"""Flags, their DYNSPEC_* variables, and one-line usage errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.common.cli import UsageError
from dynspec.router.config import parse_config

FLAGS = (
    "--eagle-url", "--baseline-url", "--policy", "--threshold", "--hysteresis", "--api-key",
    "--backend-api-key", "--admin-api-key", "--max-body-bytes", "--request-timeout",
    "--health-interval", "--max-concurrency", "--drain-timeout", "--upstream-ca",
    "--no-direct-relay", "--speed-profile", "--metrics-interval", "--check",
)  # fmt: skip
REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "launcher/sim/profiles/demo.json")


def run_router(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynspec.router", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_flags_and_environment() -> None:
    env = {
        "DYNSPEC_THRESHOLD": "12",
        "DYNSPEC_API_KEY": "k1",
        "DYNSPEC_BASELINE_URL": "http://b:2/",
    }
    cfg = parse_config(["--eagle-url", "http://e:1,http://e:3", "--hysteresis", "3"], env)
    assert cfg.eagle_urls == ("http://e:1", "http://e:3")
    assert cfg.baseline_urls == ("http://b:2",)
    assert (cfg.threshold, cfg.hysteresis, cfg.api_key) == (12, 3, "k1")
    assert "k1" not in repr(cfg)
    # The command line wins over the environment.
    assert parse_config(["--eagle-url", "http://e:1", "--threshold", "4"], env).threshold == 4


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--eagle-url", "http://e:1", "--threshold", "4", "--hysteresis", "4"],
        ["--eagle-url", "http://e:1", "--baseline-url", "http://e:1"],
    ],
)
def test_semantic_usage_errors(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_config(argv, {})


@pytest.mark.parametrize(
    "argv",
    [
        ["--eagle-url", "ftp://e:1"],
        ["--eagle-url", "http://e:1", "--threshold", "x"],
        ["--eagle-url", "http://e:1", "--policy", "random"],
        ["--eagle-url", "http://e:1", "--hysteresis", "9"],
        ["--eagle-url", "http://e:1", "--switch-margin", "1"],
        ["--eagle-url", "http://e:1", "--switch-margin", "-0.1"],
        ["--eagle-url", "http://e:1", "--switch-margin", "nan"],
        ["--eagle-url", "http://e:1", "--switch-lead", "-1"],
        ["--eagle-url", "http://e:1", "--switch-lead", "inf"],
    ],
)
def test_cli_usage_error_is_one_line_exit_2(argv: list[str]) -> None:
    r = run_router(*argv)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("dynspec-router: error:")


def test_help_lists_every_flag_with_its_variable() -> None:
    r = run_router("--help")
    assert r.returncode == 0
    for flag in FLAGS:
        assert flag in r.stdout
    assert "DYNSPEC_MAX_BODY_BYTES" in r.stdout


def test_check_reads_the_settings_and_serves_nothing() -> None:
    """``--check`` exits 0 on settings that hold, without listening (the port is taken here),
    and 2 with the usual one line on ones that do not (a flag's value, a rule between flags, a
    speed profile that does not read)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        ok = run_router("--check", "--pair", "http://e:1,http://b:2", "--port", port)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("dynspec-router: the settings hold: RouterConfig(")
    for argv in (
        ["--switch-lead", "x"], ["--threshold", "4", "--hysteresis", "4"],
        ["--speed-profile", "/no/such/profile.json"],
    ):  # fmt: skip
        r = run_router("--check", "--pair", "http://e:1,http://b:2", *argv)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith("dynspec-router: error:") and not r.stdout


def test_port_in_use_is_runtime_error_exit_1() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_router(
            "--eagle-url", "http://127.0.0.1:9", "--host", "127.0.0.1", "--port", str(port)
        )
    assert r.returncode == 1, r.stderr
    assert "cannot listen" in r.stderr and "Traceback" not in r.stderr


def test_defaults_listen_on_loopback_with_the_direct_relay() -> None:
    cfg = parse_config(["--eagle-url", "http://e:1"], {})
    assert cfg.host == "127.0.0.1" and not cfg.open_to_others()
    assert cfg.direct_relay is True and cfg.upstream_ca is None
    env = {"DYNSPEC_NO_DIRECT_RELAY": "1", "DYNSPEC_HOST": "0.0.0.0"}
    cfg = parse_config(["--eagle-url", "http://e:1"], env)
    assert cfg.direct_relay is False and cfg.open_to_others()
    assert (
        parse_config(["--eagle-url", "http://e:1", "--no-direct-relay"], {}).direct_relay is False
    )


@pytest.mark.parametrize(
    ("host", "open_to_others"),
    [("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
     ("0.0.0.0", True), ("::", True), ("10.0.0.5", True), ("myhost.example", True)],
)  # fmt: skip
def test_open_to_others(host: str, open_to_others: bool) -> None:
    cfg = parse_config(["--eagle-url", "http://e:1", "--host", host], {})
    assert cfg.open_to_others() is open_to_others


def test_balance_settings_from_flags_and_environment() -> None:
    env = {"DYNSPEC_SPEED_PROFILE": DEMO, "DYNSPEC_METRICS_INTERVAL": "0.5"}
    cfg = parse_config(["--eagle-url", "http://e:1", "--policy", "balance"], env)
    assert cfg.policy == "balance" and cfg.metrics_interval == 0.5
    assert cfg.speed_profile is not None and set(cfg.speed_profile.modes) == {"eagle", "baseline"}
    assert cfg.speed_profile_path == DEMO
    cfg = parse_config(["--eagle-url", "http://e:1", "--metrics-interval", "0"], {})
    assert cfg.metrics_interval == 0 and cfg.speed_profile is None


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_speed_profile_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    eagle_only = {"schema": 1, "modes": {"eagle": {"throughput": [[1, 90.0]]}}}
    cases = [
        (["--speed-profile", str(tmp_path / "missing.json")], "cannot read"),
        (["--speed-profile", _write(tmp_path, "bad.json", "{not json")], "not valid JSON"),
        (["--speed-profile", _write(tmp_path, "list.json", "[1, 2]")], "JSON object"),
        (
            ["--speed-profile", _write(tmp_path, "eagle.json", json.dumps(eagle_only))],
            "no 'baseline' mode",
        ),
        (["--metrics-interval", "-1"], "--metrics-interval"),
    ]
    for extra, message in cases:
        r = run_router(
            "--eagle-url", "http://127.0.0.1:9", "--baseline-url", "http://127.0.0.1:10",
            "--policy", "balance", *extra,
        )  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("dynspec-router: error:") and message in r.stderr, r.stderr
    # A profile that lacks a mode no configured server needs is fine.
    cfg = parse_config(
        ["--eagle-url", "http://e:1", "--speed-profile", str(tmp_path / "eagle.json")], {}
    )
    assert cfg.speed_profile is not None and set(cfg.speed_profile.modes) == {"eagle"}


def test_client_limits_from_flags_and_environment() -> None:
    from dynspec.router.downstream import ClientLimits

    cfg = parse_config(["--eagle-url", "http://e:1"], {})
    assert cfg.client_limits() == ClientLimits()
    assert (cfg.max_header_bytes, cfg.keep_alive_timeout) == (32 * 1024, 5.0)
    assert (cfg.client_header_timeout, cfg.client_body_timeout) == (10.0, 60.0)
    env = {"DYNSPEC_CLIENT_HEADER_TIMEOUT": "1.5", "DYNSPEC_KEEP_ALIVE_TIMEOUT": "2"}
    argv = ["--eagle-url", "http://e:1", "--max-header-bytes", "4096", "--client-body-timeout", "3"]
    limits = parse_config(argv, env).client_limits()
    # A head cap below one line's caps the lines too.
    assert (limits.max_header_bytes, limits.max_line_bytes) == (4096, 4096)
    assert (limits.header_timeout, limits.body_timeout) == (1.5, 3.0)
    assert parse_config(["--eagle-url", "http://e:1"], env).keep_alive_timeout == 2.0
    assert "max_header_bytes=32768" in repr(cfg)


@pytest.mark.parametrize(
    "argv",
    [["--max-header-bytes", "0"], ["--client-header-timeout", "0"], ["--keep-alive-timeout", "-1"]],
)
def test_client_limits_must_be_positive(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["--eagle-url", "http://e:1", *argv], {})
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("name", "from_env", "from_flag"), [("switch_margin", 0.1, 0.25), ("switch_lead", 0.5, 1.0)]
)
def test_switch_settings_from_flags_and_environment(
    name: str, from_env: float, from_flag: float
) -> None:
    """Off by default; the environment's value; the flag's over it, shown in the repr."""
    flag = "--" + name.replace("_", "-")
    assert getattr(parse_config(["--eagle-url", "http://e:1"], {}), name) == 0.0
    env = {f"DYNSPEC_{name.upper()}": str(from_env)}
    assert getattr(parse_config(["--eagle-url", "http://e:1"], env), name) == from_env
    cfg = parse_config(["--eagle-url", "http://e:1", flag, str(from_flag)], env)
    assert getattr(cfg, name) == from_flag and f"{name}={from_flag}" in repr(cfg)


def test_key_header_bytes_built_once_in_the_config() -> None:
    config = parse_config(
        ["--eagle-url", "http://127.0.0.1:1", "--api-key", "c", "--backend-api-key", "b"]
    )
    assert config.api_auth == b"Bearer c" and config.admin_auth is None
    assert config.backend_headers == b"authorization: Bearer b\r\n"
    assert "Bearer" not in repr(config)
    bare = parse_config(["--eagle-url", "http://127.0.0.1:1"])
    assert bare.api_auth is None and bare.backend_headers == b""
