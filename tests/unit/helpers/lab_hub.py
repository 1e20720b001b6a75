"""Start lab/hub/hub.py in-process on 127.0.0.1 with a temporary repo root, for tests."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[3]
HUB_PY = ROOT / "lab" / "hub" / "hub.py"


def load_hub() -> Any:
    spec = importlib.util.spec_from_file_location("dgxspark_lab_hub", HUB_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hub = load_hub()


class RunningHub:
    def __init__(self, server: Any) -> None:
        self.server = server
        self.url = "http://127.0.0.1:%d" % server.server_address[1]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback test server
            return json.loads(resp.read() or b"null")

    def fault(self, **fault: Any) -> None:
        self.call("PUT", "/_lab/fault", fault)

    def clear_fault(self) -> None:
        self.call("DELETE", "/_lab/fault")

    def stats(self) -> dict:
        return self.call("GET", "/_lab/stats")

    def reset(self) -> None:
        self.call("POST", "/_lab/reset")

    def rescan(self) -> dict:
        return self.call("POST", "/_lab/rescan")


@contextlib.contextmanager
def running_hub(root: Path, token: str | None = None) -> Iterator[RunningHub]:
    server = hub.make_server(str(root), "127.0.0.1", 0, token)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield RunningHub(server)
    finally:
        server.shutdown()
        server.server_close()


def online_hub_env(monkeypatch: Any, url: str) -> None:
    """Let huggingface_hub reach the loopback hub inside one test (bin/test sets HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants  # pylint: disable=import-outside-toplevel
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
