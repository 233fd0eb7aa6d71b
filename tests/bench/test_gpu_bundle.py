"""The bundle's pure steps: trimming, the deep_gemm stand-in, unpacking (no download here)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dynspec.bench.gpu import bundle


def test_trim_drops_unused_kernels_and_caches_only(tmp_path: Path) -> None:
    site = tmp_path / "site"
    keep = site / "sgl_kernel" / "common_ops.abi3.so"
    drop = [
        site / "sgl_kernel" / "flash_ops.abi3.so",
        site / "sgl_kernel" / "infllm_ops_sm90.so",
        site / "sgl_kernel" / "sm100" / "x.so",
        site / "sglang" / "__pycache__" / "a.pyc",
        site / "bin" / "sglang",
    ]
    for f in [keep, *drop]:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    bundle.trim(site)
    assert keep.exists()
    assert not any(f.exists() for f in drop)


def test_deep_gemm_stub_imports_and_answers_anything(tmp_path: Path) -> None:
    bundle.write_stubs(tmp_path)
    code = "import deep_gemm; print(deep_gemm.fp8_gemm_nt(1, 2).anything(3) is not None)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(tmp_path / bundle.STUBS)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "True"


def test_unpack_once_and_refuse_what_is_not_a_bundle(tmp_path: Path) -> None:
    src = tmp_path / "src" / bundle.SITE / "sglang"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    archive = tmp_path / "b.tar.xz"
    bundle.pack(src.parent, archive)
    site = bundle.unpack_bundle(archive, tmp_path / "work")
    assert (site / "sglang" / "__init__.py").exists()
    archive.unlink()
    assert bundle.unpack_bundle(archive, tmp_path / "work") == site  # kept from the first time
    with pytest.raises(RuntimeError, match="does not exist"):
        bundle.unpack_bundle(archive, tmp_path / "other")
    empty = tmp_path / "empty.tar.xz"
    with tarfile.open(empty, "w:xz"):
        pass
    with pytest.raises(RuntimeError, match="holds no sgl-site/sglang"):
        bundle.unpack_bundle(empty, tmp_path / "third")


def test_pins_name_sglang_once_and_what_dynspec_needs_there() -> None:
    pins = bundle.pins()
    names = [p.split("==")[0] for p in pins]
    assert len(names) == len(set(names)) == len(pins) > 40
    assert "sglang==0.5.17" in pins  # the release built for the GPU machine's torch 2.11
    for needed in ("fastapi", "starlette", "uvicorn", "httptools", "orjson"):
        assert needed in names
    # The file is package data: an installed dynspec reads it too.
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert f'"dynspec.bench.gpu" = ["{bundle.PINS_FILE}"]' in pyproject
