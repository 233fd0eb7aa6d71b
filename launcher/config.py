"""The launcher's settings: flags, ``DYNSPEC_*`` variables and ``--config FILE.toml`` in one config.

Precedence, highest first: command-line flag, environment variable, config file, default. The
first stage of a launch (``cli.py``): the flags (``flags.py``) read into one frozen record and
checked in combination; what the launch finds beyond them is ``facts.py``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.common.cli import UsageError, env_name
from dynspec.launcher.flags import PROG, build_parser, own_env_names
from dynspec.launcher.gpus import (
    GpuIds,
    check_visible,
    parse_gpus,
    parse_visible,
    split_gpu_sets,
    split_halves,
)
from dynspec.launcher.router_flags import ROUTER_SETTINGS
from dynspec.launcher.sim.profile import Profile, ProfileError, load_profile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# PROG and build_parser are flags.py's, here where the command and the tests have found them.
__all__ = [
    "PROG",
    "LaunchConfig",
    "build_parser",
    "config_from_namespace",
    "connect_host",
    "load_config",
    "read_config_file",
    "resolve_layout",
]


def connect_host(listen_host: str) -> str:
    """Where to reach a server that listens on ``listen_host`` from this machine."""
    if listen_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if listen_host == "::":
        return "[::1]"
    if ":" in listen_host and not listen_host.startswith("["):
        return f"[{listen_host}]"
    return listen_host


@dataclass(frozen=True)
class LaunchConfig:
    simulate: bool
    eagle_gpus: GpuIds
    baseline_gpus: GpuIds
    model_path: str | None
    draft_model_path: str | None
    served_model_name: str
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    eagle_args: tuple[str, ...]
    baseline_args: tuple[str, ...]
    sglang_args: tuple[str, ...]
    host: str
    port: int
    eagle_port: int
    baseline_port: int
    backend_host: str
    policy: str
    threshold: int
    hysteresis: int
    router_settings: tuple[tuple[str, object], ...]  # (flag, value) of each one not at its default
    sim_profile: str
    sim_speed: float
    dry_run: bool
    log_dir: Path
    startup_timeout: float
    drain_timeout: float
    kill_grace: float
    restart: str
    log_level: str
    server_command: tuple[str, ...] | None
    preflight: bool
    progress_every: float = 10.0  # seconds between progress lines when stdout is no terminal
    # The launcher's own CUDA_VISIBLE_DEVICES, which GPU indices count within; None when unset.
    visible_gpus: tuple[str, ...] | None = None
    # --speed-profile (an absolute path, for the router) and the profile read from it.
    speed_profile: str | None = None
    speed_profile_data: Profile | None = None
    # --threshold auto: the router learns each pair's threshold (``threshold`` is its start).
    threshold_auto: bool = False
    # As the flags say (what the launch finds, GPUs detected included, is in facts.py): "split",
    # the EAGLE server on eagle_gpus and the baseline on baseline_gpus; "paired", one EAGLE and
    # one baseline server on each GPU set of ``paired_gpus`` (see layout.py).
    layout: str = "split"
    paired_gpus: tuple[GpuIds, ...] = ()
    tp: int = 1  # GPUs per GPU set (paired layout)
    mps: bool = False
    no_router: bool = False
    # --calibrate auto|always|never, and the longest measured window of one level (seconds).
    calibrate: str = "auto"
    calibrate_seconds: float = 4.0
    calibrate_passes: int = 3
    # The DYNSPEC_* variables that set the launcher's own flags (its children do not get them).
    own_env: frozenset[str] = frozenset()

    def calibration_off(self) -> str | None:
        """Why this launch does not calibrate ("" where there is nothing worth saying); None
        when it does (measured, or a cached profile reused)."""
        if self.calibrate == "never":
            return "--calibrate never"
        if self.speed_profile:
            return ""  # the given profile is the router's
        if self.calibrate == "always":
            return None
        if self.no_router or not (self.threshold_auto or self.policy == "balance"):
            return ""  # no router here, or one that reads no profile (a fixed threshold)
        return None

    def router_setting(self, flag: str) -> object | None:
        """A pass-through router setting's value, or None where the router's default holds."""
        return dict(self.router_settings).get(flag)

    @property
    def server_host(self) -> str:
        """Where the servers are reached (``--backend-host`` as a client connects to it)."""
        return connect_host(self.backend_host)

    @property
    def router_url(self) -> str:
        return f"http://{connect_host(self.host)}:{self.port}"

    @property
    def api_key(self) -> str | None:
        return _text_or_none(self.router_setting("--api-key"))

    @property
    def admin_api_key(self) -> str | None:
        return _text_or_none(self.router_setting("--admin-api-key"))

    @property
    def backend_api_key(self) -> str | None:
        return _text_or_none(self.router_setting("--backend-api-key"))


def _text_or_none(value: object | None) -> str | None:
    return None if value is None else str(value)


def _router_settings(ns: argparse.Namespace) -> tuple[tuple[str, object], ...]:
    given = []
    for setting in ROUTER_SETTINGS:
        value = getattr(ns, setting.flag[2:].replace("-", "_"))
        if value not in (None, "") and value != setting.default:
            given.append((setting.flag, value))
    return tuple(given)


def read_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"--config: {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"--config: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--config: {path} is not valid TOML: {exc}") from None
    if "config" in data:
        raise UsageError(f"--config: {path}: a config file cannot name another config file")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            raise UsageError(f"--config: {path}: key {key!r} is a table; use flat flag names")
        if isinstance(value, list):
            # gpus = [0, 1, 2, 3] reads as "0,1,2,3"; eagle-args = ["--a", "1"] as "--a 1".
            sep = "," if "gpus" in key else " "
            quote = str if "gpus" in key else shlex.quote
            values[key] = sep.join(quote(str(v)) for v in value)
        else:
            values[key] = value
    return values


def _split_args(text: str, flag: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"{flag}: cannot split {text!r}: {exc}") from None


_EXTRA_ARGS_FLAGS = ("--eagle-args", "--baseline-args", "--sglang-args", "--server-command")


def _join_extra_args(argv: Sequence[str]) -> list[str]:
    """``--eagle-args --disable-cuda-graph`` -> ``--eagle-args=--disable-cuda-graph``.

    argparse takes a lone value that starts with ``-`` for a flag of its own and fails; the value
    of these flags always starts with ``-``, so bind it to its flag before parsing.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _EXTRA_ARGS_FLAGS and i + 1 < len(argv):
            out.append(f"{arg}={argv[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _find_config(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    path: str | None = known.config or environ.get(env_name("--config")) or None
    return path


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> LaunchConfig:
    """Parse the layers into a config; a bad value exits 2, a bad combination raises UsageError."""
    args_list = _join_extra_args(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    parser = build_parser()
    own_env = own_env_names(parser)
    config_path = _find_config(args_list, env)
    file_values = read_config_file(config_path) if config_path else None
    ns = parser.parse_layered(
        args_list, file_values=file_values, file_name=str(config_path), environ=env
    )
    config = dataclasses.replace(config_from_namespace(ns), own_env=own_env)
    if config.simulate:
        return config
    visible = parse_visible(env.get("CUDA_VISIBLE_DEVICES"))
    check_visible([*config.eagle_gpus, *config.baseline_gpus], visible)
    return dataclasses.replace(config, visible_gpus=visible)


def config_from_namespace(ns: argparse.Namespace) -> LaunchConfig:
    simulate = bool(ns.simulate)
    gpus = parse_gpus(ns.gpus) if ns.gpus else None
    eagle_gpus = parse_gpus(ns.eagle_gpus, "--eagle-gpus") if ns.eagle_gpus else None
    baseline_gpus = parse_gpus(ns.baseline_gpus, "--baseline-gpus") if ns.baseline_gpus else None
    if eagle_gpus is None or baseline_gpus is None:
        if gpus is None:
            # Resolved later from nvidia-smi (see resolve_gpus); simulated servers need none.
            gpus = ()
        if eagle_gpus is not None:
            baseline_gpus = tuple(g for g in gpus if g not in eagle_gpus)
        elif baseline_gpus is not None:
            eagle_gpus = tuple(g for g in gpus if g not in baseline_gpus)
        elif gpus and ns.layout == "paired":
            # Every GPU holds both kinds of server; resolve_layout groups them into GPU sets.
            eagle_gpus, baseline_gpus = gpus, gpus
        elif gpus:
            eagle_gpus, baseline_gpus = split_halves(gpus)
        else:
            eagle_gpus, baseline_gpus = (), ()
        if (ns.eagle_gpus or ns.baseline_gpus) and not (eagle_gpus and baseline_gpus):
            raise UsageError(
                "--eagle-gpus/--baseline-gpus: no GPUs left for the other server "
                "(give both, or a --gpus set that holds both)"
            )
    layout, paired_gpus = resolve_layout(ns, gpus, eagle_gpus, baseline_gpus)
    overlap = sorted(set(eagle_gpus) & set(baseline_gpus))
    # One GPU may hold both servers (they start one after the other); nothing else may overlap.
    if overlap and layout == "split":
        raise UsageError(f"GPU {overlap[0]} is given to both the EAGLE and the baseline server")

    if not simulate:
        if not ns.model_path:
            raise UsageError("--model-path is required (or --simulate to run without a model)")
        if not ns.draft_model_path:
            raise UsageError(
                "--draft-model-path is required: the EAGLE-3 draft model (or --simulate)"
            )
    if ns.speculative_num_steps is None and (
        ns.speculative_eagle_topk is not None or ns.speculative_num_draft_tokens is not None
    ):
        # SGLang picks all three or none: a topk or draft-token count without steps is rejected.
        raise UsageError(
            "--speculative-eagle-topk and --speculative-num-draft-tokens need "
            "--speculative-num-steps (omit all three to let SGLang choose)"
        )
    threshold_auto = ns.threshold == "auto"
    threshold = 8 if threshold_auto else int(ns.threshold)
    if ns.hysteresis >= threshold:
        raise UsageError(
            f"--hysteresis {ns.hysteresis} must be below --threshold {threshold} "
            "(else the router never switches back to EAGLE)"
        )
    ports = {"--port": ns.port, "--eagle-port": ns.eagle_port, "--baseline-port": ns.baseline_port}
    if len(set(ports.values())) != len(ports):
        raise UsageError(
            "--port, --eagle-port and --baseline-port must differ, got "
            + ", ".join(f"{k} {v}" for k, v in ports.items())
        )
    if ns.sim_speed <= 0:
        raise UsageError("--sim-speed must be above 0")
    speed_profile: str | None = None
    speed_profile_data: Profile | None = None
    if ns.speed_profile:
        speed_profile = str(Path(ns.speed_profile).resolve())
        try:
            speed_profile_data = load_profile(speed_profile)
        except ProfileError as exc:
            raise UsageError(f"--speed-profile: {exc}") from None
        for mode in ("eagle", "baseline"):
            if mode not in speed_profile_data.modes:
                raise UsageError(f"--speed-profile {ns.speed_profile}: no {mode!r} mode")

    if ns.calibrate == "always" and ns.speed_profile:
        raise UsageError(
            "--calibrate always measures a profile for the router: drop --speed-profile, or "
            "use --calibrate auto (a given --speed-profile is used as it is)"
        )

    served = ns.served_model_name
    if not served:
        served = (
            ns.model_path.rstrip("/").split("/")[-1]
            if ns.model_path
            else ("dynspec-sim" if simulate else "default")
        )
    server_command = (
        _split_args(ns.server_command, "--server-command") if ns.server_command else None
    )
    return LaunchConfig(
        simulate=simulate,
        eagle_gpus=eagle_gpus,
        baseline_gpus=baseline_gpus,
        model_path=ns.model_path,
        draft_model_path=ns.draft_model_path,
        served_model_name=served,
        speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk,
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        eagle_args=_split_args(ns.eagle_args, "--eagle-args"),
        baseline_args=_split_args(ns.baseline_args, "--baseline-args"),
        sglang_args=_split_args(ns.sglang_args, "--sglang-args"),
        host=ns.host,
        port=ns.port,
        eagle_port=ns.eagle_port,
        baseline_port=ns.baseline_port,
        backend_host=ns.backend_host,
        policy=ns.policy,
        threshold=threshold,
        hysteresis=ns.hysteresis,
        router_settings=_router_settings(ns),
        sim_profile=ns.sim_profile,
        sim_speed=float(ns.sim_speed),
        dry_run=bool(ns.dry_run),
        log_dir=Path(ns.log_dir),
        startup_timeout=float(ns.startup_timeout),
        drain_timeout=float(ns.drain_timeout),
        kill_grace=float(ns.kill_grace),
        restart=ns.restart,
        log_level=ns.log_level,
        server_command=server_command,
        preflight=not ns.no_preflight,
        progress_every=max(0.1, float(ns.progress_every)),
        speed_profile=speed_profile,
        speed_profile_data=speed_profile_data,
        threshold_auto=threshold_auto,
        layout=layout,
        paired_gpus=paired_gpus,
        tp=ns.tp or 1,
        mps=bool(ns.mps),
        no_router=bool(ns.no_router),
        calibrate=ns.calibrate,
        calibrate_seconds=float(ns.calibrate_seconds),
        calibrate_passes=int(ns.calibrate_passes),
    )


def resolve_layout(
    ns: argparse.Namespace, gpus: GpuIds | None, eagle: GpuIds, baseline: GpuIds
) -> tuple[str, tuple[GpuIds, ...]]:
    """The layout and, for ``paired``, each GPU set's GPUs (empty until GPUs are known).

    One GPU for both servers is a one-pair paired layout, whichever flags named it.
    """
    one_gpu = len(eagle) == 1 and eagle == baseline
    layout = "paired" if one_gpu else (ns.layout or "split")
    if layout == "split":
        if ns.tp is not None:
            raise UsageError("--tp sets the GPUs of each pair: use it with --layout paired")
        if ns.mps:
            raise UsageError(
                "--mps shares a pair's GPUs between its two servers: use it with --layout paired"
            )
        return layout, ()
    if (ns.eagle_gpus or ns.baseline_gpus) and not one_gpu:
        raise UsageError("--layout paired takes --gpus (each pair's servers share their GPUs)")
    gpus_given = eagle if one_gpu else (gpus or ())
    return layout, split_gpu_sets(gpus_given, ns.tp or 1, bool(ns.simulate))
