# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Values an inventory still holds from ``inventories/example``: its placeholders, found before anything starts.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

The example inventory marks what a user must fill in two ways: ``<NAME>`` placeholders (``<YOUR_USER>``,
``<DIGEST>``, ...) and addresses from the ranges reserved for documentation (RFC 5737: 192.0.2.0/24,
198.51.100.0/24, 203.0.113.0/24; RFC 3849: 2001:db8::/32), which no real network uses. A run with either left in
would try to reach nobody, or serve on an address no node has; `find_placeholders` names every one with its
variable and hosts, `describe` turns them into the config step's problems.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Union

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

DOCUMENTATION_NETWORKS: tuple[tuple[Network, str], ...] = (
    (ipaddress.ip_network("192.0.2.0/24"), "RFC 5737"),
    (ipaddress.ip_network("198.51.100.0/24"), "RFC 5737"),
    (ipaddress.ip_network("203.0.113.0/24"), "RFC 5737"),
    (ipaddress.ip_network("2001:db8::/32"), "RFC 3849"),
)
# <YOUR_USER>, <DIGEST>, <BYTES>: upper case, as the example writes them (a lower-case <think> or <tool_call> in a
# chat setting is text, not a placeholder)
PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*>")
_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?:/\d{1,2})?(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:/\d{1,3})?(?![\w:.])")
HIDDEN = "(hidden)"


@dataclass(frozen=True)
class Placeholder:
    """One placeholder left in: the variable (with the key or index inside it), the placeholder as found
    (``HIDDEN`` for a secret's), why it is one, and the hosts that hold it."""

    variable: str
    found: str
    reason: str
    hosts: tuple[str, ...]


def documentation_network(text: str) -> tuple[Network, str] | None:
    """The documentation range (and its RFC) an address or network lies in, or None (not one, or not an address)."""
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    for documentation, rfc in DOCUMENTATION_NETWORKS:
        if network.version == documentation.version and network.subnet_of(documentation):  # type: ignore[arg-type]
            return documentation, rfc
    return None


def placeholders_in_text(text: str) -> list[tuple[str, str]]:
    """(placeholder, why) for every ``<NAME>`` and documentation address in a string, in order, once each."""
    found: list[tuple[str, str]] = [(match.group(0), "a placeholder") for match in PLACEHOLDER.finditer(text)]
    for pattern in (_IPV4, _IPV6):
        for match in pattern.finditer(text):
            network = documentation_network(match.group(0))
            if network is not None:
                found.append((match.group(0), f"in {network[0]}, a range reserved for documentation ({network[1]})"))
    return list(dict.fromkeys(found))


def placeholders_in_value(value: Any, where: str) -> list[tuple[str, str, str]]:
    """(variable path, placeholder, why) inside a variable's value: strings, and the values of mappings and lists
    (``where.key``, ``where[0]``). Numbers, booleans and None hold none."""
    if isinstance(value, str):
        return [(where, found, why) for found, why in placeholders_in_text(value)]
    if isinstance(value, Mapping):
        return [item for key, inner in value.items() for item in placeholders_in_value(inner, f"{where}.{key}")]
    if isinstance(value, (list, tuple)):
        return [item for index, inner in enumerate(value) for item in placeholders_in_value(inner, f"{where}[{index}]")]
    return []


def find_placeholders(hostvars: Mapping[str, Mapping[str, Any]], secrets: Container[str] = ()) -> list[Placeholder]:
    """Every placeholder in the given variables of every host, one entry per variable and placeholder with the
    hosts that hold it (host order, then variable order as first seen). A secret's placeholder is shown hidden."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for host, values in hostvars.items():
        for name, value in values.items():
            for variable, found, why in placeholders_in_value(value, name):
                key = (variable, HIDDEN if name in secrets else found, why)
                hosts = seen.setdefault(key, [])
                if host not in hosts:
                    hosts.append(host)
    return [Placeholder(variable=variable, found=found, reason=why, hosts=tuple(hosts))
            for (variable, found, why), hosts in seen.items()]


def describe(found: list[Placeholder]) -> list[str]:
    """One problem per placeholder, naming the variable, the hosts and what to put there."""
    out = []
    for item in found:
        shown = item.found if item.found == HIDDEN else repr(item.found)
        if item.reason == "a placeholder":
            what = "a placeholder of the example inventory"
        else:
            what = f"{item.reason}, which the example inventory uses as a placeholder"
        out.append(f"{item.variable} on {', '.join(item.hosts)} holds {shown}: {what}; replace it with your own value "
                   "(README.md, \"Quick start on real Sparks\")")
    return out
