#!/usr/bin/env bash
# Launch overhead on the lab: the launch playbook's wall time against the engine's own time to ready, and the
# time of a no-op re-run. Goals: overhead <= 10 % of engine start; no-op re-run <= 5 s.
# The engine's own time is what a perfect operator of the recipe would wait: the worker's container start (as
# docker records it) to its rendezvous line, plus the head's container start to its "Application startup
# complete." The gap between the worker's rendezvous and the head's start is the launch's own latency (noticing
# the rendezvous, starting the head's container) and counts as overhead.
# The group guard is installed before the launch (site.yml's cache_flush step, timed and printed apart) and armed by
# the launch's last play, which the wall time counts; that play's own time (profile_tasks' elapsed time at its first
# task to the run's end) is printed too, with the overhead and ratio of the launch's play alone: what the guard's play
# after the launch costs.
# Usage: bench/launch.sh   (brings the lab up and stages the model if needed; leaves the serve running)
# The no-op re-run is measured BENCH_NOOP_RUNS times (default 5) from right after the launch; the ratio is the median's.
# Beside it, as many runs of the floor (bench/noop_floor.yml): the least any no-op in the launch's shape costs on this
# machine (two plays, the configuration and one read a node each), so that the no-op's own cost is the difference.
# The lab's nodes share this machine's kernel, so each page-cache flush on a node (the launch's flush service, and the
# guard's follow mode until the load ends) also drops the controller's cache: the bench counts them.
# Env: BENCH_TASKS (how many of the slowest tasks to list, default 12); BENCH_EXTRA_VARS (one -e value for all
# measured runs, e.g. '{"dgxspark_vllm_poll_interval": 2}', to compare a setting). Logs: bench/out/launch-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"
"$ROOT/bin/lab" up
venv_activate
inv=inventories/lab
ansible-playbook -i $inv playbooks/firewall.yml playbooks/staging.yml playbooks/cache_flush.yml >/dev/null  # the launch refuses to serve unfirewalled
# the KV budget recorded for this cluster (a launch without one calibrates: two engine starts, not one)
ansible-playbook -i $inv playbooks/launch.yml >/dev/null
ansible-playbook -i $inv playbooks/teardown.yml >/dev/null        # a cold launch: no serve container
tmp=$ROOT/bench/out/launch-$(date +%Y%m%d-%H%M%S); mkdir -p "$tmp"
# the step before the launch in site.yml: the teardown disarmed the group guard and removed its access; cache_flush.yml
# installs it again, not armed (the launch's last play arms it). Timed apart: site.yml's cost, not the launch's.
g0=$(date +%s.%N)
ansible-playbook -i $inv playbooks/cache_flush.yml >"$tmp/install.out"
guard_install=$(echo "$(date +%s.%N) - $g0" | bc)
t0=$(date +%s.%N)
extra=(); [ -z "${BENCH_EXTRA_VARS:-}" ] || extra=(-e "$BENCH_EXTRA_VARS")
ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=${BENCH_TASKS:-12} \
  ansible-playbook -i $inv playbooks/launch.yml "${extra[@]}" >"$tmp/launch.out"
t1=$(date +%s.%N)
ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=${BENCH_TASKS:-12} \
  ansible-playbook -i $inv playbooks/launch.yml "${extra[@]}" >"$tmp/noop.out"
t2=$(date +%s.%N)
noops=("$(echo "$t2 - $t1" | bc)")
# the floor: the least any no-op in the launch's shape costs here (bench/noop_floor.yml), as many runs, median. The
# runs alternate (floor, no-op, floor, ...): this machine's speed drifts by tens of percent within minutes, and a drift
# then falls on both alike instead of on whichever ran last
floors=()
runs=$(( ${BENCH_NOOP_RUNS:-5} > 1 ? ${BENCH_NOOP_RUNS:-5} : 1 ))
for i in $(seq 1 "$runs"); do
  a=$(date +%s.%N)
  ansible-playbook -i $inv bench/noop_floor.yml "${extra[@]}" >"$tmp/floor$i.out"
  floors+=("$(echo "$(date +%s.%N) - $a" | bc)")
  [ "$i" -lt "$runs" ] || break
  a=$(date +%s.%N)
  ansible-playbook -i $inv playbooks/launch.yml "${extra[@]}" >"$tmp/noop$((i + 1)).out"
  noops+=("$(echo "$(date +%s.%N) - $a" | bc)")
done
since=$(date -u -d "@${t0%.*}" '+%Y-%m-%d %H:%M:%S')
flushes=0
for node in dgxlab-head dgxlab-worker; do
  n=$(docker exec $node journalctl -u dgxspark-cache-flush -u dgxspark-cache-flush-follow --since "$since UTC" \
        --no-pager -o cat 2>/dev/null | grep -c '^flushed page cache' || true)
  flushes=$((flushes + n))
