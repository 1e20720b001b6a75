#!/usr/bin/env bash
# Checkpoint staging on the lab with the hub's link shaped to a slow rate (tc tbf on the hub container's eth0;
# the node-to-node CX7 link is not shaped), same checkpoint (dgxspark-lab/random-4x16, 64 MiB), in one run:
#   - the recipe's method: checkpoint_mode=independent, every node downloads from the hub;
#   - ours: checkpoint_mode=fanout, the head downloads, the worker copies over the CX7 link and re-verifies.
# Each is the checkpoint step alone (playbooks/staging.yml --tags checkpoint) from empty trees, timed wall to wall,
# with the hub's byte counter; then the same step again with everything in place (its fixed cost, printed for
# reading the ratio). Goals: ours <= 0.55x the recipe's time; hub bytes of ours = 1x the checkpoint.
# Then verification throughput on the head: the hf_checkpoint module's verify-only path (its own code,
# _hub_stage.stage with download=false and a full hash of every file, against the hub's manifest) run inside
# the node, against `cat` of the same files > /dev/null, the page cache dropped before each; median of
# BENCH_VERIFY_ROUNDS rounds. Goal: verification >= 0.8x the plain read's throughput.
# Usage: bench/staging.sh   (brings the lab up, tears down a running serve, stages the image; removes the
#        shaping and its own checkpoint trees on exit)
# Env: BENCH_HUB_RATE (tc rate, default 16mbit: the two independent downloads take about 67 s),
#      BENCH_VERIFY_ROUNDS (default 5). Logs: bench/out/staging-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"

RATE=${BENCH_HUB_RATE:-16mbit}
ROUNDS=${BENCH_VERIFY_ROUNDS:-5}
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

# Verification throughput on the head, inside the node (no SSH or module transfer in the timing): the
# collection's module_utils as the module ships them, the hub's manifest for the commit, the fan-out's tree.
python3 - "$ROOT/plugins/module_utils/_manifest.py" "$HUB" "$REPO" >"$out/manifest.json" <<'PY'
import importlib.util, json, sys, urllib.request
spec = importlib.util.spec_from_file_location("bench_manifest", sys.argv[1])
mf = importlib.util.module_from_spec(spec)
sys.modules["bench_manifest"] = mf   # dataclasses look their module up
spec.loader.exec_module(mf)
with urllib.request.urlopen("%s/api/models/%s?blobs=true" % (sys.argv[2], sys.argv[3]), timeout=60) as resp:
    print(json.dumps(mf.manifest_from_model_info(json.load(resp), repo=sys.argv[3]).to_dict()))
PY
cat >"$out/verify_bench.py" <<'PY'
import json, os, statistics, subprocess, sys, time
sys.path.insert(0, "/tmp/dgxspark-bench")
from ansible_collections.dgxspark.vllm.plugins.module_utils import _hub_stage as hs
from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf

manifest = mf.manifest_from_dict(json.load(open(sys.argv[1])))
root, rounds = sys.argv[2], int(sys.argv[3])
files = [os.path.join(root, e.path) for e in manifest.files]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")


def verify():
    out = hs.stage(repo=manifest.repo, revision=manifest.commit, layout_kind="local_dir", local_dir=root,
                   cache_dir=None, endpoint=None, token=None, download=False, full_verify=True, check_mode=False,
                   manifest=manifest, min_free_bytes=0)
    if not out.verify.ok or out.verify.hashed_bytes != manifest.total_bytes:
        sys.exit("verification did not hash the whole tree good: %s" % out.verify.to_dict())


def read():
    subprocess.run(["cat"] + files, stdout=subprocess.DEVNULL, check=True)


times = {"verify": [], "read": []}
for i in range(rounds):
    order = (("verify", verify), ("read", read)) if i % 2 == 0 else (("read", read), ("verify", verify))
    for name, run in order:
        drop_caches()
        t0 = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - t0)
print(json.dumps({"bytes": manifest.total_bytes, "verify_s": statistics.median(times["verify"]),
                  "read_s": statistics.median(times["read"]), "all": times}))
PY
# into the node through `docker exec` (docker cp cannot write under the node's /tmp, a tmpfs mount)
put() { docker exec -i dgxlab-head sh -c "mkdir -p \"\$(dirname '$2')\" && cat > '$2'" <"$1"; }
for f in _manifest.py _hub_stage.py; do
  put "$ROOT/plugins/module_utils/$f" "/tmp/dgxspark-bench/ansible_collections/dgxspark/vllm/plugins/module_utils/$f"
done
put "$out/manifest.json" /tmp/dgxspark-bench/manifest.json
put "$out/verify_bench.py" /tmp/dgxspark-bench/verify_bench.py
docker exec dgxlab-head python3 /tmp/dgxspark-bench/verify_bench.py /tmp/dgxspark-bench/manifest.json "$TREE" "$ROUNDS" \
  >"$out/verify.json"

python3 - "$ckpt_bytes" "$RATE" "$T_independent" "$NOOP_independent" "$BYTES_independent" \
  "$T_fanout" "$NOOP_fanout" "$BYTES_fanout" "$out/verify.json" "$ROUNDS" <<'PY'
import json, sys
size, rate = int(sys.argv[1]), sys.argv[2]
t_ind, noop_ind, b_ind = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
t_fan, noop_fan, b_fan = float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
v = json.load(open(sys.argv[9]))
rounds = sys.argv[10]
def verdict(ok):
    return "met" if ok else "MISSED"
mib = 1 << 20
print(f"checkpoint                 dgxspark-lab/random-4x16, {size} bytes; hub link shaped to {rate} (tc tbf), CX7 link unshaped")
print(f"recipe (independent)       {t_ind:7.1f} s  hub bytes {b_ind:>11}  ({b_ind / size:.2f}x the checkpoint)")
print(f"ours (fan-out)             {t_fan:7.1f} s  hub bytes {b_fan:>11}  ({b_fan / size:.2f}x the checkpoint)")
ratio = t_fan / t_ind
print(f"time ratio                 {ratio:7.2f} of the recipe's time (goal <= 0.55: {verdict(ratio <= 0.55)})")
print(f"hub bytes, ours            {b_fan / size:7.2f}x the checkpoint (goal = 1.00: {verdict(b_fan == size)})")
print(f"fixed cost (re-run, all in place): independent {noop_ind:.1f} s, fan-out {noop_fan:.1f} s;"
      f" time ratio without it {(t_fan - noop_fan) / max(t_ind - noop_ind, 1e-9):.2f}")
vt, rt = v["bytes"] / v["verify_s"] / mib, v["bytes"] / v["read_s"] / mib
print(f"verification (full hash)   {vt:7.1f} MiB/s  ({v['verify_s']:.3f} s, median of {rounds}, page cache dropped)")
print(f"plain read (cat)           {rt:7.1f} MiB/s  ({v['read_s']:.3f} s, median of {rounds}, page cache dropped)")
print(f"throughput ratio           {vt / rt:7.2f} of a plain read (goal >= 0.80: {verdict(vt / rt >= 0.8)})")
PY
echo "logs: $out"
