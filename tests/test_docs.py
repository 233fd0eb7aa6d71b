"""The docs against the commands and CI they describe.

- Every flag a command's ``--help`` lists is documented in exactly one row of one flag table
  (README.md and docs/*.md), and every flag a table documents is one the command has.
  A flag table is a Markdown table under a heading that says "flags" and names its commands in
  backticks (``### Routing: flags of `dynspec-router` and `dynspec-launch` ``), or says "every
  command" (``but `X` ``: the commands named lack it); the flags are the ``--names`` in code
  spans of each row's first cell. The router settings ``dynspec-launch`` passes through are rows
  of router.md's tables that name both commands, and only there.
- The README's "Run the tests" command is what ``.ci/run`` runs: each of its steps, in order.
- Examples in code blocks use only flags their command has; relative links and their anchors
  resolve; every alert and router metric is documented.

The checks are pure functions of the texts, so the last tests feed them docs with a row removed
(and other breakages) and see them fail.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_FILES = ("launcher.md", "router.md", "operations.md", "benchmarks.md")
EVERY = "*"  # a table under "flags of every command [but `X`...]": "*X|Y" in flag_rows' keys

MODULES = {
    "dynspec-launch": "dynspec.launcher",
    "dynspec-router": "dynspec.router",
    "dynspec-sim": "dynspec.launcher.sim",
    "dynspec-bench": "dynspec.bench",
}
# Flags documented before the branch that adds them is merged: allowed to be missing from
# --help; once a command lists one, take it out of here (the test says so).
PENDING: set[tuple[str, str]] = set()

FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
COMMAND_NAME = re.compile(r"`(dynspec-(?:launch|router|sim|bench)(?: [a-z][a-z-]*)*)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


# -- the commands' --help --------------------------------------------------------------------


def _help_text(command: str) -> str:
    words = command.split()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env["COLUMNS"] = "100"
    r = subprocess.run(
        [sys.executable, "-m", MODULES[words[0]], *words[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert r.returncode == 0, f"{command} --help: exit {r.returncode}: {r.stderr}"
    return r.stdout


def help_flags(text: str) -> set[str]:
    """The long flags of argparse's option lines (indented two spaces), without --help."""
    flags: set[str] = set()
    for line in text.splitlines():
        if re.match(r"^  -", line):
            invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            flags.update(FLAG.findall(invocation))
    flags.discard("--help")
    return flags


def subcommands(text: str) -> list[str]:
    """The NAME column of dynspec-bench's (and its gpu group's) command list."""
    return re.findall(r"^  ([a-z][a-z-]*)  ", text, re.M)


@lru_cache(maxsize=1)
def command_flags() -> dict[str, frozenset[str]]:
    bench = [f"dynspec-bench {c}" for c in subcommands(_help_text("dynspec-bench")) if c != "gpu"]
    gpu = [f"dynspec-bench gpu {c}" for c in subcommands(_help_text("dynspec-bench gpu"))]
    names = ["dynspec-launch", "dynspec-router", "dynspec-sim", *bench, *gpu]
    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = list(pool.map(_help_text, names))
    return {name: frozenset(help_flags(text)) for name, text in zip(names, texts, strict=True)}


def test_every_command_is_seen() -> None:
    flags = command_flags()
    assert "dynspec-bench gpu run" in flags and "dynspec-bench sweep" in flags, sorted(flags)
    # dynspec-launch, -router, -sim; bench's sweep, suggest-threshold, profile, envelope,
    # traffic; gpu bundle, models, run, report (overhead, ramp and replicas are retired).
    assert len(flags) >= 12, sorted(flags)
    assert all("--port" in flags[c] for c in ("dynspec-launch", "dynspec-router", "dynspec-sim"))


# -- the docs' flag tables ---------------------------------------------------------------------


