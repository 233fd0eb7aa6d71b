"""Which code a GPU run ran: a fingerprint of the project's sources, checked against its commit.

The GPU machine gets a copy of the working tree without ``.git``, so a run's commit is what its
``--commit`` says, typed by hand (one session's named a wrong hash). ``code_sha256`` hashes the
sources the run imports (every ``.py`` of the package's folders, results excluded) where it runs,
into ``meta.json``; ``commit_sha256`` hashes the same files as git holds them at a commit, so a
results folder's commit is checked where git is (tests/bench/test_gpu_fingerprint.py checks every
committed one).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path

FOLDERS = ("bench", "common", "launcher", "router")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: bench/gpu/fingerprint.py's


def _source(path: str) -> bool:
    top = path.split("/", maxsplit=1)[0]
    return path.endswith(".py") and top in FOLDERS and not path.startswith("bench/results/")


def _digest(files: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def code_sha256(root: Path = ROOT) -> str:
    """The fingerprint of the sources under ``root`` as they are on disk."""
    paths = [p.relative_to(root).as_posix() for f in FOLDERS for p in (root / f).rglob("*.py")]
    return _digest((p, (root / p).read_bytes()) for p in paths if _source(p))


def commit_sha256(commit: str, root: Path = ROOT) -> str | None:
    """The fingerprint of the same sources at ``commit`` in ``root``'s git; None where git does
    not know the commit."""
    listed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "-z", commit, *FOLDERS],
                            capture_output=True, check=False)  # fmt: skip
    if listed.returncode:
        return None
    blobs = {}
    for entry in listed.stdout.decode().split("\0"):
        meta, _, path = entry.partition("\t")
        if path and _source(path) and meta.split()[1] == "blob":
            blobs[path] = meta.split()[2]
    batch = subprocess.run(["git", "-C", str(root), "cat-file", "--batch"], check=True,
                           input="".join(f"{b}\n" for b in blobs.values()).encode(),
                           capture_output=True).stdout  # fmt: skip
    files, at = [], 0
    for path in blobs:  # each answer: "<sha> blob <size>\n<data>\n", in the order asked
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        files.append((path, batch[header_end + 1 : header_end + 1 + size]))
        at = header_end + 1 + size + 1
    return _digest(files)
