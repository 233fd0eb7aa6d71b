"""A concurrency sweep: every level against every target, the targets taking turns within a level
(a drift of the machine spreads over all), one JSONL line per finished level; it may span
processes (``resume``, ``deadline``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from dynspec.bench import load, metrics
from dynspec.bench.report import Record, append_jsonl, load_jsonl

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepConfig:
    concurrencies: Sequence[int]
    requests: int | None = None  # per level; None: max(min_requests, requests_per_c * C)
    requests_per_c: int = 4
    min_requests: int = 16
    warmup: int | None = None  # per level; None: C (one round of the closed loop)
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 1.0
    seed: int = 0
    api_key: str | None = None
    request_timeout: float = 600.0
    pause: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)
    repeats: int = 1  # runs of each (target, level), interleaved with the other targets
    min_seconds: float = 0.0  # a measured level lasts at least this long
    # Skip the (target, level, repeat) points already in ``out`` (the GPU plans' kept sessions;
    # envelope's repeats write one file, each repeat's levels as repeat 1 of its own sweep).
    resume: bool = False
    deadline: float | None = None  # time.monotonic(): no level is started that would end later
    warm_pass: bool = False  # ``warm`` every target at every level before measuring
    prompt_pool: int = 0  # random prompts: 0, a new one every request; N, N reused in turn

    def level_requests(self, c: int) -> int:
        default = max(self.min_requests, self.requests_per_c * c)
        return default if self.requests is None else self.requests


Say = Callable[[str], None]  # one line per level (a console's); None: silent


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build_record(
    target: load.Target,
    c: int,
    run: load.LevelRun,
    *,
    cfg: SweepConfig,
    warmup: int,
    model: str = "",
) -> Record:
    rec: Record = {
        "target": target.label,
        "url": target.base_url,
        "endpoint": target.endpoint,
        "model": model,
        "max_concurrency": c,
        "num_prompts": len(run.traces),
        "warmup_requests": warmup,
        "dataset_name": "random",
        **{f"random_{k}": getattr(cfg, k) for k in ("input_len", "output_len", "range_ratio")},
        "prompt_pool": cfg.prompt_pool,
    }
    per_chunk = metrics.tokens_per_chunk(run.traces)
    win = metrics.window(run.everything, *run.window, tokens_per_chunk=per_chunk)
    rec.update(metrics.compute(run.traces, run.duration, win))
    rec["warmup_failed"] = run.warmup_failed
    rec["min_seconds"] = cfg.min_seconds
    rec["warmup_sent"] = run.warmup_sent
    pools = Counter(t.backend for t in run.traces if t.backend)
    if pools:
        n = sum(pools.values())
        rec["backend_share"] = {k: v / n for k, v in sorted(pools.items())}
    if run.mode_switches is not None:
        rec["mode_switches"] = run.mode_switches
    errors = Counter(t.error for t in run.traces if not t.success)
    if errors:
        rec["errors"] = dict(errors.most_common(3))
    rec.update(cfg.extra)
    rec["timestamp"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return rec


def sweep_prompts(cfg: SweepConfig) -> load.Prompts:
    """The prompts of a sweep (``cfg.prompt_pool``: 0, a new one for every request)."""
    return load.Prompts(cfg.prompt_pool, cfg.input_len, cfg.output_len, cfg.seed, cfg.range_ratio)


async def _switches(session: aiohttp.ClientSession, target: load.Target) -> int | None:
    """The router's mode switches so far (None: not a dynspec router)."""
    text = await load.fetch_text(session, target.base_url + "/metrics")
    return None if text is None else load.mode_switches(text)


Point = tuple[str, int, int]  # (target label, concurrency, repeat from 1)


def points(targets: Sequence[load.Target], cfg: SweepConfig) -> list[Point]:
    """Every point of the sweep, in the order it runs them."""
    return [
        (t.label, c, rep)
        for c in cfg.concurrencies
        for rep in range(1, cfg.repeats + 1)
        for t in targets
        if t.levels is None or c in t.levels
    ]


def earlier(out: Path | None) -> list[Record]:
    """What an earlier run of the sweep wrote to ``out``."""
    return load_jsonl(out) if out is not None and out.exists() else []


def point(rec: Record) -> Point:
    """A record's point (a record without ``repeat`` is repeat 1)."""
    return str(rec["target"]), int(rec["max_concurrency"]), int(rec.get("repeat") or 1)


def pending(
    targets: Sequence[load.Target], cfg: SweepConfig, out: Path | None, done: Sequence[Record] = ()
) -> list[Point]:
    """The sweep's points not in ``out`` (or, given, in ``done``: the records already read)."""
    finished = {point(r) for r in (done or earlier(out))}
    return [p for p in points(targets, cfg) if p not in finished]