def doc_texts() -> dict[str, str]:
    texts = {"README.md": README.read_text(encoding="utf-8")}
    for path in sorted(DOCS.glob("*.md")):
        texts[f"docs/{path.name}"] = path.read_text(encoding="utf-8")
    return texts


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def _outside_fences(text: str) -> Iterator[tuple[int, str]]:
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def flag_rows(texts: Mapping[str, str]) -> dict[tuple[str, str], list[str]]:
    """(command, flag) -> where a flag table documents it ("file:line")."""
    rows: dict[tuple[str, str], list[str]] = {}
    for name, text in texts.items():
        scope: list[str] = []
        for number, line in _outside_fences(text):
            heading = HEADING.match(line)
            if heading:
                title = heading.group(2)
                scope = []
                if re.search(r"\bflags\b", title, re.I):
                    scope = COMMAND_NAME.findall(title)
                    if re.search(r"\bevery command\b", title, re.I):
                        # "every command but `X`": the commands named are the exceptions
                        scope = [EVERY + "|".join(sorted(scope))]
                continue
            if not scope or not line.lstrip().startswith("|"):
                continue
            first = _cells(line)[0]
            for span in re.findall(r"`([^`]*)`", first):
                for flag in FLAG.findall(span):
                    for command in scope:
                        rows.setdefault((command, flag), []).append(f"{name}:{number}")
    return rows


def flag_problems(
    flags: Mapping[str, frozenset[str]],
    rows: Mapping[tuple[str, str], list[str]],
    pending: Iterable[tuple[str, str]] = PENDING,
) -> list[str]:
    pending = set(pending)
    problems = []
    for command, found in sorted(flags.items()):
        for flag in sorted(found):
            where = rows.get((command, flag), [])
            where += [
                w for (c, f), ws in rows.items() if f == flag and c.startswith(EVERY) for w in ws
            ]
            if not where:
                problems.append(f"{command} {flag}: in --help, in no flag table of the docs")
            elif len(where) > 1:
                problems.append(f"{command} {flag}: documented {len(where)} times: {where}")
    for (command, flag), where in sorted(rows.items()):
        if command.startswith(EVERY):
            but = set(command[1:].split("|")) - {""}
            wrong = [c for c, found in sorted(flags.items()) if (flag in found) == (c in but)]
            if wrong:
                problems.append(f"{flag} ({where}): 'every command' but {sorted(but)}: {wrong}")
        elif command not in flags:
            problems.append(f"{where}: no command {command!r} (one of {sorted(flags)})")
        elif flag not in flags[command] and (command, flag) not in pending:
            problems.append(f"{command} {flag} ({where}): documented, not in its --help")
        elif flag in flags[command] and (command, flag) in pending:
            problems.append(f"{command} {flag}: in --help now; take it out of PENDING")
    return problems


def passthrough_problems(
    flags: Mapping[str, frozenset[str]], rows: Mapping[tuple[str, str], list[str]]
) -> list[str]:
    """A launcher flag documented outside launcher.md must be a router flag, in router.md."""
    problems = []
    for (command, flag), where in sorted(rows.items()):
        if command != "dynspec-launch" or all(w.startswith("docs/launcher.md:") for w in where):
            continue
        if not all(w.startswith("docs/router.md:") for w in where):
            problems.append(f"dynspec-launch {flag} ({where}): only launcher.md or router.md")
        elif flag not in flags.get("dynspec-router", frozenset()):
            problems.append(f"dynspec-launch {flag} ({where}): in router.md, not a router flag")
    return problems


def test_every_flag_is_documented_exactly_once() -> None:
    flags = command_flags()
    rows = flag_rows(doc_texts())
    problems = flag_problems(flags, rows) + passthrough_problems(flags, rows)
    assert not problems, "\n".join(problems)


def test_the_launcher_says_what_passes_through() -> None:
    launcher = (DOCS / "launcher.md").read_text(encoding="utf-8")
    assert re.search(r"pass(ed|es)? through", launcher)
    assert "](router.md#flags)" in launcher
    rows = flag_rows(doc_texts())
    passed = {f for (c, f), w in rows.items() if c == "dynspec-launch" and "router.md" in w[0]}
    assert {"--threshold", "--api-key", "--load-signal", "--drain-timeout"} <= passed, passed


# -- the README's commands and CI -------------------------------------------------------------


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def first_command(section: str) -> str:
    match = re.search(r"```(?:bash|sh)?\n(.*?)\n```", section, re.S)
    assert match, "no code block"
    lines = [ln for ln in match.group(1).splitlines() if ln.strip()]
    assert len(lines) == 1, f"one command expected, got {lines}"
    return lines[0]


