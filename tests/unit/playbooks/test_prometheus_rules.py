# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The alert rules playbooks/prometheus.yml writes (playbooks/files/dgxspark-vllm-alerts.yml): `promtool check rules`
and `promtool test rules` over tests/prometheus/dgxspark-vllm-alerts.test.yml (each alert firing when it must and not
before, with its labels and text). promtool comes with Debian's prometheus package, which bin/test installs."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "playbooks" / "files" / "dgxspark-vllm-alerts.yml"
TESTS = ROOT / "tests" / "prometheus" / "dgxspark-vllm-alerts.test.yml"
ALERTS = {"DgxSparkGuardGaveUp", "DgxSparkGuardRestoringTooLong", "DgxSparkScrapeFailing", "DgxSparkKvCacheFull",
          "DgxSparkNoTokensGenerated"}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: install Debian's prometheus package (bin/test does: ensure_promtool in bin/lib.sh)"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 5 rules found" in proc.stdout


def test_promtool_test_rules() -> None:
    proc = promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert names == ALERTS
    cases = yaml.safe_load(TESTS.read_text(encoding="utf-8"))["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    fired = {check["alertname"] for check in checks if check["exp_alerts"]}
    quiet = {check["alertname"] for check in checks if not check["exp_alerts"]}
    assert fired == quiet == ALERTS