done
docker exec dgxlab-worker docker logs --timestamps vllm_glm53 >"$tmp/worker.log" 2>&1
docker exec dgxlab-head docker logs --timestamps vllm_glm53 >"$tmp/head.log" 2>&1
first=$(docker exec dgxlab-worker docker inspect --format '{{.State.StartedAt}}' vllm_glm53)
head=$(docker exec dgxlab-head docker inspect --format '{{.State.StartedAt}}' vllm_glm53)
# the rendezvous as the launch's wait recognises it (plugins/module_utils/_vllm_log.py, phase rendezvous)
rdv=$(grep -m1 -E 'Launching vLLM.*headless multiproc executor|world_size=[0-9]+ rank=[0-9]+' "$tmp/worker.log" | cut -d' ' -f1)
ready=$(grep -m1 'Application startup complete' "$tmp/head.log" | cut -d' ' -f1)
python3 - "$t0" "$t1" "$first" "$rdv" "$head" "$ready" "$flushes" "$guard_install" "$tmp/launch.out" "${floors[*]}" \
  "${noops[@]}" <<'PY'
import re
import statistics
import sys
from datetime import datetime
t0, t1 = (float(x) for x in sys.argv[1:3])
def ts(s):
    return datetime.fromisoformat(s.rstrip("Z")[:26]).timestamp()
first, rdv, head, ready = (ts(x) for x in sys.argv[3:7])
flushes = int(sys.argv[7])
guard_install = float(sys.argv[8])
floors = [float(x) for x in sys.argv[10].split()]
noops = [float(x) for x in sys.argv[11:]]


def guard_play_seconds(path):
    """The guard's play of playbooks/launch.yml (its second play), from profile_tasks' elapsed time at its first task
    to the run's end (TASKS RECAP); None when the output has no such play."""
    in_guard = recap = False
    start = None
    with open(path, encoding="utf-8") as out:
        for line in out:
            in_guard = in_guard or line.startswith("PLAY [Arm the group guard")
            recap = recap or line.startswith("TASKS RECAP")
            m = re.search(r"\+0000 \(\d+:\d+:[\d.]+\)\s+(\d+):(\d+):([\d.]+)", line)
            if not m:
                continue
            elapsed = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
            if recap:   # the recap's own line: the run's end
                return elapsed - start if start is not None else None
            if in_guard and start is None:
                start = elapsed
    return None


guard_play = guard_play_seconds(sys.argv[9])
floor = statistics.median(floors)
engine = (rdv - first) + (ready - head)
launch, noop = t1 - t0, statistics.median(noops)
print(f"launch wall time           {launch:7.1f} s")
print(f"engine time to ready       {engine:7.1f} s  (worker start -> its rendezvous {rdv - first:.1f} s,"
      f" + head start -> 'Application startup complete.' {ready - head:.1f} s)")
print(f"overhead                   {launch - engine:7.1f} s  ratio {(launch - engine) / engine:.2f} of engine start (goal <= 0.10)")
print(f"  before the first rank    {first - t0:7.1f} s  (playbook start -> worker container start)")
print(f"  rendezvous -> head start {head - rdv:7.1f} s  (noticing the worker's rendezvous, starting the head)")
print(f"  after the head serves    {t1 - ready:7.1f} s  (head ready -> playbook end)")
print(f"  (worker start -> head ready, the gap included: {ready - first:.1f} s)")
if guard_play is not None:
    alone = launch - engine - guard_play
    print(f"  of which the guard's play {guard_play:7.1f} s  (its own play after the launch; the launch's play alone: overhead"
          f" {alone:.1f} s, ratio {alone / engine:.2f})")
print(f"no-op re-run               {noop:7.1f} s  ratio {noop / 5:.2f} of the 5 s goal"
      f"  (median of {len(noops)}: {', '.join(f'{x:.1f}' for x in noops)} s)")
print(f"no-op floor                {floor:7.1f} s  ratio {floor / 5:.2f} of the 5 s goal  (bench/noop_floor.yml: two plays,"
      f" the configuration and one read a node each, median of {len(floors)}: {', '.join(f'{x:.1f}' for x in floors)} s,"
      f" run between the no-ops); the no-op spends {noop - floor:.1f} s above it")
print(f"before the launch          {guard_install:7.1f} s  (cache_flush.yml after the teardown: the flush service read, the"
      f" group guard installed, not armed; site.yml's step before the launch, not counted above)")
print(f"page-cache flushes         {flushes:7d}    on the lab's nodes while measured (each drops this machine's cache)")
PY
echo "slowest tasks of the launch (ansible.posix.profile_tasks):"
sed -n '/^=\{10,\}/,$p' "$tmp/launch.out" | sed -n "2,$(( ${BENCH_TASKS:-12} + 1 ))p"
echo "slowest tasks of the no-op re-run:"
sed -n '/^=\{10,\}/,$p' "$tmp/noop.out" | sed -n "2,$(( ${BENCH_TASKS:-12} + 1 ))p"
