"""A measured sweep turned into a ``dynspec-sim`` profile, per mode; the profile's ``source``
names the files, the targets and the assumptions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from dynspec.bench.report import Record, model_time, targets
from dynspec.common.levels import DEFAULT_PREFILL_OVERHEAD_S, measured_mode, prefill_rate
from dynspec.launcher.sim.profile import ModeProfile, Profile


def _guess(names: Sequence[str], word: str) -> str | None:
    hits = [n for n in names if word in n.lower()]
    return hits[0] if len(hits) == 1 else None


def mode_profile(
    records: Sequence[Record],
    mode: str,
    *,
    interpolate: bool = False,
    max_running: int | None = None,
) -> ModeProfile:
    by_c: dict[int, Record] = {}
    for r in records:
        if r.get("completed") and float(r.get("output_throughput") or 0) > 0:
            by_c[int(r["max_concurrency"])] = r  # a repeated level: the last run counts
    if not by_c:
        raise ValueError(f"{mode}: no level with completed requests")
    levels = sorted(by_c)
    if levels[0] != 1:
        raise ValueError(f"{mode}: the sweep needs a C=1 level (a profile starts at batch 1)")
    first = by_c[1]
    if mode == "eagle":
        accept = max(1.0, float(first.get("mean_tokens_per_chunk") or 1.0))
        # Without per-chunk usage from the server the most tokens in one chunk is unknown.
        seen = int(first.get("max_tokens_per_chunk") or 0)
        max_accept = max(seen, math.ceil(accept)) if seen else math.ceil(accept) + 1
    else:
        accept, max_accept = 1.0, 1
    ttft = float(first.get("median_ttft_ms") or 0.0) / 1000.0
    tpot = float(first.get("median_tpot_ms") or 0.0) / 1000.0
    prompt = float(first.get("total_input_tokens") or 0) / max(1, int(first["completed"]))
    return measured_mode(
        [(c, float(by_c[c]["output_throughput"])) for c in levels],
        what=f"target {records[0].get('target')!r}", accept_length=accept,
        max_accept_length=max_accept, max_running=max_running,
        prefill_tokens_per_s=prefill_rate(ttft, tpot, prompt), interpolate=interpolate,
    )  # fmt: skip


def build_profile(
    records: Sequence[Record],
    sources: Sequence[Path],
    *,
    name: str,
    eagle_target: str | None = None,
    baseline_target: str | None = None,
    model: str | None = None,
    interpolate: bool = False,
    max_running: dict[str, int] | None = None,
    note: str = "",
) -> Profile:
    # A simulated sweep ran at --speed: back to the simulator's model time.
    records = [model_time(r) for r in records]
    # A routed target mixes both pools; it says nothing about one server.
    routed = {r.get("target") for r in records if "backend_share" in r}
    names = [n for n in targets(records) if n not in routed]
    given = {"eagle": eagle_target, "baseline": baseline_target}
    chosen = {mode: target or _guess(names, mode) for mode, target in given.items()}
    modes: dict[str, ModeProfile] = {}
    for mode, target in chosen.items():
        if target is None:
            continue
        if target not in names:
            raise ValueError(f"no target {target!r} in the sweep (found: {', '.join(names)})")
        mine = [r for r in records if r.get("target") == target]
        limit = (max_running or {}).get(mode)
        modes[mode] = mode_profile(mine, mode, interpolate=interpolate, max_running=limit)
    if not modes:
        raise ValueError(
            f"cannot tell which target is which (found: {', '.join(names) or 'none'}); "
            "use --eagle-target and/or --baseline-target"
        )
    simulated = any(r.get("simulated") for r in records)
    files = ", ".join(str(p) for p in sources)
    mapping = ", ".join(f"{m} = target {t!r}" for m, t in chosen.items() if t is not None)
    source = (
        f"dynspec-bench profile from {files} ({mapping}). "
        + ("The sweep itself ran against SIMULATED servers. " if simulated else "")
        + "throughput = measured closed-loop output tok/s per level; accept_length = mean tokens "
        "per stream chunk at C=1; max_accept_length = the most tokens seen in one chunk, or "
        "ceil(accept_length) + 1 when the server sent no per-chunk usage; "
        "prefill_tokens_per_s = C=1 p50 TTFT less "
        f"{DEFAULT_PREFILL_OVERHEAD_S}s overhead and one p50 TPOT (an estimate); "
        + (
            "max_running_requests as given per mode (see each mode's source), else SGLang's "
            "default; "
            if max_running
            else "max_running_requests left to SGLang's default; "
        )
        + (
            "throughput at powers of two between measured levels estimated with TPOT linear in "
            "C (see each mode's source); "
            if interpolate
            else ""
        )
        + "beyond the last measured level the simulator holds its tok/s flat."
        + (f" {note}" if note else "")
    )
    models = {str(r["model"]) for r in records if r.get("model")}
    model = model or (models.pop() if len(models) == 1 else "simulated-model")
    return Profile(name=name, source=source, modes=modes, illustrative=False, model=model)
