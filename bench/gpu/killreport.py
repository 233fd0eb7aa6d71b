"""The ``kill`` plan's results: each request's outcome, what one kill did to its load, the
checks, and the table of ``OUT/kill.md``. Pure functions of the records (``killload.py``'s
lines) and of the summary ``kill.py`` builds, besides reading and writing those files."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dynspec.bench.metrics import samples
from dynspec.bench.report import table

POOLS = ("eagle", "baseline")
OTHER = {"eagle": "baseline", "baseline": "eagle"}


def gpu_pids(text: str) -> list[int]:
    """The pids of ``nvidia-smi --query-compute-apps=pid,... --format=csv,noheader``."""
    pids = []
    for line in text.splitlines():
        head = line.split(",", 1)[0].strip()
        if head.isdigit():
            pids.append(int(head))
    return pids


def counters(text: str, name: str) -> dict[str, float]:
    """``name``'s samples by their labels, sorted: {"kind=connect,pool=eagle": 3.0}."""
    return {
        ",".join(sorted(f"{k}={v}" for k, v in re.findall(r'(\w+)="([^"]*)"', labels))): value
        for labels, value in samples(text, name)
        if labels
    }


def outcome(r: Mapping[str, Any]) -> str:
    """ok; cut (a byte, then no [DONE]); before_first_byte (not a byte: an error status, or a
    connection that ended first); empty ([DONE] and no content); stopped (by the load generator,
    at its drain limit: not a failure of what is measured)."""
    if r.get("stopped"):
        return "stopped"
    if r.get("ok"):
        return "ok"
    if r.get("done"):
        return "empty"
    return "cut" if r.get("first_byte") is not None else "before_first_byte"


FAILED = ("cut", "before_first_byte", "empty")


def kill_requests(
    records: Sequence[Mapping[str, Any]], *, server: str, killed_at: float, back_at: float | None
) -> dict[str, Any]:
    """What one kill did to the requests of its load (times in plan seconds)."""
    other = OTHER[server]
    counts = Counter(outcome(r) for r in records)
    failed = [r for r in records if outcome(r) in FAILED]

    def on(r: Mapping[str, Any]) -> str:
        b = r.get("backend")
        return "killed" if b == server else "other" if b == other else "unknown"

    held = [
        r
        for r in records
        if r["start"] is not None and r["start"] <= killed_at and (r["end"] or 1e18) > killed_at
    ]
    retried = [
        r
        for r in held
        if r.get("ok")
        and r.get("backend") == other
        and (r.get("first_byte") is None or r["first_byte"] > killed_at)
    ]
    back = [
        r
        for r in records
        if back_at is not None and (r["start"] or 0) >= back_at and r.get("backend") == server
    ]
    before = Counter(str(r.get("status")) for r in records if outcome(r) == "before_first_byte")
    return {
        "total": len(records),
        "ok": counts["ok"],
        "cut": counts["cut"],
        "before_first_byte": counts["before_first_byte"],
        "before_first_byte_status": dict(sorted(before.items())),
        "empty": counts["empty"],
        "stopped": counts["stopped"],
        "failed_on": dict(Counter(on(r) for r in failed)),
        "failed_before_kill": sum(1 for r in failed if (r["end"] or 0) < killed_at),
        "in_flight_at_kill": dict(Counter(str(r.get("backend")) for r in held)),
        "retried_elsewhere": len(retried),
        "back_on_server": len(back),
    }


def kill_checks(kill: Mapping[str, Any]) -> dict[str, bool]:
    req = kill.get("requests") or {}
    after = kill.get("after") or {}
    gpu_before = set(kill.get("gpu_pids_before_of_server") or [])
    failed_on = req.get("failed_on") or {}
    return {
        "healthy_again": kill.get("router_healthy_s") is not None,
        "workers_gone": kill.get("group_gone_s") is not None,
        "failures_only_on_killed": not failed_on.get("other")
        and not failed_on.get("unknown")
        and not req.get("failed_before_kill"),
        # The router moves a request whose server closed the connection before answering at all
        # to the other server, so none of those reaches the client as an error status. A 200
        # whose head the router had relayed and whose server then died before the first token
        # is a cut stream (the client has the head; nothing is replayed): counted, not a check.
        "no_error_before_first_byte": all(
            status == "200" for status in (req.get("before_first_byte_status") or {})
        ),
        "traffic_back": (req.get("back_on_server") or 0) > 0,
        "load_zero_after": after.get("zero_after_s") is not None,
        "old_gpu_processes_gone": not gpu_before & set(kill.get("gpu_pids_after") or []),
    }


def summary_checks(summary: Mapping[str, Any]) -> dict[str, bool]:
    kills = summary.get("kills") or []
    found = {"all_kills_made": len(kills) == len(summary.get("planned") or ())}
    for name in ("healthy_again", "workers_gone", "failures_only_on_killed",
                 "no_error_before_first_byte", "traffic_back", "load_zero_after",
                 "old_gpu_processes_gone"):  # fmt: skip
        found[name] = bool(kills) and all((kc.get("checks") or {}).get(name) for kc in kills)
    orphans = summary.get("orphans")
    if orphans is not None:
        found["no_gpu_process_after_stop"] = bool(
            orphans["nvidia_smi_answered"] and not orphans["gpu_processes"]
        )
        found["no_process_left"] = not orphans["survivors"] and not orphans["tagged_alive"]
    return found


