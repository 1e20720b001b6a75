# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The YAML reads documented values by name: every node's CX7 address from the resolved configuration
(dgxspark_vllm_config.nodes[host].cx7_ip, dgxspark_vllm_config.head_cx7_ip), not from each host's variables; the
files dgxspark.vllm.service_files_info read by their name (by_name), not by their position in the list; and the
molecule scenarios check what the roles document (their outputs, the modules' returns, files and units on the
nodes), never a role's internal __<role>_* variables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]

# hostvars[x].dgxspark_vllm_cx7_ip, hostvars[x]['dgxspark_vllm_cx7_ip'], map('extract', hostvars, 'dgxspark_vllm_cx7_ip'),
# map('extract', hostvars) | map(attribute='dgxspark_vllm_cx7_ip')
HOSTVARS_CX7 = re.compile(
    r"hostvars(?:\[[^\n]*?\])+\s*(?:\.|\[\s*['\"])\s*dgxspark_vllm_cx7_ip"
    r"|['\"]extract['\"]\s*,\s*hostvars\s*,\s*['\"]dgxspark_vllm_cx7_ip"
    r"|['\"]extract['\"]\s*,\s*hostvars\s*\)[^\n]*attribute\s*=\s*['\"]dgxspark_vllm_cx7_ip")


def _files(*folders: str):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".yml", ".yaml", ".j2"):
                yield path


def _hostvars_cx7_reads(text: str) -> list[str]:
    return [match.group(0) for match in HOSTVARS_CX7.finditer(text)]


@pytest.mark.parametrize(("text", "found"), [
    ("{{ hostvars[item].dgxspark_vllm_cx7_ip }}", True),
    ("{{ hostvars[dgxspark_vllm_config.workers[0]].dgxspark_vllm_cx7_ip }}", True),
    ("{{ hostvars[x]['dgxspark_vllm_cx7_ip'] }}", True),
    ("{{ workers | map('extract', hostvars, 'dgxspark_vllm_cx7_ip') | list }}", True),
    ("{{ workers | map('extract', hostvars) | map(attribute='dgxspark_vllm_cx7_ip') | list }}", True),
    ("{{ dgxspark_vllm_config.nodes[item].cx7_ip }}", False),
    ("{{ workers | map('extract', dgxspark_vllm_config.nodes, 'cx7_ip') | list }}", False),
    ("{{ hostvars[item].ansible_host }} needs dgxspark_vllm_cx7_ip on every node", False),
])
def test_the_scan_sees_each_form_of_a_hostvars_read(text: str, found: bool) -> None:
    assert bool(_hostvars_cx7_reads(text)) is found


def test_roles_and_playbooks_read_every_nodes_cx7_address_from_the_configuration() -> None:
    found = [(str(path.relative_to(ROOT)), read) for path in _files("roles", "playbooks")
             for read in _hostvars_cx7_reads(path.read_text(encoding="utf-8"))]
    assert found == [], "read dgxspark_vllm_config.nodes[host].cx7_ip (or .head_cx7_ip) instead"


# files[2].exists, files[0]['content'], map('extract', hostvars, [..., 'files', 0, ...])
FILES_BY_POSITION = re.compile(r"\bfiles\s*\[\s*-?\d+\s*\]|['\"]files['\"]\s*,\s*-?\d+\s*[,\]]")


@pytest.mark.parametrize(("text", "found"), [
    ("when: not cache_flush_read.files[2].exists", True),
    ("{{ __guard_head_also.files [ 0 ].content }}", True),
    ("map('extract', hostvars, ['cache_flush_read', 'also', 'files', 0, 'content'])", True),
    ("when: not cache_flush_read.by_name.unit.exists", False),
    ("map('extract', hostvars, ['cache_flush_read', 'also', 'files'])", False),
    ("{{ cache_flush_read.files | map(attribute='path') }}", False),
])
def test_the_scan_sees_a_file_read_by_position(text: str, found: bool) -> None:
    assert bool(FILES_BY_POSITION.search(text)) is found


def test_roles_playbooks_and_scenarios_read_files_by_name() -> None:
    found = [(str(path.relative_to(ROOT)), match.group(0))
             for path in _files("roles", "playbooks", "extensions/molecule")
             for match in FILES_BY_POSITION.finditer(path.read_text(encoding="utf-8"))]
    assert found == [], "name the file (service_files_info's files[].name) and read it from by_name"


def _names(files: list) -> set[str]:
    return {item["name"] for item in files if "name" in item}


