"""A load that changes: closed-loop concurrency stepped 1 -> peak -> 1, more than once.

``dynspec-bench ramp`` starts an EAGLE and a baseline ``dynspec-sim`` and, one after the other on
those same two servers, a ``dynspec-router --policy balance`` that learns its speed curves from
nothing (``balance-learning``) and one seeded with the profile (``balance-profile``). Each drives
the same schedule: concurrency 1, 2, 4 ... peak ... 2, 1, repeated ``cycles`` times, each step a
fixed number of wall-clock seconds. When a step lowers the concurrency, clients leave as their
request ends (nothing is cut); when it raises it, new clients start at once.

Per step: output tok/s (every token delivered inside the step's window, as the sweep's window
does), and p50 TPOT / TTFT of the requests that finished inside it. Per cycle: the same over the
whole cycle. The question is whether learning alone catches up: after the first cycle, is the
learning router within 10% of the seeded one? Everything is SIMULATED.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from dynspec.bench import load, metrics
from dynspec.bench.envelope import processes
from dynspec.bench.fourway import (
    code_commit,
    load_average,
    machine,
    router_profile,
    start_router,
    start_sim,
)
from dynspec.bench.load import Prompt, Target
from dynspec.bench.metrics import RequestTrace
from dynspec.bench.procs import stop_group
from dynspec.bench.report import Record, append_jsonl, model_time
from dynspec.launcher.sim.profile import load_profile

logger = logging.getLogger(__name__)

VARIANTS = ("balance-learning", "balance-profile")
WITHIN = 0.10  # the learning router's goal: within 10% of the seeded one after the first cycle


def schedule(peak: int, cycles: int) -> list[tuple[int, int]]:
    """``(cycle, concurrency)`` per step: 1, 2, 4 ... peak ... 2, 1, then again from 2 (pure).

    Powers of two up to ``peak`` (``peak`` itself is the top step even when it is not one).
    """
    if peak < 1 or cycles < 1:
        raise ValueError("peak and cycles must be >= 1")
    up = [1 << k for k in range(peak.bit_length()) if (1 << k) < peak] + [peak]
    one = up + up[-2::-1]
    steps = [(1, c) for c in one]
    for k in range(2, cycles + 1):
        steps += [(k, c) for c in one[1:]]
    return steps


@dataclass(frozen=True)
class RampConfig:
    profile: str
    speed: float
    out: Path
    peak: int = 128
    cycles: int = 2
    step_seconds: float = 10.0
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 1.0
    seed: int = 0
    variants: Sequence[str] = VARIANTS
    metrics_interval: float | None = None
    startup_timeout: float = 60.0
    request_timeout: float = 600.0
    command: str = ""


async def drive(
    session: aiohttp.ClientSession,
    target: Target,
    model: str,
    prompts: Sequence[Prompt],
    *,
    steps: Sequence[int],
    step_seconds: float,
) -> tuple[list[RequestTrace], list[tuple[float, float]]]:
    """Closed-loop clients whose number follows ``steps``; returns every request's trace and
    each step's ``(start, end)`` (``perf_counter`` seconds). Ends after the last step: requests
    still in flight are cancelled then (the server aborts them), so the run is bounded in time."""
    bodies = [load.request_body(target, model, p) for p in prompts]
    hdrs = {"Content-Type": "application/json"}
    traces: list[RequestTrace] = []
    state = {"want": 0, "active": 0, "sent": 0}
    tasks: set[asyncio.Task[None]] = set()

    async def client() -> None:
        try:
            while state["active"] <= state["want"]:
                k = state["sent"] % len(prompts)
                state["sent"] += 1
                trace = RequestTrace(send=time.perf_counter())
                traces.append(trace)
                await load.send_request(session, target, bodies[k], prompts[k], hdrs, trace=trace)
                if not trace.success:
                    await asyncio.sleep(0.05)  # a failing server must not make this spin
        finally:
            state["active"] -= 1

    windows: list[tuple[float, float]] = []
    try:
        for c in steps:
            start = time.perf_counter()
            state["want"] = c
            while state["active"] < c:
                state["active"] += 1
                task = asyncio.create_task(client())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(max(0.0, start + step_seconds - time.perf_counter()))
            windows.append((start, time.perf_counter()))
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return traces, windows


def step_record(
    traces: Sequence[RequestTrace], start: float, end: float, per_chunk: float
) -> dict[str, Any]:
    """bench_serving-named figures of one window: tokens delivered inside it, and latencies of
    the requests that finished inside it."""
    win = metrics.window(traces, start, end, tokens_per_chunk=per_chunk)
    done = [t for t in traces if t.success and start <= t.end < end]
    tpots = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in done if t.output_tokens > 1]
    ttfts = [t.ttft for t in done]
    failed = sum(1 for t in traces if not t.success and t.error and start <= t.end < end)
    length = max(end - start, 1e-9)
    rec: dict[str, Any] = {
        "duration": length,
        "completed": len(done),
        "failed": failed,
        "total_output_tokens": round(win.output_tokens),
        "output_throughput": win.output_tokens / length,
        "request_throughput": len(done) / length,
        "concurrency": win.busy / length,
        "median_tpot_ms": 1000.0 * metrics.percentile(tpots, 50) if tpots else None,
        "p90_tpot_ms": 1000.0 * metrics.percentile(tpots, 90) if tpots else None,
        "median_ttft_ms": 1000.0 * metrics.percentile(ttfts, 50) if ttfts else None,
        "p99_ttft_ms": 1000.0 * metrics.percentile(ttfts, 99) if ttfts else None,
    }
    pools = Counter(t.backend for t in done if t.backend)
    if pools:
        n = sum(pools.values())
        rec["backend_share"] = {k: v / n for k, v in sorted(pools.items())}
    return rec


def records_of(
    variant: str,
    plan: Sequence[tuple[int, int]],
    traces: Sequence[RequestTrace],
    windows: Sequence[tuple[float, float]],
    extra: dict[str, Any],
) -> list[Record]:
    """One record per step and one per cycle (``"scope": "cycle"``)."""
    ok = [t for t in traces if t.success]
    chunks = sum(len(t.chunk_times) for t in ok)
    per_chunk = sum(t.output_tokens for t in ok) / chunks if chunks else 1.0
    t0 = windows[0][0] if windows else 0.0
    out: list[Record] = []
    for i, ((cycle, c), (a, b)) in enumerate(zip(plan, windows, strict=False)):
        rec: Record = {"target": variant, "scope": "step", "step": i, "cycle": cycle}
        rec["max_concurrency"] = c
        rec["step_start_s"] = a - t0
        rec.update(step_record(traces, a, b, per_chunk))
        rec.update(extra)
        out.append(rec)
    for cycle in sorted({k for k, _ in plan}):
        spans = [w for (k, _), w in zip(plan, windows, strict=False) if k == cycle]
        if not spans:
            continue
        a, b = spans[0][0], spans[-1][1]
        rec = {"target": variant, "scope": "cycle", "cycle": cycle}
        rec["max_concurrency"] = max(c for k, c in plan if k == cycle)
        rec["step_start_s"] = a - t0
        rec.update(step_record(traces, a, b, per_chunk))
        rec.update(extra)
        out.append(rec)
    return out


def _router_flags(
    variant: str, eagle: str, baseline: str, cfg: RampConfig, prof: Path
) -> list[str]:
    flags = ["--eagle-url", eagle, "--baseline-url", baseline, "--policy", "balance"]
    if variant == "balance-profile":
        flags += ["--speed-profile", str(prof)]
    if cfg.metrics_interval is not None:
        flags += ["--metrics-interval", repr(cfg.metrics_interval)]
    return flags


async def _ramp(
    url: str,
    variant: str,
    cfg: RampConfig,
    prompts: Sequence[Prompt],
    plan: Sequence[tuple[int, int]],
) -> tuple[list[RequestTrace], list[tuple[float, float]]]:
    async with load.make_session(cfg.request_timeout) as session:
        target = Target(variant, url)
        model = await load.model_name(session, target)
        steps = [c for _, c in plan]
        return await drive(
            session, target, model, prompts, steps=steps, step_seconds=cfg.step_seconds
        )


def run(cfg: RampConfig) -> list[Record]:
    """Run every variant on the same two servers, one after the other; records go to ``cfg.out``
    as each variant ends."""
    prof = load_profile(cfg.profile)
    plan = schedule(cfg.peak, cfg.cycles)
    prompts = load.random_prompts(512, cfg.input_len, cfg.output_len, cfg.seed, cfg.range_ratio)
    extra: dict[str, Any] = {
        "simulated": True,
        "experiment": "ramp",
        "profile": cfg.profile,
        "speed": cfg.speed,
        "step_seconds": cfg.step_seconds,
        "dataset_name": "random",
        "random_input_len": cfg.input_len,
        "random_output_len": cfg.output_len,
        "random_range_ratio": cfg.range_ratio,
        "command": cfg.command,
        "machine": machine(),
        "code_commit": code_commit(),
        "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    cfg.out.write_text("", encoding="utf-8")
    records: list[Record] = []
    with processes() as procs:
        eagle, baseline = (
            start_sim(
                procs,
                profile=cfg.profile,
                speed=cfg.speed,
                mode=mode,
                name=f"sim-{mode}",
                seed=cfg.seed,
                timeout=cfg.startup_timeout,
            )
            for mode in ("eagle", "baseline")
        )
        path = router_profile(procs, prof, cfg.speed)
        for variant in cfg.variants:
            flags = _router_flags(variant, eagle, baseline, cfg, path)
            url, router = start_router(procs, f"router-{variant}", flags, cfg.startup_timeout, 2)
            load_before = load_average()

            traces, windows = asyncio.run(_ramp(url, variant, cfg, prompts, plan))
            stop_group(router)
            stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            more = {**extra, "loadavg_1m": load_before, "timestamp": stamp}
            recs = records_of(variant, plan, traces, windows, more)
            for rec in recs:
                append_jsonl(cfg.out, rec)
            records += recs
    return records


# ---- evaluation (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRow:
    step: int
    cycle: int
    c: int
    start_s: float
    tput: dict[str, float]
    tpot: dict[str, float | None]

    def ratio(self, which: str) -> float:
        """learning / profile, of tok/s (``tput``) or p50 TPOT (``tpot``)."""
        vals = self.tput if which == "tput" else self.tpot
        a, b = vals.get(VARIANTS[0]), vals.get(VARIANTS[1])
        if a is None or b is None or not b > 0:
            return math.nan
        return a / b


def compare(records: Sequence[Record], scope: str = "step") -> list[StepRow]:
    """Per step (or per cycle) where both variants ran: their tok/s and p50 TPOT."""
    key = "step" if scope == "step" else "cycle"
    by: dict[int, dict[str, Record]] = {}
    for r in records:
        if r.get("scope") == scope and r.get("target") in VARIANTS:
            by.setdefault(int(r[key]), {})[str(r["target"])] = r
    rows = []
    for k in sorted(by):
        pair = by[k]
        if set(pair) != set(VARIANTS):
            continue
        any_rec = pair[VARIANTS[0]]
        rows.append(
            StepRow(
                step=k if scope == "step" else -1,
                cycle=int(any_rec["cycle"]),
                c=int(any_rec["max_concurrency"]),
                start_s=float(any_rec.get("step_start_s", 0.0)),
                tput={v: float(pair[v]["output_throughput"]) for v in VARIANTS},
                tpot={
                    v: None
                    if pair[v].get("median_tpot_ms") is None
                    else float(pair[v]["median_tpot_ms"])
                    for v in VARIANTS
                },
            )
        )
    return rows


def within(row: StepRow) -> bool:
    """The learning router's tok/s >= (1 - WITHIN) x and p50 TPOT <= (1 + WITHIN) x the seeded."""
    tp, tpot = row.ratio("tput"), row.ratio("tpot")
    return tp >= 1 - WITHIN and (math.isnan(tpot) or tpot <= 1 + WITHIN)


