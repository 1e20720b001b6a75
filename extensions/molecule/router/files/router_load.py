# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router scenario's load: completions through the router at a fixed rate, each request's start, end and status.

    router_load.py load URL MODEL RATE SECONDS OUT.jsonl [MAX_TOKENS]   (the router's key in ROUTER_KEY)
    router_load.py judge OUT.jsonl DRAIN_STARTED READY_AT    (epoch seconds) -> one JSON line
    router_load.py phases OUT.jsonl NAME=START:END ...       (epoch seconds) -> one JSON line

SECONDS 0 runs until the file OUT.jsonl.stop exists (at most an hour). MAX_TOKENS (default 16): each request's
output length, generated whole (ignore_eos), so that a longer one keeps requests running at any moment.

A request is started every 1/RATE seconds in its own thread, whatever the earlier ones do (a fixed rate, as
``vllm bench serve --request-rate`` without its Poisson spread); each finished request is appended to OUT.jsonl
as one line at once, so a watcher sees the load's progress. The judge splits the requests by their start: before
the drain (they ran or were running when it began: each must succeed), between the drain and the cluster's return
(refused by the router, counted), after it (each must succeed). ``phases`` gives per named span the requests started
in it (sent, failed, each failed one's start and end, the p50 and p99 latency of those answered), the requests that
ended in it (ended, of which failed) and those running when it began (a kill's or a restart's requests in flight).
Standard library only.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request


def load(url: str, model: str, rate: float, seconds: float, out: str, max_tokens: int = 16) -> int:
    key = os.environ["ROUTER_KEY"]
    lock = threading.Lock()
    body = json.dumps({"model": model, "prompt": "The router sends this to a cluster", "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()

    def one(index: int) -> None:
        request = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
        start, status, error = time.time(), -1, ""
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                json.load(answer)
                status = answer.status
        except urllib.error.HTTPError as exc:
            status, error = exc.code, exc.read().decode("utf-8", "replace")[:200]
        except (OSError, ValueError) as exc:
            error = str(exc)[:200]
        line = json.dumps({"i": index, "start": start, "end": time.time(), "status": status, "error": error})
        with lock, open(out, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    threads = []
    begin = time.monotonic()
    index = 0
    stop = out + ".stop"
    limit = seconds if seconds > 0 else 3600.0
    while time.monotonic() - begin < limit and not (seconds <= 0 and os.path.exists(stop)):
        thread = threading.Thread(target=one, args=(index,))
        thread.start()
        threads.append(thread)
        index += 1
        time.sleep(max(0.0, begin + index / rate - time.monotonic()))
    for thread in threads:
        thread.join()
    return 0


def judge(path: str, drain_started: float, ready_at: float) -> dict:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    before = [r for r in rows if r["start"] < drain_started]
    during = [r for r in rows if drain_started <= r["start"] < ready_at]
    after = [r for r in rows if r["start"] >= ready_at]
    running = [r for r in before if r["end"] > drain_started]
    failed = [r for r in rows if r["status"] != 200]
    refused = [r for r in during if r["status"] != 200]
    return {
        "sent": len(rows), "failed": len(failed),
        "before_drain": len(before), "running_at_drain": len(running),
        "failed_before_drain": sum(r["status"] != 200 for r in before),
        "during_drain": len(during), "refused_during_drain": len(refused),
        "refused_statuses": sorted({r["status"] for r in refused}),
        "refusal_seconds_max": round(max((r["end"] - r["start"] for r in refused), default=0.0), 3),
        "after_ready": len(after), "failed_after_ready": sum(r["status"] != 200 for r in after),
        "errors": sorted({r["error"][:120] for r in failed if r["status"] not in (503,)})[:3],
    }


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(round(share * len(ordered))) - 1))] * 1000, 1)


def phases(path: str, spans: list[str]) -> dict:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    out = {}
    for span in spans:
        name, bounds = span.split("=", 1)
        start, end = bounds.split(":", 1)
        inside = [r for r in rows if float(start) <= r["start"] < float(end)]
        answered = [r["end"] - r["start"] for r in inside if r["status"] == 200]
        failed = [r for r in inside if r["status"] != 200]
        ended = [r for r in rows if float(start) <= r["end"] < float(end)]
        running = [r for r in rows if r["start"] < float(start) <= r["end"]]
        out[name] = {"sent": len(inside), "failed": len(failed), "p50_ms": _percentile(answered, 0.50),
                     "p99_ms": _percentile(answered, 0.99),
                     "ended": len(ended), "ended_failed": sum(r["status"] != 200 for r in ended),
                     "running_at_start": len(running),
                     "running_at_start_failed": sum(r["status"] != 200 for r in running),
                     "failures": [{"start": r["start"], "end": r["end"], "status": r["status"], "error": r["error"][:80]}
                                  for r in failed][:20]}
    return out


if __name__ == "__main__":
    if sys.argv[1] == "phases":
        print(json.dumps(phases(sys.argv[2], sys.argv[3:])))
        sys.exit(0)
    if sys.argv[1] == "load":
        sys.exit(load(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), sys.argv[6],
                      int(sys.argv[7]) if len(sys.argv) > 7 else 16))
    print(json.dumps(judge(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
