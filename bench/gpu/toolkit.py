"""One bounded GPU attempt: servers through ``dynspec-launch``, router checks, sweeps, results.

Plans, each one command on the GPU machine (at most about 9 minutes, checked against ``--budget``):

- ``main``: ``dynspec-launch --gpus 0`` starts the EAGLE-3 server (draft ``hi``: every draft
  accepted) and the baseline on the one GPU, one after the other, and the router in front; the
  router checks run; then ``dynspec-bench sweep`` of each server alone and of the routed system.
- ``levels``: EAGLE-3 servers alone, one after the other (each started, swept, and left idle
  while the next starts): SGLang's ``--speculative-adaptive`` with every draft accepted, then the
  drafts built for accept length about 3 and 2, then none accepted, as long as the budget lasts
  (``levels.py``).
- ``pair-a`` / ``pair-b``: one H200 = one pair behind ``--threshold auto``, without and with
  ``--mps``: the routed pair and each server alone, C = 1..256 (``pair.py``).
- ``eight``: eight H200s, a random 70B-shaped model at tp 4, one ``--layout`` per command
  (``eight.py``; ``--dry-run`` prints every command).
- ``kill``: the pair of ``pair-a`` with ``--restart on-failure``; one server SIGKILLed under a
  closed load of C=32 through the router, three times: restart times, failed requests, load
  after, no GPU process left after the stop (``kill.py``; ``--dry-run`` prints its steps).

Bad input stops the run with one line naming what failed and the log to read (exit 1), and no
process of the run is left behind: every child runs in its own process group, stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from dynspec.bench.gpu.leftovers import TAG_VAR, kill_tagged
from dynspec.bench.procs import Children, http_status, stop_group
from dynspec.common.cli import (
    FlagParser,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)

PROG = "dynspec-bench gpu run"
# Never NVLink multicast (it can take a shared host's GPUs down); no hub; no DeepGEMM JIT.
FIXED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    "PYTHONUNBUFFERED": "1",
}
# For both servers: the bundle has no FA3 and no grammar backend; piecewise prefill graphs cost
# about a minute of capture per server and the sweep's prefill is small.
SGLANG_ARGS = (
    "--dtype bfloat16 --attention-backend triton --sampling-backend pytorch --grammar-backend none "
    "--cuda-graph-backend-prefill disabled --context-length 4096"
)
EAGLE_STEPS = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
EAGLE_STEPS_ALL = (*EAGLE_STEPS, "--speculative-num-draft-tokens", "4")
LEVELS = "1,2,4,8,16,32,64,128"
PAIR_LEVELS = "1,2,4,8,16,32,64,128,256"
SERVED = "llama8b-random"


class RunFailed(Exception):
    """Stops the run: one line, exit 1."""


@dataclass
class Run:
    out: Path
    work: Path
    deadline: float
    env: dict[str, str]
    python: str = sys.executable
    children: Children = field(default_factory=Children)
    meta: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    tag: str = ""  # in every child's environment: how leftovers are found at the end
    ports: tuple[int, int, int] = (8000, 30001, 30002)  # router, EAGLE, baseline

    @property
    def logs(self) -> Path:
        # Not under --out: only a few files come back from the GPU machine (logs.tar.gz does).
        return self.work / "logs"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, text: str) -> None:
        print(f"[gpu-run {time.monotonic() - self.t0:5.0f}s] {text}", flush=True)

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A child in its own process group; ``env`` is added to the run's environment."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            f.write(f"==> {shlex.join(argv)}\n".encode())
        merged = {**self.env, **(env or {})}
        return self.children.start(name, argv, env=merged, log=log, append=True)

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
        """Stop the child's process group, and SIGKILL the group even when its leader is gone
        (an SGLang server's scheduler and detokenizer can outlive it)."""
        stop_group(proc, grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.children.procs:
            self.children.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.children.procs)):
            self.stop(proc, grace=20.0)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(
    url: str,
    timeout: float = 10.0,
    *,
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    method: str | None = None,
) -> str:
    """A loopback page's text (never through a proxy from the environment)."""
    req = urllib.request.Request(url, data=data, headers=dict(headers or {}), method=method)
    with _NO_PROXY.open(req, timeout=timeout) as r:
        return str(r.read().decode("utf-8", "replace"))


def gauge(text: str, name: str) -> float | None:
    found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M)
    return sum(float(x) for x in found) / len(found) if found else None


def dry_run_commands(stdout: str) -> list[str]:
    """The command lines of ``dynspec-launch --dry-run`` (its ``#`` lines are notes)."""
    return [line for line in stdout.strip().splitlines() if not line.startswith("#")]


def last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


# -- set-up --------------------------------------------------------------------------------------


