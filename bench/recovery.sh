#!/usr/bin/env bash
# Recovery by the group guard on the lab: from a rank's death to serving again, against the engine's own start in
# the same run. Goals: recovery <= 1.2x the engine's start; detection <= 5 s for a crash, <= grace + 5 s for a
# freeze (grace = guard_grace_seconds; the first failing probe comes up to one probe interval and one probe
# timeout after the freeze, so the script prints both the raw figure and the part beyond the grace).
# The engine's own start is measured on the restore itself: the worker's container start (as docker records it) to
# its rendezvous line, plus the head's container start to its first answered completion (the lab's CPU engine
# compiles kernels on its first request, ~20 s: the engine's time, not the guard's); the figure to the
# "Application startup complete." line (bench/launch.sh's) is printed too. Recovery is the fault's time to the
# guard's own "serves again" (a completion answered).
# The double fault: the worker killed, then killed again once the guard's restore started the head (after the
# worker's rendezvous, the head loading): the restore must end within 5 s of the second death (the restore watch),
# and the next restore serve; goal: serving again <= 1.2x the last restore's engine start plus 5 s of detection
# after the second death.
# Usage: bench/recovery.sh   (brings the lab up, stages and launches if needed; leaves the serve running)
# Logs: bench/out/recovery-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"
"$ROOT/bin/lab" up
venv_activate
inv=inventories/lab
tmp=$ROOT/bench/out/recovery-$(date +%Y%m%d-%H%M%S); mkdir -p "$tmp"
ansible-playbook -i $inv playbooks/firewall.yml playbooks/staging.yml playbooks/cache_flush.yml playbooks/launch.yml >"$tmp/launch.out"
guard() { docker exec dgxlab-head python3 -I /usr/local/lib/dgxspark-guard/dgxspark_group_guard.py status; }
count() { guard | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"]["restores_total"])'; }
wait_restore() {   # wait_restore BEFORE: until one more restore is recorded and the guard is armed again (10 min)
  local deadline=$((SECONDS + 600))
  until guard | python3 -c 'import json,sys; s=json.load(sys.stdin)["state"]; sys.exit(0 if s["restores_total"] > int(sys.argv[1]) and s["status"] in ("armed", "gave_up") else 1)' "$1"; do
    [ $SECONDS -lt $deadline ] || { echo "no restore within 600 s:"; guard; exit 1; }
    sleep 1
  done
}
stable=$(docker exec dgxlab-head python3 -c 'import json; print(json.load(open("/etc/dgxspark/guard.json")).get("stable_seconds", 0))')
settle() {   # until the guard is armed and its last restore has served for stable_seconds (2 min): a fault sooner
  # counts that restore as failed (it did not last), the guard's rule, and two such failures make it give up
  local deadline=$((SECONDS + 120))
  until guard | python3 -c 'import json,sys; d=json.load(sys.stdin); s=d["state"]; last=(s.get("last_restore") or {}).get("finished_at", 0); sys.exit(0 if s["status"] == "armed" and d["now"] - last >= float(sys.argv[1]) else 1)' "$stable"; do
    [ $SECONDS -lt $deadline ] || { echo "the guard did not settle (armed, last restore served ${stable} s) within 120 s:"; guard; exit 1; }
    sleep 1
  done
}
fault() {   # fault NAME NODE COMMAND...: inject, wait for the restore, print the figures
  local name=$1 node=$2; shift 2
  settle
  local before; before=$(count)
  local t0; t0=$(date +%s.%N)
  docker exec "dgxlab-$node" sh -c "$*"
  wait_restore "$before"
  guard >"$tmp/$name.json"
  docker exec dgxlab-worker docker logs --timestamps vllm_glm53 >"$tmp/$name-worker.log" 2>&1
  docker exec dgxlab-head docker logs --timestamps vllm_glm53 >"$tmp/$name-head.log" 2>&1
  python3 - "$name" "$t0" "$tmp" <<'PY'
import json, re, sys
from datetime import datetime
name, t0, tmp = sys.argv[1], float(sys.argv[2]), sys.argv[3]
state = json.load(open(f"{tmp}/{name}.json"))["state"]
r = state["last_restore"]
def ts(s):
    return datetime.fromisoformat(s.rstrip("Z")[:26] + "+00:00").timestamp()
def first_after(path, pattern, since):
    """The first line matching pattern at or after `since` (this start's, not an earlier start's)."""
    for line in open(path, errors="replace"):
        if re.search(pattern, line):
            when = ts(line.split(" ", 1)[0])
            if when >= since:
                return when
    raise SystemExit(f"{name}: no line matching {pattern!r} after the restore's start in {path}")
baseline = r.get("baseline", {})
w_start, h_start = ts(baseline["lab-worker"]), ts(baseline["lab-head"])
rdv = first_after(f"{tmp}/{name}-worker.log", r"Launching vLLM.*headless multiproc executor|world_size=[0-9]+ rank=[0-9]+", w_start)
ready = first_after(f"{tmp}/{name}-head.log", r"Application startup complete", h_start)
detect, recover = r["started_at"] - t0, r["finished_at"] - t0
# the engine's own start: the worker to its rendezvous, plus the head to its first answer (the guard's completion
# ends the restore: a first request that compiles kernels is the engine's time, not the guard's); and, for
# comparison with bench/launch.sh, the head only to its "Application startup complete."
engine = (rdv - w_start) + (r["finished_at"] - h_start)
to_ready = (rdv - w_start) + (ready - h_start)
print(f"{name:>14}: ok={r['ok']} detection {detect:5.1f} s, serving again after {recover:6.1f} s; engine start {engine:5.1f} s"
      f" (worker {rdv - w_start:.1f} + head to first answer {r['finished_at'] - h_start:.1f}) -> recovery ratio "
      f"{recover / engine:.2f} (goal <= 1.20); guard's own part {recover - engine:.1f} s; to the ready line only "
      f"{to_ready:.1f} s (ratio {recover / to_ready:.2f}); from the detection {recover - detect:.1f} s (ratio "
      f"{(recover - detect) / engine:.2f})")
PY
}
pid='$(docker inspect --format "{{.State.Pid}}" vllm_glm53)'
fault worker-crash worker "kill -KILL $pid"
fault head-crash head "kill -KILL $pid"
grace=$(docker exec dgxlab-head python3 -c 'import json; print(json.load(open("/etc/dgxspark/guard.json")).get("grace_seconds", 60))')
echo "freeze: grace_seconds=$grace (detection goal <= grace + 5 s)"
fault worker-freeze worker "docker pause vllm_glm53"
double_fault() {   # the worker killed, then again while the restore that follows loads the head
  settle
  local before; before=$(count)
  local t0; t0=$(date +%s.%N)
  docker exec dgxlab-worker sh -c "kill -KILL $pid"
  local deadline=$((SECONDS + 300))
  until [ "$(docker exec dgxlab-head docker inspect --format '{{.State.StartedAt}}' vllm_glm53 | xargs -I{} date -u -d {} +%s)" -gt "${t0%.*}" ]; do
    [ $SECONDS -lt $deadline ] || { echo "double fault: the guard's restore never started the head within 300 s:"; guard; exit 1; }
    sleep 0.5
  done
  docker exec dgxlab-worker sh -c "kill -KILL $pid"
  local t2; t2=$(date +%s.%N)
  wait_restore $((before + 1))
  guard >"$tmp/double-fault.json"
  python3 - "$t0" "$t2" "$tmp" <<'PY'
import json, sys
t0, t2, tmp = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
attempts = json.load(open(f"{tmp}/double-fault.json"))["state"]["attempts"]
aborted, final = attempts[-2], attempts[-1]
abort = aborted["finished_at"] - t2
again = final["finished_at"] - t2
# the engine's start is at most the last restore's own duration (which holds the guard's part too)
engine = final["duration_seconds"]
print(f"  double-fault: restore ok={aborted['ok']} ended {abort:4.1f} s after the second death (goal <= 5.0): "
      f"{aborted.get('error')}; next restore ok={final['ok']} ({engine:.1f} s), serving again {again:6.1f} s "
      f"after the second death ({final['finished_at'] - t0:.1f} s after the first) -> ratio "
      f"{(again - 5) / engine:.2f} of the restore after 5 s of detection (goal <= 1.20)")
PY
}
double_fault
