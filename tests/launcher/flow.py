"""The way a launch takes through the launcher's modules, measured with ``sys.setprofile``.

``dynspec-launch``'s ``main`` runs for real (flags, facts, plan, pre-flight checks, the
supervisor's constructor) with the machine faked below it (``nvidia-smi``'s answers, the MPS
binary on PATH) and the supervisor's ``run`` replaced, so nothing starts. Every Python function
entered in ``dynspec.launcher.*`` (and the profile reader, ``dynspec.common.profile``) is noted.

Two counts over that trace:

- ``way``: a *stop* is entering a module that has no frame on the stack (a module is *left* when
  its last frame returns, so a stage that calls its helpers one after the other is not left
  between them), stops at the same module in a row counted once; a *return* is a stop at a
  module stopped at before. Methods and properties of
  the records (``GpuSet.port``, ``LaunchConfig.api_key``, ...) are reading a record, not a
  stop, though what they call runs inside them.
  A dataclass's generated ``__init__`` is not a stop either: it holds none of the module's code.
- ``flat``: every function entered, methods included, the module sequence with repeats in a row
  folded: its length, and how many of its entries name a module seen earlier in it.

``python tests/launcher/flow.py`` prints both for the representative command lines.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

TRACKED = ("dynspec.launcher.", "dynspec.common.profile")
MODEL = ["--model-path", "org/model", "--draft-model-path", "org/draft"]
# --server-command: the pre-flight check of an installed SGLang is skipped (none is here).
FAKE = ["--server-command", "fake-sglang"]

# The representative command lines (ports are added per run: free ones on this machine).
LINES: dict[str, list[str]] = {
    "simulate": ["--simulate"],
    "split 0-7": ["--gpus", "0-7", *MODEL, *FAKE],
    "paired tp4": ["--gpus", "0-7", "--layout", "paired", "--tp", "4", *MODEL, *FAKE],
    "one gpu, auto": ["--gpus", "0", "--threshold", "auto", *MODEL, *FAKE],
    "paired mps": ["--gpus", "0-3", "--layout", "paired", "--mps", *MODEL, *FAKE],
}

GPUS = 8
GPU_FIELDS = {
    "index": str,
    "uuid": lambda i: f"GPU-{i:04d}",
    "name": lambda i: "NVIDIA H200",
    "memory.total": lambda i: "143771",
}


def fake_nvidia_smi(argv: Sequence[str]) -> str:
    """nvidia-smi's CSV answer to any ``--query-gpu=`` for eight H200s."""
    query = next(a for a in argv if a.startswith("--query-gpu="))
    fields = query.split("=", 1)[1].split(",")
    return "".join(", ".join(GPU_FIELDS[f](i) for f in fields) + "\n" for i in range(GPUS))


def _fake_which(name: str, *args: Any, **kwargs: Any) -> str | None:
    if name in ("nvidia-smi", "nvidia-cuda-mps-control"):
        return f"/usr/bin/{name}"
    return None


