"""SGLang's Prometheus metrics, by the names and labels SGLang 0.5.23 exports.

Written by hand rather than with prometheus-client: the engine observes inter-token latency once per
request per decode step, and a list increment is cheaper than a locked ``Histogram.observe``.
Scheduler metrics carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``; request
(tokenizer) metrics carry ``model_name, engine_type`` and, where SGLang adds it, ``is_streaming``.
"""

from __future__ import annotations

import bisect

# SGLang's default buckets (observability/metrics_collector.py).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    *(0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400),
    *(600, 1200, 1800, 2400),
)
ITL_BUCKETS = (
    *(0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060),
    *(0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000),
)


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}.0"
    return repr(float(value))


def _labels(pairs: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())
    return "{" + inner + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Histogram:
    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, labels: dict[str, str], out: list[str]) -> None:
        acc = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            acc += n
            out.append(f"{name}_bucket{_labels({'le': _fmt(bound), **labels})} {_fmt(acc)}")
        out.append(f"{name}_bucket{_labels({'le': '+Inf', **labels})} {_fmt(self.count)}")
        # prometheus-client's order (le first, then _count before _sum), as SGLang's output has.
        out.append(f"{name}_count{_labels(labels)} {_fmt(self.count)}")
        out.append(f"{name}_sum{_labels(labels)} {_fmt(self.sum)}")


class Metrics:
    """Counters and histograms fed by the engine; gauges are read from it at scrape time."""

    def __init__(self, model_name: str, speculative: bool, draft_tokens: int = 4) -> None:
        self.speculative = speculative
        self.draft_tokens = max(2, draft_tokens)  # speculative_num_draft_tokens
        self.tok_labels = {"model_name": model_name, "engine_type": "unified"}
        self.sched_labels = {
            **self.tok_labels,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.prompt_tokens = {True: 0.0, False: 0.0}
        self.generation_tokens = {True: 0.0, False: 0.0}
        self.num_requests = {True: 0.0, False: 0.0}
        self.aborted = 0.0
        self.ttft = {True: Histogram(TTFT_BUCKETS), False: Histogram(TTFT_BUCKETS)}
        self.e2e = {True: Histogram(E2E_BUCKETS), False: Histogram(E2E_BUCKETS)}
        self.itl = Histogram(ITL_BUCKETS)

    def render(
        self,
        *,
        running: int,
        queued: int,
        gen_throughput: float,
        token_usage: float,
        used_tokens: int,
        accept_length: float,
    ) -> bytes:
        out: list[str] = []
        s = self.sched_labels

        def gauge(name: str, doc: str, value: float) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} gauge")
            out.append(f"{name}{_labels(s)} {_fmt(value)}")

        gauge("sglang:num_running_reqs", "The number of running requests.", running)
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued)
        gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar queue.", 0)
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0)
        gauge("sglang:gen_throughput", "The generation throughput (token/s).", gen_throughput)
        gauge("sglang:token_usage", "The token usage.", token_usage)
        gauge("sglang:num_used_tokens", "The number of used tokens.", used_tokens)
        if self.speculative:
            gauge("sglang:spec_accept_length", "The average acceptance length.", accept_length)
            rate = (accept_length - 1) / (self.draft_tokens - 1) if accept_length else 0.0
            gauge(
                "sglang:spec_accept_rate",
                "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
                max(0.0, rate),
            )

        t = self.tok_labels
        for name, doc, values in (
            (
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                self.prompt_tokens,
            ),
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                self.generation_tokens,
            ),
            ("sglang:num_requests_total", "Number of requests processed.", self.num_requests),
        ):
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} counter")
            for stream in (False, True):
                lab = {**t, "is_streaming": "true" if stream else "false"}
                out.append(f"{name}{_labels(lab)} {_fmt(values[stream])}")
        name = "sglang:num_aborted_requests_total"
        out.append(f"# HELP {name} Number of requests aborted.")
        out.append(f"# TYPE {name} counter")
        out.append(f"{name}{_labels(t)} {_fmt(self.aborted)}")

        for name, doc, hists in (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                self.e2e,
            ),
        ):
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} histogram")
            for stream in (False, True):
                lab = {**t, "is_streaming": "true" if stream else "false"}
                hists[stream].render(name, lab, out)
        name = "sglang:inter_token_latency_seconds"
        out.append(f"# HELP {name} Histogram of inter-token latency in seconds.")
        out.append(f"# TYPE {name} histogram")
        self.itl.render(name, t, out)
        out.append("")
        return "\n".join(out).encode()
