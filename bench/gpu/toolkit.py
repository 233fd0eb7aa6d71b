"""The GPU plans' toolkit: what one bounded attempt on a GPU machine works with (``Run``), its
set-up (the SGLang bundle, the test models) and the steady-state sweep every plan measures with
(``Steady``). Nothing here imports a plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynspec.bench.metrics import samples
from dynspec.bench.procs import Children, captured, last_line, stop_group
from dynspec.launcher.process import tail

PROG = "dynspec-bench gpu run"
# Never NVLink multicast (it can take a shared host's GPUs down); no hub; no DeepGEMM JIT.
FIXED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    "PYTHONUNBUFFERED": "1",
}
# For both servers: the bundle has no FA3 and no grammar backend; piecewise prefill graphs cost
# about a minute of capture per server and the sweep's prefill is small.
SGLANG_ARGS = (
    "--dtype bfloat16 --attention-backend triton --sampling-backend pytorch --grammar-backend none "
    "--cuda-graph-backend-prefill disabled --context-length 4096"
)
PAIR_LEVELS = "1,2,4,8,16,32,64,128,256"

RESERVE_S = 45.0  # kept for stopping the launcher and writing the results
# A command that keeps its session needs only to write its results at the end; the one that
# stops it needs about trafficplan.STOP_S more, which an early end of the sweep leaves.
KEEP_RESERVE_S = 20.0


class RunFailed(Exception):
    """Stops the run: one line, exit 1."""


@dataclass(frozen=True)
class Steady:
    """What every GPU plan's levels are (docs/benchmarks.md, "What `Steady` does")."""

    repeats: int = 3
    min_seconds: float = 15.0
    per_c: int = 10
    input_len: int = 256
    output_len: int = 128
    pause: float = 0.5
    prompt_pool: int = 0  # 0: a new random prompt for every request (sweep.SweepConfig)


