"""Eight GPUs four ways: the same two pairs of simulated servers behind four router setups.

``dynspec-bench envelope --four-way`` starts two EAGLE and two baseline ``dynspec-sim`` servers
(each stands for four GPUs) and one ``dynspec-router`` per way of using the eight GPUs:

- ``routed-threshold``: one EAGLE and one baseline server, ``--policy threshold`` with the
  threshold that ``suggest-threshold`` picks from single-server sweeps of the same profile;
- ``routed-balance``: the same two servers, ``--policy balance --speed-profile`` (the profile);
- ``2x-eagle``: both EAGLE servers in one pool (least in flight), no baseline;
- ``2x-baseline``: both baseline servers in one pool.

Every level runs each way in turn (``sweep``'s order), so a drift of the machine spreads over all.
The report checks ``balance`` against the goals below, per concurrency. Everything is SIMULATED.

The servers are shared: ``routed-threshold``, ``routed-balance`` and ``2x-eagle`` all use the
first EAGLE server, one after the other. A ``balance`` router that polls ``/metrics`` therefore
also sees the other routers' load on its servers between its own levels; what it reads there
(running requests, throughput) is still that server's speed at that load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import importlib.util
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dynspec.bench import report, threshold
from dynspec.bench.envelope import expected_tpot_ms, processes
from dynspec.bench.load import Target
from dynspec.bench.procs import Children, free_port
from dynspec.bench.report import Record, model_time
from dynspec.bench.sweep import ProgressLine, SweepConfig, sweep
from dynspec.launcher.sim.profile import Profile, load_profile

logger = logging.getLogger(__name__)

WAYS = ("routed-threshold", "routed-balance", "2x-eagle", "2x-baseline")
SINGLES = ("eagle", "baseline")

# Goals for routed-balance, per concurrency C.
VS_THRESHOLD_TPUT = 0.98  # tok/s >= 0.98x routed-threshold's, at every C
VS_THRESHOLD_TPOT = 1.05  # p50 TPOT <= 1.05x routed-threshold's, at C <= threshold
HIGH_LOAD_GAIN = 1.25  # tok/s >= 1.25x routed-threshold's, at C >= 2 x threshold
VS_PAIR_FLOOR = 0.85  # tok/s >= 0.85x the better homogeneous pair's, at every C
VS_PAIR_NOTE = 0.95  # ... and each C below 0.95x is listed


@dataclass(frozen=True)
class Servers:
    """The four simulated servers' URLs: two EAGLE, two baseline."""

    eagle: tuple[str, str]
    baseline: tuple[str, str]


def router_flags(
    way: str,
    servers: Servers,
    *,
    threshold: int,
    hysteresis: int,
    speed_profile: Path | None = None,
    metrics_interval: float | None = None,
) -> list[str]:
    """The ``dynspec-router`` pool and policy flags of one way (pure)."""
    e, b = servers.eagle, servers.baseline
    if way == "routed-threshold":
        # Threshold 0 is suggest-threshold's "EAGLE never wins": no EAGLE pool (the policy's
        # --threshold must be >= 1, which would still send lone requests to EAGLE).
        if threshold <= 0:
            return ["--baseline-url", b[0]]
        return [
            "--eagle-url",
            e[0],
            "--baseline-url",
            b[0],
            "--policy",
            "threshold",
            "--threshold",
            str(threshold),
            "--hysteresis",
            str(hysteresis),
        ]
    if way == "routed-balance":
        flags = ["--eagle-url", e[0], "--baseline-url", b[0], "--policy", "balance"]
        if speed_profile is not None:
            flags += ["--speed-profile", str(speed_profile)]
        if metrics_interval is not None:
            flags += ["--metrics-interval", repr(metrics_interval)]
        return flags
    if way == "2x-eagle":
        return ["--eagle-url", f"{e[0]},{e[1]}"]
    if way == "2x-baseline":
        return ["--baseline-url", f"{b[0]},{b[1]}"]
    raise ValueError(f"unknown way {way!r} (known: {', '.join(WAYS)})")


