# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The address a node's ansible_host names, as the controller's SSH client would find it.

Private: may change at any time. For the action plugins that decide from the addresses Ansible reaches the nodes on
(the firewall's management networks, the addresses the workers accept the group guard's key from).
"""
from __future__ import annotations

import ipaddress
import socket


def resolve(address: str) -> str:
    """The IP address `address` is or resolves to on the controller (the first the resolver gives); "" when none."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(address, None)[0][4][0])
    except (OSError, IndexError, UnicodeError):
        return ""