def _free_run(count: int) -> int:
    """A port p with p .. p + count - 1 free here."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for p in range(base, base + count):
                    t = stack.enter_context(socket.socket())
                    t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def with_ports(argv: list[str]) -> list[str]:
    base = _free_run(2 * GPUS + 1)
    ports = ["--port", str(base + 2 * GPUS), "--eagle-port", str(base)]
    return [*argv, *ports, "--baseline-port", str(base + 1)]


@dataclass(frozen=True)
class Entry:
    module: str  # without "dynspec.launcher." ("common.profile" for the profile reader)
    function: str  # the code's qualified name
    stop: bool  # entered with no frame of its module on the stack, not a record's method


@dataclass(frozen=True)
class Flow:
    entries: tuple[Entry, ...]
    code: int
    out: str
    err: str

    @property
    def way(self) -> list[str]:
        """The modules stopped at, in order; one helper called again and again with no other
        stop between (a stage's loop over its servers) is one stop."""
        way: list[str] = []
        for e in self.entries:
            if e.stop and (not way or way[-1] != e.module):
                way.append(e.module)
        return way

    @property
    def stops(self) -> int:
        return len(self.way)

    @property
    def returns(self) -> list[str]:
        seen: set[str] = set()
        back = []
        for module in self.way:
            if module in seen:
                back.append(module)
            seen.add(module)
        return back

    @property
    def flat(self) -> list[str]:
        folded: list[str] = []
        for e in self.entries:
            if not folded or folded[-1] != e.module:
                folded.append(e.module)
        return folded

    @property
    def flat_returns(self) -> int:
        return sum(1 for i, m in enumerate(self.flat) if m in self.flat[:i])


def _short(name: str) -> str:
    return name.removeprefix("dynspec.launcher.").removeprefix("dynspec.")


def _is_record_method(qualname: str) -> bool:
    """A method or property of a class (not its constructor), or code nested in one."""
    head = qualname.split(".<locals>.", 1)[0]
    if "." not in head:
        return False
    return head.rsplit(".", 1)[1] not in ("__init__", "__post_init__", "__new__")


@contextlib.contextmanager
def _fake_machine() -> Iterator[None]:
    from dynspec.launcher import probe, supervisor

    async def no_run(self: object) -> int:
        return 0

    saved = (probe._run_nvidia_smi, shutil.which, supervisor.Supervisor.run)
    probe._run_nvidia_smi = fake_nvidia_smi  # type: ignore[assignment]
    shutil.which = _fake_which  # type: ignore[assignment]
    supervisor.Supervisor.run = no_run  # type: ignore[method-assign]
    try:
        yield
    finally:
        probe._run_nvidia_smi, shutil.which, supervisor.Supervisor.run = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def _launcher_environ() -> Iterator[None]:
    """No DYNSPEC_* variable and no CUDA_VISIBLE_DEVICES while the launch is read."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("DYNSPEC_")}
    saved.update({k: v for k, v in os.environ.items() if k == "CUDA_VISIBLE_DEVICES"})
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def measure(argv: Sequence[str]) -> Flow:
    """``dynspec-launch ARGV`` from its ``main`` to the supervisor's constructor, traced."""
    from dynspec.launcher import cli

    entries: list[Entry] = []
    live: dict[str, int] = {}
    frames: dict[int, str] = {}

    def hook(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if not isinstance(name, str) or not name.startswith(TRACKED):
                return
            module = _short(name)
            code = frame.f_code
            # A dataclass's generated __init__ (compiled from a string) holds no module code.
            generated = code.co_filename != frame.f_globals.get("__file__")
            qualname = code.co_qualname
            stop = live.get(module, 0) == 0 and not generated and not _is_record_method(qualname)
            entries.append(Entry(module, qualname, stop))
            live[module] = live.get(module, 0) + 1
            frames[id(frame)] = module
        elif event == "return":
            module = frames.pop(id(frame), None)
            if module is not None:
                live[module] -= 1

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        _fake_machine(),
        _launcher_environ(),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        sys.setprofile(hook)
        try:
            cli.main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            sys.setprofile(None)
    return Flow(tuple(entries), code, out.getvalue(), err.getvalue())


def report() -> list[str]:
    lines = [f"{'command line':<16} {'way':>13} {'flat':>13}  returns (way)"]
    totals = [0, 0, 0, 0]
    for name, argv in LINES.items():
        flow = measure(with_ports(argv))
        if flow.code != 0:
            raise RuntimeError(f"{name}: exit {flow.code}: {flow.err.strip()}")
        figures = (flow.stops, len(flow.returns), len(flow.flat), flow.flat_returns)
        totals = [a + b for a, b in zip(totals, figures, strict=True)]
        lines.append(
            f"{name:<16} {figures[0]:>5} stops {figures[1]:>3} back"
            f" {figures[2]:>5}/{figures[3]:<5}  {', '.join(flow.returns) or '-'}"
        )
        lines.append(f"{'':<16} way: {' > '.join(flow.way)}")
    lines.append(f"{'all':<16} {totals[0]:>5} stops {totals[1]:>3} back {totals[2]:>5}/{totals[3]}")
    return lines


if __name__ == "__main__":
    print("\n".join(report()))