def wall_clock_profile(profile: Profile, speed: float) -> Profile:
    """``profile`` as the router sees servers that run ``speed`` times faster than modelled.

    The router measures TPOT on the wall clock; a simulator at ``--speed 4`` serves four times the
    profile's tok/s per wall-clock second, so the curve the router is given must say so too, or its
    profile and its own observations would disagree by that factor.
    """
    if speed == 1.0:
        return profile
    modes = {
        name: dataclasses.replace(
            m,
            throughput=tuple((b, round(t * speed, 3)) for b, t in m.throughput),
            prefill_tokens_per_s=m.prefill_tokens_per_s * speed,
            prefill_overhead_s=m.prefill_overhead_s / speed,
        )
        for name, m in profile.modes.items()
    }
    return dataclasses.replace(
        profile,
        name=f"{profile.name}-x{speed:g}",
        source=f"{profile.name} with time running {speed:g}x faster (dynspec-sim --speed "
        f"{speed:g}): tok/s x {speed:g}. {profile.source}",
        modes=modes,
    )


def router_profile(procs: Children, profile: Profile, speed: float) -> Path:
    """The file given to ``--speed-profile``: ``profile`` at the simulators' wall-clock speed,
    next to the children's logs."""
    folder = procs.log_dir or Path(tempfile.mkdtemp(prefix="dynspec-envelope-"))
    path = folder / f"{profile.name}-router.json"
    path.write_text(wall_clock_profile(profile, speed).dumps(), encoding="utf-8")
    return path


@dataclass(frozen=True)
class FourWayConfig:
    profile: str
    speed: float
    sweep: SweepConfig
    out: Path
    ways: Sequence[str] = WAYS
    threshold: int | None = None
    hysteresis: int | None = None
    metrics_interval: float | None = None
    seed: int = 0
    startup_timeout: float = 60.0
    append: bool = False
    command: str = ""


@dataclass
class FourWayResult:
    records: list[Record]
    threshold: int
    hysteresis: int
    wall_seconds: float = 0.0