def verdict(records: Sequence[Record]) -> tuple[bool | None, str]:
    """After the first cycle: every later cycle's tok/s and p50 TPOT within 10% of the seeded."""
    later = [r for r in compare(records, "cycle") if r.cycle >= 2]
    if not later:
        return None, "not evaluated: the run has no second cycle with both variants"
    ok = all(within(r) for r in later)
    parts = [
        f"cycle {r.cycle}: tok/s {r.ratio('tput'):.3f}x, p50 TPOT {r.ratio('tpot'):.3f}x"
        for r in later
    ]
    word = "MET" if ok else "MISSED"
    return ok, f"{word} ({'; '.join(parts)}; learning-only / profile-seeded)"


# ---- report ------------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def step_table(rows: Sequence[StepRow]) -> str:
    a, b = VARIANTS
    lines = [
        f"| step | cycle | C | start s | {a} tok/s | {b} tok/s | tok/s ratio"
        f" | {a} TPOT p50 ms | {b} TPOT p50 ms | TPOT ratio | within 10% |",
        "|" + " --- |" * 11,
    ]
    for r in rows:
        lines.append(
            f"| {r.step if r.step >= 0 else 'all'} | {r.cycle} | {r.c} | {r.start_s:.0f}"
            f" | {_f(r.tput[a])} | {_f(r.tput[b])} | {_f(r.ratio('tput'), 3)}"
            f" | {_f(r.tpot[a], 2)} | {_f(r.tpot[b], 2)} | {_f(r.ratio('tpot'), 3)}"
            f" | {'yes' if within(r) else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def plot(records: Sequence[Record], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_tpot) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    steps = [r for r in records if r.get("scope") == "step"]
    for variant in VARIANTS:
        rows = sorted(
            (r for r in steps if r.get("target") == variant), key=lambda r: int(r["step"])
        )
        if not rows:
            continue
        xs = [float(r["step_start_s"]) for r in rows]
        ax_tp.step(xs, [float(r["output_throughput"]) for r in rows], where="post", label=variant)
        pts = [
            (x, r["median_tpot_ms"])
            for x, r in zip(xs, rows, strict=True)
            if r.get("median_tpot_ms")
        ]
        ax_tpot.plot([p[0] for p in pts], [float(p[1]) for p in pts], marker="o", label=variant)
    first = sorted(
        (r for r in steps if r.get("target") == VARIANTS[0]), key=lambda r: int(r["step"])
    )
    if first:
        ax_c = ax_tp.twinx()
        ax_c.step(
            [float(r["step_start_s"]) for r in first],
            [int(r["max_concurrency"]) for r in first],
            where="post",
            color="grey",
            alpha=0.4,
            label="concurrency",
        )
        ax_c.set_yscale("log", base=2)
        ax_c.set_ylabel("concurrency (grey)")
    ax_tp.set_ylabel("output tokens/s")
    ax_tp.set_ylim(bottom=0)
    ax_tpot.set_ylabel("p50 TPOT (ms)")
    ax_tpot.set_yscale("log")
    ax_tpot.set_xlabel("time since the ramp started (s, model time)")
    for ax in (ax_tp, ax_tpot):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """Markdown and PNG next to ``out``, from its records alone."""
    if not records:
        raise ValueError(f"{out}: no steps")
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    profile = load_profile(str(meta.get("profile", "demo")))
    model = [model_time(r, speed) for r in records]
    # step_start_s is a wall-clock offset too.
    for r in model:
        r["step_start_s"] = float(r.get("step_start_s", 0.0)) * speed
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    title = f"SIMULATED: load ramp, balance learning-only vs profile-seeded, profile {profile.name}"
    plot(model, png, f"{title} (speed {speed:g})")
    ok, text = verdict(model)
    m = meta.get("machine") or {}
    loads = [float(r["loadavg_1m"]) for r in records if r.get("loadavg_1m") is not None]
    steps = compare(model, "step")
    cycles = compare(model, "cycle")
    step_s = float(meta.get("step_seconds", 0.0))
    ran = sorted({str(r["target"]) for r in records})
    lines = [
        f"# {title}",
        "",
        "**SIMULATED.** An EAGLE and a baseline `dynspec-sim` (no GPU, no model) and, one after "
        "the other on those same two servers, `dynspec-router --policy balance` without a "
        "profile (`balance-learning`: it learns from its own requests and the servers' "
        "`/metrics`) and with `--speed-profile` (`balance-profile`). Profile "
        f"`{profile.name}`{' (ILLUSTRATIVE, not measured)' if profile.illustrative else ''}.",
        "",
        f"Command: `{meta.get('command') or 'dynspec-bench ramp --simulate'}`",
        "",
        f"- Machine: {m.get('cpus', '?')} CPUs ({m.get('cpu') or 'unknown CPU'}), "
        f"{m.get('platform', '?')}, Python {m.get('python', '?')}; client, router and simulators "
        "share it, and other work ran on it at the same time"
        + (
            f" (1-minute load average {min(loads):.1f}-{max(loads):.1f} at the variants' starts)."
            if loads
            else "."
        ),
        f"- Code: commit {meta.get('code_commit', 'unknown')}.",
        f"- Closed-loop clients, random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens; concurrency stepped every "
        f"{step_s:g} s wall-clock ({step_s * speed:g} s model time) through 1, 2, 4 ... "
        f"{max(int(r['max_concurrency']) for r in records)} ... 2, 1, "
        f"{max(int(r['cycle']) for r in records)} cycles. Going down, clients leave as their "
        "request ends; after the last step the requests still in flight are cancelled.",
        f"- Simulated time ran {speed:g}x wall-clock; figures in model time. The seeded router "
        f"got the profile with its tok/s x {speed:g} (the simulators' wall-clock speed).",
        f"- Variants run: {', '.join(ran)} (in the order of the command; the learning router "
        "starts from nothing).",
        "- Per step: output tok/s = tokens delivered inside the step's window / its length; "
        "p50 TPOT and TTFT of the requests that finished inside it (requests that span steps "
        "count in the step where they end).",
        "",
        "## SIMULATED: learning only within 10% of the profile-seeded run after the first cycle?",
        "",
        f"{'Goal ' + text if ok is not None else text}.",
        "",
        "Per cycle (all steps of the cycle together):",
        "",
        step_table(cycles),
        "## SIMULATED: per step",
        "",
        step_table(steps),
    ]
    out_of = [r for r in steps if r.cycle >= 2 and not within(r)]
    if out_of:
        lines.append(
            "Steps after the first cycle outside 10%: "
            + ", ".join(f"{r.step} (C={r.c})" for r in out_of)
            + "."
        )
        lines.append("")
    share = []
    for r in model:
        if r.get("scope") == "cycle" and isinstance(r.get("backend_share"), dict):
            share.append(
                f"- {r['target']}, cycle {r['cycle']}: "
                f"{100 * float(r['backend_share'].get('eagle', 0.0)):.0f}% of finished requests "
                "on EAGLE."
            )
    if share:
        lines += ["Where the requests went:", "", *share, ""]
    lines.append(f"Profile source: {profile.source}")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md, png


def summary(records: Sequence[Record]) -> str:
    speed = float(records[0].get("speed", 1.0)) if records else 1.0
    model = [model_time(r, speed) for r in records]
    _, text = verdict(model)
    return step_table(compare(model, "cycle")) + text + "\n"


def is_ramp(records: Sequence[Record]) -> bool:
    return any(r.get("experiment") == "ramp" for r in records)
