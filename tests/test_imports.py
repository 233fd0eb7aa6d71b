"""The import rules between the parts, read from the source with ``ast`` (nothing is imported).

- ``dynspec.common`` (the shared command-line toolkit) imports no command: router, launcher and
  bench all build on it.
- ``dynspec.router`` imports nothing from ``dynspec.launcher`` or ``dynspec.bench``: the router
  runs alone, in front of servers something else started.
- ``dynspec.launcher`` (the simulator included) and ``dynspec.bench`` import nothing from
  ``dynspec.router``: they start the router as a process by module name (``python -m
  dynspec.router``) and speak HTTP to it, so its internals stay free to change.
- ``dynspec.router.policy`` imports nothing that can do I/O: only the modules allowed below, so
  the choice stays a pure function of the snapshots it is given; the same holds for
  ``dynspec.router.speed``, the speed curves that the snapshots carry, for
  ``dynspec.router.autothreshold``, the learned threshold's rules, and for the records those
  rules read (``dynspec.router.server``, ``dynspec.router.thresholds``).

Every import counts, also one inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"common": "dynspec.common", "router": "dynspec.router"}
FOLDERS |= {"launcher": "dynspec.launcher", "bench": "dynspec.bench"}

# package -> the dynspec packages it must not import.
FORBIDDEN = {
    "dynspec.common": ("dynspec.router", "dynspec.launcher", "dynspec.bench"),
    "dynspec.router": ("dynspec.launcher", "dynspec.bench"),
    "dynspec.launcher": ("dynspec.router",),
    "dynspec.bench": ("dynspec.router",),
}
# Modules whose imports are limited to an allow-list, and that list. A dynspec module may join
# the list only if it is in PURE itself (and so checked by the same rule).
PURE = (
    "dynspec.router.policy",
    "dynspec.router.speed",
    "dynspec.router.autothreshold",
    "dynspec.router.server",
    "dynspec.router.thresholds",
    "dynspec.common.profile",
)
# json: the profile's dumps() (text, no file); the readers are handed parsed JSON.
PURE_ALLOWED = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections.abc",
        "dataclasses",
        "json",
        "math",
        "typing",
        *PURE,
    }
)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, ``module``'s text.

    ``from X import y`` yields ``X.y`` as well as ``X``: y may be a module (``from dynspec.router
    import pool``), and a rule on a package prefix must see it either way.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Each import of ``module``'s source that breaks a rule, as 'module:line imports name'."""
    found: list[str] = []
    banned = next((v for k, v in FORBIDDEN.items() if _within(module, k)), ())
    for line, name in imported(source, module, is_package):
        if any(_within(name, b) for b in banned):
            found.append(f"{module}:{line} imports {name}")
    if module in PURE:
        for line, name in imported(source, module, is_package):
            # "from typing import ClassVar" yields "typing.ClassVar": judge the module part.
            if not any(name == ok or name.startswith(ok + ".") for ok in PURE_ALLOWED):
                found.append(f"{module}:{line} imports {name}, which is not known to be pure")
    return sorted(set(found))


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_every_part_is_checked() -> None:
    names = {module_name(p) for p in sources()}
    for package in FORBIDDEN:
        assert package in names
    assert set(PURE) <= names
    assert "dynspec.launcher.sim.engine" in names  # subpackages are walked too


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_rules(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert violations(source, module_name(path), path.name == "__init__.py") == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("dynspec.router.pool", "import dynspec.bench.load", "imports dynspec.bench.load"),
        (
            "dynspec.router.app",
            "def f():\n    from dynspec.launcher import spec",
            "dynspec.router.app:2 imports dynspec.launcher",
        ),
        ("dynspec.router.app", "from ..bench import load", "imports dynspec.bench"),
        ("dynspec.bench.envelope8", "from dynspec.router import pool", "dynspec.router.pool"),
        ("dynspec.launcher.sim.app", "from dynspec.router.pool import Pool", "dynspec.router"),
        ("dynspec.launcher.sim.app", "from ...router import pool", "imports dynspec.router"),
        ("dynspec.common.cli", "import dynspec.router.config", "imports dynspec.router.config"),
        ("dynspec.router.policy", "import socket", "socket, which is not known to be pure"),
        ("dynspec.router.policy", "from . import pool", "dynspec.router.pool, which is not"),
        # The learned threshold's rules take a group as an argument: they import no pool.
        (
            "dynspec.router.autothreshold",
            "from dynspec.router.pool import Pools",
            "dynspec.router.pool, which is not",
        ),
        (
            "dynspec.router.policy",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import httpx",
            "dynspec.router.policy:3 imports httpx",
        ),
    ],
)
def test_checker_finds_a_broken_rule(module: str, source: str, expected: str) -> None:
    found = violations(source, module)
    assert found, f"{source!r} in {module} passed"
    assert any(expected in v for v in found), found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("dynspec.bench.overhead", "from dynspec.common.cli import FlagParser"),
        ("dynspec.router.policy", "from collections.abc import Sequence\nimport math"),
        ("dynspec.router.app", "from dynspec.router import policy\nfrom . import pool"),
        # A module named in a string (a child's argv) is no import.
        ("dynspec.bench.envelope8", "ARGV = ['python', '-m', 'dynspec.router']"),
    ],
)
def test_checker_passes_allowed_imports(module: str, source: str) -> None:
    assert violations(source, module) == []
