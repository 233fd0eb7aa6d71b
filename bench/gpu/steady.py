"""The ``pair-a`` / ``pair-b`` plans: one H200 = one pair, behind ``--threshold auto``.

Both plans start ``dynspec-launch --gpus 0`` (EAGLE-3 server with every draft accepted, then the
baseline once EAGLE is healthy, the router in front with ``--threshold auto`` and no speed profile)
and sweep C = 1..256 (256 in / 128 out): the routed pair first (the first traffic the router ever
sees), then each server alone (the other idle beside it), then the routed pair again if time is
left. ``pair-b`` does the same with ``--mps`` (one CUDA MPS control daemon for the GPU, both
servers its clients). Two commands, not one: each start of the pair takes about 3.5 minutes, and
two starts with their sweeps do not fit one 10-minute device command (``plan_seconds``).

The router's ``/status`` is recorded after every routed sweep (its learned threshold), whatever
fields it has. ``OUT/PLAN-summary.json`` holds tok/s per target and C and routed / better server
alone per C; ``dynspec-bench gpu report`` makes the README tables from the JSONL files.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.bench.gpu.leftovers import compute_apps
from dynspec.bench.gpu.run import (
    EAGLE_STEPS_ALL,
    SERVED,
    SGLANG_ARGS,
    Run,
    check_model_loads,
    fetch,
    gauge,
    start_launcher,
    stop_launcher,
    sweep,
)

TITLE = "One H200 = one pair, SGLang 0.5.17, random 8B (tp 1)"
DEVICE_LIMIT_S = 570.0  # one device command, SGLang start-ups included (the tool's limit is 600)

# Measured on the H200 (bench/results/h200/run-main.json, run-levels-*.json): the bundle unpack,
# SGLang's import probe and the 8B models take about 50 s (68 s in the kill attempt of
# bench/results/h200/kill-attempt-1: 34 s each); dynspec-launch --gpus 0 was ready after 207 s
# (EAGLE first, then the baseline; a cold EAGLE start alone took over 142 s there, ~75 s of it
# compiling kernels for its verify graphs); the launcher's SIGINT stop and the results ~25 s.
SETUP_S = 60.0
LAUNCH_S = 210.0
STOP_S = 25.0
SWEEP_START_S = 3.0  # one `dynspec-bench sweep` process: start, connect, write the table
PAUSE_S = 0.5  # --pause between levels
RESERVE_S = 45.0  # kept for stopping the launcher and writing the results
MEASURED = Path(__file__).resolve().parents[1] / "results" / "h200" / "h200-8b.jsonl"
TIMED = ("eagle", "baseline", "routed")


@dataclass(frozen=True)
class Target:
    label: str  # the sweep's target label
    what: str  # eagle | baseline | routed
    required: bool  # optional ones run only when the time left covers them


@dataclass(frozen=True)
class PairPlan:
    name: str
    mps: bool
    targets: tuple[Target, ...]


PAIR_PLANS = {
    "pair-a": PairPlan(
        "pair-a",
        False,
        (
            Target("routed_auto", "routed", True),
            Target("eagle", "eagle", True),
            Target("baseline", "baseline", True),
            Target("routed_auto_again", "routed", False),
        ),
    ),
    "pair-b": PairPlan(
        "pair-b",
        True,
        (
            Target("routed_auto_mps", "routed", True),
            Target("eagle_mps", "eagle", True),
            Target("baseline_mps", "baseline", True),
            Target("routed_auto_mps_again", "routed", False),
        ),
    ),
}
# Routed target -> the groups of servers alone it is compared with (the better one per C).
ALONE_GROUPS = {"timeslice": ("eagle", "baseline"), "mps": ("eagle_mps", "baseline_mps")}


# -- time ----------------------------------------------------------------------------------------


def level_seconds(record: Mapping[str, Any]) -> float:
    """Wall time of one measured level: its warm-up round (at the same rate), the measured
    requests and the pause."""
    duration = float(record["duration"])
    prompts = max(1, int(record.get("num_prompts") or record.get("completed") or 1))
    warmup = int(record.get("warmup_requests") or 0)
    return duration * (1 + warmup / prompts) + PAUSE_S


def sweep_seconds(records: Iterable[Mapping[str, Any]], levels: Sequence[int]) -> float:
    """One target's sweep over ``levels`` from its measured levels; a level above the largest
    measured one is scaled by its request count (twice C requests at the same rate: a server
    that is already saturated)."""
    by_c = {int(r["max_concurrency"]): level_seconds(r) for r in records}
    if not by_c:
        raise ValueError("no measured levels")
    top = max(by_c)
    total = SWEEP_START_S
    for c in levels:
        total += by_c[c] if c in by_c else by_c[top] * c / top
    return total


def plan_seconds(
    plan: PairPlan, records: Sequence[Mapping[str, Any]], levels: Sequence[int]
) -> dict[str, float]:
    """Expected seconds of each part of the plan, from measured sweeps of ``eagle``,
    ``baseline`` and ``routed`` (the routed one stands for every routed target)."""
    by_target: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_target.setdefault(str(r["target"]), []).append(r)
    parts = {"setup": SETUP_S, "launch": LAUNCH_S}
    for t in plan.targets:
        parts[t.label] = sweep_seconds(by_target[t.what], levels)
    parts["stop"] = STOP_S
    parts["total"] = sum(parts.values())
    return parts


def parse_levels(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


# -- the run -------------------------------------------------------------------------------------


def launch_argv(
    run: Run,
    models: Path,
    *,
    threshold: str,
    mps: bool,
    hysteresis: int | None = None,
    restart: str = "never",
    after_s: float = 240.0,
) -> list[str]:
    """``dynspec-launch --gpus 0``: the pair of these plans (and of ``kill``, which restarts its
    servers: ``restart`` on-failure). Each server may take until ``after_s`` is all that is left
    of the budget (what the plan needs once both run)."""
    argv = [
        run.python, "-m", "dynspec.launcher", "--gpus", "0",
        "--model-path", str(models / "llama8b"), "--draft-model-path", str(models / "eagle3-hi"),
        "--served-model-name", SERVED, *EAGLE_STEPS_ALL, "--threshold", threshold,
        *(["--hysteresis", str(hysteresis)] if hysteresis is not None else []),
        "--host", "127.0.0.1", "--port", str(run.ports[0]),
        "--eagle-port", str(run.ports[1]), "--baseline-port", str(run.ports[2]),
        "--sglang-args", SGLANG_ARGS,
        # Swept alone too: the EAGLE server runs up to 128 (C=256 alone queues the rest; it has
        # lost to the baseline from C=128 on), graphs up to 128 keep its start short.
        "--eagle-args", "--max-running-requests 128",
        "--baseline-args", "--cuda-graph-max-bs-decode 256",
        "--log-dir", str(run.logs), "--restart", restart, "--kill-grace", "15",
        "--startup-timeout", f"{max(60.0, run.left() - after_s):.0f}", "--progress-every", "15",
    ]  # fmt: skip
    if mps:
        argv.append("--mps")
    return argv


def learned_threshold(status: Mapping[str, Any]) -> dict[str, Any]:
    """The threshold fields of the router's ``/status``, whichever of them it has."""
    found: dict[str, Any] = {}
    for key in ("policy", "threshold", "threshold_auto", "hysteresis", "mode"):
        if key in status:
            found[key] = status[key]
    pairs = status.get("pairs")
    if isinstance(pairs, list):
        found["pairs"] = [
            {k: p.get(k) for k in ("threshold", "mode", "load") if k in p}
            for p in pairs
            if isinstance(p, Mapping)
        ]
    return found