def test_every_file_read_by_name_is_one_the_read_names() -> None:
    """cache_flush_read.by_name.<name> is one of the flush service's files (tasks/read.yml); the guard's
    cache_flush_read.also.by_name.<name> one of the files the guard asks it to read alongside (tasks/prepare.yml,
    and disarm.yml's read, vars/main.yml)."""
    read = yaml.safe_load((ROOT / "roles/cache_flush/tasks/read.yml").read_text(encoding="utf-8"))
    program = yaml.safe_load((ROOT / "roles/cache_flush/vars/main.yml").read_text(encoding="utf-8"))
    # the program (and the module_utils part of it) read as 'program' (the node_program lookup's read_as), then the rest
    assert read[0]["dgxspark.vllm.service_files_info"]["files"] == "{{ __cache_flush_program_read + __cache_flush_read_files }}"
    assert "read_as='program'" in program["__cache_flush_program_read"]
    own = _names(read[0]["vars"]["__cache_flush_read_files"]) | {"program"}
    prepare = yaml.safe_load((ROOT / "roles/guard/tasks/prepare.yml").read_text(encoding="utf-8"))
    also = _names(prepare[0]["vars"]["__guard_head_read"]["files"]) | _names(prepare[0]["vars"]["__guard_worker_read"]["files"])
    guard_vars = yaml.safe_load((ROOT / "roles/guard/vars/main.yml").read_text(encoding="utf-8"))
    disarm = _names(guard_vars["__guard_disarm_head_read"]["files"]) | _names(guard_vars["__guard_disarm_worker_read"]["files"])
    assert own == {"program", "config", "unit"}
    assert also == {"config", "state", "maintenance", "public_key", "webhook", "host_key", "authorized_keys", "sudoers",
                    "program"}
    assert disarm == {"program", "public_key", "known_hosts", "ssh_config", "webhook", "sudoers", "authorized_keys",
                      "passwd"}
    # disarm.yml and its vars read what disarm's read names; everything else what prepare's names
    disarm_vars = {key: value for key, value in guard_vars.items() if key.startswith("__guard_disarm_")}
    disarm_text = (ROOT / "roles/guard/tasks/disarm.yml").read_text(encoding="utf-8") + yaml.safe_dump(disarm_vars)
    text = "".join(yaml.safe_dump({k: v for k, v in guard_vars.items() if k not in disarm_vars})
                   if path.as_posix().endswith("roles/guard/vars/main.yml") else path.read_text(encoding="utf-8")
                   for path in _files("roles", "playbooks", "extensions/molecule")
                   if not path.as_posix().endswith("roles/guard/tasks/disarm.yml"))
    own_reads = set(re.findall(r"(?<!also\.)by_name\.(\w+)", text.replace("also.by_name", "also.BY_NAME")))

    def also_reads(in_text: str) -> set[str]:
        pairs = set(re.findall(r"also\.by_name\.(\w+)|'also', 'by_name', '(\w+)'", in_text))
        return {name for pair in pairs for name in pair if name}

    assert own_reads and own_reads <= own, own_reads - own
    assert also_reads(text) and also_reads(text) <= also, also_reads(text) - also
    assert also_reads(disarm_text) and also_reads(disarm_text) <= disarm, also_reads(disarm_text) - disarm


def _internals(text: str) -> list[str]:
    roles = sorted((path.name for path in (ROOT / "roles").iterdir() if path.is_dir()), key=len, reverse=True)
    return [match.group(0) for match in re.finditer(r"\b__(?:%s)_[a-z0-9_]+" % "|".join(roles), text)]


@pytest.mark.parametrize(("text", "found"), [
    ("hostvars[dgxspark_vllm_config.head].__guard_plan.arm_reason", ["__guard_plan"]),
    ("- __launch_metrics is not defined", ["__launch_metrics"]),
    ("environment: \"{{ __checkpoint_env }}\"", ["__checkpoint_env"]),
    ("- guard_arm.armed and launch_plan.steps == ['done']", []),
    ("__scenario_own: 1", []),
])
def test_the_scan_sees_a_roles_internal(text: str, found: list) -> None:
    assert _internals(text) == found


def test_no_scenario_reads_a_roles_internals() -> None:
    found = [(str(path.relative_to(ROOT)), name) for path in _files("extensions/molecule")
             for name in _internals(path.read_text(encoding="utf-8"))]
    assert found == [], "read the role's documented output (its README) instead"
