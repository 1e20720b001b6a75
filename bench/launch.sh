#!/usr/bin/env bash
# Launch overhead on the lab: the launch playbook's wall time against the engine's own time to ready
# (the worker container's start, as docker records it, to the head's "Application startup complete." in its
# log: the engine's own process start, imports included, to ready),
# and the time of a no-op re-run. Goals: overhead <= 10 % of engine start; no-op re-run < 20 s.
# Usage: bench/launch.sh   (brings the lab up and stages the model if needed; leaves the serve running)
# Env: BENCH_TASKS (how many of the slowest tasks to list, default 12). Logs: bench/out/launch-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"
"$ROOT/bin/lab" up
venv_activate
inv=inventories/lab
ansible-playbook -i $inv playbooks/staging.yml playbooks/cache_flush.yml >/dev/null
ansible-playbook -i $inv playbooks/teardown.yml >/dev/null        # a cold launch: no serve container
tmp=$ROOT/bench/out/launch-$(date +%Y%m%d-%H%M%S); mkdir -p "$tmp"
t0=$(date +%s.%N)
ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=${BENCH_TASKS:-12} \
  ansible-playbook -i $inv playbooks/launch.yml >"$tmp/launch.out"
t1=$(date +%s.%N)
ansible-playbook -i $inv playbooks/launch.yml >/dev/null
t2=$(date +%s.%N)
docker exec dgxlab-worker docker logs --timestamps vllm_glm53 >"$tmp/worker.log" 2>&1
docker exec dgxlab-head docker logs --timestamps vllm_glm53 >"$tmp/head.log" 2>&1
first=$(docker exec dgxlab-worker docker inspect --format '{{.State.StartedAt}}' vllm_glm53)
ready=$(grep 'Application startup complete' "$tmp/head.log" | sed -n 1p | cut -d' ' -f1)
python3 - "$t0" "$t1" "$t2" "$first" "$ready" <<'PY'
import sys
from datetime import datetime
t0, t1, t2 = (float(x) for x in sys.argv[1:4])
def ts(s):
    return datetime.fromisoformat(s.rstrip("Z")[:26]).timestamp()
engine = ts(sys.argv[5]) - ts(sys.argv[4])
launch, noop = t1 - t0, t2 - t1
print(f"launch wall time           {launch:7.1f} s")
print(f"engine time to ready       {engine:7.1f} s  (worker container start -> head 'Application startup complete.')")
print(f"overhead                   {launch - engine:7.1f} s  ratio {(launch - engine) / engine:.2f} of engine start (goal <= 0.10)")
print(f"  before the first rank    {ts(sys.argv[4]) - t0:7.1f} s  (playbook start -> worker container start)")
print(f"  after the head serves    {t1 - ts(sys.argv[5]):7.1f} s  (head ready -> playbook end)")
print(f"no-op re-run               {noop:7.1f} s  ratio {noop / 20:.2f} of the 20 s goal")
PY
echo "slowest tasks of the launch (ansible.posix.profile_tasks):"
sed -n '/^=\{10,\}/,$p' "$tmp/launch.out" | sed -n "2,$(( ${BENCH_TASKS:-12} + 1 ))p"