def record_status(run: Run, router: str, label: str) -> None:
    try:
        status = json.loads(fetch(f"{router}/status"))
    except (OSError, ValueError) as exc:
        run.meta.setdefault("status", {})[label] = {"error": str(exc)}
        return
    run.meta.setdefault("status", {})[label] = status
    learned = learned_threshold(status) if isinstance(status, Mapping) else {}
    run.meta.setdefault("learned", {})[label] = learned
    run.say(f"after {label}: {learned}")


def plan_pair(run: Run, models: Path, plan: PairPlan, *, levels: str, threshold: str) -> int:
    check_model_loads(models / "llama8b")
    check_model_loads(models / "eagle3-hi")
    with contextlib.suppress(OSError, ValueError, KeyError):
        measured = [r for r in read_rows([MEASURED]) if r.get("target") in TIMED]
        expected = plan_seconds(plan, measured, parse_levels(levels))
        run.meta["expected_s"] = {k: round(v) for k, v in expected.items()}
        run.say(f"expected about {expected['total']:.0f}s in all")
    launch = launch_argv(run, models, threshold=threshold, mps=plan.mps)
    proc = start_launcher(run, launch)
    run.meta["compute_apps"] = compute_apps()[1]
    router, eagle, baseline = (f"http://127.0.0.1:{p}" for p in run.ports)
    urls = {"routed": router, "eagle": eagle, "baseline": baseline}
    jsonl = run.out / f"sweep-{plan.name}.jsonl"
    typical = {t.label: 60.0 for t in plan.targets}  # a sweep to C=256 took under a minute
    for i, t in enumerate(plan.targets):
        required_left = sum(1 for u in plan.targets[i:] if u.required)
        spare = run.left() - RESERVE_S
        if spare < 30 or (not t.required and spare < typical[t.label]):
            run.say(f"no time left to sweep {t.label}")
            run.meta.setdefault("not_swept", []).append(t.label)
            continue
        limit = min(120.0, spare / max(1, required_left))
        run.say(f"sweep {t.label} (at most {limit:.0f}s)")
        done = sweep(run, [f"{t.label}={urls[t.what]}"], jsonl, title=TITLE, levels=levels,
                     limit=limit)  # fmt: skip
        if not done:
            run.meta.setdefault("sweeps_cut", []).append(t.label)
        if t.what == "routed":
            record_status(run, router, t.label)
        write_summary(run.out / f"{plan.name}-summary.json", jsonl, run.meta)
        if t.what == "eagle":
            with contextlib.suppress(OSError, ValueError):
                accept = gauge(fetch(f"{eagle}/metrics"), "sglang:spec_accept_length")
                run.meta["accept_after_sweep"] = accept
    stop_launcher(run, proc)
    write_summary(run.out / f"{plan.name}-summary.json", jsonl, run.meta)
    return 0


