"""The ``eight`` plan: eight GPUs, a random Llama-3.1-70B-shaped model at tp 4, one bounded
command per ``--layout`` (``build``, then ``split``, ``paired``, ``paired-mps``, ``2x-eagle``,
``2x-baseline``, ``2x-adaptive``), each stopping everything it started; ``--dry-run`` prints
every command without a GPU. What each layout starts: bench/results/h200/README.md, "Eight GPUs".
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dynspec.bench.gpu import models70b
from dynspec.bench.gpu.steady import learned
from dynspec.bench.gpu.steadyreport import markdown, read
from dynspec.bench.gpu.toolkit import (
    EAGLE_STEPS_ALL,
    FIXED_ENV,
    PAIR_LEVELS,
    SGLANG_ARGS,
    Run,
    RunFailed,
    fetch,
    sweep,
    wait_done,
    wait_healthy,
    wait_launcher,
)

LAYOUTS = ("build", "split", "paired", "paired-mps", "2x-eagle", "2x-baseline", "2x-adaptive")
SERVED = "llama70b-random"
TP = 4
GPU_SETS = ("0,1,2,3", "4,5,6,7")
TITLE = "Eight H200s, SGLang 0.5.17, random 70B (tp 4)"
# What must be in every server's environment (FIXED_ENV holds them; checked by the tests).
NO_MULTICAST = {k: FIXED_ENV[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                          "NVSHMEM_DISABLE_NVLS")}  # fmt: skip
SERVER_ARGS = "--max-running-requests 128 --cuda-graph-max-bs-decode 128"
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


@dataclass
class Step:
    """One process of a layout: its argv, its extra environment, what says it is up."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health: str | None = None  # URL answering 200 once up; None: the launcher's ready banner
    wait: bool = False  # run to the end (model building) instead of serving
    batch: bool = False  # with wait: started beside the next batch steps, waited for together

    def line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def build_steps(python: str, models: Path, drafts: Sequence[str]) -> list[Step]:
    code = (
        "import sys; from pathlib import Path; from dynspec.bench.gpu import models70b as m; "
        "m.build_shards(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
    )
    steps = [
        Step(
            "files",
            [python, "-c", "import sys; from pathlib import Path; "
             "from dynspec.bench.gpu import models70b as m; "
             "m.write_target_files(Path(sys.argv[1]))", str(models)],
            wait=True,
        )
    ]  # fmt: skip
    steps += [
        Step(f"shards{w}", [python, "-c", code, str(models), str(w), "8"], wait=True, batch=True)
        for w in range(8)
    ]
    draft_code = (
        "import sys; from pathlib import Path; from dynspec.bench.gpu import models70b as m; "
        "[m.build_draft(Path(sys.argv[1]), n) for n in sys.argv[2:]]; "
        "m.finish(Path(sys.argv[1]), sys.argv[2:])"
    )
    steps.append(Step("drafts", [python, "-c", draft_code, str(models), *drafts], wait=True))
    return steps


def server_argv(
    python: str, models: Path, port: int, *, kind: str, draft: str, work: Path
) -> list[str]:
    argv = [
        python, "-m", "sglang.launch_server", "--model-path", str(models / models70b.TARGET),
        "--served-model-name", SERVED, "--tp-size", str(TP), "--host", "127.0.0.1",
        "--port", str(port), "--enable-metrics",
    ]  # fmt: skip
    if kind != "baseline":
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"]
        argv += [str(models / f"eagle3-{draft}"), *EAGLE_STEPS_ALL]
    if kind == "adaptive":
        argv += ["--speculative-adaptive", "--speculative-adaptive-config"]
        argv.append(ADAPTIVE_FILE.format(work=work))
    return [*argv, *shlex.split(SERVER_ARGS), *shlex.split(SGLANG_ARGS)]


