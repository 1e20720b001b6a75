#!/usr/bin/env bash
# Checkpoint staging on the lab with the hub's link shaped to a slow rate (tc tbf on the hub container's eth0;
# the node-to-node CX7 link is not shaped), same checkpoint (dgxspark-lab/random-4x16, 64 MiB), in one run:
#   - the recipe's method: checkpoint_mode=independent, every node downloads from the hub;
#   - ours: checkpoint_mode=fanout, the head downloads, the worker copies over the CX7 link and re-verifies.
# Each is the checkpoint step alone (playbooks/staging.yml --tags checkpoint) from empty trees, timed wall to wall,
# with the hub's byte counter; then the same step again with everything in place (its fixed cost, printed for
# reading the ratio). Goals: ours <= 0.55x the recipe's time; hub bytes of ours = 1x the checkpoint.
# Then bench/verify.sh: verification throughput against a plain read (goal >= 0.8x), on a sample of its own.
# Usage: bench/staging.sh   (brings the lab up, tears down a running serve, stages the image; removes the
#        shaping and its own checkpoint trees on exit)
# Env: BENCH_HUB_RATE (tc rate, default 3mbit: a copy from the hub takes about 3 minutes, so the transfer, not
#      Ansible's fixed cost of about 23 s per run, dominates, as it does for the real 185 GB checkpoint at any
#      internet rate), and bench/verify.sh's variables. Logs: bench/out/staging-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"

RATE=${BENCH_HUB_RATE:-3mbit}
HUB=http://10.77.0.6                      # the lab hub (bin/lab), container dgxlab-hub
REPO=dgxspark-lab/random-4x16
TREE=/var/tmp/models/bench-staging-random   # this bench's own tree on each node
NODES=(dgxlab-head dgxlab-worker)
inv=inventories/lab
out=$ROOT/bench/out/staging-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"

unshape() { docker exec dgxlab-hub tc qdisc del dev eth0 root >/dev/null 2>&1 || true; }
clear_trees() { for n in "${NODES[@]}"; do docker exec "$n" rm -rf "$TREE" /tmp/dgxspark-bench; done; }
cleanup() { unshape; clear_trees >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run_pb NAME ARGS...: ansible-playbook ARGS into $out/NAME.log; on failure, say so with the log's end
run_pb() {
  local name=$1; shift
  if ! ansible-playbook -i "$inv" "$@" >"$out/$name.log" 2>&1; then
    echo "bench: ansible-playbook ($name) failed; last lines of $out/$name.log:" >&2
    tail -n 30 "$out/$name.log" >&2
    exit 1
  fi
}

"$ROOT/bin/lab" up
venv_activate
unshape   # a shaping left by an earlier run that was killed hard

cat >"$out/vars.json" <<EOF
{"dgxspark_vllm_model_repo": "$REPO", "dgxspark_vllm_model_revision": "main", "dgxspark_vllm_model_path": "$TREE",
 "checkpoint_hf_endpoint": "$HUB", "checkpoint_progress_interval": 5, "checkpoint_min_free_bytes": 0}
EOF

# Unshaped and untimed: no serve (staging refuses next to one), the image on both nodes, huggingface_hub on
# both nodes (independent mode installs it on every node), so neither timed run pays for a first install.
run_pb teardown playbooks/teardown.yml
run_pb warmup playbooks/staging.yml -e checkpoint_mode=independent

ckpt_bytes=$(curl -sf "$HUB/api/models/$REPO?blobs=true" | python3 -c 'import json,sys; print(sum(s["size"] for s in json.load(sys.stdin)["siblings"]))')

docker exec dgxlab-hub tc qdisc replace dev eth0 root tbf rate "$RATE" burst 128kb latency 500ms
docker exec dgxlab-hub tc qdisc show dev eth0 | grep -q tbf || { echo "bench: the hub's eth0 is not shaped" >&2; exit 1; }

# stage MODE: the checkpoint step in MODE from empty trees, then again with everything in place.
# Sets T_<mode>, NOOP_<mode> (seconds) and BYTES_<mode> (hub body bytes of the timed run).
stage() {
  local mode=$1 t0 t1 t2
  clear_trees
  curl -sf -X POST "$HUB/_lab/reset" >/dev/null
  t0=$(date +%s.%N)
  run_pb "$mode" playbooks/staging.yml --tags checkpoint -e "@$out/vars.json" -e "checkpoint_mode=$mode"
  t1=$(date +%s.%N)
  printf -v "BYTES_$mode" '%s' "$(curl -sf "$HUB/_lab/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["body_bytes"])')"
  run_pb "$mode-noop" playbooks/staging.yml --tags checkpoint -e "@$out/vars.json" -e "checkpoint_mode=$mode"
  t2=$(date +%s.%N)
  printf -v "T_$mode" '%s' "$(python3 -c "print($t1 - $t0)")"
  printf -v "NOOP_$mode" '%s' "$(python3 -c "print($t2 - $t1)")"
  echo "bench: $mode staged in $(eval echo "\$T_$mode" | cut -c1-6) s" >&2
}
stage independent
stage fanout
unshape

python3 - "$ckpt_bytes" "$RATE" "$T_independent" "$NOOP_independent" "$BYTES_independent" \
  "$T_fanout" "$NOOP_fanout" "$BYTES_fanout" <<'PY'
import json, sys
size, rate = int(sys.argv[1]), sys.argv[2]
t_ind, noop_ind, b_ind = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
t_fan, noop_fan, b_fan = float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
def verdict(ok):
    return "met" if ok else "MISSED"
print(f"checkpoint                 dgxspark-lab/random-4x16, {size} bytes; hub link shaped to {rate} (tc tbf), CX7 link unshaped")
print(f"recipe (independent)       {t_ind:7.1f} s  hub bytes {b_ind:>11}  ({b_ind / size:.2f}x the checkpoint)")
print(f"ours (fan-out)             {t_fan:7.1f} s  hub bytes {b_fan:>11}  ({b_fan / size:.2f}x the checkpoint)")
ratio = t_fan / t_ind
print(f"time ratio                 {ratio:7.2f} of the recipe's time (goal <= 0.55: {verdict(ratio <= 0.55)})")
print(f"hub bytes, ours            {b_fan / size:7.2f}x the checkpoint (goal = 1.00: {verdict(b_fan == size)})")
print(f"fixed cost (re-run, all in place): independent {noop_ind:.1f} s, fan-out {noop_fan:.1f} s;"
      f" time ratio without it {(t_fan - noop_fan) / max(t_ind - noop_ind, 1e-9):.2f}")
PY
echo "logs: $out"
"$ROOT/bench/verify.sh"
