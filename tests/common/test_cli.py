"""The command-line toolkit every command shares: flag layering (command line > DYNSPEC_* > file >
default), one-line errors, and the value checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dynspec.common.cli import (
    FlagParser,
    env_name,
    non_negative_float,
    non_negative_int,
    port,
    port_or_zero,
    positive_float,
    positive_int,
    run_main,
)


def make_parser() -> FlagParser:
    p = FlagParser(prog="t")
    p.add_argument("--threshold", type=int, default=8, help="switch point")
    p.add_argument("--mode", choices=["eagle", "baseline"], default="eagle")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--model-path", required=True)
    return p


def test_env_name() -> None:
    assert env_name("--max-body-bytes") == "DYNSPEC_MAX_BODY_BYTES"


@pytest.mark.parametrize(
    ("argv", "env", "file", "expected"),
    [
        ([], {}, {}, 8),
        ([], {}, {"threshold": 5}, 5),
        ([], {"DYNSPEC_THRESHOLD": "6"}, {"threshold": 5}, 6),
        (["--threshold", "7"], {"DYNSPEC_THRESHOLD": "6"}, {"threshold": 5}, 7),
    ],
)
def test_precedence(
    argv: list[str], env: dict[str, str], file: dict[str, object], expected: int
) -> None:
    ns = make_parser().parse_layered([*argv, "--model-path", "m"], file, environ=env)
    assert ns.threshold == expected


def test_env_satisfies_required_and_bool() -> None:
    ns = make_parser().parse_layered(
        [], environ={"DYNSPEC_MODEL_PATH": "m", "DYNSPEC_DRY_RUN": "true"}
    )
    assert ns.model_path == "m"
    assert ns.dry_run is True


def test_file_key_with_underscores() -> None:
    ns = make_parser().parse_layered([], {"model_path": "x", "dry-run": True}, environ={})
    assert (ns.model_path, ns.dry_run) == ("x", True)


@pytest.mark.parametrize(
    ("env", "file", "needle"),
    [
        ({"DYNSPEC_THRESHOLD": "many"}, {}, "$DYNSPEC_THRESHOLD for --threshold"),
        ({"DYNSPEC_MODE": "fast"}, {}, "invalid choice"),
        ({"DYNSPEC_DRY_RUN": "maybe"}, {}, "expected true or false"),
        ({}, {"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_bad_layer_values_are_one_line_exit_2(
    env: dict[str, str], file: dict[str, object], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        make_parser().parse_layered(["--model-path", "m"], file, environ=env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


def test_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        make_parser().parse_layered(["--threshold", "x", "--model-path", "m"], environ={})
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_help_names_env_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        make_parser().parse_layered(["--help"], environ={})
    assert "DYNSPEC_THRESHOLD" in capsys.readouterr().out


def test_run_main_turns_failure_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def boom() -> int:
        raise RuntimeError("port 8000 is taken")

    with pytest.raises(SystemExit) as exc:
        run_main("dynspec-x", boom)
    assert exc.value.code == 1
    assert capsys.readouterr().err == "dynspec-x: error: port 8000 is taken\n"


CHECKS: dict[str, Callable[[str], object]] = {
    "positive_int": positive_int,
    "non_negative_int": non_negative_int,
    "positive_float": positive_float,
    "non_negative_float": non_negative_float,
    "port": port,
    "port_or_zero": port_or_zero,
}


@pytest.mark.parametrize(
    ("check", "text", "expected"),
    [
        ("positive_int", "1", 1),
        ("non_negative_int", "0", 0),
        ("positive_float", "0.5", 0.5),
        ("non_negative_float", "0", 0.0),
        ("port", "1", 1),
        ("port", "65535", 65535),
        ("port_or_zero", "0", 0),
    ],
)
def test_value_check_accepts(check: str, text: str, expected: object) -> None:
    assert CHECKS[check](text) == expected


@pytest.mark.parametrize(
    ("check", "text", "needle"),
    [
        ("positive_int", "0", "must be >= 1, got 0"),
        ("positive_int", "two", "invalid positive_int value: 'two'"),
        ("non_negative_int", "-1", "must be >= 0, got -1"),
        ("positive_float", "0", "must be a finite number > 0, got 0"),
        ("positive_float", "inf", "must be a finite number > 0, got inf"),
        ("positive_float", "nan", "must be a finite number > 0, got nan"),
        ("non_negative_float", "-0.1", "must be a finite number >= 0, got -0.1"),
        ("port", "0", "must be 1-65535, got 0"),
        ("port", "65536", "must be 1-65535, got 65536"),
        ("port_or_zero", "-1", "must be 0-65535, got -1"),
    ],
)
def test_value_check_rejects_in_one_line_exit_2(
    check: str, text: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = FlagParser(prog="t")
    p.add_argument("--value", type=CHECKS[check])
    with pytest.raises(SystemExit) as exc:
        p.parse_layered(["--value", text], environ={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"t: error: argument --value: {needle}\n"


def test_value_check_from_environment_names_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = FlagParser(prog="t")
    p.add_argument("--port", type=port, default=8000)
    with pytest.raises(SystemExit) as exc:
        p.parse_layered([], environ={"DYNSPEC_PORT": "70000"})
    assert exc.value.code == 2
    assert "$DYNSPEC_PORT for --port: invalid value '70000' (must be 1-65535, got 70000)" in (
        capsys.readouterr().err
    )
