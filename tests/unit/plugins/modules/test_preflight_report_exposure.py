# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dgxspark.vllm.preflight_report module's exposure option (api_exposure) and secret_files probe, in-process."""
from __future__ import annotations

import os
import sys
from typing import Any
from unittest import mock

import pytest
import yaml

from helpers.module_runner import ModuleFail, run_module

from ansible_collections.dgxspark.vllm.plugins.modules import preflight_report
from ansible_collections.dgxspark.vllm.plugins.modules.preflight_report import main

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "module_utils"))
import test_preflight as probes  # noqa: E402  (the probe samples of the module_utils tests)

LAB_ARGS = {"cx7_subnet": "10.77.1.0/24", "model_path": "/var/tmp/models/tiny-glm53", "lab": True,
            "checkpoint_size_bytes": 10 ** 9, "disk_margin_bytes": 10 ** 9, "mem_available_floor_bytes": 2 ** 31}
# What roles/preflight/tasks/report.yml passes for the lab (an API key set, the firewall on by default).
LAB_EXPOSURE = {"host": "0.0.0.0", "host_source": "profile lab_cpu", "launcher": "docker_run", "api_key_set": True,
                "require_api_key": False, "firewall": True, "api_allowed_cidrs": []}


def run(exposure: dict[str, Any] | None, **node: Any) -> dict[str, Any]:
    nodes = [probes.lab_node("lab-head"), probes.lab_node("lab-worker", **node)]
    extra = {} if exposure is None else {"exposure": exposure}
    return run_module(main, dict(LAB_ARGS, nodes=nodes, **extra))


def checks(result: dict[str, Any], node: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in result["reports"][node]["checks"]}


def test_the_lab_passes_with_its_key_on_the_head_only() -> None:
    result = run(LAB_EXPOSURE)
    assert result["ok"] is True
    head = checks(result, "lab-head")["api_exposure"]
    assert head["status"] == "pass"
    assert head["evidence"] == (
        "The API listens on 0.0.0.0:8000 (every interface; settings.host, from profile lab_cpu) and answers /v1 "
        "requests only with the API key; its other routes (/health, /metrics, /version, /tokenize) answer without "
        "it, to whoever reaches the port: the collection's firewall (dgxspark_vllm_firewall) admits port 8000 only "
        "from the controller's address (dgxspark_vllm_api_allowed_cidrs unset) and the nodes.")
    assert "api_exposure" not in checks(result, "lab-worker")
    assert checks(result, "lab-worker")["secret_files"]["status"] == "pass"


@pytest.mark.parametrize(("change", "status", "ok"), [
    ({"api_key_set": False}, "warn", True),
    ({"api_key_set": False, "require_api_key": True}, "fail", False),
    ({"api_key_set": False, "require_api_key": True, "host": "127.0.0.1"}, "pass", True),
])
def test_the_exposure_settings_decide_the_check(change: dict[str, Any], status: str, ok: bool) -> None:
    result = run(dict(LAB_EXPOSURE, **change))
    assert checks(result, "lab-head")["api_exposure"]["status"] == status
    assert result["ok"] is ok


def test_only_what_is_given_is_decided() -> None:
    result = run({"api_key_set": False})      # the defaults: docker_run, vLLM's default host, the firewall on
    assert checks(result, "lab-head")["api_exposure"]["status"] == "warn"
    assert all("api_exposure" not in checks(run(None), node) for node in ("lab-head", "lab-worker"))


def test_an_exposed_secret_file_fails_the_run() -> None:
    exposed = probes.cmd("pattern\t/run/dgxspark/hf-token*\nfile\t644\troot\troot\tregular file\t/run/dgxspark/hf-token\n")
    result = run(LAB_EXPOSURE, secret_files=exposed)
    assert [(f["node"], f["name"]) for f in result["failures"]] == [("lab-worker", "secret_files")]
    assert "chmod 600 /run/dgxspark/hf-token" in result["message"]


def test_an_unknown_launcher_is_refused() -> None:
    with pytest.raises(ModuleFail, match="launcher"):
        run(dict(LAB_EXPOSURE, launcher="podman"))


def test_the_exposure_suboptions_are_documented_as_specified() -> None:
    docs = yaml.safe_load(preflight_report.DOCUMENTATION)["options"]["exposure"]["suboptions"]
    seen: dict[str, Any] = {}

    def capture(self: Any, argument_spec: dict[str, Any], **_kwargs: Any) -> None:
        seen.update(argument_spec)
        raise RuntimeError("captured")

    with mock.patch("ansible.module_utils.basic.AnsibleModule.__init__", capture), pytest.raises(RuntimeError):
        main()
    spec = seen["exposure"]["options"]
    assert set(docs) == set(spec)
    for name, option in spec.items():
        assert docs[name]["type"] == option["type"], name
        assert docs[name].get("default") == option.get("default"), name
        assert docs[name].get("choices") == option.get("choices"), name
        assert docs[name].get("elements") == option.get("elements"), name
