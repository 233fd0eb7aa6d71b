"""``--calibrate``: measure each server once it is healthy, before the router starts, and give the
router the result as ``--speed-profile``, so that a learned threshold starts from a measurement.

The plan (pure: the cached files are read with the launch's facts) says whether to measure, reuse a
cached profile or do nothing, and what: each GPU set's EAGLE server, then its baseline server, each
alone (the other idle), at C = 1, 4, 16 and the powers of two up to the EAGLE server's running
limit (the limit itself last). GPU sets are measured at once. The profile (``common/profile.py``'s
schema; levels into modes by ``common/levels.py``) is written to
``LOG_DIR/calibration/NAME-DIGEST.json``, where the digest is of the cache key: the model and draft
paths, the servers' flags (argv without ports, hosts, log level and key), the SGLang version, the
GPU name and how the GPU is shared. The key's fields are stored in the file too; a file is reused
only while they match. It is written to a temporary file and renamed, so a failed or interrupted
calibration leaves none half-written.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from dynspec.common.levels import (
    DEFAULT_PREFILL_OVERHEAD_S,
    DEFAULT_PREFILL_TOKENS_PER_S,
    measured_mode,
)
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts
from dynspec.launcher.loadgen import (
    METHOD,
    READ_TIMEOUT_S,
    ROUNDS,
    CalibrationError,
    Level,
    gauge,
    measure_level,
    read_metrics,
    wait_quiet,
)
from dynspec.launcher.sim.profile import (
    DEFAULT_RUNNING_LIMIT,
    ModeProfile,
    Profile,
    ProfileError,
)
from dynspec.launcher.spec import POOLS, ProcessSpec

# Flags that say where a server listens or how much it logs, not how fast it serves.
_NOT_KEYED = frozenset(
    {"--port", "--host", "--eagle-port", "--baseline-port", "--log-level", "--api-key"}
)


@dataclass(frozen=True)
class Target:
    label: str  # "eagle gpu0", "baseline1 gpu4-7", "eagle sim": the console's name for it
    mode: str  # eagle | baseline
    url: str
    gpu_set: int


@dataclass(frozen=True)
class CalibrationPlan:
    action: str  # "skip", "reuse" or "measure"
    why: str = ""  # skip: the reason; measure: why there is no cached file to reuse
    path: Path | None = None
    key: Mapping[str, Any] = field(default_factory=dict)
    measured_at: str = ""  # reuse: when the cached file was measured
    targets: tuple[Target, ...] = ()
    levels: tuple[int, ...] = ()
    running_limits: Mapping[str, int | None] = field(default_factory=dict)
    window_s: float = 4.0
    # Times each level is measured (--calibrate-passes), each server's levels a pass at a time,
    # the servers of a GPU set taking turns; the profile takes each level's median.
    passes: int = 1
    simulated: bool = False
    served_model_name: str = ""

    def note(self) -> str | None:
        """One line for --dry-run (None: nothing worth saying, the router takes no profile)."""
        if self.action == "reuse":
            return f"calibration: reusing {self.path} (measured {self.measured_at})"
        if self.action == "measure":
            return (
                f"calibration: each server measured alone at C={','.join(map(str, self.levels))} "
                f"({self.passes} passes after a warm-up level) once healthy ({self.why}), "
                f"written to {self.path} and given to the router as --speed-profile"
            )
        return f"calibration: off ({self.why})" if self.why else None


def levels_up_to(limit: int) -> tuple[int, ...]:
    """C = 1, 4, 16, then the powers of two below ``limit``, then ``limit`` itself."""
    levels = [c for c in (1, 4, 16) if c < limit]
    c = 32
    while c < limit:
        levels.append(c)
        c *= 2
    return (*levels, max(1, limit))


def keyed_flags(argv: Sequence[str]) -> list[str]:
    """A server's argv as the cache key counts it: without the interpreter's path, ports, hosts,
    log level and API key (which change where and how loudly it serves, not how fast)."""
    args = list(argv[1:] if argv and argv[0] == sys.executable else argv)
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _NOT_KEYED:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def calibration_key(
    config: LaunchConfig, facts: LaunchFacts, specs: Sequence[ProcessSpec]
) -> dict[str, Any]:
    servers = sorted({tuple(keyed_flags(s.argv)) for s in specs if s.is_server})
    sharing = "none" if facts.layout == "split" else ("mps" if config.mps else "timeslice")
    return {
        "model_path": config.model_path,
        "draft_model_path": config.draft_model_path,
        "servers": [list(s) for s in servers],
        "sglang": facts.sglang_version,
        "gpu": facts.gpu_name,
        "sharing": sharing,
        "load": METHOD,
        "passes": config.calibrate_passes,
    }


def key_digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(log_dir: Path, key: Mapping[str, Any], served: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", served).strip("-.") or "model"
    return log_dir.resolve() / "calibration" / f"{name}-{key_digest(key)}.json"


def read_cache(cached: Profile | str | None, key: Mapping[str, Any]) -> tuple[str | None, str]:
    """(when the cached profile was measured, or None when it cannot be reused; why not), of
    what the launch found cached for this key's file (``facts.cached``: a profile, why it was
    unreadable, or None: no such file)."""
    if cached is None:
        return None, "none cached"
    if isinstance(cached, str):
        return None, f"the cached file is unreadable: {cached}"
    profile = cached
    recorded = profile.calibration or {}
    if recorded.get("key") != key or not {"eagle", "baseline"} <= set(profile.modes):
        return None, "the cached file was measured for another key"
    return str(recorded.get("measured_at", "at an unknown time")), ""


def _running_limit(facts: LaunchFacts, specs: Sequence[ProcessSpec], mode: str) -> int | None:
    """``--max-running-requests`` as the first GPU set's server of ``mode`` runs (None: SGLang's
    own default); a simulated GPU set (one process) runs its profile's."""
    for spec in specs:
        if spec.name == mode:
            given = spec.option("--max-running-requests")
            return int(given) if given else None
        if spec.name == "pair":
            sim = facts.sim_profile
            if not isinstance(sim, Profile):
                raise ProfileError(sim or f"profile {facts.gpu_name} was not read")
            limit = sim.mode(mode).max_running_requests
            return limit if limit is not None or mode == "baseline" else DEFAULT_RUNNING_LIMIT[mode]
    return None


