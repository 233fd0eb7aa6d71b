"""The launcher's flags: the parser, every flag's name, default and help in one place.

``config.py`` reads them (with ``DYNSPEC_*`` variables and ``--config FILE.toml``) into one
frozen ``LaunchConfig``.
"""

from __future__ import annotations

import argparse

from dynspec.common.cli import (
    FlagParser,
    add_log_level,
    env_name,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from dynspec.launcher.router_flags import ROUTER_SETTINGS

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
        "closed-loop sweep up to the EAGLE server's running limit, about a minute a pass), write "
        "it as a speed profile to LOG_DIR/calibration/ (keyed by model, draft, the servers' "
        "flags, SGLang version and GPU) and give it to the router as --speed-profile; "
        "'auto': when no --speed-profile is given, none is cached for the key, and the router "
        "uses one (--threshold auto or --policy balance); 'always': measure again (not with "
        "--speed-profile) and overwrite the cached one; 'never': do not. A calibration that "
        "fails says so in one line and the router starts without a profile",
    )
    r.add_argument(
        "--calibrate-passes",
        type=positive_int,
        default=3,
        help="how many times the calibration measures each level, the servers of a GPU set "
        "taking turns pass by pass after one warm-up level each; the profile takes each level's "
        "median, so one disturbed level does not set the router's start (default 3)",
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


def own_env_names(parser: argparse.ArgumentParser) -> frozenset[str]:
    """``DYNSPEC_*`` variables that set the launcher's own flags (not passed on to children)."""
    names = set()
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                names.add(env_name(opt))
    return frozenset(names)
