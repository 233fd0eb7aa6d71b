"""The ``kill`` plan: SIGKILL one SGLang server under load, three times, on one GPU (issue 17).

``dynspec-launch --restart on-failure`` starts the ``pair-a`` pair with the router in front;
before each kill the router's threshold is moved (``steering``) so that a closed loop of C=32
(``killload.py``) sits on the server about to die. What is measured per kill, why the threshold
moves, and the time each part takes: bench/results/h200/README.md, "Kill a server under load".
Results are written after every kill, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynspec.bench.gpu.killreport import (
    OTHER,
    POOLS,
    counters,
    gpu_pids,
    kill_checks,
    kill_requests,
    read_records,
    summary_checks,
    write_results,
)
from dynspec.bench.gpu.leftovers import compute_apps, tagged_pids
from dynspec.bench.gpu.toolkit import (
    LAUNCH_S,
    RESERVE_S,
    SERVED,
    SETUP_S,
    STOP_S,
    LogTail,
    Run,
    RunFailed,
    check_model_loads,
    fetch,
    gauge,
    launch_argv,
    start_launcher,
    stop_launcher,
)
from dynspec.bench.procs import alive, cmdline, comm, descendants, parents, proc_stat
from dynspec.launcher.process import group_members

KILLS = ("eagle", "baseline", "eagle")
CONCURRENCY = 32
# A restart on the H200 once the first start filled the JIT caches (triton kernels: the cold
# EAGLE start spent 70 s capturing its verify graphs, a warm one 3 s): the second EAGLE server of
# the levels plan took 67-70 s to healthy, pair-b's EAGLE 61 s and baseline 52 s.
RESTART_S = {"eagle": 70.0, "baseline": 55.0}
# Per kill besides the restart: the load generator's start and the steering (~3 s), the launcher's
# 1 s restart delay and its poll, the router's health interval (2 s), settling (3 s), the drain.
PHASE_S = 15.0
SETTLE_S = 3.0  # load kept on the restarted server once the router sees it healthy
STEER_TIMEOUT_S = 20.0
DRAIN_S = 15.0  # the load generator's wait for its requests in flight (each ~1 s) once stopped
RESTART_LIMIT_S = 300.0
POLL_S = 0.25
AFTER_TIMEOUT_S = 10.0
ADMIN_KEY_VAR = "DYNSPEC_ADMIN_API_KEY"
# The launcher's own lines about a server (not the server's echoed output).
EVENT = re.compile(
    r"^\[(?P<server>eagle|baseline) [^\]]*\] (?P<text>(?:was killed by|exited with code|"
    r"restarted \(start|healthy again after|not healthy within).*)$"
)
HEALTHY_AGAIN = re.compile(r"healthy again after (\d+)s")


def steering(pool: str, concurrency: int) -> dict[str, int]:
    """The router's threshold that keeps a closed loop of ``concurrency`` on ``pool``: twice the
    load for EAGLE, half of it for the baseline (and back to EAGLE only at a quarter)."""
    if pool == "eagle":
        high = 2 * concurrency
        return {"threshold": high, "hysteresis": max(1, high // 4)}
    low = max(2, concurrency // 2)
    return {"threshold": low, "hysteresis": max(1, low // 2)}


def need_seconds(server: str) -> float:
    return RESTART_S[server] + PHASE_S + RESERVE_S


def choose_server(planned: str, left: float) -> str | None:
    """The server to kill with ``left`` seconds to go: the planned one, else the baseline (the
    faster restart), else none."""
    for server in (planned, "baseline"):
        if left >= need_seconds(server):
            return server
    return None


def plan_seconds(kills: Sequence[str]) -> dict[str, float]:
    parts = {"setup": SETUP_S, "launch": LAUNCH_S}
    for i, server in enumerate(kills, 1):
        parts[f"kill{i}_{server}"] = RESTART_S[server] + PHASE_S
    parts["stop"] = STOP_S
    parts["total"] = sum(parts.values())
    return parts


# -- processes -----------------------------------------------------------------------------------


def server_pid(launcher: int, port: int) -> int | None:
    """The launcher's child that serves ``port``: an SGLang server's main process."""
    for pid, parent in parents().items():
        argv = cmdline(pid)
        if parent == launcher and any(
            a == "--port" and b == str(port) for a, b in itertools.pairwise(argv)
        ):
            return pid
    return None


# -- the router and the servers ------------------------------------------------------------------


@dataclass
class KillRun:
    run: Run
    launcher: subprocess.Popen[bytes]
    key: str
    concurrency: int
    log: LogTail
    # Every process of the launcher's tree seen: pid -> (start time, name).
    seen: dict[int, tuple[int, str]] = field(default_factory=dict)

    @property
    def router(self) -> str:
        return f"http://127.0.0.1:{self.run.ports[0]}"

    def port(self, pool: str) -> int:
        return self.run.ports[1] if pool == "eagle" else self.run.ports[2]

    def url(self, pool: str) -> str:
        return f"http://127.0.0.1:{self.port(pool)}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def status(self) -> dict[str, Any] | None:
        try:
            data = json.loads(fetch(f"{self.router}/status", 5.0, headers=self.headers()))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def set_threshold(self, settings: Mapping[str, int]) -> None:
        body = json.dumps(dict(settings)).encode()
        headers = {**self.headers(), "Content-Type": "application/json"}
        try:
            fetch(f"{self.router}/admin/threshold", 10.0, headers=headers, data=body, method="PUT")
        except OSError as exc:
            raise RunFailed(f"PUT /admin/threshold {dict(settings)}: {exc}") from None

    def remember(self) -> None:
        """Add the launcher's tree as it is now (a killed server's reparented workers are found
        by the run's tag at the end instead)."""
        for pid in [self.launcher.pid, *descendants(self.launcher.pid)]:
            st = proc_stat(pid)
            if st is not None and pid not in self.seen:
                self.seen[pid] = (st[2], comm(pid))

    def gpu_apps(self) -> tuple[bool, list[str]]:
        ok, text = compute_apps(header=False, env=self.run.env)
        return ok, [ln.strip() for ln in text.splitlines() if ln.strip()] if ok else [text]


