# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The YAML reads documented values by name: every node's CX7 address from the resolved configuration
(dgxspark_vllm_config.nodes[host].cx7_ip, dgxspark_vllm_config.head_cx7_ip), not from each host's variables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

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
