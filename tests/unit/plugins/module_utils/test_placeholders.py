# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The example inventory's placeholders found in any value: <NAME> and the documentation address ranges."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._placeholders import (
    HIDDEN,
    Placeholder,
    describe,
    documentation_network,
    find_placeholders,
    placeholders_in_text,
    placeholders_in_value,
)

DOC4 = "in 192.0.2.0/24, a range reserved for documentation (RFC 5737)"


@pytest.mark.parametrize("text, expected", [
    ("<YOUR_USER>", [("<YOUR_USER>", "a placeholder")]),
    ("/home/<YOUR_USER>/.hf-cli/venv/bin/hf", [("<YOUR_USER>", "a placeholder")]),
    ("ghcr.io/tonyd2wild/vllm-glm53-flash@sha256:<DIGEST>", [("<DIGEST>", "a placeholder")]),
    ("192.0.2.10", [("192.0.2.10", DOC4)]),
    ("198.51.100.0/24", [("198.51.100.0/24", "in 198.51.100.0/24, a range reserved for documentation (RFC 5737)")]),
    ("http://203.0.113.5:8000/v1", [("203.0.113.5", "in 203.0.113.0/24, a range reserved for documentation "
                                                    "(RFC 5737)")]),
    ("2001:db8::1", [("2001:db8::1", "in 2001:db8::/32, a range reserved for documentation (RFC 3849)")]),
    ("[2001:db8:0:1::5]:8000", [("2001:db8:0:1::5", "in 2001:db8::/32, a range reserved for documentation "
                                                    "(RFC 3849)")]),
    ("<A> and <A>", [("<A>", "a placeholder")]),
    # not placeholders: real addresses, neighbours of the ranges, lower-case tags, versions, times
    ("10.77.1.11", []),
    ("192.0.3.1", []),
    ("198.51.101.0/24", []),
    ("192.0.2.0/23", []),     # wider than the range: a real network that holds it
    ("2001:db9::1", []),
    ("<think>", []),
    ("<tool_call>", []),
    ("1.2.3", []),
    ("10:30:00", []),
    ("v192.0.2.1", []),
    ("", []),
])
def test_placeholders_in_text(text: str, expected: list[tuple[str, str]]) -> None:
    assert placeholders_in_text(text) == expected


@pytest.mark.parametrize("value, expected", [
    ({"extra_env": {"A": "1", "B": "<IFACE>"}}, [("v.extra_env.B", "<IFACE>", "a placeholder")]),
    (["10.0.0.0/8", "192.0.2.0/24"], [("v[1]", "192.0.2.0/24", DOC4)]),
    ({"a": [{"b": "192.0.2.1"}]}, [("v.a[0].b", "192.0.2.1", DOC4)]),
    (8000, []),
    (True, []),
    (None, []),
])
def test_placeholders_in_value(value: Any, expected: list[tuple[str, str, str]]) -> None:
    assert placeholders_in_value(value, "v") == expected


def test_each_placeholder_once_with_every_host_that_holds_it() -> None:
    found = find_placeholders({
        "spark-a": {"ansible_user": "<YOUR_USER>", "ansible_host": "192.0.2.10", "port": 22},
        "spark-b": {"ansible_user": "<YOUR_USER>", "ansible_host": "192.0.2.11"},
    })
    assert found == [
        Placeholder("ansible_user", "<YOUR_USER>", "a placeholder", ("spark-a", "spark-b")),
        Placeholder("ansible_host", "192.0.2.10", DOC4, ("spark-a",)),
        Placeholder("ansible_host", "192.0.2.11", DOC4, ("spark-b",)),
    ]


def test_a_secrets_placeholder_is_named_but_not_shown() -> None:
    found = find_placeholders({"spark-a": {"dgxspark_vllm_api_key": "key-<API_KEY>"}}, {"dgxspark_vllm_api_key"})
    assert found == [Placeholder("dgxspark_vllm_api_key", HIDDEN, "a placeholder", ("spark-a",))]
    assert describe(found) == ["dgxspark_vllm_api_key on spark-a holds (hidden): a placeholder of the example "
                               "inventory; replace it with your own value (README.md, \"Quick start on real Sparks\")"]


def test_nothing_found_in_a_real_inventory() -> None:
    assert find_placeholders({"lab-head": {"ansible_host": "10.77.0.11", "dgxspark_vllm_cx7_ip": "10.77.1.11",
                                           "dgxspark_vllm_cx7_subnet": "10.77.1.0/24",
                                           "dgxspark_vllm_api_allowed_cidrs": ["10.77.0.1/32"]}}) == []


def test_describe_names_the_variable_the_hosts_and_the_range() -> None:
    assert describe([Placeholder("dgxspark_vllm_cx7_subnet", "198.51.100.0/24",
                                 "in 198.51.100.0/24, a range reserved for documentation (RFC 5737)",
                                 ("spark-a", "spark-b"))]) == [
        "dgxspark_vllm_cx7_subnet on spark-a, spark-b holds '198.51.100.0/24': in 198.51.100.0/24, a range reserved "
        "for documentation (RFC 5737), which the example inventory uses as a placeholder; replace it with your own "
        "value (README.md, \"Quick start on real Sparks\")"]


@pytest.mark.parametrize("text, network", [
    ("192.0.2.255", "192.0.2.0/24"), ("203.0.113.0/25", "203.0.113.0/24"), ("2001:db8:ffff::/48", "2001:db8::/32"),
    ("192.168.1.1", None), ("not an address", None), ("300.1.1.1", None),
])
def test_documentation_network(text: str, network: str | None) -> None:
    found = documentation_network(text)
    assert (str(found[0]) if found else None) == network