def estimate_seconds(c: int, cfg: SweepConfig, seen: Sequence[Record]) -> float:
    """How long one level at ``c`` takes, from the target's earlier records (``seen``): at the
    tok/s of the nearest level at or below ``c`` (tok/s grows with C, so this errs long), plus a
    warm-up round, the tail and the pause; with no record yet, twice ``min_seconds`` and 10 s."""
    below = [r for r in seen if int(r["max_concurrency"]) <= c and r.get("output_throughput")]
    if not below:
        return 2 * cfg.min_seconds + 10.0 + cfg.pause
    near = max(below, key=lambda r: int(r["max_concurrency"]))
    tok_s = float(near["output_throughput"])
    one_round = c * cfg.output_len / tok_s
    measured = max(cfg.min_seconds, cfg.level_requests(c) * cfg.output_len / tok_s)
    return measured + 2 * one_round + cfg.pause + 1.0


async def warm(
    session: aiohttp.ClientSession,
    targets: Sequence[load.Target],
    cfg: SweepConfig,
    *,
    models: dict[load.Target, str],
    prompts: load.Prompts,
    headers: dict[str, str],
    say: Say | None,
) -> None:
    """Every target at each of its levels once: one round of C requests, not recorded."""
    for target in targets:
        for c in cfg.concurrencies:
            if target.levels is not None and c not in target.levels:
                continue
            run = await load.run_level(
                session, target, models[target], prompts,
                concurrency=c, requests=c, warmup=0, headers=headers,
            )  # fmt: skip
            ok = sum(1 for t in run.traces if t.success)
            if say is not None:
                say(f"{target.label} C={c} warm: warm, {ok}/{c} ok")


OnRecord = Callable[[Record], None]


async def sweep(
    targets: Sequence[load.Target],
    cfg: SweepConfig,
    out: Path | None,
    say: Say | None = None,
    *,
    on_record: OnRecord | None = None,
    on_start: Callable[[str], None] | None = None,
) -> list[Record]:
    """Run the sweep; append each finished level to ``out`` as it ends; return all records.
    ``on_start(label)`` runs before each level, ``on_record`` may add to a record before it is
    written; ``cfg.deadline`` stops it early, with points left unrun."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    prompts = sweep_prompts(cfg)
    records: list[Record] = []
    before_now = earlier(out) if cfg.resume else []
    todo = pending(targets, cfg, None, before_now)
    seen: dict[str, list[Record]] = {t.label: [] for t in targets}
    for r in before_now:
        seen.setdefault(str(r["target"]), []).append(r)
    by_label = {t.label: t for t in targets}
    async with load.make_session(cfg.request_timeout) as session:
        models = {t: await load.model_name(session, t, headers) for t in targets}
        if cfg.warm_pass:
            await warm(session, targets, cfg, models=models, prompts=prompts, headers=headers,
                       say=say)  # fmt: skip
        for label, c, rep in todo:
            target = by_label[label]
            if cfg.deadline is not None:
                need = estimate_seconds(c, cfg, seen[label])
                if time.monotonic() + need > cfg.deadline:
                    logger.info("%s C=%d #%d needs about %.0fs: past the deadline", label, c, rep,
                                need)  # fmt: skip
                    break
            n, w = cfg.level_requests(c), c if cfg.warmup is None else cfg.warmup
            before: list[int | None] = []  # the switches when measuring began

            async def snapshot(t: load.Target = target, box: list[int | None] = before) -> None:
                box.append(await _switches(session, t))

            if on_start is not None:
                on_start(label)
            cpu0 = time.process_time()
            run = await load.run_level(
                session, target, models[target], prompts,
                concurrency=c, requests=n, warmup=w, headers=headers,
                on_measure=snapshot, min_seconds=cfg.min_seconds,
            )  # fmt: skip
            after = await _switches(session, target)
            if before and before[0] is not None and after is not None:
                run.mode_switches = after - before[0]
            rec = build_record(target, c, run, cfg=cfg, warmup=w, model=models[target])
            rec["repeat"] = rep
            # A load generator that saturates a core measures itself, not the server.
            rec["client_cpu_s"] = round(time.process_time() - cpu0, 3)
            if on_record is not None:
                on_record(rec)
            records.append(rec)
            seen[label].append(rec)
            if out is not None:
                append_jsonl(out, rec)
            if say is not None:
                name = f"{label} C={c}" + (f" #{rep}" if cfg.repeats > 1 else "")
                say(
                    f"{name}: {rec['completed']}/{rec['num_prompts']} ok, "
                    f"{rec['output_throughput']:.0f} tok/s, TPOT p50 {rec['median_tpot_ms']:.1f} "
                    f"ms, achieved C {rec['concurrency']:.1f}, {rec['duration']:.1f}s"
                )
            if rec["completed"] == 0:
                raise RuntimeError(
                    f"{label}: every request at C={c} failed"
                    f" ({next(iter(rec.get('errors', {'?': 0})))})"
                )
            await asyncio.sleep(cfg.pause)
    return records
