"""What the servers held over each level (``bench/gpu/held.py``), read from SGLang's decode-log
lines: on the committed H200 runs' real logs, on made-up lines, and through
``gpu report --logs``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dynspec.bench.gpu import held, steadyreport
from dynspec.common.sglanglog import Decode, seconds

H200 = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200"


def load(run: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in next((H200 / run).glob("sweep-*.jsonl")).open()]
    held.annotate(rows, held.samples([H200 / run / "logs.tar.xz"]), again=True)
    return rows


def total(rows: list[dict[str, Any]], target: str, c: int) -> list[float]:
    found = sorted(
        (int(r.get("repeat") or 1), r["server_held"]["running"] + r["server_held"]["queued"])
        for r in rows
        if r["target"] == target and r["max_concurrency"] == c
    )
    return [t for _, t in found]


def test_the_capped_baseline_was_fed_unlike_eagle_at_c256_on_the_h200() -> None:
    rows = load("pair-a-capped")
    # EAGLE held its 128 running and 117-122 queued in every C=256 level.
    assert all(t > 230 for t in total(rows, "eagle", 256))
    # The baseline (capped at 128 too) held 118 in the level that read 9.3k tok/s, 180 in the
    # one that read 13.9k: the load the clients named did not reach it alike.
    base = total(rows, "baseline", 256)
    assert base[0] < 130 and base[2] > 170, base
    tok = sorted(
        (r["repeat"], r["output_throughput"])
        for r in rows
        if r["target"] == "baseline" and r["max_concurrency"] == 256
    )
    assert tok[0][1] < 10_000 and tok[2][1] > 13_000


def test_no_uncapped_baseline_level_at_c256_held_what_eagle_held() -> None:
    for run in ("pair-a-learner", "pair-a-calibrated", "pair-b-calibrated", "pair-a-steady"):
        rows = load(run)
        eagle, base = total(rows, "eagle", 256), total(rows, "baseline", 256)
        assert eagle and base and min(eagle) > 230 and max(base) < 210, (run, eagle, base)


def line(at: str, running: int, queued: int) -> str:
    return (
        f"[2026-12-04 {at}] Decode batch, #running-req: {running}, #token: 1, token usage: 0.1,"
        f" cuda graph: True, gen throughput (token/s): 100.00, #queue-req: {queued}"
    )


def test_a_level_reads_only_the_seconds_wholly_inside_it_on_the_h200() -> None:
    # pair-b-interval4's first routed C=1 level began in the second of the warm pass's last
    # C=256 line (127 running, 129 queued); the live run read 8+8 from it. One request open.
    rows = load("pair-b-interval4")
    assert all(0.9 <= t <= 1.2 for t in total(rows, "routed", 1)), total(rows, "routed", 1)
    assert all(250 <= t <= 257 for t in total(rows, "eagle", 256)), total(rows, "eagle", 256)


def test_a_router_level_sums_both_servers_second_by_second() -> None:
    found = {
        "eagle": [Decode(seconds("2026-12-04 10:00:01"), 4, 1.0, 0)],
        "baseline": [
            Decode(seconds("2026-12-04 10:00:00"), 77, 1.0, 77),  # the second it began
            Decode(seconds("2026-12-04 10:00:01"), 10, 1.0, 2),
            Decode(seconds("2026-12-04 10:00:01"), 20, 1.0, 4),
            Decode(seconds("2026-12-04 10:00:02"), 30, 1.0, 0),
            Decode(seconds("2026-12-04 10:00:03"), 88, 1.0, 88),  # the second it ended
            Decode(seconds("2026-12-04 10:00:09"), 99, 1.0, 99),  # after the level
        ],
    }
    # It ran from 10:00:03.x - 3.0 to 10:00:03.x: seconds 1 and 2 are wholly inside it.
    rec = {"target": "routed", "timestamp": "2026-12-04T10:00:03+00:00", "duration": 3.0}
    # Second 1: eagle 4 + baseline (10+20)/2 = 19 running, 3 queued; second 2: the baseline's 30
    # alone (EAGLE wrote no line then: it held nothing). The mean of the two seconds.
    assert held.held(rec, found) == {"running": 24.5, "queued": 1.5, "lines": 4}
    assert held.held({**rec, "target": "eagle"}, found) == {"running": 4, "queued": 0, "lines": 1}
    assert held.held({**rec, "timestamp": "2026-12-04T11:00:00+00:00"}, found) is None
    assert held.held({"target": "routed", "duration": 3.0}, found) is None
    assert held.held({**rec, "duration": 1.5}, found) is None  # no whole second inside
    kept = [{**rec, "server_held": {"running": 1, "queued": 0, "lines": 1}}]
    held.annotate(kept, found)
    assert kept[0]["server_held"]["running"] == 1
    held.annotate(kept, found, again=True)
    assert kept[0]["server_held"]["running"] == 24.5
    assert held.held({**rec, "target": "someone"}, found) is None


def test_the_live_tail_reads_whole_lines_once(tmp_path: Path) -> None:
    log = tmp_path / "baseline.log"
    log.write_text(line("10:00:01", 8, 0) + "\nnot a decode line\n" + line("10:00:02", 9, 1)[:30])
    tail = held.LogTail(tmp_path)
    assert [d.running for d in tail.read()["baseline"]] == [8]
    with log.open("a") as f:
        f.write(line("10:00:02", 9, 1)[30:] + "\n" + line("10:00:03", 7, 0) + "\n")
    assert [d.running for d in tail.read()["baseline"]] == [8, 9, 7]
    assert [d.running for d in tail.read()["baseline"]] == [8, 9, 7]
    assert tail.read()["eagle"] == []


def test_the_report_shows_the_table_only_where_the_records_say(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"target": t, "max_concurrency": 8, "repeat": 1, "output_throughput": x,
         "median_tpot_ms": 1.0, "median_ttft_ms": 1.0}
        for t, x in (("routed", 99.0), ("eagle", 100.0), ("baseline", 50.0))
    ]  # fmt: skip
    assert "held" not in steadyreport.markdown(rows)
    rows[2]["server_held"] = {"running": 6.0, "queued": 0.0, "lines": 3}
    text = steadyreport.markdown(rows)
    assert "Requests the servers held" in text and "| 8 | - | - | 6+0 |" in text


def test_report_logs_flag(tmp_path: Path) -> None:
    run = H200 / "pair-a-capped"
    cmd = [sys.executable, "-m", "dynspec.bench", "gpu", "report", str(run / "sweep-pair-a.jsonl")]
    done = subprocess.run(
        [*cmd, "--logs", str(run / "logs.tar.xz")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| 256 | 88+1, 102+0, 128+11 | 128+118, 128+122, 128+117 |" in done.stdout
    missing = subprocess.run(
        [*cmd, "--logs", str(tmp_path / "none.tar.xz")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    err = missing.stderr.strip().splitlines()
    assert missing.returncode == 2 and len(err) == 1 and "no such file" in err[0], missing.stderr
