"""promtool on the shipped config and rules; systemd-analyze on the unit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from deploy_files import ALERTS, ALERTS_TEST, DEPLOY, PROMETHEUS_YML, alert_rules, require_tool


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def test_promtool_check_config() -> None:
    r = _run([require_tool("promtool"), "check", "config", str(PROMETHEUS_YML)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout + r.stderr


def test_promtool_check_rules() -> None:
    r = _run([require_tool("promtool"), "check", "rules", str(ALERTS)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_test_rules_fire_and_clear() -> None:
    r = _run([require_tool("promtool"), "test", "rules", ALERTS_TEST.name], cwd=ALERTS_TEST.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    # Each alert has a case where it fires and a later one where it has cleared.
    text = ALERTS_TEST.read_text()
    for alert in re.findall(r"- alert: (\w+)", ALERTS.read_text()):
        cases = re.findall(rf"alertname: {alert}\n\s+exp_alerts:(\s*\[\]|\n\s+- exp_labels)", text)
        assert any(c.strip() == "[]" for c in cases), f"{alert}: no case where it is quiet"
        assert any("exp_labels" in c for c in cases), f"{alert}: no case where it fires"


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests can fail: with any alert's `for` or bound raised, they must."""
    promtool = require_tool("promtool")
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    for rule in alert_rules():
        name = rule["alert"]
        doc = yaml.safe_load(ALERTS.read_text())
        for r in doc["groups"][0]["rules"]:
            if r["alert"] == name:
                # A longer hold than the test series last, or (no `for`) a bound ten times higher.
                if "for" in r:
                    r["for"] = "1h"
                else:
                    r["expr"] = re.sub(r">\s*([\d.]+)\s*$", r"> 10 * \1", r["expr"].strip())
                    assert "> 10 *" in r["expr"], name
        (tmp_path / ALERTS.name).write_text(yaml.safe_dump(doc))
        r = _run([promtool, "test", "rules", ALERTS_TEST.name], cwd=tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and f"alertname: {name}," in out, f"{name}: a broken rule passed"


def test_systemd_analyze_verify_unit(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze", "systemd")
    # The unit names the installed paths; point them at ones that exist here to verify the rest.
    text = (DEPLOY / "systemd" / "dynspec.service").read_text()
    exe = shutil.which("true") or "/bin/true"
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={exe}", text, flags=re.M)
    unit = tmp_path / "dynspec.service"
    unit.write_text(text)
    r = _run([analyze, "verify", str(unit)])
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 0 and "dynspec.service" not in out, out


EXPOSURE = re.compile(r"Overall exposure level for dynspec\.service: (\d+(?:\.\d+)?) ")


def test_systemd_unit_is_hardened(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze", "systemd")
    unit = tmp_path / "dynspec.service"
    unit.write_text((DEPLOY / "systemd" / "dynspec.service").read_text())
    # --offline reads the unit file alone (systemd >= 250), without a running systemd.
    r = _run([analyze, "security", "--offline=true", "--no-pager", str(unit)])
    out = r.stdout + r.stderr
    found = EXPOSURE.search(out)
    assert found, out
    # 0 is fully locked down, 10 is UNSAFE (the unit without a sandbox scored 9.2).
    assert float(found.group(1)) < 5, out
