# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The alert rules playbooks/prometheus.yml writes (playbooks/files/dgxspark-vllm-alerts.yml, and
dgxspark-vllm-router-alerts.yml with a router): `promtool check rules` and `promtool test rules` over
tests/prometheus/<the same name>.test.yml (each alert firing when it must and not before, with its labels and text).
promtool comes with Debian's prometheus package, which bin/test installs."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "playbooks" / "files"
TESTS = ROOT / "tests" / "prometheus"
# each rules file and its alerts
ALERTS = {
    "dgxspark-vllm-alerts": {"DgxSparkGuardGaveUp", "DgxSparkGuardRestoringTooLong", "DgxSparkScrapeFailing",
                             "DgxSparkKvCacheFull", "DgxSparkNoTokensGenerated"},
    # HAProxy 2.6's exporter on the router: haproxy_server_status and haproxy_backend_status, and the job's up
    "dgxspark-vllm-router-alerts": {"DgxSparkRouterClusterDown", "DgxSparkRouterModelDown",
                                    "DgxSparkRouterScrapeFailing"},
}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: install Debian's prometheus package (bin/test does: ensure_promtool in bin/lib.sh)"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_promtool_check_rules(name: str) -> None:
    proc = promtool("check", "rules", str(FILES / f"{name}.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS[name])} rules found" in proc.stdout


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_promtool_test_rules(name: str) -> None:
    tests = TESTS / f"{name}.test.yml"
    assert yaml.safe_load(tests.read_text(encoding="utf-8"))["rule_files"] == [f"../../playbooks/files/{name}.yml"]
    proc = promtool("test", "rules", tests.name, cwd=TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not(name: str) -> None:
    rules = yaml.safe_load((FILES / f"{name}.yml").read_text(encoding="utf-8"))
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert names == ALERTS[name]
    cases = yaml.safe_load((TESTS / f"{name}.test.yml").read_text(encoding="utf-8"))["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    fired = {check["alertname"] for check in checks if check["exp_alerts"]}
    quiet = {check["alertname"] for check in checks if not check["exp_alerts"]}
    assert fired == quiet == ALERTS[name]


# HAProxy 2.6.12 (Debian 12's haproxy) serving the configuration the router role renders (plugins/module_utils/_router.py
# render): model_0 with pair_a (drained, its API not answering) and pair_b (up), model_1 with pair_c only (maint); its
# exporter's haproxy_server_status and haproxy_backend_status, captured from /metrics
CAPTURE = ROOT / "tests" / "fixtures" / "metrics" / "haproxy-2.6.12-router-captured.txt"
ROUTER_TARGET = {"component": "router", "router": "router-1", "instance": "192.0.2.30:8404", "job": "dgxspark-vllm-router"}
SAMPLE_RE = re.compile(r'^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def captured() -> list[tuple[str, dict[str, str], str]]:
    samples = []
    for line in CAPTURE.read_text(encoding="utf-8").splitlines():
        match = SAMPLE_RE.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            samples.append((match["name"], labels, match["value"]))
    return samples


def test_the_router_rules_fire_on_what_haproxy_exposes(tmp_path: Path) -> None:
    """The rules over the real exporter's series (with the router job's target labels), held for 10 minutes: the
    drained cluster whose API fails is down, the one in maintenance is not; the model whose only cluster is in
    maintenance is refused, the model still served is not."""
    samples = captured()
    assert {sample[0] for sample in samples} == {"haproxy_server_status", "haproxy_backend_status"}
    series = []
    for name, labels, value in samples:
        text = ",".join(f'{key}="{val}"' for key, val in {**labels, **ROUTER_TARGET}.items())
        series.append({"series": f"{name}{{{text}}}", "values": f"{value}x10"})
    expected = {
        "DgxSparkRouterClusterDown": [{"proxy": "model_0", "server": "pair_a", "state": "DOWN"}],
        "DgxSparkRouterModelDown": [{"proxy": "model_1", "state": "DOWN"}],
    }
    severity = {"DgxSparkRouterClusterDown": "warning", "DgxSparkRouterModelDown": "critical"}
    # every alert firing, by its labels (alert_rule_test would compare the annotations too)
    firing = [{"labels": "ALERTS" + "{" + ",".join(f'{key}="{val}"' for key, val in sorted(
        {**labels, **ROUTER_TARGET, "alertname": alert, "alertstate": "firing", "severity": severity[alert]}.items()))
        + "}", "value": 1} for alert, alerts in expected.items() for labels in alerts]
    checks = [{"eval_time": "10m", "expr": 'ALERTS{alertstate="firing"}', "exp_samples": firing}]
    test = {"rule_files": [str(FILES / "dgxspark-vllm-router-alerts.yml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    path = tmp_path / "captured.test.yml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    proc = promtool("test", "rules", path.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_promtool_tests_use_the_exporters_label_sets() -> None:
    """The hand-written router tests' series carry the labels the exporter gives (plus the job's target labels)."""
    exposed = {(name, frozenset(labels)) for name, labels, _value in captured()}
    cases = yaml.safe_load((TESTS / "dgxspark-vllm-router-alerts.test.yml").read_text(encoding="utf-8"))["tests"]
    used = set()
    for case in cases:
        for entry in case["input_series"]:
            match = SAMPLE_RE.match(entry["series"] + " 0")
            assert match, entry["series"]
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            if match["name"].startswith("haproxy_") and labels.get("component") == "router":
                used.add((match["name"], frozenset(set(labels) - set(ROUTER_TARGET))))
    assert used == exposed