def machine() -> dict[str, Any]:
    """What the figures were measured on (the simulators, client and routers share it)."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def code_commit() -> str:
    """The git commit of the router code that the children run (``+dirty`` with local edits),
    or "unknown" outside a git checkout."""
    # Where the router's code lies (the children run it), found without importing it.
    spec = importlib.util.find_spec("dynspec.router")
    if spec is None or spec.origin is None:
        return "unknown"
    folder = Path(spec.origin).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def launch(
    procs: Children, name: str, argv: Sequence[str], ready: str, timeout: float
) -> subprocess.Popen[bytes]:
    """Start a child (log: ``procs.log_dir/NAME.log``), wait until ``ready`` answers 200."""
    proc = procs.start(name, argv)
    procs.wait_ready(proc, ready, timeout, name=name)
    return proc


def start_sim(
    procs: Children, *, profile: str, speed: float, mode: str, name: str, seed: int, timeout: float
) -> str:
    port = free_port()
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--mode", mode, "--profile", profile]
    argv += ["--speed", repr(speed), "--seed", str(seed), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    launch(procs, name, argv, url + "/health_generate", timeout)
    return url


def start_router(
    procs: Children, name: str, flags: Sequence[str], timeout: float, servers: int
) -> tuple[str, subprocess.Popen[bytes]]:
    """A ``dynspec-router`` with ``flags``, once it sees ``servers`` healthy servers."""
    port = free_port()
    argv = [sys.executable, "-m", "dynspec.router", *flags]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    proc = launch(procs, name, argv, url + "/health", timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = httpx.get(url + "/status", timeout=2.0).json()
            up = [s for s in status.get("servers", []) if s.get("healthy")]
            if len(up) >= servers:
                return url, proc
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(
        f"dynspec-router ({name}) does not see its servers healthy (log dir: {procs.log_dir})"
    )


def _sweep_levels(
    targets: Sequence[Target], scfg: SweepConfig, out: Path, progress: ProgressLine | None
) -> list[Record]:
    """``sweep`` one level at a time, so each level's records carry the machine's load then."""
    records: list[Record] = []
    for c in scfg.concurrencies:
        extra = {**scfg.extra, "loadavg_1m": load_average()}
        level = dataclasses.replace(scfg, concurrencies=[c], extra=extra)
        records += asyncio.run(sweep(targets, level, out, progress))
    return records


def run(cfg: FourWayConfig, progress: ProgressLine | None = None) -> FourWayResult:
    """Run the comparison; each finished level is appended to ``cfg.out`` as it ends."""
    started = time.monotonic()
    prof = load_profile(cfg.profile)
    extra: dict[str, Any] = {
        "simulated": True,
        "experiment": "four-way",
        "profile": cfg.profile,
        "speed": cfg.speed,
        "requests_per_c": cfg.sweep.requests_per_c,
        "min_requests": cfg.sweep.min_requests,
        "command": cfg.command,
        "machine": machine(),
        "code_commit": code_commit(),
        "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    scfg = dataclasses.replace(cfg.sweep, extra={**cfg.sweep.extra, **extra})
    if not cfg.append:
        cfg.out.write_text("", encoding="utf-8")
    records: list[Record] = []
    with processes() as procs:
        urls = {
            (mode, k): start_sim(
                procs,
                profile=cfg.profile,
                speed=cfg.speed,
                mode=mode,
                name=f"sim-{mode}-{'ab'[k]}",
                seed=cfg.seed + k,
                timeout=cfg.startup_timeout,
            )
            for mode in SINGLES
            for k in (0, 1)
        }
        servers = Servers(
            eagle=(urls[("eagle", 0)], urls[("eagle", 1)]),
            baseline=(urls[("baseline", 0)], urls[("baseline", 1)]),
        )
        thr, hyst = cfg.threshold, cfg.hysteresis
        if thr is None or hyst is None:
            # As the envelope does: each server alone, then suggest-threshold on those sweeps.
            singles = [Target("eagle", servers.eagle[0]), Target("baseline", servers.baseline[0])]
            records += _sweep_levels(singles, scfg, cfg.out, progress)
            s = threshold.suggest(
                [r for r in records if r["target"] == "eagle"],
                [r for r in records if r["target"] == "baseline"],
            )
            thr = s.threshold if thr is None else thr
            hyst = s.hysteresis if hyst is None else hyst
        profile_path = router_profile(procs, prof, cfg.speed)
        targets: list[Target] = []
        for way in cfg.ways:
            flags = router_flags(
                way,
                servers,
                threshold=thr,
                hysteresis=hyst,
                speed_profile=profile_path,
                metrics_interval=cfg.metrics_interval,
            )
            n = 1 if way == "routed-threshold" and thr <= 0 else 2
            url, _ = start_router(procs, f"router-{way}", flags, cfg.startup_timeout, n)
            targets.append(Target(way, url))
        rextra = {**scfg.extra, "threshold": thr, "hysteresis": hyst}
        if cfg.threshold is not None and cfg.hysteresis is not None:
            rextra["threshold_by_hand"] = True
        rcfg = dataclasses.replace(scfg, extra=rextra)
        records += _sweep_levels(targets, rcfg, cfg.out, progress)
    return FourWayResult(records, thr, hyst, time.monotonic() - started)


# ---- evaluation (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class GoalRow:
    """routed-balance against routed-threshold and the better homogeneous pair at one C."""

    c: int
    tput: Mapping[str, float]  # way -> output tok/s
    tpot: Mapping[str, float]  # way -> p50 TPOT ms
    balance_eagle_share: float | None
    better_pair: str
    vs_threshold_tput: float
    vs_threshold_tpot: float
    vs_pair_tput: float
    # Goal -> met (True/False), or None where the goal does not apply at this C.
    checks: Mapping[str, bool | None] = field(default_factory=dict)


GOALS = {
    "tput": f"tok/s >= {VS_THRESHOLD_TPUT}x threshold, every C",
    "tpot": f"p50 TPOT <= {VS_THRESHOLD_TPOT}x threshold, C <= threshold",
    "gain": f"tok/s >= {HIGH_LOAD_GAIN}x threshold, C >= 2 x threshold",
    "pair": f"tok/s >= {VS_PAIR_FLOOR}x the better pair, every C",
}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def evaluate(records: Sequence[Record], thr: int) -> list[GoalRow]:
    """Per C where all four ways ran: the goals for ``routed-balance`` (records in model time;
    ratios do not depend on it). ``thr`` is the threshold ``routed-threshold`` ran with."""
    by: dict[tuple[str, int], Record] = {
        (str(r["target"]), int(r["max_concurrency"])): r for r in records
    }
    rows: list[GoalRow] = []
    for c in sorted({c for _, c in by}):
        if not all((w, c) in by for w in WAYS):
            continue
        tput = {w: float(by[(w, c)]["output_throughput"]) for w in WAYS}
        tpot = {w: float(by[(w, c)]["median_tpot_ms"]) for w in WAYS}
        pair = "2x-eagle" if tput["2x-eagle"] >= tput["2x-baseline"] else "2x-baseline"
        bal, th = tput["routed-balance"], tput["routed-threshold"]
        vs_t = _ratio(bal, th)
        vs_tpot = _ratio(tpot["routed-balance"], tpot["routed-threshold"])
        vs_p = _ratio(bal, tput[pair])
        share = by[("routed-balance", c)].get("backend_share")
        checks: dict[str, bool | None] = {
            "tput": vs_t >= VS_THRESHOLD_TPUT,
            "tpot": vs_tpot <= VS_THRESHOLD_TPOT if c <= thr else None,
            "gain": vs_t >= HIGH_LOAD_GAIN if c >= max(2 * thr, 2) else None,
            "pair": vs_p >= VS_PAIR_FLOOR,
        }
        rows.append(
            GoalRow(
                c=c,
                tput=tput,
                tpot=tpot,
                balance_eagle_share=(
                    float(share.get("eagle", 0.0)) if isinstance(share, dict) else None
                ),
                better_pair=pair,
                vs_threshold_tput=vs_t,
                vs_threshold_tpot=vs_tpot,
                vs_pair_tput=vs_p,
                checks=checks,
            )
        )
    return rows


def verdicts(rows: Sequence[GoalRow]) -> dict[str, tuple[bool | None, list[int]]]:
    """Per goal: met at every C where it applies (None: applies nowhere), and the Cs that miss."""
    out: dict[str, tuple[bool | None, list[int]]] = {}
    for goal in GOALS:
        applied = [(r.c, r.checks.get(goal)) for r in rows if r.checks.get(goal) is not None]
        missed = [c for c, ok in applied if not ok]
        out[goal] = (None if not applied else not missed, missed)
    return out


def below_note(rows: Sequence[GoalRow]) -> list[GoalRow]:
    """Levels where balance is below ``VS_PAIR_NOTE`` x the better homogeneous pair."""
    return [r for r in rows if not r.vs_pair_tput >= VS_PAIR_NOTE]


# ---- report ------------------------------------------------------------------------------------


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


def goal_table(rows: Sequence[GoalRow]) -> str:
    head = (
        "| C | threshold tok/s | balance tok/s | 2x-eagle tok/s | 2x-baseline tok/s"
        " | balance / threshold tok/s | balance / threshold TPOT | balance / better pair tok/s"
        " | balance to EAGLE | >= 0.98x thr | TPOT <= 1.05x | >= 1.25x thr | >= 0.85x pair |"
    )
    lines = [head, "|" + " --- |" * 13]
    for r in rows:
        share = "-" if r.balance_eagle_share is None else f"{100 * r.balance_eagle_share:.0f}%"
        lines.append(
            f"| {r.c} | {r.tput['routed-threshold']:.1f} | {r.tput['routed-balance']:.1f}"
            f" | {r.tput['2x-eagle']:.1f} | {r.tput['2x-baseline']:.1f}"
            f" | {r.vs_threshold_tput:.3f} | {r.vs_threshold_tpot:.3f}"
            f" | {r.vs_pair_tput:.3f} ({r.better_pair}) | {share}"
            f" | {_mark(r.checks['tput'])} | {_mark(r.checks['tpot'])}"
            f" | {_mark(r.checks['gain'])} | {_mark(r.checks['pair'])} |"
        )
    return "\n".join(lines) + "\n"


def way_table(records: Sequence[Record], ways: Sequence[str], key: str, unit: str) -> str:
    """One column per way: ``key`` of each way's record at each C."""
    by = {(str(r["target"]), int(r["max_concurrency"])): r for r in records}
    levels = sorted({c for _, c in by})
    digits = 2 if key.endswith("_ms") else 1
    lines = ["| C | " + " | ".join(f"{w} {unit}" for w in ways) + " |"]
    lines.append("|" + " --- |" * (len(ways) + 1))
    for c in levels:
        cells = [f"{float(by[(w, c)][key]):.{digits}f}" if (w, c) in by else "-" for w in ways]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def verdict_lines(rows: Sequence[GoalRow]) -> list[str]:
    out = []
    for goal, (ok, missed) in verdicts(rows).items():
        if ok is None:
            state = "does not apply at any measured C"
        elif ok:
            state = "MET at every C where it applies"
        else:
            state = "MISSED at C=" + ", ".join(map(str, missed))
        out.append(f"- balance {GOALS[goal]}: {state}.")
    return out


