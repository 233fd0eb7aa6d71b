"""What the simulated experiments' reports share: what the profile predicts and the table that
holds the simulators to it, the header lines (profile, machine, code, prompts) and the threshold
suggestion. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dynspec.bench import threshold
from dynspec.bench.report import Record, cell, table
from dynspec.launcher.sim.profile import Profile


def _batch(profile: Profile, mode: str, c: int) -> int:
    m = profile.mode(mode)
    return min(c, m.max_running_requests or (48 if mode == "eagle" else 1024))


def expected_tpot_ms(profile: Profile, mode: str, c: int) -> float:
    """The p50 TPOT the profile predicts for one server at closed-loop concurrency ``c``."""
    b = _batch(profile, mode, c)
    return 1000.0 * b / profile.mode(mode).throughput_at(b)


def expected_tput(profile: Profile, mode: str, c: int) -> float:
    """Output tok/s the profile predicts for one server with ``c`` clients (decode only)."""
    return profile.mode(mode).throughput_at(_batch(profile, mode, c))


SCHEDULE_TEXT = (
    "Measured p50 TPOT and tok/s of the single servers (and of the homogeneous pairs, each server "
    "holding about C/2) against the profile's decode-only prediction (batch = min(C, running-"
    "request limit), TPOT = batch / throughput(batch)). A baseline TPOT near 1.00x means the "
    "simulator kept its schedule and the client kept up; prefill steps that pause decoding make "
    "the measured TPOT somewhat higher and tok/s somewhat lower. A CPU that cannot keep up would "
    "show as the baseline's TPOT well above 1.00x."
)


def schedule_table(records: Sequence[Record], profile: Profile) -> str:
    """SCHEDULE_TEXT's table, from model-time records."""
    head = ["target", "C", "per server", "TPOT p50 ms", "profile TPOT ms", "measured / profile",
            "tok/s", "profile tok/s", "measured / profile", "achieved C"]  # fmt: skip
    body = []
    for r in records:
        t, c = str(r["target"]), int(r["max_concurrency"])
        if t in ("eagle", "baseline"):
            mode, per = t, c
        elif t in ("2x-eagle", "2x-baseline"):
            mode, per = t[3:], max(1, math.ceil(c / 2))
        else:
            continue
        want = expected_tpot_ms(profile, mode, per)
        # Two servers with an odd C: one holds ceil(C/2), the other floor(C/2).
        tput = expected_tput(profile, mode, per) + (
            expected_tput(profile, mode, c - per) if c > per else 0.0
        )
        got = float(r["output_throughput"])
        tpot = r["median_tpot_ms"]
        body.append([t, str(c), str(per), f"{tpot:.2f}", f"{want:.2f}", f"{tpot / want:.3f}",
                     f"{got:.1f}", f"{tput:.1f}", f"{got / tput:.3f}",
                     cell(r.get("concurrency"))])  # fmt: skip
    return "\n".join(table(head, body)) + "\n"


def profile_text(profile: Profile) -> str:
    return f"`{profile.name}`{' (ILLUSTRATIVE, not measured)' if profile.illustrative else ''}"


def machine_line(records: Sequence[Record], who: str, when: str = "") -> str:
    """The machine, who shares it, and the 1-minute load averages the records saw (``when``)."""
    m = records[0].get("machine") or {}
    loads = [float(r["loadavg_1m"]) for r in records if r.get("loadavg_1m") is not None]
    load = f" (1-minute load average {min(loads):.1f}-{max(loads):.1f}{when})" if loads else ""
    return (
        f"- Machine: {m.get('cpus', '?')} CPUs ({m.get('cpu') or 'unknown CPU'}), "
        f"{m.get('platform', '?')}, Python {m.get('python', '?')}; {who} share it, and other "
        f"work ran on it at the same time{load}."
    )


def code_lines(records: Sequence[Record]) -> list[str]:
    commits = sorted({str(r["code_commit"]) for r in records if r.get("code_commit")})
    return [f"- Code: commit {', '.join(commits)}."] if commits else []


def prompts_text(meta: Record) -> str:
    text = (
        f"random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens"
    )
    ratio = meta.get("random_range_ratio")
    if ratio is not None and float(ratio) < 1.0:
        return text + f" (each uniform from {float(ratio):g}x that)"
    return text + " (fixed)"


def suggestion_section(model: Sequence[Record]) -> list[str]:
    """``suggest-threshold`` on the run's single-server sweeps, if it has both."""
    eagle = [r for r in model if r.get("target") == "eagle"]
    baseline = [r for r in model if r.get("target") == "baseline"]
    if not (eagle and baseline):
        return []
    title = "## SIMULATED: threshold suggestion from the single-server sweeps"
    return [title, "", threshold.render(threshold.suggest(eagle, baseline)), ""]
