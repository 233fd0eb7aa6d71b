"""One device command's life (``attempt``): set-up, the plan, the end, the results:
docs/benchmarks.md, "What `Steady` does".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from dynspec.bench.gpu import toolkit
from dynspec.bench.gpu.fingerprint import code_sha256
from dynspec.bench.gpu.launch import kept_session, session_file
from dynspec.bench.gpu.leftovers import TAG_VAR, kill_tagged


@dataclass(frozen=True)
class Attempt:
    """One device command: where it writes, how long it may take, what it brings."""

    plan: str
    out: Path
    work: Path
    budget: float
    ports: tuple[int, int, int]
    bundle: Path | None
    models: Path | None
    drafts: tuple[str, ...]
    commit: str
    steady: toolkit.Steady
    keep: bool = False  # keep the session (launcher) running when the plan is not finished


Body = Callable[[toolkit.Run, Path, "dict[str, Any] | None"], int]


def attempt(a: Attempt, body: Body) -> NoReturn:
    """Run ``body(run, models, session)`` as one bounded attempt and exit with its code: set-up
    (skipped in a kept session), the plan, then whatever happened every child stopped (unless
    kept) and whatever carries the run's tag killed, ``meta.json`` and the logs written and the
    results copied to ``--out``. A ``RunFailed`` is one line and exit 1."""
    env = {**os.environ, **toolkit.FIXED_ENV}
    run = toolkit.Run(out=a.out, work=a.work, deadline=time.monotonic() + a.budget, env=env)
    run.ports, run.steady = a.ports, a.steady
    run.reserve = toolkit.KEEP_RESERVE_S if a.keep else toolkit.RESERVE_S
    session = kept_session(run, a.plan)
    if session is None:
        shutil.rmtree(run.logs, ignore_errors=True)
        shutil.rmtree(run.results, ignore_errors=True)
        run.tag = f"{os.getpid()}-{time.time_ns()}"
    else:
        run.tag = str(session["tag"])
        run.ports = tuple(session["ports"])
        with contextlib.suppress(OSError, ValueError):
            run.meta = json.loads((run.results / "meta.json").read_text())
    env[TAG_VAR] = run.tag
    run.results.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.meta.update(tag=run.tag, plan=a.plan, commit=a.commit, steady=vars(a.steady))
    run.meta.setdefault("started", started)
    # Each command's code, checked against --commit where git is (fingerprint.py).
    command: dict[str, Any] = {"started": started, "resumed": session is not None,
                               "commit": a.commit, "code_sha256": code_sha256()}  # fmt: skip
    run.meta.setdefault("device_commands", []).append(command)
    code, failure = 1, None
    try:
        extra = toolkit.site_paths(run, a.bundle)
        here = env.get("PYTHONPATH", "")
        run.env["PYTHONPATH"] = os.pathsep.join([*([here] if here else []), *extra])
        models = a.models or a.work / "models"
        if session is None:
            run.meta["versions"] = toolkit.probe_python(run)
            run.meta["sglang_args"] = toolkit.SGLANG_ARGS
            run.say(f"versions: {run.meta['versions']}")
            if a.models is None and a.drafts:
                toolkit.build_models(run, models, a.drafts)
                run.say("models built")
        else:
            run.say(f"resuming the session kept by the last command (tag {run.tag})")
        code = body(run, models, session)
    except toolkit.RunFailed as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as exc:  # a fault of the plan's code: one line here, the traceback in logs
        run.logs.mkdir(parents=True, exist_ok=True)
        (run.logs / "traceback.txt").write_text(traceback.format_exc())
        failure = f"{type(exc).__name__}: {exc} (traceback in logs/traceback.txt)"
    finally:
        run.stop_all()
        if not run.keep:
            run.meta["leftovers_killed"] = kill_tagged(run.tag)
            session_file(run).unlink(missing_ok=True)
        command["elapsed_s"] = round(time.monotonic() - run.t0, 1)
        if failure:
            run.meta["failure"] = failure
        (run.results / "meta.json").write_text(json.dumps(run.meta, indent=1, default=str))
        with contextlib.suppress(OSError, tarfile.TarError):
            if run.logs.is_dir():
                with tarfile.open(run.results / "logs.tar.gz", "w:gz") as t:
                    t.add(run.logs, arcname="logs")
        a.out.mkdir(parents=True, exist_ok=True)
        for f in run.results.iterdir():
            if f.is_file():
                shutil.copy2(f, a.out / f.name)
    if failure:
        fail(failure)
    sys.exit(code)


def fail(text: str) -> NoReturn:
    print(f"{toolkit.PROG}: error: {text}", file=sys.stderr)
    sys.exit(1)
