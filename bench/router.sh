#!/usr/bin/env bash
# The two router candidates on the lab, on the same load: HAProxy (Debian's package, the configuration the router
# role writes: plugins/module_utils/_router.py) and vLLM's router (PyPI vllm-router, its lightest policy,
# round_robin). Both run on the lab host (10.77.0.1, a CPU-only machine) in front of the serving lab cluster; the
# load is vLLM's own `vllm bench serve`, run in the head's serve container.
# Printed:
# - added latency: p50/p99 of the end-to-end latency, direct to the head's API and through each router, for
#   (a) one request at a time with one output token (the router's own cost is largest next to it) and
#   (b) a fixed request rate (ROUTER_BENCH_RATE per s, ROUTER_BENCH_PROMPTS requests): router minus direct, and the ratio;
# - a drain under the fixed-rate load: each router has the cluster twice (two server entries for the one engine,
#   so a drained entry's requests have somewhere to go); once the first entry has a request running it is drained
#   (HAProxy: `set server ... state drain` on its runtime socket; vLLM's router: POST /remove_worker), then put back
#   once 10 more requests were answered: the failed requests of the whole run, and what the drain takes
#   (HAProxy: from the command until the entry has no running request, read from `show stat`; vLLM's router
#   answers at once and shows no per-worker count, so the engine's running requests are read instead).
# Usage: bench/router.sh   (brings the lab up, stages and launches if needed, the guard off; leaves the serve running; installs
#        haproxy on the lab host with apt and vllm-router into a venv of the lab cache when missing)
# Logs: bench/out/router-<time>/ (mode 0700: HAProxy's configuration there holds the cluster's key).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"
rate=${ROUTER_BENCH_RATE:-2}
prompts=${ROUTER_BENCH_PROMPTS:-40}
single=${ROUTER_BENCH_SINGLE:-40}
vr_version=0.1.17
"$ROOT/bin/lab" up
venv_activate
inv=inventories/lab
tmp=$ROOT/bench/out/router-$(date +%Y%m%d-%H%M%S); mkdir -p "$ROOT/bench/out"; mkdir -m 0700 "$tmp"
# the group guard off: a router that takes the engine's requests is measured, not the guard's probes beside them
ansible-playbook -i $inv -e '{"dgxspark_vllm_guard": false}' playbooks/firewall.yml playbooks/staging.yml \
  playbooks/cache_flush.yml playbooks/launch.yml >"$tmp/launch.out"

command -v haproxy >/dev/null || { apt-get install -y -q haproxy >"$tmp/apt.out"; }
cache=${DGXSPARK_LAB_CACHE:-/var/cache/dgxspark-lab}
vr=$cache/vllm-router-$vr_version
[ -x "$vr/bin/vllm-router" ] || { python3 -m venv "$vr" && "$vr/bin/pip" install -q "vllm-router==$vr_version" >"$tmp/pip.out"; }
haproxy -v | head -1
"$vr/bin/pip" show vllm-router | sed -n 's/^Version: /vllm-router /p'