def plan_calibration(
    config: LaunchConfig, facts: LaunchFacts, specs: Sequence[ProcessSpec]
) -> CalibrationPlan:
    """What this launch calibrates (``facts``: found with the cache and the key's versions when
    it does). Pure: the cached profile is the one ``facts`` found under this key's file name."""
    why = config.calibration_off()
    if why is not None:
        return CalibrationPlan("skip", why)
    key = calibration_key(config, facts, specs)
    path = cache_path(config.log_dir, key, config.served_model_name)
    measured_at, missing = read_cache(dict(facts.cached).get(path.name), key)
    if config.calibrate == "always":
        measured_at, missing = None, "--calibrate always"
    if measured_at is not None:
        return CalibrationPlan("reuse", path=path, key=key, measured_at=measured_at)
    targets = tuple(
        Target(
            f"{gpu_set.name(pool)} {gpu_set.label(pool)}",
            pool,
            gpu_set.url(pool),
            gpu_set.index,
        )
        for gpu_set in facts.gpu_sets
        for pool in POOLS
    )
    limits = {mode: _running_limit(facts, specs, mode) for mode in POOLS}
    eagle_limit = limits["eagle"] or DEFAULT_RUNNING_LIMIT["eagle"]
    return CalibrationPlan(
        "measure",
        missing,
        path,
        key,
        targets=targets,
        levels=levels_up_to(eagle_limit),
        running_limits=limits,
        window_s=config.calibrate_seconds,
        passes=config.calibrate_passes,
        simulated=config.simulate,
        served_model_name=config.served_model_name,
    )


# -- measuring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerResult:
    target: Target
    levels: tuple[Level, ...]  # per level, the median pass's (its tok/s the median of them all)
    accept_gauge: float | None  # sglang:spec_accept_length after its levels (EAGLE)
    passes: tuple[tuple[float, ...], ...] = ()  # per level, every pass's tok/s


