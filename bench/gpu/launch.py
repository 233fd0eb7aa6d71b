"""A plan's launch of one pair on one GPU (``dynspec-launch --gpus 0``): its command line, its
start and its end, its entry in ``meta.json``, and the session that keeps it running for the next
device command (``--keep``): docs/benchmarks.md, "Across device commands".
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dynspec.bench.gpu.leftovers import compute_apps
from dynspec.bench.gpu.toolkit import SGLANG_ARGS, Run, RunFailed
from dynspec.bench.procs import alive, captured, last_line, proc_stat, wait_http
from dynspec.launcher.process import tail

EAGLE_STEPS = (
    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip
SERVED = "llama8b-random"
AFTER_S = 240.0  # what a plan needs of the budget once both servers run


def launch_argv(
    run: Run,
    models: Path,
    *,
    threshold: str,
    mps: bool = False,
    baseline_limit: int | None = None,
    baseline_args: str = "",
    draft: str = "hi",
    more: Sequence[str] = (),
) -> list[str]:
    """``dynspec-launch --gpus 0``: the EAGLE-3 server (draft ``hi``: every draft accepted) and
    the baseline on one GPU, the router in front. Each server may take until ``AFTER_S`` is all
    that is left of the budget.
    ``baseline_limit``: the baseline's ``--max-running-requests`` too (None: SGLang's own);
    ``baseline_args``: more SGLang flags for the baseline, after those; ``draft``: the EAGLE
    draft (``traffic`` may run ``p54``, accept length about 2.4); ``more``: more launcher flags,
    last (``traffic``: the router's return delay, the log level)."""
    baseline = "--cuda-graph-max-bs-decode 256"
    if baseline_limit is not None:
        baseline += f" --max-running-requests {baseline_limit}"
    if baseline_args:
        baseline += f" {baseline_args}"
    argv = [
        run.python, "-m", "dynspec.launcher", "--gpus", "0",
        "--model-path", str(models / "llama8b"),
        "--draft-model-path", str(models / f"eagle3-{draft}"),
        "--served-model-name", SERVED, *EAGLE_STEPS, "--threshold", threshold,
        "--host", "127.0.0.1", "--port", str(run.ports[0]),
        "--eagle-port", str(run.ports[1]), "--baseline-port", str(run.ports[2]),
        "--sglang-args", SGLANG_ARGS,
        # Swept alone too: the EAGLE server runs up to 128 (C=256 alone queues the rest; it has
        # lost to the baseline from C=128 on), graphs up to 128 keep its start short.
        "--eagle-args", "--max-running-requests 128",
        "--baseline-args", baseline,
        "--log-dir", str(run.logs), "--restart", "never", "--kill-grace", "15",
        "--startup-timeout", f"{max(60.0, run.left() - AFTER_S):.0f}", "--progress-every", "15",
    ]  # fmt: skip
    if mps:
        argv.append("--mps")
    return [*argv, *more]


def wait_launcher(run: Run, proc: subprocess.Popen[bytes], log: Path) -> float:
    """Until the launcher prints its ready banner; its own one-line error if it exits first."""
    began = time.monotonic()
    while time.monotonic() < run.deadline:
        if proc.poll() is not None:
            line = "".join(tail(log, 1)) or f"exited with code {proc.returncode}"
            raise RunFailed(f"dynspec-launch: {line.removeprefix('dynspec-launch: ')}")
        if "[dynspec] ready:" in log.read_text(errors="replace"):
            return time.monotonic() - began
        time.sleep(1.0)
    raise RunFailed(f"dynspec-launch was not ready in time; see {log} and the logs beside it")


def start_launcher(run: Run, launch: Sequence[str]) -> subprocess.Popen[bytes]:
    """``dynspec-launch``: its ``--dry-run`` first (a bad flag is one line, nothing started; its
    command lines, not its ``#`` notes, go to the meta), then the launcher itself, until its ready
    banner."""
    dry = captured([*launch, "--dry-run"], env=run.env, timeout=120)
    if dry.returncode != 0:
        raise RunFailed(f"dynspec-launch --dry-run: {last_line(dry.stderr)}")
    commands = [ln for ln in dry.stdout.strip().splitlines() if not ln.startswith("#")]
    run.meta.update(launch_argv=list(launch[1:]), commands=commands)
    run.say("launch: " + shlex.join(launch[3:]))
    log = run.logs / "launcher.log"
    proc = run.spawn("launcher", launch, log)
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


def drop_flag(argv: Sequence[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def router_argv(
    commands: Sequence[str], port: int | str, *, drop: Sequence[str] = (), more: Sequence[str] = ()
) -> list[str]:
    """A second router in front of the launch's servers: the launcher's router command line (its
    ``--dry-run``'s, ``meta.json``'s ``commands``) on ``port``, less ``drop`` (each flag with its
    value), then ``more``."""
    lines = [c for c in commands if " -m dynspec.router " in f" {c} "]
    if not lines:
        raise RunFailed("the launcher's --dry-run printed no router command")
    argv = [a for a in shlex.split(lines[-1]) if "=" not in a or a.startswith("-")]
    for flag in ("--port", *drop):
        argv = drop_flag(argv, flag)
    return [*argv, "--port", str(port), *more]


def start_router(run: Run, name: str, argv: Sequence[str], port: int) -> subprocess.Popen[bytes]:
    """A second router (``router_argv``), logging to ``logs/NAME.log``, until it is healthy."""
    log = run.logs / f"{name}.log"
    proc = run.spawn(name, argv, log)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 60.0, proc=proc)
    except (RuntimeError, TimeoutError):
        run.stop(proc)
        raise RunFailed(f"{name} did not come up; see {log}") from None
    return proc


def start_launch(run: Run, launch: Sequence[str]) -> subprocess.Popen[bytes]:
    """``start_launcher``, then what the GPU runs and the launch's calibration, for the results."""
    proc = start_launcher(run, launch)
    run.meta["compute_apps"] = compute_apps()[1]
    # The launcher's calibration profile(s), into the results (what the router started from).
    folder = run.logs / "calibration"
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        (run.results / f"calibration-{f.name}").write_bytes(f.read_bytes())
        run.meta.setdefault("calibration", []).append(f.name)
    return proc


def finish(
    run: Run,
    procs: Mapping[str, subprocess.Popen[bytes]],
    session: dict[str, Any] | None,
    *,
    keep: bool,
    **extra: Any,
) -> int:
    """The plan's end: its launch kept for the next command (``keep``: the budget ended first;
    ``extra`` goes into the session's file), or stopped."""
    if keep and session is None:
        keep_session(run, procs, **extra)
    else:
        run.keep = keep
        if not keep:
            stop_all(run, procs, session)
    return 0


def stop_all(
    run: Run, procs: Mapping[str, subprocess.Popen[bytes]], session: dict[str, Any] | None
) -> None:
    """A second router (``start_router``) first, then the launcher (SIGINT: its router drains, its
    servers stop), whether this command or an earlier one started them; then what the GPU runs."""
    if session is None:
        for name in [n for n in procs if n != "launcher"]:
            run.stop(procs[name], grace=20.0)
        stop_launcher(run, procs["launcher"])
    else:
        for name in sorted(session["procs"], key=lambda n: n == "launcher"):
            pid, start = session["procs"][name]
            run.say(f"stopping the kept {name} (pid {pid})")
            stop_kept(int(pid), int(start))
        pid, start = session["procs"]["launcher"]
        # Not this command's child: its exit code is its parent's to read, not ours.
        run.meta["launcher_exit"] = "running" if alive(int(pid), int(start)) else "stopped"
    run.meta["compute_apps_after"] = compute_apps(header=False)[1]


def session_file(run: Run) -> Path:
    return run.work / "session.json"


def keep_session(run: Run, procs: Mapping[str, subprocess.Popen[bytes]], **extra: Any) -> None:
    """Leave ``procs`` (session leaders: ``Children`` starts every child in a session of its own)
    running past this command, for the next one with the same ``--work`` (``extra`` is kept in
    the session's file too)."""
    kept = {}
    for name, proc in procs.items():
        st = proc_stat(proc.pid)
        if st is None:
            raise RunFailed(f"{name} (pid {proc.pid}) is gone: nothing to keep")
        kept[name] = [proc.pid, st[2]]
        if proc in run.children.procs:
            run.children.procs.remove(proc)
    run.keep = True
    state = {"tag": run.tag, "ports": list(run.ports), "procs": kept, "plan": run.meta.get("plan")}
    state.update(extra)
    session_file(run).write_text(json.dumps(state))
    run.say("kept running for the next command: " + ", ".join(kept))


def kept_session(run: Run, plan: str) -> dict[str, Any] | None:
    """The session an earlier command of this plan left running, if every process of it still
    runs; a file whose processes are gone is removed (the next command starts afresh)."""
    path = session_file(run)
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    procs = state.get("procs", {})
    if state.get("plan") != plan or not all(alive(pid, start) for pid, start in procs.values()):
        gone = [name for name, (pid, start) in procs.items() if not alive(pid, start)]
        run.say(f"not resuming the kept session ({', '.join(gone) or 'another plan'} gone): "
                "starting afresh")  # fmt: skip
        for pid, start in procs.values():
            if alive(pid, start):
                stop_kept(pid, start)
        path.unlink(missing_ok=True)
        return None
    return state


def stop_kept(pid: int, start: int, grace: float = 90.0) -> None:
    """SIGINT a kept session leader (as Ctrl-C: the launcher drains and stops its servers), then
    SIGKILL its process group if it has not ended within ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    limit = time.monotonic() + grace
    while alive(pid, start) and time.monotonic() < limit:
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