def _words(command: str) -> list[str]:
    # pip's -q only quiets it: the same install.
    return [w for w in shlex.split(command) if w not in ("-q", "--quiet")]


def ci_steps(script: str) -> list[list[str]]:
    steps = []
    for raw in script.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            try:
                steps.append(_words(line))
            except ValueError:  # a line of a multi-line construct: not a whole command
                continue
    return steps


def ci_problems(readme: str, script: str) -> list[str]:
    """Each step of the README's test command, in order, must be a line .ci/run runs."""
    steps = [_words(s) for s in first_command(_section(readme, "Run the tests")).split("&&")]
    problems = []
    if not any(s[:2] == ["pip", "install"] for s in steps) or not any(
        s[:1] == ["pytest"] for s in steps
    ):
        problems.append(f"the README's test command has no pip install or pytest step: {steps}")
    lines = ci_steps(script)
    at = 0
    for step in steps:
        try:
            at = lines.index(step, at) + 1
        except ValueError:
            problems.append(f".ci/run does not run {shlex.join(step)!r} (after the steps before)")
    return problems


def test_the_readme_test_command_is_what_ci_runs() -> None:
    problems = ci_problems(README.read_text(encoding="utf-8"), (ROOT / ".ci/run").read_text())
    assert not problems, "\n".join(problems)


def test_the_readme_is_short_with_a_measured_picture_and_both_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) == 1, images
    assert "MEASURED" in text.split(images[0], 1)[1][:400], "the picture's caption says MEASURED"
    assert "dynspec-launch --simulate" in first_command(_section(text, "Try it"))
    assert first_command(_section(text, "Run the tests")).endswith("pytest")
    assert all((DOCS / name).is_file() for name in DOC_FILES)


# -- examples, links, alerts, metrics ---------------------------------------------------------


def code_lines(text: str) -> Iterator[str]:
    """Lines of fenced and four-space-indented code blocks, continuation lines joined."""
    fenced = False
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            pending += line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            yield pending
        pending = ""


def example_problems(texts: Mapping[str, str], flags: Mapping[str, frozenset[str]]) -> list[str]:
    problems = []
    for name, text in texts.items():
        for line in code_lines(text):
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError:
                continue
            command: list[str] = []
            for token in [*tokens, ";"]:
                if token and set(token) <= set(";&|()"):
                    problems += _example_flags(name, command, flags)
                    command = []
                else:
                    command.append(token)
    return problems


def _example_flags(name: str, words: list[str], flags: Mapping[str, frozenset[str]]) -> list[str]:
    if not words or words[0] not in MODULES:
        return []
    key, rest = words[0], words[1:]
    # dynspec-bench COMMAND, dynspec-bench gpu COMMAND
    while key in ("dynspec-bench", "dynspec-bench gpu") and rest and not rest[0].startswith("-"):
        key, rest = f"{key} {rest[0]}", rest[1:]
    known = flags.get(key)
    if known is None:
        return [f"{name}: an example runs {key!r}, not a command"]
    used = {w.split("=", 1)[0] for w in rest if w.startswith("--") and " " not in w}
    return [
        f"{name}: `{key} {flag}` in an example, not in its --help" for flag in sorted(used - known)
    ]