head_api=10.77.0.11:8000
host=10.77.0.1
hap_port=18080 hap_metrics=18404 vr_port=18090 vr_metrics=18491
in_head() { docker exec dgxlab-head "$@"; }
# the cluster's generated key (root's on the head), kept in this shell only; the HAProxy client key is the router's own
cluster_key=$(in_head cat /etc/dgxspark/api-key)
router_key=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
served=$(in_head python3 -c 'import json,sys,urllib.request as u; r=u.Request("http://127.0.0.1:8000/v1/models", headers={"Authorization": "Bearer " + sys.argv[1]}); d=json.load(u.urlopen(r))["data"][0]; print(d["id"], d["root"])' "$cluster_key")
model=${served%% *} tokenizer=${served#* }

pids=()
cleanup() {   # the routers stopped; the cluster stays serving (as bench/recovery.sh leaves it)
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# HAProxy with the router role's configuration: the cluster twice (entries a and b, the same engine)
PYTHONPATH=$ROOT/.collections python3 - "$tmp" "$host" "$hap_port" "$hap_metrics" <<'PY' 3<<<"$cluster_key" 4<<<"$router_key"
import os, sys
from ansible_collections.dgxspark.vllm.plugins.module_utils import _router
tmp, host, port, metrics = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cluster_key, router_key = os.fdopen(3).read().strip(), os.fdopen(4).read().strip()
clusters = [{"name": name, "head": "lab-head", "address": "10.77.0.11", "port": 8000, "model": "bench"} for name in ("a", "b")]
plan = _router.plan({"clusters": clusters, "keys": {"a": cluster_key, "b": cluster_key}, "router_key": router_key,
                     "bind_address": host, "port": port, "metrics_port": metrics, "allowed_cidrs": ["10.77.0.0/24"],
                     "socket": f"{tmp}/haproxy.sock", "models_file": f"{tmp}/models.json"})
with os.fdopen(os.open(f"{tmp}/haproxy.cfg", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
    handle.write(plan["config"])   # it holds the keys
open(f"{tmp}/models.json", "w").write(plan["models"])
PY
haproxy -c -q -f "$tmp/haproxy.cfg"
haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 & pids+=($!)
"$vr/bin/vllm-router" --host $host --port $vr_port --policy round_robin --health-check-interval-secs 2 \
  --prometheus-host $host --prometheus-port $vr_metrics \
  --worker-urls "http://$head_api" "http://[::ffff:10.77.0.11]:8000" >"$tmp/vllm-router.log" 2>&1 & pids+=($!)

hap() { python3 - "$tmp/haproxy.sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode() + b"\n"); out = b""
while chunk := s.recv(65536):
    out += chunk
print(out.decode(), end="")
PY
}
hap_server() {   # hap_server NAME FIELD: a field of show stat for server model_0/NAME
  hap "show stat" | python3 -c 'import csv,sys; rows=list(csv.DictReader(sys.stdin.read().lstrip("# ").splitlines())); print([r for r in rows if r["pxname"]=="model_0" and r["svname"]==sys.argv[1]][0][sys.argv[2]])' "$1" "$2"
}
engine_running() { curl -s -H "Authorization: Bearer $cluster_key" "http://$head_api/metrics" | awk '/^vllm:num_requests_running/ {s+=$2} END {print int(s)}'; }
engine_done() { curl -s -H "Authorization: Bearer $cluster_key" "http://$head_api/metrics" | awk '/^vllm:request_success_total/ {s+=$2} END {print int(s)}'; }
wait_until() {   # wait_until SECONDS WHAT COMMAND...: until COMMAND succeeds
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@"; do [ $SECONDS -lt $deadline ] || { echo "timed out after waiting for $what"; exit 1; }; sleep 0.2; done
}
wait_until 120 "HAProxy's entries up" bash -c "$(declare -f hap hap_server); tmp=$tmp; [ \"\$(hap_server a status)\" = UP ] && [ \"\$(hap_server b status)\" = UP ]"
wait_until 120 "vLLM's router up" curl -sf -o /dev/null "http://$host:$vr_port/health"

bench() {   # bench NAME URL KEY ARGS...: one vllm bench serve run in the head's serve container; its result JSON to $tmp
  local name=$1 url=$2 key=$3; shift 3
  OPENAI_API_KEY=$key docker exec -e OPENAI_API_KEY dgxlab-head docker exec -e OPENAI_API_KEY vllm_glm53 \
    vllm bench serve --backend openai --base-url "$url" --endpoint /v1/completions --model "$model" \
    --tokenizer "$tokenizer" --dataset-name random --ignore-eos --temperature 0 --seed 7 --disable-tqdm \
    --percentile-metrics e2el,ttft --metric-percentiles 50,99 --save-result --result-dir /tmp/router-bench \
    --result-filename "$name.json" "$@" >"$tmp/$name.out" 2>&1
  in_head docker exec vllm_glm53 cat "/tmp/router-bench/$name.json" >"$tmp/$name.json"
}
in_head docker exec vllm_glm53 mkdir -p /tmp/router-bench
# one request first: the lab's CPU engine compiles kernels on its first request after a start (about 20 s), which
# would land in the first case's p99
bench warmup "http://$head_api" "$cluster_key" --random-input-len 32 --random-output-len 1 --num-prompts 1
paths=("direct http://$head_api $cluster_key" "haproxy http://$host:$hap_port $router_key" "vllm-router http://$host:$vr_port $cluster_key")
for round in 1 2; do   # interleaved, twice: drift of the engine hits every path alike
  for p in "${paths[@]}"; do set -- $p
    bench "single-$1-$round" "$2" "$3" --random-input-len 32 --random-output-len 1 --num-prompts "$single" --max-concurrency 1
  done
done
for p in "${paths[@]}"; do set -- $p
  bench "rate-$1" "$2" "$3" --random-input-len 64 --random-output-len 32 --num-prompts "$prompts" --request-rate "$rate"
done

drain_haproxy() {
  wait_until 300 "a request on HAProxy's entry a" bash -c "$(declare -f hap hap_server); tmp=$tmp; [ \"\$(hap_server a scur)\" -gt 0 ]"
  local running t0 t1 done0; running=$(hap_server a scur); t0=$(date +%s.%N)
  hap "set server model_0/a state drain" >/dev/null
  wait_until 600 "entry a drained" bash -c "$(declare -f hap hap_server); tmp=$tmp; [ \"\$(hap_server a scur)\" -eq 0 ]"
  t1=$(date +%s.%N); done0=$(hap_server b stot); local a_drained; a_drained=$(hap_server a stot)
  wait_until 600 "10 requests on entry b" bash -c "$(declare -f hap hap_server); tmp=$tmp; [ \"\$(hap_server b stot)\" -ge $((done0 + 10)) ]"
  local sent_a; sent_a=$(hap_server a stot)
  hap "set server model_0/a state ready" >/dev/null
  python3 -c 'import sys; print(f"drain haproxy: entry a had {sys.argv[1]} running request(s) at the drain; it took {float(sys.argv[3]) - float(sys.argv[2]):.2f} s to reach 0; entry a had {sys.argv[4]} requests in all once drained and {sys.argv[5]} when put back (its requests while drained: {int(sys.argv[5]) - int(sys.argv[4])})")' \
    "$running" "$t0" "$t1" "$a_drained" "$sent_a" >"$tmp/drain-haproxy.txt"
}
drain_vllm_router() {
  wait_until 300 "a running request on the engine" bash -c "$(declare -f engine_running); cluster_key=$cluster_key head_api=$head_api; [ \"\$(engine_running)\" -gt 0 ]"
  local running t0 t1 t2 done0; running=$(engine_running); t0=$(date +%s.%N)
  curl -s -XPOST "http://$host:$vr_port/remove_worker?url=http://$head_api" >"$tmp/remove.out"; t1=$(date +%s.%N)
  wait_until 600 "the engine's requests at the drain answered" bash -c "$(declare -f engine_done); cluster_key=$cluster_key head_api=$head_api; [ \"\$(engine_done)\" -ge $(( $(engine_done) + running )) ]"
  t2=$(date +%s.%N); done0=$(engine_done)
  wait_until 600 "10 more requests answered" bash -c "$(declare -f engine_done); cluster_key=$cluster_key head_api=$head_api; [ \"\$(engine_done)\" -ge $((done0 + 10)) ]"
  curl -s -XPOST "http://$host:$vr_port/add_worker?url=http://$head_api" >"$tmp/add.out"
  python3 -c 'import sys; print(f"drain vllm-router: the engine ran {sys.argv[1]} request(s) at the drain; /remove_worker answered in {float(sys.argv[3]) - float(sys.argv[2]):.3f} s ({open(sys.argv[5]).read().strip()}); that many more answered {float(sys.argv[4]) - float(sys.argv[2]):.2f} s after it (the router shows no per-worker count: a drain must watch the engine)")' \
    "$running" "$t0" "$t1" "$t2" "$tmp/remove.out" >"$tmp/drain-vllm-router.txt"
}
drain_haproxy & ctl=$!
bench drain-haproxy "http://$host:$hap_port" "$router_key" --random-input-len 64 --random-output-len 32 --num-prompts "$prompts" --request-rate "$rate"
wait $ctl
drain_vllm_router & ctl=$!
bench drain-vllm-router "http://$host:$vr_port" "$cluster_key" --random-input-len 64 --random-output-len 32 --num-prompts "$prompts" --request-rate "$rate"
wait $ctl

python3 - "$tmp" "$rate" "$prompts" "$single" <<'PY'
import json, sys
tmp, rate, prompts, single = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def load(name):
    return json.load(open(f"{tmp}/{name}.json"))
def pct(doc, metric, p):
    return float(doc.get(f"p{p}_{metric}_ms") if p != 50 else doc.get(f"median_{metric}_ms") or doc.get(f"p50_{metric}_ms"))
print(f"added latency, one request at a time, 1 output token ({single} requests x 2 rounds, interleaved):")
base = {}
for path in ("direct", "haproxy", "vllm-router"):
    docs = [load(f"single-{path}-{r}") for r in (1, 2)]
    p50 = sum(pct(d, "e2el", 50) for d in docs) / 2
    p99 = max(pct(d, "e2el", 99) for d in docs)
    failed = sum(int(d["num_prompts"]) - int(d["completed"]) for d in docs)
    base.setdefault("p50", p50); base.setdefault("p99", p99)
    print(f"  {path:>12}: e2e p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  failed {failed}"
          + ("" if path == "direct" else f"  added p50 {p50 - base['p50']:+6.2f} ms ({p50 / base['p50']:.3f}x)  "
                                         f"p99 {p99 - base['p99']:+7.2f} ms ({p99 / base['p99']:.3f}x)"))
print(f"fixed rate {rate}/s, {prompts} requests (64 in, 32 out):")
base = {}
for path in ("direct", "haproxy", "vllm-router"):
    d = load(f"rate-{path}")
    p50, p99 = pct(d, "e2el", 50), pct(d, "e2el", 99)
    base.setdefault("p50", p50); base.setdefault("p99", p99)
    print(f"  {path:>12}: e2e p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  ttft p50 {pct(d, 'ttft', 50):6.1f} ms  failed "
          f"{int(d['num_prompts']) - int(d['completed'])}"
          + ("" if path == "direct" else f"  added p50 {p50 - base['p50']:+6.1f} ms ({p50 / base['p50']:.3f}x)  "
                                         f"p99 {p99 - base['p99']:+7.1f} ms ({p99 / base['p99']:.3f}x)"))
print(f"drain under the same load (fixed rate {rate}/s, {prompts} requests):")
for path in ("haproxy", "vllm-router"):
    d = load(f"drain-{path}")
    print(f"  {path:>12}: sent {d['num_prompts']}, failed {int(d['num_prompts']) - int(d['completed'])}, e2e p50 "
          f"{pct(d, 'e2el', 50):.1f} ms p99 {pct(d, 'e2el', 99):.1f} ms")
    print("    " + open(f"{tmp}/drain-{path}.txt").read().strip())
PY
