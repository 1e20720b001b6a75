# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard scenario's webhook receiver, on the controller: each POST (its path, Content-Type and JSON body) is one
line of JSON appended to a file, answered 204. Standard library only.

    python3 -I webhook_receiver.py ADDRESS PORT FILE
"""
from __future__ import annotations

import http.server
import json
import sys


class Receiver(http.server.BaseHTTPRequestHandler):
    out = ""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"unreadable": raw.decode("utf-8", "replace")}
        record = {"path": self.path, "content_type": self.headers.get("Content-Type"), "body": body}
        with open(self.out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args) -> None:  # pylint: disable=redefined-builtin
        sys.stderr.write("%s %s\n" % (self.address_string(), format % args))


def main(argv: list) -> int:
    address, port, out = argv[0], int(argv[1]), argv[2]
    handler = type("Handler", (Receiver,), {"out": out})
    http.server.ThreadingHTTPServer((address, port), handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
