"""The command-line toolkit every dynspec command shares (router, launcher, simulator, bench).

- ``FlagParser``: an ``argparse`` parser whose every ``--flag`` can also come from the environment
  variable ``DYNSPEC_<FLAG>`` (``--max-body-bytes`` -> ``DYNSPEC_MAX_BODY_BYTES``), and from a file
  layer (the launcher's ``--config FILE.toml``). Precedence: command line, then environment, then
  file, then the flag's default. Usage errors are one line and exit 2.
- ``run_main``: runs an entry point so that a runtime failure is one line and exit 1 (a traceback
  only with ``--log-level debug``).
- ``configure_logging``: the one place logging is set up, called by each entry point.
- Value checks for ``type=``: ``positive_int``, ``non_negative_int``, ``positive_float``,
  ``non_negative_float``, ``port`` and ``port_or_zero``. A bad value is a usage error that names
  the rule (``--port: must be 1-65535, got 0``).
- Output whose reader leaves early (``dynspec-launch --dry-run | head -1``) ends the command
  quietly, as it ends ``cat`` or ``ls``: no "Broken pipe" line, exit 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

ENV_PREFIX = "DYNSPEC_"
READER_GONE = 141  # 128 + SIGPIPE: the status a shell shows for a writer whose reader left
LOG_LEVELS = ("debug", "info", "warning", "error")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class UsageError(Exception):
    """Bad usage found after parsing (a flag combination, a value out of range): exit 2."""


# Value checks for ``add_argument(type=...)``. A text that is no number at all raises ValueError,
# which argparse reports with the function's name ("invalid positive_int value: 'x'"); a number out
# of range raises ArgumentTypeError, whose message argparse prints as is. Floats must be finite:
# "inf" or "nan" seconds is no setting any command can honour.
def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text.strip()}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text.strip()}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 0 and < 1, got {text.strip()}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 1-65535, got {value}")
    return value


def port_or_zero(text: str) -> int:
    """A port to listen on; 0 lets the system pick a free one."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {value}")
    return value


def _reader_gone() -> NoReturn:
    # Python ignores SIGPIPE, so the write failed with EPIPE instead of ending the process. Point
    # stdout at /dev/null first: the flush at exit would otherwise fail again, and say so.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(READER_GONE)


def _error_line(text: str) -> None:
    """The one error line on stderr; a stderr with no reader left loses it, not the exit code."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr)


def write_stdout(text: str) -> None:
    """Write and flush; when stdout's reader has left, exit quietly (see the module's note)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()


def env_name(option: str) -> str:
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


def _long_option(action: argparse.Action) -> str | None:
    for opt in action.option_strings:
        if opt.startswith("--"):
            return opt
    return None


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser with environment and file layers under the command line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # One line, exit 2: the usage block argparse prints by default buries the reason.
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse's own version drops a failed write and then exits 0 as if all was shown.
        if message:
            if file is None or file is sys.stdout:
                write_stdout(message)  # --help into a pipe that closes early
            else:
                file.write(message)

    def format_help(self) -> str:
        # Each flag's help names its variable, added here rather than in add_argument so that flags
        # added through argument groups (which bypass the parser's add_argument) get it too.
        for action in self._actions:
            opt = _long_option(action)
            if opt is None or opt == "--help" or action.help is argparse.SUPPRESS:
                continue
            if "[env " not in (action.help or ""):
                action.help = f"{action.help or ''} [env {env_name(opt)}]".strip()
        return super().format_help()

    def _convert(self, action: argparse.Action, raw: object, source: str) -> object:
        opt = _long_option(action) or action.dest
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            self.error(f"{source} for {opt}: expected true or false, got {raw!r}")
        value: object = raw
        if callable(action.type) and not isinstance(raw, (bool, list, dict)):
            try:
                value = action.type(raw if isinstance(raw, str) else str(raw))
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                self.error(f"{source} for {opt}: invalid value {raw!r} ({exc})")
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            self.error(f"{source} for {opt}: invalid choice {raw!r} (choose from {choices})")
        return value

    def _apply_layer(self, values: Mapping[str, object], source: str) -> None:
        for action in self._actions:
            opt = _long_option(action)
            if opt is None or opt == "--help":
                continue
            key = opt[2:]
            for candidate in (key, key.replace("-", "_")):
                if candidate in values:
                    action.default = self._convert(action, values[candidate], source)
                    action.required = False
                    break

    def parse_layered(
        self,
        argv: Sequence[str] | None = None,
        file_values: Mapping[str, object] | None = None,
        file_name: str = "config file",
        environ: Mapping[str, str] | None = None,
    ) -> argparse.Namespace:
        """Parse ``argv`` over the environment layer, itself over ``file_values``."""
        if file_values:
            known = {(_long_option(a) or "")[2:] for a in self._actions}
            known |= {k.replace("-", "_") for k in known}
            unknown = sorted(k for k in file_values if k not in known)
            if unknown:
                self.error(f"{file_name}: unknown key {unknown[0]!r}")
            self._apply_layer(file_values, file_name)
        env = os.environ if environ is None else environ
        env_values: dict[str, object] = {}
        for action in self._actions:
            opt = _long_option(action)
            if opt is None or opt == "--help":
                continue
            name = env_name(opt)
            if name in env:
                env_values[opt[2:]] = env[name]
        for key, raw in env_values.items():
            action = next(a for a in self._actions if _long_option(a) == "--" + key)
            action.default = self._convert(action, raw, f"${env_name('--' + key)}")
            action.required = False
        return self.parse_args(argv)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="logging level; 'debug' also shows tracebacks of failures",
    )


def run_main(prog: str, body: Callable[[], int | None], log_level: str = "info") -> NoReturn:
    """Run ``body`` and exit with its code; turn failures into one line (exit 1, usage exit 2)."""
    try:
        code = body()
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
    except KeyboardInterrupt:
        sys.exit(130)
    except UsageError as exc:
        _error_line(f"{prog}: error: {exc}")
        sys.exit(2)
    except BrokenPipeError:
        _reader_gone()
    except Exception as exc:
        if log_level == "debug":
            raise
        _error_line(f"{prog}: error: {exc}")
        sys.exit(1)
    sys.exit(0 if code is None else code)
