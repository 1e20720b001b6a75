#!/usr/bin/env bash
# Verification throughput on the lab's head node: the collection's own verify-only path (_hub_stage.stage with
# download=false and a full hash of every file against a manifest, as the hf_checkpoint module runs it) against a
# plain sequential read (`cat` > /dev/null) of the same files, the page cache dropped before each run, the two
# alternating; median of BENCH_VERIFY_ROUNDS rounds. Goal: verification >= 0.8x the plain read's throughput.
#
# The sample is shaped like a checkpoint: BENCH_VERIFY_SHARDS safetensors-sized files of random bytes (LFS
# entries, SHA-256) plus small JSON files (git blob ids), written inside the node on its disk. Its manifest comes
# from coreutils' sha256sum and git's hash-object, not from the collection's code, so the run also checks that the
# collection's hashes agree with two independent tools. A real checkpoint (185 GB) is larger than the Spark's
# memory: it is read from disk, hence the dropped page cache.
#
# Usage: bench/verify.sh   (brings the lab up, tears down a running serve; removes its sample on exit)
# Env: BENCH_VERIFY_SHARDS (default 4), BENCH_VERIFY_MIB (MiB per shard, default 512), BENCH_VERIFY_ROUNDS
#      (default 5). Logs: bench/out/verify-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"

SHARDS=${BENCH_VERIFY_SHARDS:-4}
MIB=${BENCH_VERIFY_MIB:-512}
ROUNDS=${BENCH_VERIFY_ROUNDS:-5}
NODE=dgxlab-head
SAMPLE=/var/tmp/dgxspark-bench-verify        # the sample tree, on the node's disk
WORK=/tmp/dgxspark-bench-verify-code         # the collection's module_utils and the bench driver
out=$ROOT/bench/out/verify-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"

cleanup() { docker exec "$NODE" rm -rf "$SAMPLE" "$WORK" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$ROOT/bin/lab" up
venv_activate
# a serving engine spins on the CPUs the hashing needs: no serve during the measurement
ansible-playbook -i inventories/lab playbooks/teardown.yml >"$out/teardown.log" 2>&1 \
  || { echo "bench: teardown failed; see $out/teardown.log" >&2; exit 1; }

# into the node through `docker exec` (docker cp cannot write under the node's /tmp, a tmpfs mount)
put() { docker exec -i "$NODE" sh -c "mkdir -p \"\$(dirname '$2')\" && cat > '$2'" <"$1"; }
for f in __init__.py _manifest.py _hub_stage.py; do
  [ -f "$ROOT/plugins/module_utils/$f" ] || continue
  put "$ROOT/plugins/module_utils/$f" "$WORK/ansible_collections/dgxspark/vllm/plugins/module_utils/$f"
done

echo "bench: writing the sample ($SHARDS x $MIB MiB) on $NODE" >&2
docker exec "$NODE" sh -euc "
  rm -rf '$SAMPLE'; mkdir -p '$SAMPLE'
  i=1
  while [ \$i -le $SHARDS ]; do
    head -c \$(( $MIB * 1048576 - i * 4096 )) /dev/urandom >'$SAMPLE/model-'\$(printf %05d \$i)'-of-'\$(printf %05d $SHARDS)'.safetensors'
    i=\$((i + 1))
  done
  printf '{\"architectures\": [\"Glm4MoeForCausalLM\"]}\n' >'$SAMPLE/config.json'
  printf '{\"temperature\": 1.0, \"top_p\": 0.95}\n' >'$SAMPLE/generation_config.json'
  cd '$SAMPLE'
  for f in *; do
    case \$f in
      *.safetensors) printf 'lfs %s %s %s\n' \"\$f\" \$(stat -c %s \"\$f\") \$(sha256sum \"\$f\" | cut -d' ' -f1) ;;
      *) printf 'git %s %s %s\n' \"\$f\" \$(stat -c %s \"\$f\") \$(git hash-object \"\$f\") ;;
    esac
  done >'$WORK/sample.list'
"

cat >"$out/verify_bench.py" <<'PY'
import hashlib, json, os, statistics, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.dgxspark.vllm.plugins.module_utils import _hub_stage as hs
from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf

work, root, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
entries = []
for line in open(os.path.join(work, "sample.list")):
    kind, path, size, digest = line.split()
    entries.append({"path": path, "size": int(size), "sha256": digest if kind == "lfs" else None,
                    "blob_id": digest if kind == "git" else None})
listing = json.dumps(entries, sort_keys=True).encode()
manifest = mf.manifest_from_dict({"repo": "dgxspark-bench/verify-sample",
                                  "commit": hashlib.sha1(listing).hexdigest(), "files": entries})  # noqa: S324
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
        sys.exit("verification disagrees with sha256sum/git hash-object on the sample: %s" % out.verify.to_dict())


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
print(json.dumps({"bytes": manifest.total_bytes, "files": len(files), "cpus": mf.available_cpus(),
                  "verify_s": statistics.median(times["verify"]), "read_s": statistics.median(times["read"]),
                  "all": times}))
PY
put "$out/verify_bench.py" "$WORK/verify_bench.py"
echo "bench: $ROUNDS rounds of verification and plain read, page cache dropped before each" >&2
docker exec "$NODE" python3 "$WORK/verify_bench.py" "$WORK" "$SAMPLE" "$ROUNDS" >"$out/verify.json"

python3 - "$out/verify.json" "$ROUNDS" <<'PY'
import json, sys
v, rounds = json.load(open(sys.argv[1])), sys.argv[2]
mib = 1 << 20
vt, rt = v["bytes"] / v["verify_s"] / mib, v["bytes"] / v["read_s"] / mib
print(f"sample                     {v['files']} files, {v['bytes'] / mib:.0f} MiB on the head node's disk; {v['cpus']} CPUs")
print(f"verification (full hash)   {vt:7.1f} MiB/s  ({v['verify_s']:.3f} s, median of {rounds}, page cache dropped)")
print(f"plain read (cat)           {rt:7.1f} MiB/s  ({v['read_s']:.3f} s, median of {rounds}, page cache dropped)")
verdict = "met" if vt / rt >= 0.8 else "MISSED"
print(f"throughput ratio           {vt / rt:7.2f} of a plain read (goal >= 0.80: {verdict})")
PY
echo "logs: $out"
