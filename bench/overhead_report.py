"""The overhead benchmark's Markdown report, from its result alone (so a rerender works)."""

from __future__ import annotations

from typing import Any


def _f(v: object, fmt: str = "{:.1f}") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return fmt.format(v)
    return str(v)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    st = result["settings"]
    lines = [
        "# Router hot-path overhead",
        "",
        f"Measured {result['date']} on {m['nproc']} x {m['cpu_model']}, Python {m['python']}, "
        f"{m['platform']}; commit {m['commit'] or '?'}; packages "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
        + ".",
        "",
        f"Closed loop, {st['runs']} runs per row (median; range in brackets), targets taking "
        f"turns. Streams of {st['tokens']} tokens unless stated; a chunk is {st['chunk']}. "
        "Load generator, two upstreams and each router are separate processes on one machine, "
        "so on a small machine wall-clock ratios also measure spare cores; router CPU is from "
        "/proc (all threads and children) over the measured window only.",
        "",
        "| interval | C | tokens | target | req/s | x direct | chunks/s | TTFT p50 ms | +p50 ms "
        "| TTFT p99 ms | +p99 ms | router CPU s / 1k chunks | bad / failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["summary"]:
        rr = r["requests_per_s_range"] or [None, None]
        direct = r["target"] == "direct"
        add50 = "" if direct else _f(r["added_ttft_p50_ms"], "{:+.2f}")
        add99 = "" if direct else _f(r["added_ttft_p99_ms"], "{:+.2f}")
        lines.append(
            f"| {r['interval_ms']:g} ms | {r['concurrency']} | {r['tokens']} | {r['target']} "
            f"| {_f(r['requests_per_s'])} [{_f(rr[0], '{:.0f}')}-{_f(rr[1], '{:.0f}')}] "
            f"| {_f(r['x_direct'], '{:.2f}')} | {_f(r['chunks_per_s'], '{:.0f}')} "
            f"| {_f(r['ttft_p50_ms'], '{:.2f}')} | {add50} "
            f"| {_f(r['ttft_p99_ms'], '{:.2f}')} | {add99} "
            f"| {_f(r['router_cpu_s_per_1k_chunks'], '{:.3f}')} "
            f"| {r['bad_streams']} / {r['failed']} |"
        )
    cm = result["cost_model"]
    if cm:
        lines += [
            "",
            f"## CPU cost model (C={st['cost_concurrency']}, {st['cost_interval_ms']:g} ms per "
            f"token, streams of {' and '.join(map(str, st['cost_tokens']))} tokens; medians per "
            "length of cpu per request = chunks per request x a + b; brackets: each run set alone)",
            "",
            "| router | runs | a: us per chunk | a / floor's a | b: ms per request "
            "| target a <= 25 us | target b <= 0.3 ms |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        # The floor's own a says what this machine charges for the bare relay (syscalls, loop);
        # the ratio to it travels between machines better than microseconds do.
        floor_a = cm.get("floor", {}).get("chunk_us")
        for name, c in cm.items():
            a, b = c["chunk_us"], c["request_ms"]
            ar = c.get("chunk_us_range") or [None, None]
            br = c.get("request_ms_range") or [None, None]
            ratio = f"{a / floor_a:.2f}" if a is not None and floor_a else "-"
            lines.append(
                f"| {name} | {c['runs']} | {_f(a)} [{_f(ar[0])} to {_f(ar[1])}] | {ratio} "
                f"| {_f(b, '{:.3f}')} [{_f(br[0], '{:.3f}')} to {_f(br[1], '{:.3f}')}] "
                f"| {'-' if a is None else ('met' if a <= 25 else 'not met')} "
                f"| {'-' if b is None else ('met' if b <= 0.3 else 'not met')} |"
            )
    targets = _target_checks(result)
    if targets:
        lines += [
            "",
            "## Targets at C=64",
            "",
            "| router | check | value | met |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {t} | {check} | {value} | {'yes' if ok else 'no'} |"
            for t, check, value, ok in targets
        ]
    mem = result["memory"]
    if mem:
        lines += [
            "",
            "## Router memory (RSS, MB)",
            "",
            "| router | measure | MB |",
            "| --- | --- | --- |",
        ]
        for name, vals in mem.items():
            for k, v in vals.items():
                if k == "soak":
                    points = ", ".join(f"{p['requests']:.0f}: {p['rss_mb']}" for p in v["points"])
                    lines.append(
                        f"| {name} | soak: growth after first slice (MB) "
                        f"| {v['growth_mb_after_first_slice']} (requests: MB {points}) |"
                    )
                else:
                    lines.append(f"| {name} | {k} | {v} |")
    command = result.get("command") or "python -m dynspec.bench.overhead"
    lines += ["", f"Reproduce: `{command}` (see `--help`).", ""]
    return "\n".join(lines)


def _target_checks(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    out: list[tuple[str, str, str, bool]] = []
    st = result["settings"]
    for r in result["summary"]:
        if r["target"] == "direct" or r["concurrency"] != 64 or r["tokens"] != st["tokens"]:
            continue
        label = f"{r['target']} ({r['interval_ms']:g} ms)"
        if r["x_direct"] is not None:
            out.append(
                (label, "req/s >= 0.95x direct", f"{r['x_direct']:.2f}x", r["x_direct"] >= 0.95)
            )
        if r["added_ttft_p50_ms"] is not None:
            out.append(
                (
                    label,
                    "added TTFT p50 <= 2 ms",
                    f"{r['added_ttft_p50_ms']:+.2f} ms",
                    r["added_ttft_p50_ms"] <= 2,
                )
            )
    return out