def layout_steps(
    layout: str,
    *,
    python: str,
    models: Path,
    work: Path,
    ports: tuple[int, int, int],
    draft: str,
    startup_timeout: float,
) -> list[Step]:
    """The processes of one layout, in start order; the last one is what the sweep goes to."""
    router_port, eagle_port, baseline_port = ports
    if layout == "build":
        return build_steps(python, models, models70b.DRAFTS)
    if layout in ("split", "paired", "paired-mps"):
        argv = [
            python, "-m", "dynspec.launcher", "--gpus", "0-7",
            "--layout", "split" if layout == "split" else "paired",
            "--model-path", str(models / models70b.TARGET),
            "--draft-model-path", str(models / f"eagle3-{draft}"),
            "--served-model-name", SERVED, *EAGLE_STEPS_ALL, "--threshold", "auto",
            "--host", "127.0.0.1", "--port", str(router_port),
            "--eagle-port", str(eagle_port), "--baseline-port", str(baseline_port),
            "--sglang-args", SGLANG_ARGS, "--baseline-args", "--cuda-graph-max-bs-decode 256",
            "--log-dir", str(work / "logs"), "--restart", "never", "--kill-grace", "20",
            "--startup-timeout", f"{startup_timeout:.0f}", "--progress-every", "15",
        ]  # fmt: skip
        if layout != "split":
            argv[argv.index("--model-path") : argv.index("--model-path")] = ["--tp", str(TP)]
        if layout == "paired-mps":
            argv.append("--mps")
        return [Step("launcher", argv, dict(NO_MULTICAST))]
    kind = layout.removeprefix("2x-")
    if kind not in ("eagle", "baseline", "adaptive"):
        raise RunFailed(f"--layout: unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    steps = []
    urls = []
    for i, gpus in enumerate(GPU_SETS):
        port = eagle_port + 10 * i
        env = {"CUDA_VISIBLE_DEVICES": gpus, **NO_MULTICAST}
        url = f"http://127.0.0.1:{port}"
        argv = server_argv(python, models, port, kind=kind, draft=draft, work=work)
        steps.append(Step(f"{kind}{i}", argv, env, health=f"{url}/health_generate"))
        urls.append(url)
    pool = "--baseline-url" if kind == "baseline" else "--eagle-url"
    router = [python, "-m", "dynspec.router", pool, ",".join(urls), "--host", "127.0.0.1"]
    router += ["--port", str(router_port)]
    steps.append(Step("router", router, health=f"http://127.0.0.1:{router_port}/health"))
    return steps


def dry_run(args_layout: str, **kw: object) -> str:
    layouts = LAYOUTS if args_layout == "all" else (args_layout,)
    lines = []
    for layout in layouts:
        lines.append(f"# {layout}")
        lines += [s.line() for s in layout_steps(layout, **kw)]  # type: ignore[arg-type]
        if layout != "build":
            lines.append(
                f"# then: dynspec-bench sweep --url {layout}=ROUTER --concurrency {PAIR_LEVELS} "
                "--input-len 256 --output-len 128; GET ROUTER/status; stop"
            )
    return "\n".join(lines) + "\n"


def run_steps(
    run: Run, steps: Sequence[Step], start_timeout: float
) -> list[subprocess.Popen[bytes]]:
    """Start each step; a waited one runs to its end (a batch of them side by side), then the
    serving ones are waited for until they are up."""
    serving = []
    batch: list[tuple[Step, subprocess.Popen[bytes], Path]] = []
    for step in steps:
        if batch and not step.batch:
            for done_step, done_proc, done_log in batch:
                wait_done(run, done_proc, done_step.name, done_log, spare=30)
            batch = []
        log = run.logs / f"{step.name}.log"
        env_before = dict(run.env)
        run.env.update(step.env)
        try:
            proc = run.spawn(step.name, step.argv, log)
        finally:
            run.env.clear()
            run.env.update(env_before)
        run.meta.setdefault("commands", []).append(step.line())
        if step.wait and step.batch:
            batch.append((step, proc, log))
        elif step.wait:
            wait_done(run, proc, step.name, log, spare=30)
        else:
            serving.append((step, proc, log))
    for done_step, done_proc, done_log in batch:
        wait_done(run, done_proc, done_step.name, done_log, spare=30)
    for step, proc, log in serving:
        if step.health is None:
            took = wait_launcher(run, proc, log)
        else:
            took = wait_healthy(run, step.health, proc, step.name, log=log, timeout=start_timeout)
        run.meta.setdefault("ready_s", {})[step.name] = round(took, 1)
        run.say(f"{step.name} ready after {took:.0f}s")
    return [p for _, p, _ in serving]


def plan_eight(
    run: Run, models: Path, layout: str, *, levels: Sequence[int], draft: str, start_timeout: float
) -> int:
    run.work.mkdir(parents=True, exist_ok=True)
    Path(ADAPTIVE_FILE.format(work=run.work)).write_text(json.dumps(ADAPTIVE_CONFIG))
    kw = dict(python=run.python, models=models, work=run.work, ports=run.ports, draft=draft)
    if not (models / models70b.TARGET / ".done").exists() or layout == "build":
        run.say("building the 70B-shaped model (missing shards only)")
        run_steps(run, layout_steps("build", startup_timeout=start_timeout, **kw), start_timeout)  # type: ignore[arg-type]
        if layout == "build":
            return 0
    steps = layout_steps(layout, startup_timeout=max(60.0, run.left() - 150), **kw)  # type: ignore[arg-type]
    # A 70B server at tp 4 loads 35 GB per GPU and captures its graphs: give it the time left.
    procs = run_steps(run, steps, max(start_timeout, run.left() - 150))
    router = f"http://127.0.0.1:{run.ports[0]}"
    from dynspec.bench.load import Target

    jsonl = run.results / "sweep-eight.jsonl"
    sweep(run, [Target(layout, router)], jsonl, levels=levels)
    with contextlib.suppress(OSError, ValueError):
        run.meta.setdefault("learned", {})[layout] = learned(json.loads(fetch(f"{router}/status")))
    for proc in reversed(procs):
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            run.stop(proc)
    return 0


EIGHT_GROUPS = {"others": ("split", "2x-eagle", "2x-baseline", "2x-adaptive")}


def eight_markdown(paths: Sequence[Path]) -> str:
    return markdown(read(paths), routed=("paired", "paired-mps"), alone=EIGHT_GROUPS["others"])
