"""The ``levels`` plan: EAGLE-3 servers alone, one after the other, each started, swept, and left
idle while the next starts (SGLang's ``--speculative-adaptive`` with every draft accepted, then the
drafts built for accept length about 3 and 2, then none accepted), as long as the budget lasts."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynspec.bench.gpu.toolkit import (
    EAGLE_STEPS_ALL,
    SERVED,
    SGLANG_ARGS,
    Run,
    RunFailed,
    accept_probe,
    check_model_loads,
    fetch,
    gauge,
    sweep,
    wait_healthy,
    warm,
)
from dynspec.bench.procs import free_port

# SGLang 0.5.17's default adaptive tiers (by running batch size: candidate draft steps; no drafting
# from 64 up), with the steps capped at the 3 the other EAGLE servers run: with the default's 7
# and 4 draft tokens, 0.5.17 hit an illegal memory access capturing the 7-step draft graphs.
ADAPTIVE_CONFIG = {
    "1": {"candidate_steps": [1, 3], "up_hysteresis": 0.0, "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
}
ADAPTIVE_FILE = "{work}/adaptive.json"
# (name, draft, extra flags): the EAGLE servers of the levels plan, most wanted first.
LEVEL_SERVERS = (
    (
        "eagle_adaptive",
        "hi",
        ("--speculative-adaptive", "--speculative-adaptive-config", ADAPTIVE_FILE),
    ),
    ("eagle_p81", "p81", ()),
    ("eagle_p54", "p54", ()),
    ("eagle_lo", "lo", ()),
)


def level_server_argv(
    run: Run, models: Path, draft: str, extra: Sequence[str], port: int
) -> list[str]:
    # About 30 GB each (weights, a 64k-token KV cache, graphs): four fit one after the other.
    argv = [
        run.python, "-m", "sglang.launch_server", "--model-path", str(models / "llama8b"),
        "--served-model-name", SERVED, "--tp-size", "1", "--host", "127.0.0.1",
        "--port", str(port), "--enable-metrics", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(models / f"eagle3-{draft}"), *EAGLE_STEPS_ALL,
        "--max-running-requests", "128", "--cuda-graph-max-bs-decode", "128",
        "--mem-fraction-static", "0.6", "--max-total-tokens", "64000",
        *shlex.split(SGLANG_ARGS), *(x.format(work=run.work) for x in extra),
    ]  # fmt: skip
    return argv


def level_servers(names: str | None) -> list[tuple[str, str, tuple[str, ...]]]:
    if not names:
        return list(LEVEL_SERVERS)
    wanted = names.split(",")
    known = {name for name, _, _ in LEVEL_SERVERS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise RunFailed(
            f"--servers: unknown server {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )
    return [s for s in LEVEL_SERVERS if s[0] in wanted]


def plan_levels(
    run: Run, models: Path, levels: Sequence[int], start_timeout: float, servers: str | None = None
) -> int:
    from dynspec.bench.load import Target

    jsonl = run.results / "sweep-levels.jsonl"
    run.meta["level_servers"] = {}
    run.work.mkdir(parents=True, exist_ok=True)
    Path(ADAPTIVE_FILE.format(work=run.work)).write_text(json.dumps(ADAPTIVE_CONFIG))
    run.meta["adaptive_config"] = ADAPTIVE_CONFIG
    failed: list[str] = []
    for name, draft, extra in level_servers(servers):
        # A start (about 2 minutes) and a sweep (about 1) must fit, with a minute to stop.
        if run.left() < 200:
            run.say(f"no time left for {name}")
            run.meta.setdefault("not_run", []).append(name)
            continue
        check_model_loads(models / f"eagle3-{draft}")
        # A port free now: one at a fixed offset from --ports was taken once by another process
        # (the server then failed to listen and the plan stopped).
        port = free_port()
        argv = level_server_argv(run, models, draft, extra, port)
        log = run.logs / f"{name}.log"
        proc = run.spawn(name, argv, log)
        url = f"http://127.0.0.1:{port}"
        try:
            took = wait_healthy(
                run,
                f"{url}/health_generate",
                proc,
                f"{name} server",
                log=log,
                timeout=start_timeout,
            )
        except RunFailed as exc:
            # The other levels still run; the run ends with this line (exit 1).
            run.say(str(exc))
            failed.append(str(exc))
            run.stop(proc)
            continue
        run.say(f"{name} healthy after {took:.0f}s")
        info: dict[str, Any] = {"draft": draft, "argv": argv[1:], "start_s": round(took, 1)}
        info["probe"] = accept_probe(run, url)
        run.say(f"{name} accept: {info['probe']}")
        warm(run, {name: url}, levels)
        sweep(run, [Target(name, url)], jsonl, levels=levels)
        info["accept_after_sweep"] = gauge(fetch(f"{url}/metrics"), "sglang:spec_accept_length")
        run.meta["level_servers"][name] = info
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise RunFailed(failed[0] + more)
    return 0
