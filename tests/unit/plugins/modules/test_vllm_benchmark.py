# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_benchmark against a small fake OpenAI server on loopback."""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_benchmark
from helpers.module_runner import ModuleFail, run_module


class Fake(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _json(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json({"data": [{"id": "m", "max_model_len": 4096}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._json({"count": len(body["prompt"]) // 3, "max_model_len": 4096})
            return
        if body["model"] != "m":
            self._json({"error": {"message": "model not found"}}, 404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(body["max_tokens"]):
            self.wfile.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        usage = {"prompt_tokens": 10, "completion_tokens": body["max_tokens"]}
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_benchmark_writes_csv_json_png(server, tmp_path):
    result = run_module(vllm_benchmark.main, {"api_url": server, "model": "m", "max_tokens": 8,
                                              "large_prompt_tokens": 256, "output_dir": str(tmp_path)})
    assert result["changed"] is True
    assert result["decode"]["completion_tokens"] == 8
    assert [r["concurrency"] for r in result["rows"] if r["test"] == "concurrency"] == [1, 2, 4]
    assert all(r["errors"] == 0 for r in result["rows"])
    for path in result["files"].values():
        assert os.path.getsize(path) > 0
    with open(result["files"]["png"], "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_benchmark_check_mode_sends_nothing(tmp_path):
    result = run_module(vllm_benchmark.main, {"api_url": "http://127.0.0.1:9", "model": "m",
                                              "output_dir": str(tmp_path)}, check_mode=True)
    assert result["changed"] is True and not os.listdir(tmp_path)


def test_benchmark_wrong_model_fails(server, tmp_path):
    with pytest.raises(ModuleFail, match="HTTP 404"):
        run_module(vllm_benchmark.main, {"api_url": server, "model": "other", "max_tokens": 4,
                                         "large_prompt_tokens": 128, "output_dir": str(tmp_path)})
