"""Pure builders: what each process of a launch runs (argv, environment, health URL, log file).

Nothing here starts a process, reads the environment or touches the network, so every command the
launcher can build is tested without GPUs (and checked against SGLang's own parser in CI). The
plan (``plan.py``) calls them once a launch, with the config, the facts and the shared GPUs'
memory plan (``sharing.py``); they read those records and ask no other module.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dynspec.common.cli import UsageError, env_name
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts, flag_facts
from dynspec.launcher.layout import GpuSet
from dynspec.launcher.sharing import SharedGpuPlan
from dynspec.launcher.sim.profile import EAGLE_DEFAULT_MAX_RUNNING, Profile

SGLANG_MODULE = "sglang.launch_server"
SIM_MODULE = "dynspec.launcher.sim"
ROUTER_MODULE = "dynspec.router"
POOLS = ("eagle", "baseline")

# The baseline server takes every request above the threshold, so its decode batches are large.
# SGLang 0.5.23 sizes decode CUDA graphs from GPU memory (512 only on >= 60 GB GPUs at tp >= 4;
# 32-160 on 24-60 GB GPUs); past that batch size decode runs without graphs, slower. 512 is what
# SGLang itself picks on the large GPUs this design targets. --baseline-args overrides it.
BASELINE_CUDA_GRAPH_MAX_BS = 512

# The baseline streams a chunk every 4 tokens (the first token at once): SGLang's HTTP front sends
# one event a chunk, and at one token a chunk it could not keep a busy baseline fed: on one H200
# at C=256 (capped at 128 running) it held 118-180 of the 256 open requests and served 9.3-13.9k
# tok/s (bench/results/h200/pair-a-capped); at 4 tokens a chunk it held 231-240 and served
# 14.4-14.7k (pair-a-interval4). EAGLE-3 sends
# about as many tokens a chunk (its accepted tokens a step), so either server streams alike.
BASELINE_STREAM_INTERVAL = 4

# The longest MPS pipe directory: its sockets ("control_privileged") must fit a Unix socket path.
MPS_PIPE_MAX = 85

# Environment variables whose values must never be printed (dry-run shows a reference instead).
# A router setting named here reaches the router through its variable, never its command line.
SECRET_ENV = frozenset({"DYNSPEC_API_KEY", "DYNSPEC_ADMIN_API_KEY", "DYNSPEC_BACKEND_API_KEY"})

# Flags the launcher owns: a user's extra SGLang flags may not change them, because the router's
# URLs, the health checks and the GPU split are built from them. Value: the launcher flag to use.
_RESERVED = {
    "--model-path": "--model-path",
    "--model": "--model-path",
    "--tp-size": "--gpus / --eagle-gpus / --baseline-gpus",
    "--tensor-parallel-size": "--gpus / --eagle-gpus / --baseline-gpus",
    "--host": "--backend-host",
    "--port": "--eagle-port / --baseline-port",
    "--served-model-name": "--served-model-name",
    "--speculative-algorithm": "(the EAGLE server always runs EAGLE3)",
    "--speculative-draft-model-path": "--draft-model-path",
    "--speculative-draft-model": "--draft-model-path",
    "--api-key": "--backend-api-key (the router sends it to the servers)",
}

# The launcher's own choices that a user's flag replaces: our flag -> user flags that replace it.
_REPLACED_BY = {
    "--enable-metrics": {"--enable-metrics"},
    "--max-running-requests": {"--max-running-requests"},
    "--cuda-graph-max-bs-decode": {
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-bs-decode",
        "--cuda-graph-config",
        "--disable-cuda-graph",
        "--disable-decode-cuda-graph",
    },
    "--stream-interval": {"--stream-interval"},
    "--speculative-num-steps": {"--speculative-num-steps"},
    "--speculative-eagle-topk": {"--speculative-eagle-topk"},
    "--speculative-num-draft-tokens": {"--speculative-num-draft-tokens"},
    "--mem-fraction-static": {"--mem-fraction-static"},
    "--max-total-tokens": {"--max-total-tokens"},
}


@dataclass(frozen=True)
class ProcessSpec:
    # "eagle", "baseline", "router", or "pair" (a simulator serving both servers of a GPU set)
    name: str
    prefix: str  # console prefix: "[eagle gpu0-3]", "[baseline1 gpu4-7]", "[router]"
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # set on top of the launcher's environment
    health_url: str
    log_file: Path
    port: int
    # Secret values that must stand in argv (SGLang takes its key only as a flag): value -> the
    # variable that holds it, which the printed command line shows instead.
    secret_args: tuple[tuple[str, str], ...] = ()
    # Every health URL past the first that must answer 200 (a simulated GPU set serves two).
    more_health: tuple[str, ...] = ()
    key: str = ""  # unique in a launch: "eagle", "eagle0", "pair1", "router"
    after: str | None = None  # the key of the server that must be healthy before this one starts
    # Shared GPUs: the argv for a (re)start while ``partner`` runs, when it differs from ``argv``
    # (the EAGLE server restarted beside its running baseline takes the second server's share).
    partner: str | None = None
    second_argv: tuple[str, ...] = ()

    @property
    def is_server(self) -> bool:
        return self.name != "router"

    @property
    def health_urls(self) -> tuple[str, ...]:
        return (self.health_url, *self.more_health)

    def command_line(self, argv: Sequence[str] | None = None) -> str:
        """A shell command a user can paste: environment first, secrets as ``$VAR`` references."""
        parts = []
        for key, value in self.env:
            if key in SECRET_ENV:
                parts.append(f'{key}="${key}"')
            else:
                parts.append(f"{key}={shlex.quote(value)}")
        hidden = dict(self.secret_args)
        argv = self.argv if argv is None else argv
        parts += [f'"${hidden[a]}"' if a in hidden else shlex.quote(a) for a in argv]
        return " ".join(parts)

    def option(self, flag: str) -> str | None:
        """The last value its argv gives ``flag`` (None: not given)."""
        return last_value(self.argv, flag)

    def with_speed_profile(self, path: str) -> ProcessSpec:
        """The router's spec with ``--speed-profile PATH`` (a calibration's profile) added."""
        return replace(self, argv=(*self.argv, "--speed-profile", path))


def eagle_max_running_requests(threshold: int) -> int:
    """The EAGLE server's ``--max-running-requests``: the threshold plus a margin.

    Behind the router the EAGLE server holds at most ``threshold`` requests that the router counts.
    The margin covers what the router no longer counts but SGLang still runs: a stream whose client
    left is released by the router at once but aborted by SGLang about 2 s later. And when the
    baseline pool is down (being restarted), the router sends everything to EAGLE: requests above
    this cap then wait in SGLang's queue instead of growing a batch where speculation loses anyway.
    Half the threshold, at least 4: 8 -> 12, 32 -> 48 (SGLang's own cap for EAGLE servers).
    """
    return threshold + max(4, threshold // 2)


def balance_eagle_limit(profile: Profile) -> int:
    """The EAGLE server's ``--max-running-requests`` under ``balance``, from a speed profile.

    ``balance`` sends a request to EAGLE while EAGLE's predicted time per token is the lower one,
    so the EAGLE batch grows until it is as slow as the baseline's. The slowest baseline the
    profile knows is at its running limit (or, without one, its largest measured batch): the
    EAGLE server is sized to the largest batch whose time per token is still no worse than that.
    Capped at the profile's EAGLE running limit, else SGLang's own cap for EAGLE servers (48).
    """
    eagle, base = profile.mode("eagle"), profile.mode("baseline")
    cap = eagle.max_running_requests or EAGLE_DEFAULT_MAX_RUNNING
    base_batch = base.max_running_requests or base.throughput[-1][0]
    base_tpot = base_batch / base.throughput_at(base_batch)
    limit = 1
    for batch in range(1, cap + 1):
        if batch / eagle.throughput_at(batch) <= base_tpot:
            limit = batch
    return limit


def eagle_running_limit(config: LaunchConfig) -> int:
    """The EAGLE server's ``--max-running-requests``: from the profile under ``balance``, else
    from the threshold (``balance`` without a profile keeps the threshold's sizing)."""
    if config.policy == "balance" and config.speed_profile_data is not None:
        return balance_eagle_limit(config.speed_profile_data)
    if config.threshold_auto:
        # The learned threshold may settle anywhere: SGLang's own cap for EAGLE servers.
        return EAGLE_DEFAULT_MAX_RUNNING
    return eagle_max_running_requests(config.threshold)


def _flag_names(args: Iterable[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def _check_user_args(args: Sequence[str], source: str, pool: str | None) -> None:
    for name in sorted(_flag_names(args)):
        if name in _RESERVED:
            raise UsageError(f"{source}: {name} is set by the launcher; use {_RESERVED[name]}")
        if name == "--cuda-graph-max-bs":
            raise UsageError(
                f"{source}: --cuda-graph-max-bs was removed in SGLang 0.5.23; "
                "use --cuda-graph-max-bs-decode"
            )
        if pool == "baseline" and name.startswith("--speculative-"):
            raise UsageError(f"{source}: {name} does not belong on the baseline server")


def last_value(args: Sequence[str], flag: str) -> str | None:
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def stream_interval(config: LaunchConfig, pool: str) -> int:
    """A server's SGLang ``--stream-interval``: the user's last one in ``--sglang-args`` or the
    pool's args, else ``BASELINE_STREAM_INTERVAL`` for the baseline and SGLang's 1 for EAGLE.
    A simulated launch starts no SGLang to pass the args to: the simulator gets it as its own."""
    eagle = pool == "eagle"
    given = last_value(
        [*config.sglang_args, *(config.eagle_args if eagle else config.baseline_args)],
        "--stream-interval",
    )
    if given is None:
        return 1 if eagle else BASELINE_STREAM_INTERVAL
    if not given.isdigit() or int(given) < 1:
        where = "--eagle-args" if eagle else "--baseline-args"
        raise UsageError(
            f"--sglang-args / {where}: --stream-interval {given!r} is not a positive integer"
        )
    return int(given)


def _merge(own: Sequence[Sequence[str]], extra: Sequence[str]) -> list[str]:
    """Our options, minus those the user's ``extra`` flags replace, then ``extra`` as given."""
    given = _flag_names(extra)
    argv: list[str] = []
    for option in own:
        if not (_REPLACED_BY.get(option[0], set()) & given):
            argv.extend(option)
    argv.extend(extra)
    return argv


def shares_gpu(config: LaunchConfig, facts: LaunchFacts | None = None) -> bool:
    """Both servers of a GPU set on the same GPUs (the paired layout; one GPU is one set): they
    start one after the other, each with half of the memory. ``facts``: the launch's (None:
    what the flags alone say)."""
    return (facts or flag_facts(config)).shares_gpu


def memory_options(plan: SharedGpuPlan | None, pool: str, second: bool = False) -> list[list[str]]:
    """``--mem-fraction-static`` (and ``--max-total-tokens`` when sizable) on shared GPUs (None:
    not shared); ``second``: the share of a server that starts while the other one holds its
    half."""
    if plan is None:
        return []
    fraction = plan.eagle_fraction if pool == "eagle" and not second else plan.baseline_fraction
    own = [["--mem-fraction-static", f"{fraction:g}"]]
    if plan.max_total_tokens is not None:
        own.append(["--max-total-tokens", str(plan.max_total_tokens)])
    return own


def mps_env(config: LaunchConfig, gpu_set: GpuSet) -> tuple[tuple[str, str], ...]:
    """The CUDA MPS directories of a GPU set's daemon; its servers are its clients through them."""
    if not (config.mps and gpu_set.shared):
        return ()
    root = config.log_dir.resolve() / f"mps{gpu_set.index}"
    if len(str(root / "pipe")) > MPS_PIPE_MAX:
        # MPS makes Unix sockets in the pipe directory (a path of at most 107 bytes): a deep log
        # directory moves the set's MPS directories to one named after it in /tmp.
        digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
        root = Path(tempfile.gettempdir()) / f"dynspec-mps-{digest}"
    return (
        ("CUDA_MPS_PIPE_DIRECTORY", str(root / "pipe")),
        ("CUDA_MPS_LOG_DIRECTORY", str(root / "log")),
    )


def build_server_spec(
    config: LaunchConfig, pool: str, gpu_set: GpuSet, shared: SharedGpuPlan | None = None
) -> ProcessSpec:
    """One server of a GPU set (``shared``: the memory plan when its GPUs hold both servers)."""
    if pool not in POOLS:
        raise ValueError(f"unknown pool {pool!r}")
    eagle = pool == "eagle"
    port = gpu_set.port(pool)
    key = gpu_set.name(pool)
    prefix = f"[{key} {gpu_set.label(pool)}]"
    base = gpu_set.url(pool)
    log_file = config.log_dir / f"{key}.log"
    max_running = eagle_running_limit(config)
    after = gpu_set.name("eagle") if gpu_set.shared and not eagle else None
    if config.simulate:
        argv = [
            sys.executable,
            "-m",
            SIM_MODULE,
            "--mode",
            pool,
            "--profile",
            config.sim_profile,
            "--host",
            config.backend_host,
            "--port",
            str(port),
            "--served-model-name",
            config.served_model_name,
        ]
        if eagle:
            argv += ["--max-running-requests", str(max_running)]
        argv += ["--stream-interval", str(stream_interval(config, pool))]
        argv += ["--speed", f"{config.sim_speed:g}", "--log-level", config.log_level]
        return ProcessSpec(
            pool, prefix, tuple(argv), (), base + "/health_generate", log_file, port, key=key
        )

    gpus = gpu_set.gpus(pool)
    extra = [*config.sglang_args, *(config.eagle_args if eagle else config.baseline_args)]
    _check_user_args(config.sglang_args, "--sglang-args", None)
    _check_user_args(config.eagle_args, "--eagle-args", "eagle")
    _check_user_args(config.baseline_args, "--baseline-args", "baseline")
    assert config.model_path is not None and config.draft_model_path is not None
    own: list[list[str]] = [
        ["--model-path", config.model_path],
        ["--served-model-name", config.served_model_name],
        ["--tp-size", str(len(gpus))],
        ["--host", config.backend_host],
        ["--port", str(port)],
        ["--enable-metrics"],
    ]
    if eagle:
        own += [
            ["--speculative-algorithm", "EAGLE3"],
            ["--speculative-draft-model-path", config.draft_model_path],
        ]
        if config.speculative_num_steps is not None:
            own.append(["--speculative-num-steps", str(config.speculative_num_steps)])
        if config.speculative_eagle_topk is not None:
            own.append(["--speculative-eagle-topk", str(config.speculative_eagle_topk)])
        if config.speculative_num_draft_tokens is not None:
            own.append(["--speculative-num-draft-tokens", str(config.speculative_num_draft_tokens)])
        # CUDA graphs cover every batch the server may run: the user's cap if they set one.
        graph_bs = last_value(extra, "--max-running-requests") or str(max_running)
        own += [
            ["--max-running-requests", str(max_running)],
            ["--cuda-graph-max-bs-decode", graph_bs],
        ]
    else:
        own += [
            ["--cuda-graph-max-bs-decode", str(BASELINE_CUDA_GRAPH_MAX_BS)],
            ["--stream-interval", str(BASELINE_STREAM_INTERVAL)],
        ]
    secret_args: tuple[tuple[str, str], ...] = ()
    if config.backend_api_key:
        # The router sends this key; SGLang then refuses requests without it.
        own.append(["--api-key", config.backend_api_key])
        secret_args = ((config.backend_api_key, env_name("--backend-api-key")),)
    command = (
        list(config.server_command)
        if config.server_command
        else [sys.executable, "-m", SGLANG_MODULE]
    )
    argv = [*command, *_merge(own + memory_options(shared, pool), extra)]
    second_argv: list[str] = []
    if gpu_set.shared and eagle:
        second = memory_options(shared, pool, second=True)
        second_argv = [*command, *_merge(own + second, extra)]
    mps = mps_env(config, gpu_set)
    # Under MPS the daemon sees the set's GPUs and its clients see them renumbered from 0
    # (NVIDIA's MPS guide, "CUDA_VISIBLE_DEVICES"): the daemon's own ids would be an error.
    devices = ",".join(map(str, range(len(gpus)))) if mps else gpu_set.devices_of(pool)
    env: tuple[tuple[str, str], ...] = (("CUDA_VISIBLE_DEVICES", devices), *mps)
    return ProcessSpec(
        pool,
        prefix,
        tuple(argv),
        env,
        base + "/health_generate",
        log_file,
        port,
        secret_args,
        key=key,
        after=after,
        partner=gpu_set.name("baseline") if gpu_set.shared and eagle else None,
        second_argv=tuple(second_argv) if second_argv != argv else (),
    )


def build_sim_pair_spec(config: LaunchConfig, gpu_set: GpuSet) -> ProcessSpec:
    """One ``dynspec-sim --pair`` process serving both servers of a simulated GPU set (one
    clock: while both are busy each runs at its share of the GPU, timeslice or MPS)."""
    argv = [
        sys.executable,
        "-m",
        SIM_MODULE,
        "--pair",
        "--eagle-port",
        str(gpu_set.eagle_port),
        "--baseline-port",
        str(gpu_set.baseline_port),
        "--sharing",
        "mps" if config.mps else "timeslice",
        "--stream-interval",
        str(stream_interval(config, "eagle")),
        "--baseline-stream-interval",
        str(stream_interval(config, "baseline")),
        "--profile",
        config.sim_profile,
        "--host",
        config.backend_host,
        "--served-model-name",
        config.served_model_name,
        "--speed",
        f"{config.sim_speed:g}",
        "--log-level",
        config.log_level,
    ]
    key = f"pair{gpu_set.tag}"
    return ProcessSpec(
        "pair",
        f"[{key} sim]",
        tuple(argv),
        (),
        gpu_set.url("eagle") + "/health_generate",
        config.log_dir / f"{key}.log",
        gpu_set.eagle_port,
        more_health=(gpu_set.url("baseline") + "/health_generate",),
        key=key,
    )


def _flag_value(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def backend_args(config: LaunchConfig, facts: LaunchFacts) -> list[str]:
    """The router's servers: the two pool URLs (split), or one ``--pair E,B`` per GPU set."""
    if facts.layout == "split":
        (only,) = facts.gpu_sets
        return ["--eagle-url", only.url("eagle"), "--baseline-url", only.url("baseline")]
    argv: list[str] = []
    for s in facts.gpu_sets:
        argv += ["--pair", f"{s.url('eagle')},{s.url('baseline')}"]
    return argv


def build_router_spec(config: LaunchConfig, facts: LaunchFacts | None = None) -> ProcessSpec:
    """The router (``facts``: the launch's; None: what the flags alone say)."""
    argv = [
        sys.executable,
        "-m",
        ROUTER_MODULE,
        *backend_args(config, facts or flag_facts(config)),
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--policy",
        config.policy,
        "--threshold",
        "auto" if config.threshold_auto else str(config.threshold),
        "--hysteresis",
        str(config.hysteresis),
        "--drain-timeout",
        f"{config.drain_timeout:g}",
        "--log-level",
        config.log_level,
    ]
    env: list[tuple[str, str]] = []
    for flag, value in config.router_settings:
        if env_name(flag) in SECRET_ENV:
            # Keys go through the environment: a command line is visible to every user in `ps`.
            env.append((env_name(flag), str(value)))
        elif value is True:
            argv.append(flag)  # a switch that is on
        else:
            argv += [flag, _flag_value(value)]
    if config.speed_profile:
        argv += ["--speed-profile", config.speed_profile]
    return ProcessSpec(
        "router",
        "[router]",
        tuple(argv),
        tuple(env),
        config.router_url + "/health",
        config.log_dir / "router.log",
        config.port,
        key="router",
    )


def build_specs(
    config: LaunchConfig, facts: LaunchFacts | None = None, shared: SharedGpuPlan | None = None
) -> tuple[ProcessSpec, ...]:
    """Each GPU set's EAGLE server and baseline server (simulated on one GPU set: one process),
    then the router (none with --no-router): in start order. ``facts``: the launch's (None:
    what the flags alone say, nothing asked of the machine); ``shared``: the memory plan of
    GPUs that hold both servers (None: as ``facts`` say, ``plan.shared_gpu_plan``)."""
    facts = facts or flag_facts(config)
    if shared is None and facts.shares_gpu:
        shared = facts.shared_gpu_plan()
    sets = facts.gpu_sets
    if not config.simulate and not all(s.eagle_gpus and s.baseline_gpus for s in sets):
        raise UsageError("no GPUs to split: pass --gpus (e.g. --gpus 0-7)")
    if facts.layout == "paired" and not sets:
        raise UsageError("no GPUs to pair: pass --gpus (e.g. --gpus 0-7 --layout paired)")
    specs: list[ProcessSpec] = []
    for gpu_set in sets:
        if config.simulate and facts.layout == "paired":
            specs.append(build_sim_pair_spec(config, gpu_set))
        else:
            specs += [build_server_spec(config, pool, gpu_set, shared) for pool in POOLS]
    if not config.no_router:
        specs.append(build_router_spec(config, facts))
    return tuple(specs)