def expected_tput(profile: Profile, mode: str, per_server: int, servers: int) -> float:
    """Output tok/s the profile predicts for ``servers`` servers with ``per_server`` clients each
    (decode only: prefill pauses make the measured value somewhat lower)."""
    m = profile.mode(mode)
    limit = m.max_running_requests or (48 if mode == "eagle" else 1024)
    return servers * m.throughput_at(min(per_server, limit))


def schedule_table(records: Sequence[Record], profile: Profile) -> str:
    """Measured p50 TPOT and tok/s of the single servers and the homogeneous pairs against the
    profile's prediction."""
    lines = [
        "| target | C | per server | TPOT p50 ms | profile TPOT ms | measured / profile"
        " | tok/s | profile tok/s | measured / profile |",
        "|" + " --- |" * 9,
    ]
    for r in records:
        t, c = str(r["target"]), int(r["max_concurrency"])
        if t in SINGLES:
            mode, per, n = t, c, 1
        elif t in ("2x-eagle", "2x-baseline"):
            mode, per, n = t[3:], max(1, math.ceil(c / 2)), 2
        else:
            continue
        want = expected_tpot_ms(profile, mode, per)
        # Two servers with an odd C: one holds ceil(C/2), the other floor(C/2).
        tput = expected_tput(profile, mode, per, 1) + (
            expected_tput(profile, mode, c - per, 1) if n == 2 and c > per else 0.0
        )
        got = float(r["output_throughput"])
        lines.append(
            f"| {t} | {c} | {per} | {r['median_tpot_ms']:.2f} | {want:.2f}"
            f" | {r['median_tpot_ms'] / want:.3f} | {got:.1f} | {tput:.1f} | {got / tput:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _lengths(meta: Record) -> str:
    if meta.get("dataset_name") == "sharegpt":
        return "ShareGPT prompts"
    text = (
        f"random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens"
    )
    ratio = meta.get("random_range_ratio")
    if ratio is not None and float(ratio) < 1.0:
        return text + f" (each uniform from {float(ratio):g}x that)"
    return text + " (fixed)"


def _machine_line(records: Sequence[Record]) -> str:
    m = records[0].get("machine") or {}
    loads = [float(r["loadavg_1m"]) for r in records if r.get("loadavg_1m") is not None]
    load = (
        f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} at the levels' starts"
        if loads
        else ""
    )
    return (
        f"- Machine: {m.get('cpus', '?')} CPUs ({m.get('cpu') or 'unknown CPU'}), "
        f"{m.get('platform', '?')}, Python {m.get('python', '?')}; the client, the routers "
        f"and the four simulators share it, and other work ran on it at the same time{load}. "
        "A busy machine adds latency to every way alike, but it caps the chunk rate that can be "
        "measured: see the schedule check at the end."
    )


