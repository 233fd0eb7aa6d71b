"""The ``main`` plan: ``dynspec-launch --gpus 0`` (the EAGLE-3 server with every draft
accepted and the baseline on the one GPU, the router in front), the router checks against the
real servers, then ``dynspec-bench sweep`` of each server alone and of the routed system."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

from dynspec.bench.gpu.toolkit import (
    EAGLE_STEPS_ALL,
    SERVED,
    SGLANG_ARGS,
    Run,
    accept_probe,
    check_model_loads,
    fetch,
    gauge,
    pending_points,
    start_launcher,
    stop_launcher,
    sweep,
    warm,
)
from dynspec.bench.load import Target


def plan_main(
    run: Run, models: Path, deploy: Path, *, levels: Sequence[int], threshold: int, hysteresis: int
) -> int:
    from dynspec.bench.gpu.checks import RouterChecks

    check_model_loads(models / "llama8b")
    check_model_loads(models / "eagle3-hi")
    launch = [
        run.python, "-m", "dynspec.launcher", "--gpus", "0",
        "--model-path", str(models / "llama8b"), "--draft-model-path", str(models / "eagle3-hi"),
        "--served-model-name", SERVED, *EAGLE_STEPS_ALL,
        "--threshold", str(threshold), "--hysteresis", str(hysteresis),
        "--host", "127.0.0.1", "--port", str(run.ports[0]),
        "--eagle-port", str(run.ports[1]), "--baseline-port", str(run.ports[2]),
        "--sglang-args", SGLANG_ARGS,
        # Swept alone up to C=128 too: the EAGLE server must run that many (the launcher's own
        # cap, threshold + margin, is for serving behind the router).
        "--eagle-args", "--max-running-requests 128",
        # The sweep stops at C=128: larger decode graphs would only lengthen the start.
        "--baseline-args", "--cuda-graph-max-bs-decode 128",
        "--log-dir", str(run.logs), "--restart", "never", "--kill-grace", "15",
        "--startup-timeout", f"{max(60.0, run.left() - 240):.0f}", "--progress-every", "15",
    ]  # fmt: skip
    proc = start_launcher(run, launch)
    router, eagle, baseline = (f"http://127.0.0.1:{port}" for port in run.ports)
    files = [deploy / "grafana" / "dynspec.json", deploy / "prometheus" / "alerts.yml"]
    checks = RouterChecks(
        router, eagle=eagle, baseline=baseline, threshold=threshold, deploy_files=files
    )
    try:
        results = checks.run()
    finally:
        checks.close()
    for r in results:
        run.say(r.line())
    run.meta["checks"] = [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in results]
    run.meta["check_facts"] = checks.facts
    run.meta["accept_main"] = accept_probe(run, eagle)
    run.say(f"EAGLE server accept length: {run.meta['accept_main']}")
    jsonl = run.results / "sweep-main.jsonl"
    # One steady sweep, the three targets taking turns at each level.
    targets = [Target("eagle", eagle), Target("baseline", baseline), Target("routed", router)]
    warm(run, {"eagle": eagle, "baseline": baseline}, levels)
    if not sweep(run, targets, jsonl, levels=levels):
        run.meta["not_swept"] = [list(p) for p in pending_points(run, targets, jsonl, levels)]
    run.meta["accept_after_sweep"] = gauge(fetch(f"{eagle}/metrics"), "sglang:spec_accept_length")
    with contextlib.suppress(OSError, ValueError):
        run.meta["router_status"] = json.loads(fetch(f"{router}/status"))
    stop_launcher(run, proc)
    return 0 if all(r.ok for r in results) else 1
