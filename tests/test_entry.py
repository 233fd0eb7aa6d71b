"""The flag layering every entry point shares: command line > DYNSPEC_* > file > default."""

from __future__ import annotations

import pytest

from dynspec.router.entry import FlagParser, env_name, run_main


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