# -- results -------------------------------------------------------------------------------------


def read_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with contextlib.suppress(OSError):
            rows += [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return rows


def tok_s(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """target -> C -> output tok/s (the last record of a target and C wins)."""
    table: dict[str, dict[int, float]] = {}
    for r in rows:
        table.setdefault(str(r["target"]), {})[int(r["max_concurrency"])] = float(
            r["output_throughput"]
        )
    return table


def ratios(
    table: Mapping[str, Mapping[int, float]],
    routed: Sequence[str],
    groups: Mapping[str, Sequence[str]],
) -> list[dict[str, Any]]:
    """One row per (routed target, group of servers alone) both present: per C, routed tok/s
    over the better server of the group (its name too), and the smallest ratio."""
    out = []
    for label in routed:
        mine = table.get(label)
        if not mine:
            continue
        for group, members in groups.items():
            alone = [m for m in members if table.get(m)]
            if not alone:
                continue
            per_c: dict[int, dict[str, Any]] = {}
            for c, value in sorted(mine.items()):
                best = max(alone, key=lambda m: table[m].get(c, -1.0))
                if c not in table[best]:
                    continue
                per_c[c] = {
                    "ratio": round(value / table[best][c], 3) if table[best][c] else None,
                    "better": best,
                }
            values = [v["ratio"] for v in per_c.values() if v["ratio"] is not None]
            out.append(
                {
                    "routed": label,
                    "against": group,
                    "per_c": per_c,
                    "min": min(values) if values else None,
                }
            )
    return out


def routed_labels(table: Mapping[str, Any]) -> list[str]:
    return [t for t in table if t.startswith("routed")]


def write_summary(path: Path, jsonl: Path, meta: Mapping[str, Any]) -> None:
    table = tok_s(read_rows([jsonl]))
    summary = {
        "tok_s": table,
        "ratios": ratios(table, routed_labels(table), ALONE_GROUPS),
        "learned": meta.get("learned", {}),
        "not_swept": meta.get("not_swept", []),
        "launch_ready_s": meta.get("launch_ready_s"),
    }
    path.write_text(json.dumps(summary, indent=1))


def markdown(
    rows: Sequence[Mapping[str, Any]],
    groups: Mapping[str, Sequence[str]] = ALONE_GROUPS,
    routed: Sequence[str] | None = None,
) -> str:
    """The README tables: output tok/s per C and target, then routed / better alone per C."""
    table = tok_s(rows)
    targets = list(table)
    levels = sorted({c for t in table.values() for c in t})
    lines = ["| C | " + " | ".join(targets) + " |", "| --- |" + " --- |" * len(targets)]
    for c in levels:
        cells = [f"{table[t][c]:.0f}" if c in table[t] else "-" for t in targets]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    found = ratios(table, routed if routed is not None else routed_labels(table), groups)
    if found:
        lines += ["", "| routed / better alone | " + " | ".join(f"C={c}" for c in levels)]
        lines[-1] += " | min |"
        lines.append("| --- |" + " --- |" * (len(levels) + 1))
        for row in found:
            cells = []
            for c in levels:
                cell = row["per_c"].get(c)
                ratio = cell["ratio"] if cell else None
                cells.append(f"{ratio:.2f} ({cell['better']})" if ratio is not None else "-")
            low = f"{row['min']:.2f}" if row["min"] is not None else "-"
            name = f"{row['routed']} / best({', '.join(groups[row['against']])})"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {low} |")
    return "\n".join(lines) + "\n"
