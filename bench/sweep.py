"""A concurrency sweep: every level against every target, one JSONL line per finished level.

Levels run in order of concurrency, and within a level the targets take turns, so that a slow
drift of the machine (other work, thermal) spreads over all targets instead of biasing one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from dynspec.bench import load, metrics
from dynspec.bench.report import Record, append_jsonl

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
    dataset: Path | None = None
    seed: int = 0
    api_key: str | None = None
    request_timeout: float = 600.0
    pause: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    def level_requests(self, c: int) -> int:
        return (
            self.requests
            if self.requests is not None
            else max(self.min_requests, self.requests_per_c * c)
        )

    def level_warmup(self, c: int) -> int:
        return self.warmup if self.warmup is not None else c


class ProgressLine:
    """A one-line progress bar on a terminal (``\\r``), one line per level elsewhere."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.label = ""
        self.start = 0.0
        self.last = 0.0

    def begin(self, label: str) -> None:
        self.label = label
        self.start = self.last = time.monotonic()
        if self.enabled and self.tty:
            self.stream.write(f"\r\x1b[K{label} warm-up ...")
            self.stream.flush()

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not (self.enabled and self.tty) or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        width = 24
        fill = width * done // max(total, 1)
        self.stream.write(
            f"\r\x1b[K{self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}"
            f" {now - self.start:.0f}s"
        )
        self.stream.flush()

    def end(self, summary: str) -> None:
        if not self.enabled:
            return
        prefix = "\r\x1b[K" if self.tty else ""
        self.stream.write(f"{prefix}{self.label}: {summary}\n")
        self.stream.flush()


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
        "dataset_name": "sharegpt" if cfg.dataset else "random",
        "random_input_len": None if cfg.dataset else cfg.input_len,
        "random_output_len": None if cfg.dataset else cfg.output_len,
        "random_range_ratio": None if cfg.dataset else cfg.range_ratio,
    }
    win = None
    if run.window is not None:
        ok = [t for t in run.traces if t.success]
        chunks = sum(len(t.chunk_times) for t in ok)
        per_chunk = sum(t.output_tokens for t in ok) / chunks if chunks else 1.0
        win = metrics.window(run.everything, *run.window, tokens_per_chunk=per_chunk)
    rec.update(metrics.compute(run.traces, run.duration, win))
    rec["warmup_failed"] = run.warmup_failed
    rec.update(run.extra)
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


def sweep_prompts(cfg: SweepConfig) -> list[load.Prompt]:
    """The prompts of a sweep: the dataset's, else random ones (at most 512, reused in turn)."""
    n_max = max(cfg.level_requests(c) for c in cfg.concurrencies)
    if cfg.dataset is not None:
        return load.sharegpt_prompts(cfg.dataset, n_max, None, cfg.seed)
    return load.random_prompts(
        min(n_max, 512), cfg.input_len, cfg.output_len, cfg.seed, cfg.range_ratio
    )


async def _switches(session: aiohttp.ClientSession, target: load.Target) -> int | None:
    text = await load.fetch_text(session, target.base_url + "/metrics")
    return None if text is None else load.mode_switches(text)


async def sweep(
    targets: Sequence[load.Target],
    cfg: SweepConfig,
    out: Path | None,
    progress: ProgressLine | None = None,
) -> list[Record]:
    """Run the sweep; append each finished level to ``out`` as it ends; return all records."""
    progress = progress or ProgressLine(enabled=False)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    prompts = sweep_prompts(cfg)
    records: list[Record] = []
    async with load.make_session(cfg.request_timeout) as session:
        models = {t: await load.model_name(session, t, headers) for t in targets}
        for c in cfg.concurrencies:
            for target in targets:
                n, w = cfg.level_requests(c), cfg.level_warmup(c)
                progress.begin(f"{target.label} C={c}")
                before: list[int | None] = [None]

                async def snapshot(t: load.Target = target, box: list[int | None] = before) -> None:
                    box[0] = await _switches(session, t)

                run = await load.run_level(
                    session,
                    target,
                    models[target],
                    prompts,
                    concurrency=c,
                    requests=n,
                    warmup=w,
                    headers=headers,
                    progress=progress.update,
                    on_measure=snapshot,
                )
                after = await _switches(session, target)
                if before[0] is not None and after is not None:
                    run.mode_switches = after - before[0]
                rec = build_record(target, c, run, cfg=cfg, warmup=w, model=models[target])
                records.append(rec)
                if out is not None:
                    append_jsonl(out, rec)
                progress.end(
                    f"{rec['completed']}/{n} ok, {rec['output_throughput']:.0f} tok/s,"
                    f" TPOT p50 {rec['median_tpot_ms']:.1f} ms, achieved C {rec['concurrency']:.1f}"
                )
                if rec["completed"] == 0:
                    raise RuntimeError(
                        f"{target.label}: every request at C={c} failed"
                        f" ({next(iter(rec.get('errors', {'?': 0})))})"
                    )
                await asyncio.sleep(cfg.pause)
    return records