def site_paths(run: Run, bundle: Path | None) -> list[str]:
    """PYTHONPATH entries for SGLang: the bundle's site (+ stubs last), or none if installed."""
    from dynspec.bench.gpu.bundle import STUBS, unpack_bundle

    if bundle is None:
        if importlib.util.find_spec("sglang") is None:
            raise RunFailed("no SGLang installed and no --bundle given (dynspec-bench gpu bundle)")
        return []
    try:
        site = unpack_bundle(bundle, run.work)
    except RuntimeError as exc:
        raise RunFailed(str(exc)) from None
    return [str(site), str(site / STUBS)]


def probe_python(run: Run) -> dict[str, str]:
    """Versions as the servers will see them; a broken bundle fails here, with its message."""
    code = (
        "import json, torch, sglang, transformers; "
        "print(json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__, "
        "'transformers': transformers.__version__, "
        "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}))"
    )
    done = subprocess.run(
        [run.python, "-c", code],
        env=run.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise RunFailed(
            f"SGLang does not import: {tail[-1] if tail else 'exit ' + str(done.returncode)}"
        )
    versions: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return versions


def build_models(run: Run, models: Path, drafts: Sequence[str]) -> None:
    log = run.logs / "models.log"
    code = (
        "import sys; from pathlib import Path; from dynspec.bench.gpu.models import build_models; "
        "build_models(Path(sys.argv[1]), sys.argv[2:])"
    )
    proc = run.spawn("models", [run.python, "-c", code, str(models), *drafts], log)
    try:
        code_ = proc.wait(max(1.0, run.left()))
    except subprocess.TimeoutExpired:
        raise RunFailed(f"building the test models ran out of time; see {log}") from None
    finally:
        run.stop(proc)
    if code_ != 0:
        raise RunFailed(f"building the test models failed ({last_line(log)}); see {log}")


def check_model_loads(path: Path) -> None:
    cfg = path / "config.json"
    try:
        json.loads(cfg.read_text())
    except (OSError, ValueError):
        raise RunFailed(f"model {path}: no readable config.json") from None


# -- waiting -------------------------------------------------------------------------------------


def wait_healthy(
    run: Run, url: str, proc: subprocess.Popen[bytes], what: str, *, log: Path, timeout: float
) -> float:
    began = time.monotonic()
    limit = min(run.deadline, began + timeout)
    while time.monotonic() < limit:
        if proc.poll() is not None:
            raise RunFailed(f"{what} exited with code {proc.returncode} during start-up; see {log}")
        if http_status(url, timeout=5.0) == 200:
            return time.monotonic() - began
        time.sleep(1.0)
    raise RunFailed(f"{what} did not answer {url} within {limit - began:.0f}s; see {log}")


def wait_launcher(run: Run, proc: subprocess.Popen[bytes], log: Path) -> float:
    """Until the launcher prints its ready banner; its own one-line error if it exits first."""
    began = time.monotonic()
    while time.monotonic() < run.deadline:
        if proc.poll() is not None:
            line = last_line(log) or f"exited with code {proc.returncode}"
            raise RunFailed(f"dynspec-launch: {line.removeprefix('dynspec-launch: ')}")
        if "[dynspec] ready:" in log.read_text(errors="replace"):
            return time.monotonic() - began
        time.sleep(1.0)
    raise RunFailed(f"dynspec-launch was not ready in time; see {log} and the logs beside it")


def start_launcher(
    run: Run, launch: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``dynspec-launch``: its ``--dry-run`` first (a bad flag is one line, nothing started; its
    command lines go to the meta), then the launcher itself, until its ready banner."""
    dry = subprocess.run(
        [*launch, "--dry-run"],
        env={**run.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if dry.returncode != 0:
        raise RunFailed(f"dynspec-launch --dry-run: {last_line_of(dry.stderr)}")
    run.meta.update(launch_argv=list(launch[1:]), commands=dry_run_commands(dry.stdout))
    run.say("launch: " + shlex.join(launch[3:]))
    log = run.logs / "launcher.log"
    proc = run.spawn("launcher", launch, log, env)
    took = wait_launcher(run, proc, log)
    run.meta["launch_ready_s"] = round(took, 1)
    run.say(f"launcher ready after {took:.0f}s")
    return proc


def stop_launcher(run: Run, proc: subprocess.Popen[bytes]) -> None:
    """SIGINT, as Ctrl-C: the router drains, then each server's process group is stopped."""
    run.say("stopping the launcher (SIGINT: router drains, servers stop)")
    proc.send_signal(signal.SIGINT)
    try:
        run.meta["launcher_exit"] = proc.wait(90)
    except subprocess.TimeoutExpired:
        run.meta["launcher_exit"] = "timeout"


# -- sweeps --------------------------------------------------------------------------------------


def sweep(
    run: Run, targets: Sequence[str], out: Path, *, title: str, levels: str, limit: float
) -> bool:
    """``dynspec-bench sweep``; stopped (finished levels kept) when ``limit`` seconds pass."""
    argv = [run.python, "-m", "dynspec.bench", "sweep"]
    for t in targets:
        argv += ["--url", t]
    argv += ["--concurrency", levels, "--input-len", "256", "--output-len", "128"]
    argv += ["--requests-per-c", "2", "--min-requests", "8", "--request-timeout", "120"]
    argv += ["--pause", "0.5", "--no-progress", "--append", "--out", str(out), "--title", title]
    log = run.logs / "sweep.log"
    proc = run.spawn("sweep", argv, log)
    try:
        proc.wait(max(1.0, limit))
        finished = proc.returncode == 0
    except subprocess.TimeoutExpired:
        run.say(f"sweep of {', '.join(targets)} stopped at its time limit (finished levels kept)")
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        finished = False
    run.stop(proc)
    return finished


def accept_probe(run: Run, server: str) -> dict[str, float | None]:
    """Short load at C=4, then SGLang's own ``sglang:spec_accept_length`` gauge."""
    argv = [run.python, "-m", "dynspec.bench", "sweep", "--url", server, "--concurrency", "4"]
    argv += ["--requests", "16", "--warmup", "4", "--output-len", "128", "--no-progress"]
    argv += ["--out", str(run.work / f"probe-{time.monotonic_ns()}.jsonl")]
    proc = run.spawn("probe", argv, run.logs / "sweep.log")
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(max(1.0, min(90.0, run.left())))
    run.stop(proc)
    text = fetch(f"{server}/metrics")
    return {
        "spec_accept_length": gauge(text, "sglang:spec_accept_length"),
        "spec_accept_rate": gauge(text, "sglang:spec_accept_rate"),
    }


# -- plans ---------------------------------------------------------------------------------------


def last_line_of(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# -- entry ---------------------------------------------------------------------------------------


PLANS = ("main", "levels", "pair-a", "pair-b", "eight", "kill")
KILL_SERVERS = ("eagle", "baseline")
EIGHT_LAYOUTS = ("build", "split", "paired", "paired-mps", "2x-eagle", "2x-baseline", "2x-adaptive")


def _threshold(text: str) -> str:
    if text == "auto":
        return text
    try:
        return str(positive_int(text))
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"want a whole number >= 1 or auto: {text!r}") from None


def _kills(text: str) -> tuple[str, ...]:
    servers = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in servers if x not in KILL_SERVERS]
    if not servers or bad:
        raise argparse.ArgumentTypeError(f"want eagle or baseline, comma-separated: {text!r}")
    return servers


def _ports(text: str) -> tuple[int, int, int]:
    values = tuple(port(x) for x in text.split(","))
    if len(values) != 3 or len(set(values)) != 3:
        raise ValueError("want three different ports: router,EAGLE,baseline")
    return values


def parser() -> FlagParser:
    p = FlagParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--plan", choices=PLANS, default="main", help="what to run")
    p.add_argument("--bundle", type=Path, help="sgl-site.tar.xz (default: the installed SGLang)")
    p.add_argument("--out", type=Path, required=True, help="results folder")
    p.add_argument("--work", type=Path, default=Path("/tmp/dynspec-gpu"), help="models, site")
    p.add_argument(
        "--budget", type=positive_float, default=540.0, help="seconds for the whole attempt"
    )
    p.add_argument(
        "--levels", help=f"sweep concurrency levels (default {LEVELS}; pair-*, eight: to 256)"
    )
    p.add_argument(
        "--threshold",
        type=_threshold,
        help="router threshold: N or auto (default: 32 for main, auto for pair-*)",
    )
    p.add_argument(
        "--hysteresis", type=non_negative_int, default=8, help="router hysteresis (main)"
    )
    p.add_argument(
        "--start-timeout", type=positive_float, default=240.0, help="seconds per server start"
    )
    p.add_argument(
        "--deploy",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "deploy",
        help="the dashboard and alerts whose sglang:* metric names are checked",
    )
    p.add_argument("--models", type=Path, help="prebuilt models (default: build into --work)")
    p.add_argument("--servers", help="levels plan: which EAGLE servers (default: all, in order)")
    p.add_argument(
        "--ports", type=_ports, default="8000,30001,30002", help="router, EAGLE, baseline ports"
    )
    p.add_argument("--layout", default="split", help="eight plan: " + ", ".join(EIGHT_LAYOUTS))
    p.add_argument("--draft", choices=("hi", "p54"), default="hi", help="eight plan: EAGLE draft")
    p.add_argument(
        "--concurrency", type=positive_int, default=32, help="kill plan: closed-loop clients"
    )
    p.add_argument(
        "--kills",
        type=_kills,
        default="eagle,baseline,eagle",
        help="kill plan: the server SIGKILLed by each kill, in order",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="eight and kill plans: print every command, start nothing",
    )
    return p


def pack_logs(run: Run) -> None:
    if not run.logs.is_dir():
        return
    with tarfile.open(run.out / "logs.tar.gz", "w:gz") as t:
        t.add(run.logs, arcname="logs")


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = parser().parse_args(argv)
    if args.plan == "eight" and args.layout not in (*EIGHT_LAYOUTS, "all"):
        parser().error(f"--layout: unknown layout {args.layout!r}")
    if args.plan == "eight" and args.layout == "all" and not args.dry_run:
        parser().error("--layout all only with --dry-run (one layout per command)")
    if args.dry_run and args.plan not in ("eight", "kill"):
        parser().error("--dry-run: only the eight and kill plans have one")
    if args.dry_run and args.plan == "kill":
        from dynspec.bench.gpu.kill import dry_run as kill_dry_run

        dry = Run(out=args.out, work=args.work, deadline=time.monotonic() + args.budget, env={})
        dry.ports = args.ports
        print(kill_dry_run(dry, args.models or args.work / "models", concurrency=args.concurrency,
                           kills=args.kills), end="")  # fmt: skip
        sys.exit(0)
    if args.dry_run:
        from dynspec.bench.gpu.eight import dry_run

        work: Path = args.work
        print(dry_run(args.layout, python=sys.executable, models=args.models or work / "models",
                      work=work, ports=args.ports, draft=args.draft, startup_timeout=400.0),
              end="")  # fmt: skip
        sys.exit(0)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(FIXED_ENV)
    run = Run(out=out, work=args.work, deadline=time.monotonic() + args.budget, env=env)
    run.tag = f"{os.getpid()}-{time.time_ns()}"
    run.ports = args.ports
    env[TAG_VAR] = run.tag
    shutil.rmtree(run.logs, ignore_errors=True)
    run.meta.update(
        tag=run.tag, plan=args.plan, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    )
    code = 1
    failure: str | None = None
    try:
        extra = site_paths(run, args.bundle)
        here = env.get("PYTHONPATH", "")
        run.env["PYTHONPATH"] = os.pathsep.join([*([here] if here else []), *extra])
        run.meta["versions"] = probe_python(run)
        run.meta["sglang_args"] = SGLANG_ARGS
        run.say(f"versions: {run.meta['versions']}")
        if args.models is not None:
            models = args.models
        else:
            models = args.work / "models"
            if args.plan == "levels":
                from dynspec.bench.gpu.levels import level_servers

                drafts = [d for _, d, _ in level_servers(args.servers)]
            else:
                drafts = ["hi"]
            if args.plan != "eight":
                build_models(run, models, drafts)
                run.say("models built")
        levels = args.levels or (LEVELS if args.plan in ("main", "levels") else PAIR_LEVELS)
        if args.plan in ("pair-a", "pair-b"):
            from dynspec.bench.gpu.pair import PAIR_PLANS, plan_pair

            code = plan_pair(
                run,
                models,
                PAIR_PLANS[args.plan],
                levels=levels,
                threshold=args.threshold or "auto",
            )
        elif args.plan == "kill":
            from dynspec.bench.gpu.kill import plan_kill

            code = plan_kill(run, models, concurrency=args.concurrency, kills=args.kills)
        elif args.plan == "eight":
            from dynspec.bench.gpu.eight import plan_eight

            code = plan_eight(
                run, models, args.layout, levels=levels, draft=args.draft,
                start_timeout=args.start_timeout,
            )  # fmt: skip
        elif args.plan == "main":
            from dynspec.bench.gpu.mainplan import plan_main

            code = plan_main(
                run,
                models,
                args.deploy,
                levels=levels,
                threshold=int(args.threshold or 32),
                hysteresis=args.hysteresis,
            )
        else:
            from dynspec.bench.gpu.levels import plan_levels

            code = plan_levels(run, models, levels, args.start_timeout, args.servers)
    except RunFailed as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        run.stop_all()
        run.meta["leftovers_killed"] = kill_tagged(run.tag)
        run.meta["elapsed_s"] = round(time.monotonic() - run.t0, 1)
        if failure:
            run.meta["failure"] = failure
        (out / "meta.json").write_text(json.dumps(run.meta, indent=1, default=str))
        with contextlib.suppress(OSError, tarfile.TarError):
            pack_logs(run)
    if failure:
        print(f"{PROG}: error: {failure}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()
