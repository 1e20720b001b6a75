# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HAProxy's runtime API over its UNIX socket: one command, its answer as text.

Private module: may change at any time. The one adapter the router's modules use (module_utils/_router.py decides).
"""
from __future__ import annotations

import socket


class SocketError(OSError):
    """The runtime socket did not answer; the message says where and why."""


def command(path: str, text: str, timeout: float = 5.0) -> str:
    """Send one command (a line) to HAProxy's runtime socket at ``path`` and return its whole answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.sendall(text.strip().encode() + b"\n")
            chunks = []
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        raise SocketError(f"the router's runtime socket {path} did not answer ({exc}): is dgxspark-router running?") from exc
    return b"".join(chunks).decode("utf-8", "replace")