def write_results(out: Path, summary: Mapping[str, Any]) -> None:
    (out / "kill-summary.json").write_text(json.dumps(summary, indent=1))
    (out / "kill.md").write_text(markdown(summary))


def read_records(path: Path, kill: int) -> list[dict[str, Any]]:
    rows = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if row.get("kill") == kill:
                    rows.append(row)
    return rows


# -- report --------------------------------------------------------------------------------------


def _s(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


COLUMNS = (
    "kill", "server", "in flight at the kill (by the server that answered)", "workers gone",
    "restarted", "healthy again: launcher / router", "failed before 1st byte (status)", "cut",
    "retried elsewhere", "failed elsewhere", "router upstream errors", "back on it after",
    "load after (running: eagle, baseline)",
)  # fmt: skip


def markdown(summary: Mapping[str, Any]) -> str:
    versions = summary.get("versions") or {}
    lines = [
        f"# Kill one server under load (MEASURED: SGLang {versions.get('sglang', '?')}, "
        f"GPU {versions.get('gpu', '?')})",
        "",
        f"`dynspec-launch --gpus 0 --restart on-failure`, C={summary.get('concurrency')} "
        "closed-loop streamed chat requests through the router; before each kill the router's "
        "threshold puts the load on the server then killed with SIGKILL (its main process). "
        "Times: seconds after the kill. Requests: counts in that kill's load.",
    ]
    body = []
    for kill in summary.get("kills") or []:
        req = kill.get("requests") or {}
        after = kill.get("after") or {}
        flights = ", ".join(f"{p} {n}" for p, n in (req.get("in_flight_at_kill") or {}).items())
        failed_on = req.get("failed_on") or {}
        elsewhere = (failed_on.get("other") or 0) + (failed_on.get("unknown") or 0)
        statuses = ", ".join(
            f"{n}x {c}" for c, n in (req.get("before_first_byte_status") or {}).items()
        )
        errors = ", ".join(
            f"{key.replace('kind=', '').replace(',pool=', ' ')} {v:g}"
            for key, v in (kill.get("router_upstream_errors") or {}).items()
        )
        run_after = ", ".join(_s(v) for v in (after.get("running") or {}).values())
        name = kill["server"] + (f" (for {kill['instead_of']})" if "instead_of" in kill else "")
        cells = [
            str(kill["kill"]), name, flights or "-", _s(kill.get("group_gone_s")),
            _s(kill.get("restarted_s")),
            f"{_s(kill.get('launcher_healthy_s'))} / {_s(kill.get('router_healthy_s'))}",
            _s(req.get("before_first_byte")) + (f" ({statuses})" if statuses else ""),
            _s(req.get("cut")), _s(req.get("retried_elsewhere")), str(elsewhere),
            errors or "-", _s(req.get("back_on_server")),
            f"{_s(after.get('load'))} ({run_after or '-'})",
        ]  # fmt: skip
        body.append(cells)
    for skipped in summary.get("not_run") or []:
        cells = [str(skipped["kill"]), f"{skipped['server']}: not run ({skipped['why']})"]
        body.append(cells + ["-"] * (len(COLUMNS) - 2))
    lines += [
        "",
        *table(COLUMNS, body),
        "",
        "Workers gone: the killed server's process group empty (its scheduler and detokenizer). "
        "Healthy again: the launcher's /health_generate probe, the router's /status. Failed "
        "before the first byte: no byte of the body came (an error status, or a 200 cut "
        "first); cut: cut after it. Retried elsewhere: in flight at the kill with no byte yet, "
        "answered by the other server. Router upstream errors (its counters over the kill): "
        "connect (each such request was sent once more, to the other server), protocol (the "
        "server failed mid-response or before answering). Back on it: requests the restarted "
        "server answered once the router saw it healthy.",
    ]
    orphans = summary.get("orphans")
    if orphans is not None:
        gpu = (
            "nothing"
            if orphans["nvidia_smi_answered"] and not orphans["gpu_processes"]
            else "; ".join(orphans["gpu_processes"]) or "-"
        )
        left = [f"{p['pid']} {p['name']}" for p in orphans["survivors"] + orphans["tagged_alive"]]
        lines += [
            "",
            f"After the launcher's stop (exit {orphans['launcher_exit']}): "
            f"`nvidia-smi --query-compute-apps` lists {gpu}; processes of the launcher's tree "
            f"left: {', '.join(left) or 'none'} (of {orphans['processes_seen']} seen).",
        ]
    checks = summary.get("checks") or {}
    if checks:
        body = [[n, "PASS" if ok else "MISS"] for n, ok in checks.items()]
        lines += ["", *table(["check", "result"], body)]
    return "\n".join(lines) + "\n"
