# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does the Python that runs modules on each node have what the modules used there need?

Private to the dgxspark.vllm collection: this API may change at any time.

Pure logic, no Ansible imports and no I/O. The preflight role (``tasks/node_python.yml``) runs ``PROBE`` with the
node's module interpreter (a read-only ``python3 -c``, which works with any Python 3, where a module would not
start on a Python too old for it) and hands the registered results of every node here. Each node gets
``python`` (the version) and one check per library in ``LIBRARIES``, each failure with the package that fixes
it on Ubuntu / DGX OS.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class NodePythonError(Exception):
    """Input the decision cannot work with (malformed node data)."""


# huggingface_hub 2.4.0 (the checkpoint role's checkpoint_hf_packages, imported on the downloading nodes by
# dgxspark.vllm.hf_checkpoint) requires Python >= 3.10; ansible-core 2.19 itself runs modules on 3.8 and later.
MIN_PYTHON = (3, 10)
MIN_PYTHON_WHY = "huggingface_hub 2.4.0, which the checkpoint role runs on the nodes, requires it"


@dataclass(frozen=True)
class Library:
    """A library the modules import on the nodes, and how to install it."""

    name: str
    why: str
    apt: str


LIBRARIES = (
    Library("requests",
            "community.docker's modules (docker_container, docker_container_info, docker_image_info, "
            "docker_image_pull, ...) talk to the Docker API through it",
            "python3-requests"),
)

# Run as `<interpreter> -c PROBE <library>...`; prints one JSON line. Only reads: imports, versions.
PROBE = """\
import json, sys
found = {}
for name in sys.argv[1:]:
    try:
        module = __import__(name)
    except Exception as exc:
        found[name] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    else:
        found[name] = {"ok": True, "version": str(getattr(module, "__version__", ""))}
print(json.dumps({"version": list(sys.version_info[:3]), "executable": sys.executable, "libraries": found}))
"""


def probe_argv(interpreter: str) -> list[str]:
    """The probe's command line for one node's module interpreter."""
    return [interpreter, "-c", PROBE] + [lib.name for lib in LIBRARIES]


def _install_hint(node: str, interpreter: str, packages: list[str]) -> str:
    return ("On %s (Ubuntu / DGX OS): sudo apt-get install -y %s. If %s is not the system Python, install %s "
            "into it (%s -m pip install %s) or point ansible_python_interpreter at /usr/bin/python3."
            % (node, " ".join(packages), interpreter, ", ".join(p.replace("python3-", "") for p in packages),
               interpreter, " ".join(p.replace("python3-", "") for p in packages)))


def decide_node(name: str, interpreter: str, result: dict[str, Any]) -> dict[str, Any]:
    """One node's registered probe result -> its report (ok, python, libraries, failures with their fixes)."""
    if not isinstance(result, dict):
        raise NodePythonError("node %s: the probe result must be a dict, got %r" % (name, type(result).__name__))
    report: dict[str, Any] = {"node": name, "interpreter": interpreter, "ok": True, "python": None,
                              "executable": None, "libraries": {}, "failures": []}

    def fail(check: str, evidence: str, fix: str) -> None:
        report["ok"] = False
        report["failures"].append({"node": name, "name": check, "evidence": evidence, "fix": fix})

    rc = result.get("rc")
    stdout = str(result.get("stdout") or "").strip()
    if rc != 0 or not stdout:
        lines = str(result.get("stderr") or result.get("msg") or "").strip().splitlines()
        fail("python", "`%s -c <probe>` did not run (rc %s): %s" % (interpreter, rc, lines[-1] if lines else "no output"),
             "Install Python 3 (>= %d.%d) on %s (sudo apt-get install -y python3 python3-requests) or set "
             "ansible_python_interpreter to a Python 3 that exists there." % (MIN_PYTHON + (name,)))
        return report
    try:
        data = json.loads(stdout.splitlines()[-1])
        version = tuple(int(part) for part in data["version"])
        libraries = data["libraries"]
    except (ValueError, KeyError, TypeError) as exc:
        raise NodePythonError("node %s: the probe printed no report (%s): %r" % (name, exc, stdout[:200])) from exc

    report["python"] = ".".join(str(part) for part in version)
    report["executable"] = data.get("executable")
    if version[:2] < MIN_PYTHON:
        fail("python", "%s is Python %s" % (interpreter, report["python"]),
             "Python >= %d.%d is needed on %s (%s): use a newer OS release (DGX OS 7 / Ubuntu 24.04 has 3.12) "
             "or set ansible_python_interpreter to a Python >= %d.%d there."
             % (MIN_PYTHON + (name, MIN_PYTHON_WHY) + MIN_PYTHON))

    missing = []
    for lib in LIBRARIES:
        found = libraries.get(lib.name) or {"ok": False, "error": "not probed"}
        report["libraries"][lib.name] = found.get("version") if found.get("ok") else None
        if not found.get("ok"):
            missing.append(lib)
            fail("python.%s" % lib.name,
                 "%s cannot import %s (%s); %s" % (interpreter, lib.name, found.get("error", ""), lib.why), "")
    if missing:
        hint = _install_hint(name, interpreter, [lib.apt for lib in missing])
        for failure in report["failures"]:
            if not failure["fix"]:
                failure["fix"] = hint
    return report


def evaluate(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Every node's probe -> ``{ok, reports, failures, message}``; message lists every failure with its fix."""
    reports: dict[str, Any] = {}
    for node in nodes:
        if not isinstance(node, dict) or not node.get("name"):
            raise NodePythonError("every node needs a name, got %r" % (node,))
        reports[node["name"]] = decide_node(str(node["name"]), str(node.get("interpreter") or "python3"),
                                            node.get("result") or {})
    failures = [failure for report in reports.values() for failure in report["failures"]]
    message = ""
    if failures:
        bad = sorted({failure["node"] for failure in failures})
        message = "\n".join(
            ["The Python that runs modules on %d node(s) (%s) lacks what the collection's modules need:"
             % (len(bad), ", ".join(bad))]
            + ["- %s %s: %s Fix: %s" % (f["node"], f["name"], f["evidence"], f["fix"]) for f in failures])
    return {"ok": not failures, "reports": reports, "failures": failures, "message": message}
