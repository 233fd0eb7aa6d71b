"""The launcher's settings: flags, ``DYNSPEC_*`` variables and ``--config FILE.toml`` in one config.

Precedence, highest first: command-line flag, environment variable, config file, default.
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

from dynspec.common.cli import (
    FlagParser,
    UsageError,
    add_log_level,
    env_name,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
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

PROG = "dynspec-launch"
RESTART_POLICIES = ("on-failure", "never")
POLICIES = ("threshold", "balance")
CALIBRATE_CHOICES = ("auto", "always", "never")
LAYOUTS = ("split", "paired")


def threshold_value(text: str) -> int | str:
    """``--threshold``: a load (>= 1), or ``auto`` (the router learns it per pair)."""
    if text.strip().lower() == "auto":
        return "auto"
    return positive_int(text)


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


def build_parser() -> FlagParser:
    p = FlagParser(
        prog=PROG,
        description=(
            "Start an EAGLE-3 SGLang server, a baseline SGLang server (same model) and the dynspec "
            "router in front of them; supervise them; stop them all cleanly on Ctrl-C."
        ),
    )
    g = p.add_argument_group("GPUs and model")
    g.add_argument(
        "--gpus",
        help="GPUs to use, e.g. 0-7, 0,1,2,3 or 0-3,6,7; first half for the EAGLE server, second "
        "half for the baseline, tp = half the count. These are indices into the GPUs visible to "
        "the launcher: with CUDA_VISIBLE_DEVICES=4,5 already set (Slurm, containers), --gpus 0-1 "
        "means GPUs 4 and 5 (default: every visible GPU; every GPU nvidia-smi lists when "
        "CUDA_VISIBLE_DEVICES is unset)",
    )
    g.add_argument(
        "--layout",
        choices=LAYOUTS,
        help="'split': the EAGLE server on the first half of --gpus, the baseline on the second; "
        "'paired': an EAGLE and a baseline server on each GPU set of --tp GPUs, the baseline "
        "started once EAGLE is healthy, each with half of the set's memory; pair i listens on "
        "--eagle-port + 2i and --baseline-port + 2i (default: split; paired for one GPU)",
    )
    g.add_argument(
        "--tp",
        type=positive_int,
        help="--layout paired: GPUs per pair (must divide the GPU count; default 1: one pair "
        "per GPU)",
    )
    g.add_argument(
        "--mps",
        action="store_true",
        help="--layout paired: one CUDA MPS control daemon per pair's GPU set, both servers its "
        "clients (with --simulate: the simulator's MPS sharing)",
    )
    g.add_argument("--eagle-gpus", help="GPUs of the EAGLE server (overrides the split)")
    g.add_argument("--baseline-gpus", help="GPUs of the baseline server (overrides the split)")
    g.add_argument("--model-path", help="model (local path or hub id); required unless --simulate")
    g.add_argument(
        "--draft-model-path", help="EAGLE-3 draft model (path or hub id); needed unless --simulate"
    )
    g.add_argument(
        "--served-model-name",
        help="model name clients send (default: the model path's last part; 'dynspec-sim' "
        "with --simulate)",
    )
    s = p.add_argument_group("SGLang settings")
    s.add_argument(
        "--speculative-num-steps",
        type=positive_int,
        help="EAGLE draft steps (omitted: SGLang chooses steps, topk and draft tokens)",
    )
    s.add_argument("--speculative-eagle-topk", type=positive_int, help="EAGLE draft top-k")
    s.add_argument(
        "--speculative-num-draft-tokens", type=positive_int, help="EAGLE draft tokens per step"
    )
    s.add_argument(
        "--eagle-args",
        default="",
        help='extra SGLang flags for the EAGLE server, e.g. "--mem-fraction-static 0.8"; they '
        "replace the launcher's own choice of the same flag (the EAGLE server gets "
        "--max-running-requests = threshold + max(4, threshold/2), or with --policy balance and "
        "--speed-profile the largest batch at which the profile's EAGLE time per token is "
        "still no worse than the baseline's at its largest batch (at most 48), and CUDA graphs "
        "up to that batch; without a profile, balance keeps the threshold sizing; the baseline "
        "--cuda-graph-max-bs-decode 512; --dry-run shows them)",
    )
    s.add_argument("--baseline-args", default="", help="extra SGLang flags for the baseline server")
    s.add_argument("--sglang-args", default="", help="extra SGLang flags for both servers")
    n = p.add_argument_group("addresses")
    n.add_argument(
        "--host",
        default="127.0.0.1",
        help="router listen address; 0.0.0.0 serves other machines (then set --api-key)",
    )
    n.add_argument("--port", type=port, default=8000, help="router port")
    n.add_argument("--eagle-port", type=port, default=30001, help="EAGLE server port")
    n.add_argument("--baseline-port", type=port, default=30002, help="baseline server port")
    n.add_argument("--backend-host", default="127.0.0.1", help="listen address of both servers")
    r = p.add_argument_group("router")
    r.add_argument(
        "--no-router",
        action="store_true",
        help="start and supervise the servers only (a Kubernetes pod: the router runs elsewhere)",
    )
    r.add_argument(
        "--policy",
        default="threshold",
        choices=POLICIES,
        help="routing policy: 'threshold' (EAGLE up to --threshold, then baseline) or 'balance' "
        "(each request to the lowest predicted time per output token; both servers serve)",
    )
    r.add_argument(
        "--threshold",
        type=threshold_value,
        default=8,
        help="load above which new requests go to the baseline server; 'auto': the router "
        "learns it per pair from the servers' speed curves (starting at 8)",
    )
    r.add_argument(
        "--hysteresis",
        type=non_negative_int,
        default=2,
        help="back to EAGLE when load <= threshold - hysteresis",
    )
    for setting in ROUTER_SETTINGS:
        if setting.switch:
            r.add_argument(setting.flag, action="store_true", help=setting.help)
        else:
            r.add_argument(
                setting.flag,
                type=setting.type,
                default=setting.default,
                choices=setting.choices,
                help=setting.help,
            )
    r.add_argument(
        "--speed-profile",
        metavar="FILE.json",
        help="speed curves per mode in dynspec-sim's profile format (dynspec-bench profile writes "
        "one), passed to the router as the start of its learned curves; with --policy balance "
        "it also sizes the EAGLE server (see --eagle-args)",
    )
    r.add_argument(
        "--calibrate",
        default="auto",
        choices=CALIBRATE_CHOICES,
        help="measure each server alone once it is healthy, before the router starts (a short "
        "closed-loop sweep up to the EAGLE server's running limit, about a minute), write it "
        "as a speed profile to LOG_DIR/calibration/ (keyed by model, draft, the servers' "
        "flags, SGLang version and GPU) and give it to the router as --speed-profile; "
        "'auto': when no --speed-profile is given, none is cached for the key, and the router "
        "uses one (--threshold auto or --policy balance); 'always': measure again (not with "
        "--speed-profile) and overwrite the cached one; 'never': do not. A calibration that "
        "fails says so in one line and the router starts without a profile",
    )
    m = p.add_argument_group("simulation")
    m.add_argument(
        "--simulate",
        action="store_true",
        help="run simulated SGLang servers (dynspec-sim): no GPU, no model",
    )
    m.add_argument("--sim-profile", default="demo", help="dynspec-sim profile: NAME or FILE.json")
    m.add_argument(
        "--sim-speed",
        type=float,
        default=1.0,
        help="dynspec-sim time runs this many times faster than real time",
    )
    o = p.add_argument_group("operation")
    o.add_argument(
        "--dry-run", action="store_true", help="print each process's command line, start nothing"
    )
    o.add_argument("--log-dir", default="./dynspec-logs", help="one log file per process here")
    o.add_argument(
        "--startup-timeout",
        type=non_negative_float,
        default=1800.0,
        help="seconds a server may take to answer /health_generate with 200",
    )
    o.add_argument(
        "--drain-timeout",
        type=positive_float,  # as the router checks it: a 0 would stop it at start-up
        default=30.0,
        help="on shutdown, seconds the router may take to finish requests in flight",
    )
    o.add_argument(
        "--kill-grace",
        type=non_negative_float,
        default=20.0,
        help="on shutdown, seconds between SIGTERM and SIGKILL for each server's process group",
    )
    o.add_argument(
        "--restart",
        default="on-failure",
        choices=RESTART_POLICIES,
        help="restart a server that dies after start-up (with backoff), or stop everything",
    )
    o.add_argument("--config", help="TOML file whose keys are these flags' names")
    add_log_level(p)
    # Test and expert hooks, not in --help: replace `python -m sglang.launch_server` by another
    # command (a fake SGLang in tests), and skip the pre-flight checks.
    p.add_argument("--server-command", help=argparse.SUPPRESS)
    p.add_argument("--no-preflight", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--progress-every", type=non_negative_float, default=10.0, help=argparse.SUPPRESS
    )
    p.add_argument("--calibrate-seconds", type=positive_float, default=4.0, help=argparse.SUPPRESS)
    return p


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
    config_path = _find_config(args_list, env)
    file_values = read_config_file(config_path) if config_path else None
    ns = parser.parse_layered(
        args_list, file_values=file_values, file_name=str(config_path), environ=env
    )
    config = config_from_namespace(ns)
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
