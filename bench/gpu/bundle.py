"""The SGLang site bundle: one ``.tar.xz`` a GPU machine without a package index unpacks and puts
on ``PYTHONPATH``.

Built here from wheels for the GPU machine's Python (3.12) and torch (2.11, already there): SGLang
0.5.17 (the newest release built for torch 2.11) with what its server imports, plus what dynspec
needs beyond that machine's packages (fastapi, starlette, uvicorn, httptools, orjson). Kernels
that the triton attention backend never loads are dropped, so the archive stays one transfer
(< 60 MiB). ``deep_gemm`` gets an import-only stand-in: SGLang's EAGLE worker imports a backend
that imports it at module level.
"""

from __future__ import annotations

import importlib.resources
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

from dynspec.bench.procs import captured, last_line
from dynspec.common.cli import UsageError

PYTHON_VERSION = "3.12"
PINS_FILE = "sglang-pins.txt"  # exact versions, beside this module (package data)
# manylinux tags pip must accept for the 3.12 wheels (it matches each glibc version exactly).
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in (34, 28, 27, 26, 24, 17, 5)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
)
# Paths (relative to the site folder; files as glob patterns) the triton backend never loads:
# FA3, Blackwell, FlashMLA, InfLLM kernels, a static library, CUTLASS sources, console scripts.
TRIM_FILES = (
    "sgl_kernel/flash_ops.abi3.so",
    "sgl_kernel/flashmla_ops.abi3.so",
    "xgrammar/lib/libxgrammar.a",
    "sgl_kernel/infllm_ops*.so",
)
TRIM_DIRS = (
    "sgl_kernel/sm100",
    "flashinfer/data/cutlass/examples",
    "flashinfer/data/cutlass/python",
    "flashinfer/data/cutlass/test",
    "bin",
)
SITE = "sgl-site"
STUBS = "_stubs"  # inside the site folder; goes LAST on PYTHONPATH
DEEP_GEMM_STUB = '''"""Import-only stand-in for deep_gemm (the triton backend never calls it)."""


class _Anything:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()


def __getattr__(name):
    return _Anything()
'''
LIMIT_BYTES = 60 * 1024 * 1024


def pins() -> list[str]:
    """The exact versions (``sglang-pins.txt``), one requirement a line."""
    text = importlib.resources.files("dynspec.bench.gpu").joinpath(PINS_FILE).read_text("utf-8")
    lines = (raw.split("#", 1)[0].strip() for raw in text.splitlines())
    return [line for line in lines if line]


def _run(argv: Sequence[str], what: str) -> None:
    done = captured(argv)
    if done.returncode != 0:
        last = last_line(done.stderr or done.stdout) or f"exit {done.returncode}"
        raise RuntimeError(f"{what} failed: {last}")


def trim(site: Path) -> None:
    for path in [p for pattern in TRIM_FILES for p in site.glob(pattern)]:
        path.unlink()
    for folder in [*(site / rel for rel in TRIM_DIRS), *site.rglob("__pycache__")]:
        shutil.rmtree(folder, ignore_errors=True)


def write_stubs(site: Path) -> None:
    stub = site / STUBS / "deep_gemm"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text(DEEP_GEMM_STUB)


def pack(folder: Path, archive: Path) -> None:
    """``tar | xz -9 -T0`` where xz exists (all cores), else Python's single-threaded xz."""
    tmp = archive.with_name(archive.name + ".part")
    if shutil.which("xz") and shutil.which("tar"):
        with open(tmp, "wb") as f:
            tar = subprocess.Popen(
                ["tar", "-C", str(folder.parent), "-cf", "-", folder.name], stdout=subprocess.PIPE
            )
            xz = subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=f, check=False)
            assert tar.stdout is not None
            tar.stdout.close()
            if tar.wait() != 0 or xz.returncode != 0:
                raise RuntimeError("packing the bundle failed (tar | xz)")
    else:
        with tarfile.open(tmp, "w:xz", preset=9) as t:
            t.add(folder, arcname=folder.name)
    tmp.replace(archive)


def build_bundle(out: Path, python: str, wheels: Path) -> Path:
    """Download the wheels (kept in ``wheels`` for the next build), install, trim, pack."""
    if shutil.which(python) is None and not Path(python).is_file():
        raise UsageError(f"--python {python}: not found (a Python {PYTHON_VERSION} with pip)")
    wheels.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    wanted = pins()
    _run(
        [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms,
         "-d", str(wheels), *wanted],
        "pip download",
    )  # fmt: skip
    site = out / "build" / SITE  # installed here, packed, then left for a look inside
    shutil.rmtree(site, ignore_errors=True)
    _run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
         "--no-deps", "--no-compile", "--target", str(site), *wanted],
        "pip install --target",
    )  # fmt: skip
    trim(site)
    write_stubs(site)
    archive = out / f"{SITE}.tar.xz"
    pack(site, archive)
    size = archive.stat().st_size
    if size > LIMIT_BYTES:
        raise RuntimeError(
            f"{archive} is {size / 2**20:.1f} MiB, over the {LIMIT_BYTES / 2**20:.0f} MiB "
            "one transfer allows"
        )
    return archive


def unpack_bundle(archive: Path, dest: Path) -> Path:
    """Unpack (once) and return the site folder; a missing or broken archive is a RuntimeError."""
    site = dest / SITE
    marker = site / ".unpacked"
    if marker.exists():
        return site
    if not archive.is_file():
        raise RuntimeError(f"bundle {archive} does not exist (build it: dynspec-bench gpu bundle)")
    shutil.rmtree(site, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="tar")
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"bundle {archive} is broken: {first.rstrip(':')}") from None
    if not (site / "sglang").is_dir():
        raise RuntimeError(f"bundle {archive} holds no {SITE}/sglang")
    marker.write_text("")
    return site