def median_levels(passes: Sequence[Sequence[Level]]) -> tuple[Level, ...]:
    """Per level, the pass whose tok/s is the median (the lower middle one of an even count),
    with the median tok/s."""
    out = []
    for same_c in zip(*passes, strict=True):
        ranked = sorted(same_c, key=lambda lv: lv.tok_s)
        mid = ranked[(len(ranked) - 1) // 2]
        out.append(replace(mid, tok_s=statistics.median(lv.tok_s for lv in ranked)))
    return tuple(out)


async def _measure_levels(
    client: httpx.AsyncClient,
    plan: CalibrationPlan,
    target: Target,
    levels: Sequence[int],
    headers: Mapping[str, str],
    *,
    say: Callable[[str], None] | None,
) -> list[Level]:
    """One closed-loop level after another on ``target``, each on a quiet server, and the
    server left quiet (its mate is measured next); ``say`` None: a warm-up, not told."""
    out: list[Level] = []
    c = 0
    model = plan.served_model_name or "default"  # SGLang's OpenAI routes want one
    try:
        await wait_quiet(client, target.url, headers)
        for c in levels:
            level = await measure_level(
                client, target.url, c, model=model, headers=headers, window_s=plan.window_s
            )
            out.append(level)
            if say is not None:
                tag = " (SIMULATED)" if plan.simulated else ""
                say(f"calibrate {target.label} C={c}: {level.tok_s:.0f} tok/s{tag}")
            await wait_quiet(client, target.url, headers)
    except CalibrationError as exc:
        warm = " (warm-up)" if say is None else ""
        raise CalibrationError(f"{target.label} C={c}{warm}: {exc}") from None
    return out


async def _measure_set(
    client: httpx.AsyncClient,
    plan: CalibrationPlan,
    targets: Sequence[Target],
    headers: Mapping[str, str],
    say: Callable[[str], None],
) -> list[ServerResult]:
    """One server of the GPU set at a time (the other idles beside it): a warm-up level at the
    top C each (not kept: a server's first loads compile and allocate), then ``plan.passes``
    passes of every level, the servers taking turns pass by pass, so a slow spell of the GPU
    falls on one pass of each rather than on all of one server's."""
    top = plan.levels[-1:]
    for t in targets:
        say(f"calibrate {t.label}: a warm-up level at C={top[0]}, not kept")
        await _measure_levels(client, plan, t, top, headers, say=None)
    runs: dict[Target, list[list[Level]]] = {t: [] for t in targets}
    for n in range(plan.passes):
        if plan.passes > 1:
            say(f"calibration pass {n + 1} of {plan.passes}")
        for t in targets:
            runs[t].append(await _measure_levels(client, plan, t, plan.levels, headers, say=say))
    results = []
    for t in targets:
        accept = None
        if t.mode == "eagle":
            text = await read_metrics(client, t.url, headers)
            accept = gauge(text, "sglang:spec_accept_length") if text else None
        passes = tuple(tuple(run[i].tok_s for run in runs[t]) for i in range(len(plan.levels)))
        results.append(ServerResult(t, median_levels(runs[t]), accept, passes))
    return results


async def measure(
    plan: CalibrationPlan, headers: Mapping[str, str], say: Callable[[str], None]
) -> list[ServerResult]:
    """Every GPU set at once; the first failure cancels the rest (their streams close)."""
    sets: dict[int, list[Target]] = {}
    for target in plan.targets:
        sets.setdefault(target.gpu_set, []).append(target)
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=5.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    # trust_env=False: a proxy from the environment must never see loopback traffic.
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        tasks = [
            asyncio.create_task(_measure_set(client, plan, ts, headers, say))
            for ts in sets.values()
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = task.exception()
                if error is not None:
                    raise error
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return [r for task in tasks for r in task.result()]


# -- the profile ---------------------------------------------------------------------------------


def _accept(result: ServerResult) -> tuple[float, int]:
    """(mean tokens per step, most in one step) of an EAGLE server, from its C=1 level and the
    gauge SGLang reports."""
    first = result.levels[0]
    per_chunk = first.tokens_per_chunk or 1.0
    accept = result.accept_gauge if result.accept_gauge and result.accept_gauge >= 1 else per_chunk
    accept = max(1.0, accept)
    return accept, max(first.max_tokens_per_chunk, math.ceil(accept))


def _mode(plan: CalibrationPlan, mode: str, results: Sequence[ServerResult]) -> ModeProfile:
    points = [
        (c, statistics.median(r.levels[i].tok_s for r in results))
        for i, c in enumerate(plan.levels)
    ]
    accept, most = 1.0, 1
    if mode == "eagle":
        figures = [_accept(r) for r in results]
        accept = statistics.median(a for a, _ in figures)
        most = max(*(m for _, m in figures), math.ceil(accept))
    labels = ", ".join(repr(r.target.label) for r in results)
    return measured_mode(
        points,
        what=f"calibration of {labels}" + (" (median per level)" if len(results) > 1 else ""),
        accept_length=accept,
        max_accept_length=most,
        max_running=plan.running_limits.get(mode),
        interpolate=True,
    )


def _source(plan: CalibrationPlan, sets: int, measured_at: str) -> str:
    key = plan.key
    combined = (
        f"{sets} GPU sets measured at once, each level the median of their figures (each "
        "server's own are in calibration.servers). "
        if sets > 1
        else ""
    )
    return (
        (
            "SIMULATED: dynspec-sim servers, not a GPU; the figures are of the launch's wall "
            "clock. "
            if plan.simulated
            else ""
        )
        + f"dynspec-launch --calibrate, {measured_at}, on {key['gpu']} with {key['sglang']}: "
        "each server alone (the other server of its GPU set idle), closed loop, "
        f"{METHOD}, at C={','.join(map(str, plan.levels))}; throughput = aggregate output "
        "tok/s over a steady window (every one of the C requests decoding, until "
        f"{ROUNDS} rounds of C requests ended or {plan.window_s:g}s passed), "
        + (
            f"each level the median of {plan.passes} passes (the servers of a GPU set taking "
            "turns pass by pass, after a warm-up level each at the top C, not kept; every "
            "pass's figure is in calibration.servers). "
            if plan.passes > 1
            else "one pass after a warm-up level each at the top C, not kept. "
        )
        + combined
        + "accept_length = sglang:spec_accept_length read after the EAGLE levels (else the mean "
        "tokens per stream event at C=1); max_accept_length = the most tokens in one event at "
        "C=1; prefill NOT measured: prefill_tokens_per_s and prefill_overhead_s are the "
        f"schema's defaults ({DEFAULT_PREFILL_TOKENS_PER_S:g}, {DEFAULT_PREFILL_OVERHEAD_S}s), "
        "as one prompt length cannot tell the overhead from the rate (the C=1 p50 TTFT and "
        "prompt length are in calibration.servers); max_running_requests as the servers ran "
        "(null: SGLang's default)."
    )


def _passes(r: ServerResult) -> list[list[Any]]:
    """[[C, [tok/s of each pass]], ...]: what each level's median was taken of."""
    return [[lv.c, [round(x, 1) for x in xs]] for lv, xs in zip(r.levels, r.passes, strict=True)]


def build_profile(
    plan: CalibrationPlan, results: Sequence[ServerResult], measured_at: str
) -> Profile:
    """The measured servers as one profile (several GPU sets: the median per level)."""
    by_mode = {mode: [r for r in results if r.target.mode == mode] for mode in POOLS}
    sets = len({r.target.gpu_set for r in results})
    servers = {
        r.target.label: {
            "levels": [[lv.c, round(lv.tok_s, 1)] for lv in r.levels],
            "ttft_c1_s": r.levels[0].ttft_s,
            "prompt_tokens_c1": r.levels[0].prompt_tokens,
            "tokens_per_chunk_c1": r.levels[0].tokens_per_chunk,
            **({"passes": _passes(r)} if r.passes and len(r.passes[0]) > 1 else {}),
            **({"spec_accept_length": r.accept_gauge} if r.target.mode == "eagle" else {}),
        }
        for r in results
    }
    return Profile(
        name=f"calibration-{key_digest(plan.key)}",
        source=_source(plan, sets, measured_at),
        modes={mode: _mode(plan, mode, rs) for mode, rs in by_mode.items()},
        model=plan.served_model_name or "simulated-model",
        calibration={
            "key": dict(plan.key),
            "measured_at": measured_at,
            "servers": servers,
        },
    )


def write_profile(path: Path, profile: Profile) -> None:
    """Write ``profile`` whole or not at all (a temporary file in the same folder, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(profile.dumps())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def calibrate(
    plan: CalibrationPlan, headers: Mapping[str, str], say: Callable[[str], None]
) -> Path:
    """Measure, build and write the profile; its path. ``CalibrationError`` when it failed."""
    assert plan.path is not None
    results = await measure(plan, headers, say)
    profile = build_profile(plan, results, time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        await asyncio.to_thread(write_profile, plan.path, profile)
    except OSError as exc:
        raise CalibrationError(f"cannot write {plan.path}: {exc.strerror or exc}") from None
    return plan.path