def pools_of(status: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each pool's server entry of the router's ``/status`` (one pair: one server a pool)."""
    found: dict[str, dict[str, Any]] = {}
    for s in (status or {}).get("servers") or []:
        if isinstance(s, dict) and s.get("pool") in POOLS:
            found.setdefault(str(s["pool"]), s)
    return found


def in_flight(status: Mapping[str, Any] | None) -> dict[str, int]:
    return {p: int(s.get("in_flight") or 0) for p, s in pools_of(status).items()}


def running(url: str) -> float | None:
    """SGLang's ``sglang:num_running_reqs`` (what the run's checks read on 0.5.17)."""
    try:
        return gauge(fetch(f"{url}/metrics", 5.0), "sglang:num_running_reqs")
    except OSError:
        return None


def upstream_errors(k: KillRun) -> dict[str, float]:
    try:
        return counters(fetch(f"{k.router}/metrics", 5.0), "dynspec_upstream_errors_total")
    except OSError:
        return {}


# -- one kill ------------------------------------------------------------------------------------


def load_argv(run: Run, kill: int, concurrency: int, router: str) -> list[str]:
    return [
        run.python, "-m", "dynspec.bench.gpu.killload", "--url", router, "--model", SERVED,
        "--out", str(run.results / "kill.jsonl"), "--kill", str(kill), "--t0", repr(run.t0),
        "--concurrency", str(concurrency), "--drain", f"{DRAIN_S:g}",
        "--max-seconds", f"{max(30.0, run.left() - RESERVE_S / 2):.0f}",
    ]  # fmt: skip


def wait_steady(k: KillRun, pool: str, loader: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Until the router holds at least half the load on ``pool`` and none on the other, three
    polls in a row (or the steering timeout: the kill is then made anyway, and says so)."""
    began = time.monotonic()
    need = max(1, k.concurrency // 2)
    stable = 0
    flights: dict[str, int] = {}
    while time.monotonic() - began < STEER_TIMEOUT_S:
        if loader.poll() is not None:
            raise RunFailed(f"the load generator exited early; see {k.run.logs / 'load.log'}")
        flights = in_flight(k.status())
        if flights.get(pool, 0) >= need and flights.get(OTHER[pool], 0) == 0:
            stable += 1
            if stable >= 3:
                return {"steady": True, "waited_s": round(time.monotonic() - began, 2),
                        "in_flight": flights}  # fmt: skip
        else:
            stable = 0
        time.sleep(POLL_S)
    return {"steady": False, "waited_s": round(time.monotonic() - began, 2), "in_flight": flights}


def watch_restart(
    k: KillRun, pool: str, pid: int, *, workers: Mapping[int, int], killed_at: float, limit: float
) -> dict[str, Any]:
    """From the kill until the launcher and the router both see the server healthy again (or
    ``limit``): seconds after the kill of each event."""
    port = k.port(pool)
    left = dict(workers)  # pid -> start time, still alive
    out: dict[str, Any] = {"workers_gone_s": {}, "launcher_lines": []}
    next_poll = 0.0

    def ago() -> float:  # taken when each reading is in (a /proc scan takes milliseconds)
        return round(time.monotonic() - killed_at, 3)

    while True:
        now = time.monotonic()
        for w, started in list(left.items()):
            if not alive(w, started):
                out["workers_gone_s"][str(w)] = ago()
                del left[w]
        if now >= next_poll:
            next_poll = now + POLL_S
            if "group_gone_s" not in out and not group_members(pid):
                out["group_gone_s"] = ago()
            if "restarted_s" not in out:
                new = server_pid(k.launcher.pid, port)
                if new is not None and new != pid:
                    out["restarted_s"], out["new_pid"] = ago(), new
            for line in k.log.lines():
                m = EVENT.match(line)
                if m is None or m["server"] != pool:
                    continue
                out["launcher_lines"].append({"s": ago(), "line": line})
                said = HEALTHY_AGAIN.search(m["text"])
                if said and "launcher_healthy_s" not in out:
                    out["launcher_healthy_s"] = ago()
                    out["launcher_says_s"] = int(said.group(1))
            healthy = pools_of(k.status()).get(pool, {}).get("healthy")
            if healthy is False and "router_down_s" not in out:
                out["router_down_s"] = ago()
            seen_down = "router_down_s" in out or "launcher_healthy_s" in out
            if healthy is True and seen_down and "router_healthy_s" not in out:
                out["router_healthy_s"] = ago()
        if "router_healthy_s" in out and "launcher_healthy_s" in out and "group_gone_s" in out:
            break
        if k.launcher.poll() is not None:
            raise RunFailed(f"dynspec-launch exited during kill of {pool}; see {k.log.path}")
        if now >= limit:
            out["timed_out_s"] = ago()
            break
        # The workers' ends to 20 ms (whose signal ended them shows in the timing).
        time.sleep(0.02 if left else 0.05)
    return out


def stop_load(run: Run, proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM: no new requests; those in flight finish (up to DRAIN_S), then it writes them."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(DRAIN_S + 15)
    run.stop(proc, grace=5.0)


def after_load(k: KillRun) -> dict[str, Any]:
    """The router's load and each server's running requests once the load generator is gone:
    the first reading, and how long until all were 0 (None: not within AFTER_TIMEOUT_S)."""
    began = time.monotonic()
    first: dict[str, Any] | None = None
    while True:
        status = k.status()
        flights = in_flight(status)
        counts = {p: running(k.url(p)) for p in POOLS}
        reading = {"load": (status or {}).get("load"), "in_flight": flights, "running": counts}
        if first is None:
            first = dict(reading)
        zero = reading["load"] == 0 and all(v == 0 for v in flights.values())
        zero = zero and all(v == 0 for v in counts.values())
        waited = round(time.monotonic() - began, 2)
        if zero or waited >= AFTER_TIMEOUT_S:
            first["zero_after_s"] = waited if zero else None
            if not zero:
                first["last"] = reading
            return first
        time.sleep(0.5)


def one_kill(k: KillRun, kill: dict[str, Any]) -> None:
    """One kill, filled into ``kill`` (``{"kill": index, "server": pool}``) as it goes, so that
    what it measured stays in the summary when it stops half-way."""
    run = k.run
    index, server = int(kill["kill"]), str(kill["server"])
    kill["threshold"] = settings = steering(server, k.concurrency)
    k.set_threshold(settings)
    run.say(f"kill {index}: load C={k.concurrency} on {server} (threshold {settings})")
    argv = load_argv(run, index, k.concurrency, k.router)
    loader = run.spawn("load", argv, run.logs / "load.log")
    try:
        kill["before"] = wait_steady(k, server, loader)
        pid = server_pid(k.launcher.pid, k.port(server))
        if pid is None:
            raise RunFailed(f"no process of the launcher listens on port {k.port(server)}")
        members = [p for p in group_members(pid) if p != pid]
        workers = {p: st[2] for p in members if (st := proc_stat(p)) is not None}
        kill["pid"] = pid
        kill["argv"] = cmdline(pid)[:3]
        kill["workers"] = [{"pid": p, "name": comm(p)} for p in sorted(workers)]
        k.remember()
        _, apps = k.gpu_apps()
        kill["gpu_before"] = apps
        kill["gpu_pids_before_of_server"] = [p for p in gpu_pids("\n".join(apps)) if p in workers]
        errors_before = upstream_errors(k)
        k.log.skip()
        # The clock is read before the signal, not after: what the kill causes (a stream the
        # load generator sees cut) cannot then be stamped before it. Read after, a plan
        # preempted between the two on a busy machine put the cuts 2-3 ms before the kill,
        # "failed before the kill". Rounded as the load's records are, so the order holds.
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        kill["killed_at"] = round(killed_at - run.t0, 4)
        run.say(f"kill {index}: SIGKILL {server} server pid {pid} ({len(workers)} workers)")
        limit = killed_at + min(RESTART_LIMIT_S, run.left() - RESERVE_S)
        kill.update(
            watch_restart(k, server, pid, workers=workers, killed_at=killed_at, limit=limit)
        )
        back_at = None
        if "router_healthy_s" in kill:
            back_at = killed_at + kill["router_healthy_s"] - run.t0
            time.sleep(max(0.0, min(SETTLE_S, run.left() - RESERVE_S)))
        run.say(
            f"kill {index}: {server} restarted after {kill.get('restarted_s')}s, healthy for "
            f"the router after {kill.get('router_healthy_s')}s"
        )
    finally:
        stop_load(run, loader)
    kill["after"] = after_load(k)
    errors_after = upstream_errors(k)
    kill["router_upstream_errors"] = {
        key: value - errors_before.get(key, 0.0)
        for key, value in errors_after.items()
        if value != errors_before.get(key, 0.0)
    }
    _, apps = k.gpu_apps()
    kill["gpu_after"] = apps
    kill["gpu_pids_after"] = gpu_pids("\n".join(apps))
    k.remember()
    records = read_records(run.results / "kill.jsonl", index)
    kill["requests"] = kill_requests(
        records, server=server, killed_at=kill["killed_at"], back_at=back_at
    )
    kill["checks"] = kill_checks(kill)


# -- the plan ------------------------------------------------------------------------------------


def orphan_check(k: KillRun) -> dict[str, Any]:
    """After the launcher's stop: nvidia-smi lists no compute process (asked until it is empty,
    up to 15 s: a process's GPU context goes shortly after it), and nothing of the launcher's
    tree or of the run's tag lives on."""
    began = time.monotonic()
    while True:
        ok, apps = k.gpu_apps()
        waited = round(time.monotonic() - began, 2)
        if (ok and not apps) or not ok or waited >= 15:
            break
        time.sleep(1.0)
    survivors = [
        {"pid": pid, "name": name}
        for pid, (started, name) in sorted(k.seen.items())
        if alive(pid, started)
    ]
    tagged = tagged_pids(k.run.tag)
    return {
        "nvidia_smi_answered": ok,
        "gpu_processes": apps,
        "gpu_empty_after_s": waited if ok and not apps else None,
        "processes_seen": len(k.seen),
        "survivors": survivors,
        "tagged_alive": [{"pid": p, "name": comm(p)} for p in tagged],
        "launcher_exit": k.run.meta.get("launcher_exit"),
    }


def plan_kill(
    run: Run, models: Path, *, concurrency: int = CONCURRENCY, kills: Sequence[str] = KILLS
) -> int:
    check_model_loads(models / "llama8b")
    check_model_loads(models / "eagle3-hi")
    expected = plan_seconds(kills)
    run.meta["expected_s"] = {name: round(v) for name, v in expected.items()}
    run.say(f"expected about {expected['total']:.0f}s in all")
    least = LAUNCH_S + need_seconds("baseline") + STOP_S
    if run.left() < least:
        # A launch that cannot be followed by one kill spends the GPU's time for nothing.
        raise RunFailed(
            f"{run.left():.0f}s of --budget left: the first start of both servers and one kill "
            f"need about {least:.0f}s"
        )
    first = steering(kills[0] if kills else "eagle", concurrency)
    launch = launch_argv(
        run, models, threshold=str(first["threshold"]), hysteresis=first["hysteresis"],
        mps=False, restart="on-failure", after_s=need_seconds("baseline") + STOP_S,
    )  # fmt: skip
    key = secrets.token_hex(16)
    proc = start_launcher(run, launch, env={ADMIN_KEY_VAR: key})
    k = KillRun(run, proc, key, concurrency, LogTail(run.logs / "launcher.log"))
    k.remember()
    _, run.meta["compute_apps"] = k.gpu_apps()
    summary: dict[str, Any] = {
        "what": "MEASURED",
        "versions": run.meta.get("versions"),
        "concurrency": concurrency,
        "planned": list(kills),
        "launch_ready_s": run.meta.get("launch_ready_s"),
        "kills": [],
        "not_run": [],
    }
    stopped = ""  # why no more kills are made
    try:
        for index, planned in enumerate(kills, 1):
            server = choose_server(planned, run.left())
            if stopped or server is None:
                why = stopped or f"{run.left():.0f} s left"
                run.say(f"kill {index} ({planned}) not run: {why}")
                summary["not_run"].append({"kill": index, "server": planned, "why": why})
                continue
            kill: dict[str, Any] = {"kill": index, "server": server}
            if server != planned:
                kill["instead_of"] = planned
            summary["kills"].append(kill)
            one_kill(k, kill)
            write_results(run.results, summary)
            if kill.get("router_healthy_s") is None:
                stopped = f"kill {index}: {server} was not healthy again"
    finally:
        k.remember()
        stop_launcher(run, proc)
        summary["orphans"] = orphan_check(k)
        summary["checks"] = summary_checks(summary)
        run.meta["kill_checks"] = summary["checks"]
        write_results(run.results, summary)
    missed = [name for name, ok in summary["checks"].items() if not ok]
    run.say("kill checks: " + ("all passed" if not missed else "MISSED " + ", ".join(missed)))
    return 0 if not missed else 1


def dry_run(run: Run, models: Path, *, concurrency: int, kills: Sequence[str]) -> str:
    """The launcher's command and each kill's steps, as the plan would run them."""
    first = steering(kills[0] if kills else "eagle", concurrency)
    launch = launch_argv(
        run, models, threshold=str(first["threshold"]), hysteresis=first["hysteresis"],
        mps=False, restart="on-failure", after_s=need_seconds("baseline") + STOP_S,
    )  # fmt: skip
    expected = plan_seconds(kills)
    lines = [
        f"# kill plan: C={concurrency} streamed chat requests through the router, SIGKILL of one "
        "server's main process per kill",
        "# expected seconds: " + ", ".join(f"{n} {v:.0f}" for n, v in expected.items()),
        f"{ADMIN_KEY_VAR}=<random> {shlex.join(launch)}",
    ]
    router = f"http://127.0.0.1:{run.ports[0]}"
    for index, server in enumerate(kills, 1):
        lines.append(
            f"# kill {index}: {server}: PUT {router}/admin/threshold "
            f"{json.dumps(steering(server, concurrency))}, then the load, then SIGKILL"
        )
        lines.append(shlex.join(load_argv(run, index, concurrency, router)))
    lines.append(
        "# then: SIGINT to the launcher; nvidia-smi --query-compute-apps=pid,process_name,"
        "used_memory --format=csv,noheader must list nothing"
    )
    return "\n".join(lines) + "\n"