@dataclass
class Run:
    out: Path
    work: Path
    deadline: float
    env: dict[str, str]
    python: str = sys.executable
    children: Children = field(default_factory=Children)
    meta: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    tag: str = ""  # in every child's environment: how leftovers are found at the end
    ports: tuple[int, int, int] = (8000, 30001, 30002)  # router, EAGLE, baseline
    steady: Steady = field(default_factory=Steady)
    keep: bool = False  # a kept session: leave its processes running at the end
    reserve: float = RESERVE_S  # seconds kept at the end of the budget for the stop and results

    @property
    def logs(self) -> Path:
        # Not under --out: only a few files come back from the GPU machine (logs.tar.gz does).
        return self.work / "logs"

    @property
    def results(self) -> Path:
        """Where a plan writes its results: kept on the machine across the commands of one
        session, copied to ``--out`` at the end of each."""
        return self.work / "results"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sweep_deadline(self, seconds: float | None) -> float:
        """When a sweep (the open-loop runs) must end: the budget less the reserve, and at most
        ``seconds`` from now."""
        deadline = self.deadline - self.reserve
        return deadline if seconds is None else min(deadline, time.monotonic() + seconds)

    def say(self, text: str) -> None:
        print(f"[gpu-run {time.monotonic() - self.t0:5.0f}s] {text}", flush=True)

    def spawn(self, name: str, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        """A child in its own process group, in the run's environment, logging to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            f.write(f"==> {shlex.join(argv)}\n".encode())
        return self.children.start(name, argv, env=self.env, log=log, append=True)

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
        """Stop the child's process group, and SIGKILL the group even when its leader is gone
        (an SGLang server's scheduler and detokenizer can outlive it)."""
        stop_group(proc, grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.children.procs:
            self.children.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.children.procs)):
            self.stop(proc, grace=20.0)


def gauge(text: str, name: str) -> float | None:
    """The mean of ``name``'s samples (over its label sets), None where the page has none."""
    found = [v for _, v in samples(text, name)]
    return sum(found) / len(found) if found else None


# -- set-up --------------------------------------------------------------------------------------


def site_paths(run: Run, bundle: Path | None) -> list[str]:
    """PYTHONPATH entries for SGLang: the bundle's site (+ stubs last), or none if installed."""
    from dynspec.bench.gpu.bundle import STUBS, unpack_bundle

    if bundle is None:
        if importlib.util.find_spec("sglang") is None:
            raise RunFailed("no SGLang installed and no --bundle given (dynspec-bench gpu bundle)")
        return []
    try:
        site = unpack_bundle(bundle, run.work)
    except RuntimeError as exc:
        raise RunFailed(str(exc)) from None
    return [str(site), str(site / STUBS)]


def probe_python(run: Run) -> dict[str, str]:
    """Versions as the servers will see them; a broken bundle fails here, with its message."""
    code = (
        "import json, torch, sglang, transformers; "
        "print(json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__, "
        "'transformers': transformers.__version__, "
        "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}))"
    )
    done = captured([run.python, "-c", code], env=run.env, timeout=300)
    if done.returncode != 0:
        tail = last_line(done.stderr) or f"exit {done.returncode}"
        raise RunFailed(f"SGLang does not import: {tail}")
    versions: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return versions


def build_models(run: Run, models: Path, drafts: Sequence[str]) -> None:
    log = run.logs / "models.log"
    code = (
        "import sys; from pathlib import Path; from dynspec.bench.gpu.models import build_models; "
        "build_models(Path(sys.argv[1]), sys.argv[2:])"
    )
    proc = run.spawn("models", [run.python, "-c", code, str(models), *drafts], log)
    wait_done(run, proc, "building the test models", log)


def wait_done(run: Run, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    """Until ``proc`` (a step that ends by itself) exits, at most until the budget ends; stopped
    either way; a timeout or a non-zero exit is one line naming its log."""
    try:
        code = proc.wait(max(1.0, run.left()))
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{what} ran out of time; see {log}") from None
    finally:
        run.stop(proc)
    if code != 0:
        raise RunFailed(f"{what} failed ({''.join(tail(log, 1))}); see {log}")


def check_models(models: Path, draft: str) -> None:
    """The target and the EAGLE draft a plan's launch loads, each with a readable config.json."""
    for path in (models / "llama8b", models / f"eagle3-{draft}"):
        try:
            json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            raise RunFailed(f"model {path}: no readable config.json") from None


def pair_urls(ports: Sequence[int]) -> dict[str, str]:
    """The base URLs of the router and each server's own port (``--ports``: router, EAGLE,
    baseline)."""
    labels = ("routed", "eagle", "baseline")
    return {label: f"http://127.0.0.1:{p}" for label, p in zip(labels, ports, strict=True)}


# -- sweeps --------------------------------------------------------------------------------------


def sweep_config(run: Run, levels: Sequence[int], deadline: float | None) -> Any:
    from dynspec.bench.sweep import SweepConfig

    st = run.steady
    return SweepConfig(
        concurrencies=sorted(set(levels)), requests_per_c=st.per_c, min_requests=8,
        input_len=st.input_len, output_len=st.output_len, request_timeout=120.0,
        pause=st.pause, repeats=st.repeats, min_seconds=st.min_seconds, resume=True,
        deadline=deadline, prompt_pool=st.prompt_pool,
    )  # fmt: skip


def warm(run: Run, urls: Mapping[str, str], levels: Sequence[int]) -> None:
    """Every server at every level of the plan once, nothing recorded (SGLang's triton kernels
    compile on their first use at a batch size: that must not land in a measured level)."""
    from dynspec.bench import load
    from dynspec.bench.sweep import sweep_prompts
    from dynspec.bench.sweep import warm as warm_levels

    cfg = sweep_config(run, levels, None)
    targets = [load.Target(label, url) for label, url in urls.items()]
    began = time.monotonic()

    async def go() -> None:
        async with load.make_session(cfg.request_timeout) as session:
            models = {t: await load.model_name(session, t) for t in targets}
            await warm_levels(session, targets, cfg, models=models, prompts=sweep_prompts(cfg),
                              headers={}, say=console)  # fmt: skip

    asyncio.run(go())
    run.meta.setdefault("warm_s", []).append(round(time.monotonic() - began, 1))
    run.say(f"warm pass over {len(targets)} servers x {len(cfg.concurrencies)} levels done")


def sweep(
    run: Run,
    targets: Sequence[Any],
    out: Path,
    *,
    levels: Sequence[int],
    limit: float | None = None,
    on_record: Any = None,
    on_start: Any = None,
    title: str = "",
) -> bool:
    """The steady-state sweep (``Steady``) of ``targets`` (``load.Target``), resuming ``out``;
    no level is started that would end past ``limit`` seconds from now or past the budget less
    ``RESERVE_S``. True when every point is in ``out``."""
    from dynspec.bench.sweep import pending
    from dynspec.bench.sweep import sweep as run_sweep

    cfg = sweep_config(run, levels, run.sweep_deadline(limit))
    run.out.mkdir(parents=True, exist_ok=True)

    def start(label: str) -> None:
        # The points so far, in --out too: a command killed at the device's limit still brings
        # back what it measured.
        if out.exists():
            with contextlib.suppress(OSError):
                shutil.copy2(out, run.out / out.name)
        if on_start is not None:
            on_start(label)

    try:
        asyncio.run(run_sweep(targets, cfg, out, console, on_record=on_record, on_start=start))
    except RuntimeError as exc:  # every request of a level failed
        raise RunFailed(str(exc)) from None
    from dynspec.bench.gpu.steadyreport import read, write_rows

    if out.exists():
        write_rows(out, read([out]), title)
    left = pending(targets, cfg, out)
    if left:
        run.say(f"{len(left)} points left (the budget): the next command with --keep resumes")
    return not left


def console(line: str) -> None:
    """A level's line on the command's console (``console-N.txt``)."""
    print(line, flush=True)