def test_examples_use_real_flags() -> None:
    problems = example_problems(doc_texts(), command_flags())
    assert not problems, "\n".join(problems)


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for _, line in _outside_fences(text):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def link_problems(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for _, line in _outside_fences(text):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{path.relative_to(root)}: {target}"
                if not dest.exists():
                    problems.append(f"{where}: no such file")
                elif (
                    anchor
                    and dest.suffix == ".md"
                    and anchor not in anchors(dest.read_text(encoding="utf-8"))
                ):
                    problems.append(f"{where}: no heading with that anchor")
    return problems


def test_links_resolve() -> None:
    problems = link_problems([README, *(DOCS / n for n in DOC_FILES)])
    assert not problems, "\n".join(problems)


def test_every_alert_and_metric_is_documented() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    operations = (DOCS / "operations.md").read_text(encoding="utf-8")
    assert alerts and not [a for a in sorted(alerts) if f"`{a}`" not in operations]
    source = (ROOT / "router/metrics.py").read_text(encoding="utf-8")
    metrics = set(re.findall(r'"(dynspec_[a-z_]+)"', source))
    router = (DOCS / "router.md").read_text(encoding="utf-8")
    missing = [m for m in sorted(metrics) if f"`{m}" not in router]
    assert metrics and not missing, missing


# -- the checks can fail ----------------------------------------------------------------------


def _without_row(texts: dict[str, str], doc: str, flag: str) -> dict[str, str]:
    lines = texts[doc].splitlines()
    kept = [ln for ln in lines if not ln.startswith(f"| `{flag} ")]
    assert len(kept) == len(lines) - 1, f"{doc} has no single row for {flag}"
    return {**texts, doc: "\n".join(kept)}


def test_a_flag_removed_from_the_docs_fails() -> None:
    flags = command_flags()
    texts = _without_row(doc_texts(), "docs/router.md", "--hysteresis")
    problems = flag_problems(flags, flag_rows(texts))
    assert any(p.startswith("dynspec-router --hysteresis: in --help, in no") for p in problems)
    assert any(p.startswith("dynspec-launch --hysteresis: in --help, in no") for p in problems)
    texts = _without_row(doc_texts(), "docs/benchmarks.md", "--traffic-peak")
    assert any("gpu run --traffic-peak" in p for p in flag_problems(flags, flag_rows(texts)))


def test_a_flag_twice_or_unknown_fails() -> None:
    flags = command_flags()
    texts = doc_texts()
    extra = (
        "\n### More: flags of `dynspec-launch`\n\n| flag |\n| --- |\n| `--port N` |\n| `--nope` |\n"
    )
    texts["docs/launcher.md"] += extra
    rows = flag_rows(texts)
    problems = flag_problems(flags, rows)
    assert any(p.startswith("dynspec-launch --port: documented 2 times") for p in problems)
    assert any(p.startswith("dynspec-launch --nope (") for p in problems)
    texts["docs/operations.md"] += "\n### Flags of `dynspec-launch`\n\n| `--gpus` |\n"
    assert any(
        "only launcher.md or router.md" in p for p in passthrough_problems(flags, flag_rows(texts))
    )
    pending = flag_problems(flags, rows, pending=[("dynspec-launch", "--gpus")])
    assert "dynspec-launch --gpus: in --help now; take it out of PENDING" in pending


def test_a_readme_test_command_ci_does_not_run_fails() -> None:
    readme = README.read_text(encoding="utf-8")
    script = (ROOT / ".ci/run").read_text()
    assert not ci_problems(readme, script)
    changed = readme.replace("&& pytest\n", "&& pytest -x\n", 1)
    assert changed != readme and ci_problems(changed, script)
    assert ci_problems(readme.replace("'.[test]'", "'.[test,sglang]'", 1), script)
    reordered = script.replace("\npytest\n", "\n", 1) + "\npytest\n"
    assert not ci_problems(readme, reordered)  # still runs after the install
    assert ci_problems(readme, script.replace("pip install -q -e '.[test]'", "true", 1))


def test_stale_examples_and_links_fail(tmp_path: Path) -> None:
    texts = {"x.md": "```bash\ndynspec-router --eagle-url http://a --old-flag 1 # --fine\n```\n"}
    assert example_problems(texts, command_flags()) == [
        "x.md: `dynspec-router --old-flag` in an example, not in its --help"
    ]
    doc = tmp_path / "a.md"
    doc.write_text("# Top\n## The `x` thing: `--y`\n[ok](#the-x-thing---y) [a](b.md) [b](#nope)\n")
    assert link_problems([doc], root=tmp_path) == [
        "a.md: b.md: no such file",
        "a.md: #nope: no heading with that anchor",
    ]


@pytest.mark.parametrize(
    ("title", "anchor"),
    [
        ("Pairs: `--pair EAGLE_URL,BASELINE_URL`", "pairs---pair-eagle_urlbaseline_url"),
        ("Load ramp (SIMULATED): `ramp-demo.*`", "load-ramp-simulated-ramp-demo"),
        ("The README's picture", "the-readmes-picture"),
    ],
)
def test_slug(title: str, anchor: str) -> None:
    assert slug(title) == anchor