def _code_line(records: Sequence[Record]) -> str:
    commits = sorted({str(r["code_commit"]) for r in records if r.get("code_commit")})
    return f"- Code: commit {', '.join(commits)}." if commits else ""


def _runs_line(records: Sequence[Record]) -> str:
    runs: dict[str, tuple[set[str], str]] = {}
    for r in records:
        ts, _ = runs.setdefault(str(r.get("run_started", "?")), (set(), str(r.get("command", ""))))
        ts.add(str(r["target"]))
    if len(runs) <= 1:
        return ""
    parts = [
        f"{start}: {', '.join(sorted(ts))} (`{cmd}`)" for start, (ts, cmd) in sorted(runs.items())
    ]
    return (
        "- NOTE: these records come from more than one run: "
        + "; ".join(parts)
        + ". Ways from different runs did not share each level's time slot, so a change in the "
        "machine's load between the runs shows up as a difference between those ways."
    )


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """``out``'s Markdown report and plot, from the level records alone (so a rerender works)."""
    if not records:
        raise ValueError(f"{out}: no levels")
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    profile = load_profile(str(meta.get("profile", "demo")))
    model = [model_time(r, speed) for r in records]
    routed = [r for r in model if r.get("target") in WAYS]
    thr_rec = next((r for r in routed if r.get("threshold") is not None), None)
    thr = int(thr_rec["threshold"]) if thr_rec is not None else 0
    hyst = thr_rec.get("hysteresis") if thr_rec is not None else None
    rows = evaluate(model, thr)
    ways = [w for w in WAYS if any(r["target"] == w for r in routed)]
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    title = f"SIMULATED: eight GPUs four ways, profile {profile.name}"
    report.plot(routed, png, f"{title} (dynspec-sim, model time, speed {speed:g})")
    eagle = [r for r in model if r.get("target") == "eagle"]
    baseline = [r for r in model if r.get("target") == "baseline"]
    suggestion = threshold.suggest(eagle, baseline) if eagle and baseline else None
    levels = sorted({int(r["max_concurrency"]) for r in records})
    if thr_rec is None:
        thr_line = "- routed-threshold: not run."
    elif thr <= 0:
        thr_line = (
            "- routed-threshold: baseline pool only: `suggest-threshold` found that EAGLE never "
            "wins, and the threshold policy cannot send every request to the baseline."
        )
    else:
        how = (
            "set by hand (`--threshold`/`--hysteresis`)"
            if thr_rec.get("threshold_by_hand")
            else "picked by `suggest-threshold` from the single-server sweeps below"
        )
        thr_line = f"- routed-threshold: `--threshold {thr} --hysteresis {hyst}`, {how}."
    stamps = [str(r["timestamp"]) for r in records if r.get("timestamp")]
    run_time = ""
    if meta.get("run_started") and stamps and not _runs_line(records):
        secs = (
            dt.datetime.fromisoformat(max(stamps))
            - dt.datetime.fromisoformat(str(meta["run_started"]))
        ).total_seconds()
        run_time = f"- Run time {secs / 60:.1f} min wall-clock."
    runs = _runs_line(records)
    text = [
        f"# {title}",
        "",
        "**SIMULATED.** Four `dynspec-sim` servers (no GPU, no model; each stands for a 4-GPU "
        "SGLang server) and real `dynspec-router` processes, on a CPU-only machine. Profile "
        f"`{profile.name}`{' (ILLUSTRATIVE, not measured)' if profile.illustrative else ''}.",
        "",
        f"Profile source: {profile.source}",
        "",
        f"Command: `{meta.get('command') or 'dynspec-bench envelope --four-way --simulate'}`",
        "",
        _machine_line(records),
        *([_code_line(records)] if _code_line(records) else []),
        f"- Simulated time ran {speed:g}x wall-clock (`--speed {speed:g}`); every figure is in "
        "model time (wall-clock durations x speed, rates / speed). The router's own cost is "
        "wall-clock, so it counts that many times over in model time.",
        f"- Closed-loop clients, {_lengths(meta)}; per level {meta.get('requests_per_c', '?')} x "
        f"C measured requests (at least {meta.get('min_requests', '?')}) after C warm-up "
        f"requests; throughputs over the steady window; levels {','.join(map(str, levels))}.",
        "- The ways: `routed-threshold` and `routed-balance` = one EAGLE + one baseline server; "
        "`2x-eagle` = two EAGLE servers, `2x-baseline` = two baseline servers, each pair one "
        "router pool, least in flight. `routed-balance` got the profile as `--speed-profile` "
        f"(its tok/s x {speed:g}, the wall-clock speed of the simulators).",
        thr_line,
        *([runs] if runs else []),
        *([run_time] if run_time else []),
        "",
        "## SIMULATED: the goals for `balance`",
        "",
        *(verdict_lines(rows) if rows else ["- Not evaluated: the run lacks one of the ways."]),
        "",
        *([goal_table(rows)] if rows else []),
    ]
    low = below_note(rows)
    if rows:
        text.append(
            f"Below {VS_PAIR_NOTE}x the better homogeneous pair: " + ("none." if not low else "")
        )
        for r in low:
            share = (
                ""
                if r.balance_eagle_share is None
                else f"; balance sent {100 * r.balance_eagle_share:.0f}% to EAGLE"
            )
            text.append(
                f"- C={r.c}: {r.vs_pair_tput:.3f}x {r.better_pair} "
                f"({r.tput['routed-balance']:.1f} vs {r.tput[r.better_pair]:.1f} tok/s){share}."
            )
        text.append("")
    text += [
        "## SIMULATED: output tok/s per way (model time)",
        "",
        way_table(routed, ways, "output_throughput", "tok/s"),
        "## SIMULATED: p50 TPOT per way (ms, model time)",
        "",
        way_table(routed, ways, "median_tpot_ms", "TPOT p50 ms"),
    ]
    if suggestion is not None:
        text += [
            "## SIMULATED: threshold suggestion from the single-server sweeps",
            "",
            threshold.render(suggestion),
            "",
        ]
    text += [
        "## SIMULATED: did the simulators keep their schedule?",
        "",
        "Measured p50 TPOT and tok/s of the single servers and of the homogeneous pairs (each "
        "server holding about C/2) against the profile's decode-only prediction. The baseline's "
        "TPOT is the check on the machine: its requests finish and restart together, so its "
        "prefills land in TTFT, and a TPOT near 1.00x of the profile means the simulator kept "
        "its schedule and the client kept up. tok/s falls short of the profile by the time "
        "spent in prefill steps (decoding pauses meanwhile), more so at high C; EAGLE's TPOT "
        "rises with C because its requests drift apart and the prefill pauses land inside it. "
        "A CPU that cannot keep up would show as the baseline's TPOT well above 1.00x.",
        "",
        schedule_table(model, profile),
        report.markdown_table(model, "SIMULATED: all levels (model time)"),
    ]
    md.write_text("\n".join(text), encoding="utf-8")
    return md, png


def summary(records: Sequence[Record]) -> str:
    """The goal table in model time and the verdicts, for the terminal."""
    if not records:
        return "no levels\n"
    speed = float(records[0].get("speed", 1.0))
    model = [model_time(r, speed) for r in records]
    thr = next((int(r["threshold"]) for r in model if r.get("threshold") is not None), 0)
    rows = evaluate(model, thr)
    if not rows:
        return "not all four ways ran at any level: no goal evaluated\n"
    return goal_table(rows) + "\n".join(verdict_lines(rows)) + "\n"


def is_four_way(records: Sequence[Record]) -> bool:
    return any(r.get("experiment") == "four-way" or r.get("target") in WAYS for r in records)
