"""Per-request traces in, SGLang ``bench_serving``'s metrics out, by its definitions so that the
numbers compare (docs/benchmarks.md, "How a level is measured"). Pure: no I/O, no clock.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class RequestTrace:
    """What the client saw of one request. Times are ``perf_counter()`` seconds."""

    send: float
    # Arrival of each chunk that carried content, in order.
    chunk_times: list[float] = field(default_factory=list)
    # New tokens in each of those chunks; None when the server did not say (then 1 per chunk).
    chunk_tokens: list[int] | None = None
    # Last line of the stream (``[DONE]``), or the end of the body when not streaming.
    end: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    success: bool = False
    error: str = ""
    # The router's pool for this request (``x-dynspec-backend``), when the target is a router.
    backend: str | None = None
    # The response's HTTP status (None: no response); the first ``data:`` line's arrival, content
    # or not (None: no byte of the body); whether the stream ended with ``data: [DONE]``.
    status: int | None = None
    first_byte: float | None = None
    done: bool = False
    # A refusal's ``Retry-After`` header (a router shedding load: 429/503), as sent.
    retry_after: str | None = None

    @property
    def ttft(self) -> float:
        return (self.chunk_times[0] if self.chunk_times else self.end) - self.send

    @property
    def latency(self) -> float:
        return self.end - self.send

    def itl(self) -> list[float]:
        """Inter-token latencies, multi-token chunks split per token (bench_serving's rule)."""
        times = self.chunk_times
        tokens = self.chunk_tokens if self.chunk_tokens is not None else [1] * len(times)
        out: list[float] = []
        if not times:
            return out
        last = times[0]
        for t, n in zip(times[1:], tokens[1:], strict=True):
            if n <= 0:
                continue
            out.extend([(t - last) / n] * n)
            last = t
        return out


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between order statistics, as ``numpy.percentile``'s default."""
    if not values:
        return 0.0
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def std(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def _summary(prefix: str, values: Sequence[float], extra: Iterable[int] = ()) -> dict[str, float]:
    ms = [v * 1000.0 for v in values]
    return {
        f"mean_{prefix}_ms": mean(ms),
        f"median_{prefix}_ms": percentile(ms, 50),
        f"std_{prefix}_ms": std(ms),
        f"p90_{prefix}_ms": percentile(ms, 90),
        f"p99_{prefix}_ms": percentile(ms, 99),
        **{f"p{p}_{prefix}_ms": percentile(ms, p) for p in extra},
    }


@dataclass(frozen=True)
class Window:
    """What all requests of a level delivered between ``start`` and ``end`` (seconds)."""

    start: float
    end: float
    output_tokens: float
    input_tokens: int
    requests: int
    busy: float  # request-seconds in flight inside the window

    @property
    def length(self) -> float:
        return self.end - self.start


def window(
    traces: Sequence[RequestTrace], start: float, end: float, tokens_per_chunk: float = 1.0
) -> Window:
    """Tokens, finished requests and time in flight of ``traces`` inside ``[start, end]``. A
    chunk counts its own tokens where the server said, else the request's mean if it finished,
    else ``tokens_per_chunk`` (a cancelled request gets no usage)."""
    out = 0.0
    inp = 0
    done = 0
    busy = 0.0
    for t in traces:
        times = t.chunk_times
        if t.chunk_tokens is not None:
            out += sum(n for c, n in zip(times, t.chunk_tokens, strict=True) if start <= c <= end)
        else:
            per = t.output_tokens / len(times) if t.success and times else tokens_per_chunk
            out += per * sum(1 for c in times if start <= c <= end)
        stop = t.end if t.end > 0 else end
        busy += max(0.0, min(stop, end) - max(t.send, start))
        if t.success and start <= t.end <= end:
            done += 1
            inp += t.prompt_tokens
    return Window(start, end, out, inp, done, busy)


def tokens_per_chunk(traces: Sequence[RequestTrace]) -> float:
    """The successful requests' output tokens per content chunk (1 where none)."""
    ok = [t for t in traces if t.success]
    chunks = sum(len(t.chunk_times) for t in ok)
    return sum(t.output_tokens for t in ok) / chunks if chunks else 1.0


def compute(
    traces: Sequence[RequestTrace], duration: float, win: Window | None = None
) -> dict[str, float | int]:
    """bench_serving's metrics over one level's measured ``traces``. The throughputs are the
    measured requests' over ``duration``, or with ``win`` what every request delivered inside
    it; the latencies always come from ``traces``."""
    ok = [t for t in traces if t.success]
    ttfts = [t.ttft for t in ok]
    latencies = [t.latency for t in ok]
    tpots = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in ok if t.output_tokens > 1]
    itls = [x for t in ok for x in t.itl()]
    total_input = sum(t.prompt_tokens for t in ok)
    total_output = sum(t.output_tokens for t in ok)
    if win is None or win.length <= 0:  # the measured requests' own, over ``duration``
        win = Window(0.0, duration, total_output, total_input, len(ok), sum(latencies))
    n = win.length if win.length > 0 else math.inf
    result: dict[str, float | int] = {
        "completed": len(ok),
        "failed": len(traces) - len(ok),
        "duration": win.length,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": win.requests / n,
        "input_throughput": win.input_tokens / n,
        "output_throughput": win.output_tokens / n,
        "total_throughput": (win.input_tokens + win.output_tokens) / n,
        "concurrency": win.busy / n,
    }
    result.update(_summary("ttft", ttfts))
    result.update(_summary("tpot", tpots))
    result.update(_summary("itl", itls, extra=(95,)))
    result["max_itl_ms"] = max(itls) * 1000.0 if itls else 0.0
    # Stream chunks: SGLang sends one per decode step, so tokens per chunk is EAGLE's accept length.
    chunks = sum(len(t.chunk_times) for t in ok)
    result["mean_tokens_per_chunk"] = total_output / chunks if chunks else 0.0
    result["max_tokens_per_chunk"] = max(
        (n for t in ok if t.chunk_tokens is not None for n in t.chunk_tokens), default=0
    )
    result.update(_summary("e2e_latency", latencies))
    return result


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """``name``'s (labels or "", value) samples in a Prometheus text page, NaN left out."""
    found: list[tuple[str, float]] = []
    for labels, value in re.findall(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", text, re.M):
        with contextlib.suppress(ValueError):
            if not math.isnan(float(value)):
                found.append((labels, float(value)))
    return found
