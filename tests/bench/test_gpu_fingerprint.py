"""The GPU run's code fingerprint: the sources on disk against the same sources at a commit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from dynspec.bench.gpu.fingerprint import FOLDERS, ROOT, code_sha256, commit_sha256


def checkout(commit: str, dest: Path) -> Path:
    """The package folders at ``commit``, as the GPU machine's copy of a clean tree has them."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "--", *FOLDERS, ":(exclude)bench/results"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def test_a_commits_fingerprint_is_that_of_its_files_on_disk(tmp_path: Path) -> None:
    tree = checkout("HEAD", tmp_path)
    assert code_sha256(tree) == commit_sha256("HEAD")
    # Results and files that are not sources are not the code.
    (tree / "bench" / "results").mkdir(exist_ok=True)
    (tree / "bench" / "results" / "x.py").write_text("x = 1\n")
    (tree / "router" / "notes.txt").write_text("not code\n")
    assert code_sha256(tree) == commit_sha256("HEAD")


def test_an_edit_a_new_file_or_a_move_changes_it(tmp_path: Path) -> None:
    tree = checkout("HEAD", tmp_path)
    first = code_sha256(tree)
    policy = tree / "router" / "policy.py"
    policy.write_text(policy.read_text() + "\n")
    assert code_sha256(tree) != first
    policy.write_text(policy.read_text()[:-1])
    assert code_sha256(tree) == first
    (tree / "common" / "scratch.py").write_text("")
    assert code_sha256(tree) != first
    (tree / "common" / "scratch.py").unlink()
    shutil.move(tree / "router" / "trend.py", tree / "router" / "trend2.py")
    assert code_sha256(tree) != first


def test_a_commit_git_does_not_know_has_none() -> None:
    assert commit_sha256("0" * 40) is None


def test_every_committed_gpu_run_ran_the_commit_it_names() -> None:
    """Each device command since the fingerprint was recorded: its code is its --commit's."""
    for meta in sorted((ROOT / "bench" / "results").rglob("meta.json")):
        for command in json.loads(meta.read_text()).get("device_commands", []):
            if "code_sha256" in command:
                named = commit_sha256(command["commit"])
                assert named == command["code_sha256"], f"{meta}: not {command['commit']}'s code"
