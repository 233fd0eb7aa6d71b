"""A fake SGLang site bundle and a fake nvidia-smi, to run ``dynspec-bench gpu run`` on a CPU.

The bundle's ``sglang.launch_server`` takes SGLang's flags and runs ``dynspec-sim`` (which speaks
SGLang's HTTP surface, /metrics included); ``torch`` and ``transformers`` are just importable.
With ``workers`` each server first forks a ``sglang::schedul`` child in its process group that
dies with it (``PR_SET_PDEATHSIG``, as SGLang's scheduler and detokenizer do), and the fake
``nvidia-smi --query-compute-apps`` lists those children of the run (by its ``GPU_RUN_TAG``) as
the real one lists SGLang's schedulers.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

LAUNCH_SERVER = """
import argparse, os, sys
p = argparse.ArgumentParser()
p.add_argument("--port", default="30000")
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--speculative-algorithm")
p.add_argument("--served-model-name", default="fake")
p.add_argument("--max-running-requests")
args, _ = p.parse_known_args()
if os.environ.get("FAKE_SGLANG_CRASH"):
    print("loading weights ... RuntimeError: CUDA out of memory (fake)", flush=True)
    sys.exit(1)
if os.environ.get("FAKE_SGLANG_WORKERS"):
    parent = os.getpid()
    if os.fork() == 0:
        import ctypes, signal, time
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(0)
        with open("/proc/self/comm", "w") as f:
            f.write("sglang::schedul")
        while True:
            time.sleep(3600)
argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", args.port, "--host", args.host,
        "--mode", "eagle" if args.speculative_algorithm else "baseline",
        "--served-model-name", args.served_model_name, "--profile", "demo", "--speed", "20"]
if args.max_running_requests:
    argv += ["--max-running-requests", args.max_running_requests]
os.execv(sys.executable, argv)
"""
FILES = {
    "sglang/__init__.py": '__version__ = "0.5.17"\n',
    "sglang/launch_server.py": LAUNCH_SERVER,
    "sglang-0.5.17.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17\n",
    "torch/__init__.py": '__version__ = "0.0-fake"\nfrom torch import cuda\n',
    "torch/cuda.py": "def is_available():\n    return False\n",
    "transformers/__init__.py": '__version__ = "0.0-fake"\n',
}
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *compute-apps*)
    for d in /proc/[0-9]*; do
      { read -r name < "$d/comm"; } 2>/dev/null || continue
      [ "$name" = "sglang::schedul" ] && [ -n "$GPU_RUN_TAG" ] || continue
      grep -qzx "GPU_RUN_TAG=$GPU_RUN_TAG" "$d/environ" 2>/dev/null || continue
      echo "${d#/proc/}, sglang::scheduler, 1024 MiB"
    done ;;
  *memory.total*) echo "0, GPU-00000000-fake, 143771" ;;
  *) echo "0" ;;
esac
"""


def make_bundle(tmp: Path, crash: bool = False, workers: bool = False) -> Path:
    """The fake bundle; with ``crash`` its servers exit 1 at start (as on a model that fails),
    with ``workers`` each has a worker child (see above)."""
    site = tmp / "build" / "sgl-site"
    files = dict(FILES)
    for flag, wanted in (("FAKE_SGLANG_CRASH", crash), ("FAKE_SGLANG_WORKERS", workers)):
        if wanted:
            files["sglang/launch_server.py"] = (
                f"import os\nos.environ['{flag}'] = '1'\n" + files["sglang/launch_server.py"]
            )
    for rel, text in files.items():
        f = site / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    archive = tmp / "sgl-site.tar.xz"
    with tarfile.open(archive, "w:xz") as t:
        t.add(site, arcname="sgl-site")
    return archive


def make_models(tmp: Path) -> Path:
    from dynspec.bench.gpu.models import draft_config, target_config

    root = tmp / "models"
    (root / "llama8b").mkdir(parents=True)
    (root / "llama8b" / "config.json").write_text(json.dumps(target_config()))
    for name in ("hi", "p54", "p81"):
        (root / f"eagle3-{name}").mkdir()
        (root / f"eagle3-{name}" / "config.json").write_text(json.dumps(draft_config()))
    return root


def fake_path(tmp: Path) -> str:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
