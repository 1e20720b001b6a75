#!/usr/bin/env bash
# THE dgxspark.vllm LAB'S STAND-IN for the MiaAI-Lab EXL3 kit's start.sh -- not the kit.
#
#   ./start.sh [start]   validate, preflight, image, locate the staged weights, launch worker then head, wait
#   ./start.sh stop      remove both containers (the worker's over ssh)
#   ./start.sh status    both containers' state
#   ./start.sh logs [worker]  the end of the head's (or the worker's) container log
#
# The lab (two CPU-only containers standing in for DGX Sparks) cannot run the real kit: it needs GB10 GPUs,
# RDMA and the kit's EXL3 image. This script keeps the kit's interface as docs/exl3-kit.md of the
# dgxspark.vllm collection records it for kit commit 008ae945 -- the same .env keys and defaults, the caller
# overrides, the same checks, the same order (worker first, then head), the same ports, container names,
# ssh use and health wait -- and launches the lab's real vLLM CPU engine with those values.
#
# Left out, because the lab's CPU engine or the lab's nodes cannot do them (README.md says more):
#   --quantization $QUANTIZATION (exl3)        no EXL3 kernels on CPU; the tiny model is bf16
#   --kv-cache-dtype $KV_CACHE_DTYPE (fp8)     no fp8 (fp8_ds_mla) KV cache on the CPU build
#   --cudagraph-capture-sizes ...              no CUDA graphs (the kit appends them when ENFORCE_EAGER=0)
#   --speculative-config (dflash / mtp)        the CPU engine cannot run DFlash and the tiny model has no MTP
#                                              layers; the drafter's staging is still checked for dflash
#   --language-model-only, --limit-mm-per-prompt, --skip-mm-profiling   no multimodal model in the lab
#   --gpus all, --device /dev/infiniband       no GPU, no RDMA device
#   --ulimit memlock=-1                        the lab's nodes lack CAP_SYS_RESOURCE to raise it
#   --shm-size 32g                             1g, as the lab_cpu profile: two engines must fit in one machine
#   the overlay (python3 /opt/glm53/patch_*.py, overlay/exl3.py, the GPU self-check), the recipe stamp and
#   BUILD, USE_HOST_NCCL, the NCCL IB tuning env (NCCL_NET=IB, RoCE v2, ...), ABLIT_*, EXL3_*, the
#   GLM53_* patch switches: they configure GPU code the stand-in does not run
#   weights download (hf download) and the rsync to the worker: the collection stages the weights, so the
#   stand-in requires SKIP_DOWNLOAD=1 SKIP_SYNC=1 and only resolves the staged snapshots
#   image shipping (docker save | ssh docker load): the worker pulls for itself
#   the boot-shape warm-up script: one small chat request instead
# Added for the CPU engine (the lab_cpu profile's needs): HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE,
# VLLM_NO_USAGE_STATS, DO_NOT_TRACK, TMPDIR=/tmp, NCCL_IB_DISABLE=1, VLLM_ENGINE_READY_TIMEOUT_S=3600;
# VLLM_CPU_KVCACHE_SPACE=1 (a 1 GiB KV cache per rank whatever GPU_MEM_UTIL says: on CPU that flag is a
# fraction of host RAM, and two engines share one machine); VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (the tiny model
# declares 4096 positions; the kit's MAX_MODEL_LEN is 850000).
# shellcheck disable=SC2153  # the kit's keys are assigned by .env and by the defaults table below
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STARTED=$SECONDS
# Lab difference: the real kit reads /sys/class/infiniband; the lab bind-mounts each node's recorded
# ConnectX-7 sysfs tree (tests/fixtures/sysfs/lab_<node> in the collection) here.
LAB_SYSFS=/var/lib/dgxspark-lab/sysfs

log() { printf '[stand-in kit %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
warn() { printf '[stand-in kit %s] WARNING: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[stand-in kit %s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

# ------------------------------------------------------------------------------------------------- .env
if [ ! -f "$SCRIPT_DIR/.env" ]; then
  [ -f "$SCRIPT_DIR/.env.example" ] || die "neither .env nor .env.example in $SCRIPT_DIR"
  cp "$SCRIPT_DIR/.env.example" "$SCRIPT_DIR/.env"
  log "no .env: copied .env.example to .env (edit it for your cluster)"
fi

# The caller's exports of these names win over .env, as in the kit.
OVERRIDABLE='^(MTP_TOKENS|SPEC_METHOD|ENFORCE_EAGER|EXL3_.*|MAX_NUM_BATCHED_TOKENS|IMAGE|GPU_MEM_UTIL|LANGUAGE_MODEL_ONLY|MAX_NUM_SEQS|MAX_MODEL_LEN|GLM53_ADAPTIVE_K.*|GLM53_DENSE_FP8|ABLIT.*|GLM53_INDEXER_WORKSPACE|GLM53_SPINWAIT_MS)$'
declare -A CALLER_OVERRIDES=()
while IFS= read -r name; do
  if [[ $name =~ $OVERRIDABLE ]]; then CALLER_OVERRIDES[$name]=${!name}; fi
done < <(compgen -e)

set -a
# shellcheck disable=SC1091
source "$SCRIPT_DIR/.env"
set +a

for name in "${!CALLER_OVERRIDES[@]}"; do
  export "$name=${CALLER_OVERRIDES[$name]}"
done

# The kit defaults (the active keys of .env.example): each key keeps its value unless unset or empty,
# i.e. KEY="${KEY:-default}" for every line below.
KIT_DEFAULTS=(
  HEAD_IP=10.0.0.1
  WORKER_IP=10.0.0.2
  HEAD_CX7_IF=enp1s0f1np1
  WORKER_CX7_IF=enp1s0f0np0
  HEAD_CX7_IB=rocep1s0f1
  WORKER_CX7_IB=rocep1s0f0
  MODEL=Mia-AiLab/GLM-5.3-Flash-EXL3-TR3-4bpw
  MODEL_FALLBACK=brandonmusic/GLM-5.3-Flash-tr3-4bpw
  MODEL_REVISION=25a44fdbf16862a46b7cc9921142c6c81350af2f
  IMAGE=ghcr.io/miaai-lab/glm-5.3-flash-2x-dgx-sparks:exl3
  PORT=8888
  TP=2
  NNODES=2
  MASTER_PORT=29521
  QUANTIZATION=exl3
  ENFORCE_EAGER=0
  EXL3_FUSED_MOE=1
  EXL3_FAT_KERNEL=1
  EXL3_FAT_GROUPED=1
  SERVED_MODEL_NAME=GLM-5.3-Flash-EXL3
  SPEC_METHOD=dflash
  DFLASH_MODEL=incoai/GLM-5.3-Flash-DFlash2
  DFLASH_TOKENS=7
  DFLASH_DRAFT_TP=2
  MTP_TOKENS=2
  MAX_MODEL_LEN=850000
  MAX_NUM_SEQS=4
  MAX_NUM_BATCHED_TOKENS=7168
  GPU_MEM_UTIL=0.85
  KV_CACHE_DTYPE=fp8
  LANGUAGE_MODEL_ONLY=0
  SKIP_MM_PROFILING=1
  'LIMIT_MM={"image":100,"video":1}'
  ABLIT=0
  ABLIT_METHOD=auto
  ABLIT_DIRECTION=dealign
  ABLIT_LAYERS=15-45
  ABLIT_ALPHA=3.0
  ABLIT_INCLUDE_MTP=1
  GLM53_BOOT_SHAPE_WARMUP=1
  GLM53_SUPPRESS_STOPS_IN_REASONING=1
  GLM53_MIXED_PREFILL_CHUNK=0
  GLM53_INDEXER_WORKSPACE=rightsize
  GLM53_SPINWAIT_MS=stock
  USE_HOST_NCCL=0
  NCCL_SO_NAME=libnccl.so.2.30.7
  NCCL_IB_GID_INDEX=3
  CG_ESTIMATE=1
  NCCL_DEBUG=WARN
)
for pair in "${KIT_DEFAULTS[@]}"; do
  name=${pair%%=*}
  [ -n "${!name:-}" ] || printf -v "$name" '%s' "${pair#*=}"
done

# Keys the example only shows in comments, with start.sh's fallbacks.
USER=${USER:-$(id -un)}
WORKER_USER="${WORKER_USER:-$USER}"
WORKER_HOME="${WORKER_HOME:-$HOME}"
WORKER_SSH="${WORKER_SSH:-${WORKER_USER}@${WORKER_IP}}"
HEAD_GID="${HEAD_GID:-$NCCL_IB_GID_INDEX}"
WORKER_GID="${WORKER_GID:-$NCCL_IB_GID_INDEX}"
MODEL_CACHE_NAME="${MODEL_CACHE_NAME:-models--${MODEL//\//--}}"
HF_HOME="${HF_HOME:-$HOME/.cache/huggingface}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
VLLM_API_KEY="${VLLM_API_KEY:-}"
GLM53_WARMUP_REQ_TIMEOUT="${GLM53_WARMUP_REQ_TIMEOUT:-240}"
# Environment-only knobs (not in the example).
READY_TIMEOUT="${READY_TIMEOUT:-3600}"
CONTAINER_HEAD="${CONTAINER_HEAD:-glm53-exl3-head}"
CONTAINER_WORKER="${CONTAINER_WORKER:-glm53-exl3-worker}"
TAIL="${TAIL:-80}"
# Stand-in only: seconds between health checks (the kit polls every 10 s).
HEALTH_POLL_SECONDS="${HEALTH_POLL_SECONDS:-10}"

WORKER_HF_HOME="$WORKER_HOME/.cache/huggingface"   # fixed in the kit: the worker's HF cache
CONTAINER_HF=/root/.cache/huggingface

# --------------------------------------------------------------------------------------------- helpers
# Run a command on the worker: arguments quoted for the remote shell, stdin from the caller.
# WORKER_SSH is split into words, as in the kit (it may carry ssh options before the destination).
read -ra WORKER_SSH_WORDS <<<"$WORKER_SSH"
SSH_WORKER=(ssh -T -o BatchMode=yes -o ConnectTimeout=10 "${WORKER_SSH_WORDS[@]}")
wssh() { "${SSH_WORKER[@]}" "$(printf '%q ' "$@")"; }
# on head|worker CMD...: the command on that node
on() {
  local where=$1; shift
  if [ "$where" = head ]; then "$@"; else wssh "$@" </dev/null; fi
}

int_in_range() {   # int_in_range NAME MIN MAX
  local name=$1 min=$2 max=$3 value=${!1}
  if ! [[ $value =~ ^[0-9]{1,12}$ ]] || (( 10#$value < min || 10#$value > max )); then
    die "$name=$value: expected an integer from $min to $max"
  fi
}

validate_numeric_config() {
  [[ $GPU_MEM_UTIL =~ ^(0([.][0-9]+)?|[.][0-9]+|1([.]0+)?)$ ]] && [[ $GPU_MEM_UTIL =~ [1-9] ]] ||
    die "GPU_MEM_UTIL=$GPU_MEM_UTIL: expected a decimal greater than 0 and at most 1 (e.g. 0.85)"
  int_in_range MAX_MODEL_LEN 1 1000000
  int_in_range MAX_NUM_SEQS 1 4096
  int_in_range MAX_NUM_BATCHED_TOKENS 1 8388608
  case $GLM53_INDEXER_WORKSPACE in
    stock|rightsize) ;;
    *) die "GLM53_INDEXER_WORKSPACE=$GLM53_INDEXER_WORKSPACE: expected stock or rightsize" ;;
  esac
  [ "$GLM53_SPINWAIT_MS" = stock ] || int_in_range GLM53_SPINWAIT_MS 1 1000
  int_in_range PORT 1 65535
  int_in_range MASTER_PORT 1 65535
  [ "$PORT" != "$MASTER_PORT" ] || die "PORT and MASTER_PORT are both $PORT: the API and the rendezvous need two ports"
  [[ $READY_TIMEOUT =~ ^[0-9]+$ ]] || die "READY_TIMEOUT=$READY_TIMEOUT: expected seconds"
}

require_staged_weights() {   # stand-in limitation, checked before anything touches the nodes
  if [ "${SKIP_DOWNLOAD:-0}" != 1 ] || [ "${SKIP_SYNC:-0}" != 1 ]; then
    die "the lab's stand-in kit does not download weights (hf download) nor rsync them to the worker: the" \
      "collection stages $MODEL into $HF_HOME/hub on the head and $WORKER_HF_HOME/hub on the worker." \
      "Run it with SKIP_DOWNLOAD=1 SKIP_SYNC=1."
  fi
}

gid_empty() { [ -z "$1" ] || [[ $1 =~ ^[0:]+$ ]]; }
gid_path() { echo "$LAB_SYSFS/class/infiniband/$1/ports/1/gids/$2"; }
gid_table() {   # gid_table head|worker HCA
  local dir="$LAB_SYSFS/class/infiniband/$2/ports/1/gids"
  # shellcheck disable=SC2016
  on "$1" sh -c 'for f in "$1"/*; do [ -f "$f" ] && printf "  %s: %s\n" "${f##*/}" "$(cat "$f")"; done' sh "$dir" |
    sort -n -k1 || true
}

preflight() {
  local tool
  for tool in docker curl ssh ip ss; do
    command -v "$tool" >/dev/null || die "$tool is not installed on the head"
  done
  docker info >/dev/null 2>&1 || die "docker does not work on the head for $USER (is $USER in the docker group?)"
  # grep without -q reads all of ip's output: with -q it may exit first, and pipefail turns ip's SIGPIPE into a
  # failure of a check that matched
  ip -4 addr show | grep -F "inet ${HEAD_IP}/" >/dev/null ||
    die "HEAD_IP=$HEAD_IP is not an IPv4 address of this host (ip -4 addr show); run start.sh on the head"
  wssh true </dev/null ||
    die "cannot reach the worker with 'ssh -T -o BatchMode=yes $WORKER_SSH' (key-based ssh from the head is required)"
  wssh docker info </dev/null >/dev/null 2>&1 || die "docker does not work on the worker for $WORKER_SSH"

  local head_gid worker_gid
  head_gid=$(cat "$(gid_path "$HEAD_CX7_IB" "$HEAD_GID")" 2>/dev/null || true)
  worker_gid=$(wssh cat "$(gid_path "$WORKER_CX7_IB" "$WORKER_GID")" </dev/null 2>/dev/null || true)
  if gid_empty "$head_gid" || gid_empty "$worker_gid"; then
    echo "head $HEAD_CX7_IB port 1 GID table (index $HEAD_GID: '${head_gid}'):" >&2
    gid_table head "$HEAD_CX7_IB" >&2
    echo "worker $WORKER_CX7_IB port 1 GID table (index $WORKER_GID: '${worker_gid}'):" >&2
    gid_table worker "$WORKER_CX7_IB" >&2
    die "empty RoCE GID entry: set HEAD_GID / WORKER_GID to the index whose GID carries the node's CX7 IPv4" \
      "(RoCE v2) and HEAD_CX7_IB / WORKER_CX7_IB to the device that holds it"
  fi
  log "GID head ${HEAD_CX7_IB}[${HEAD_GID}]=$head_gid worker ${WORKER_CX7_IB}[${WORKER_GID}]=$worker_gid"

  [ "$TP" = 2 ] || warn "TP=$TP: the kit is built for TP=2 on two Sparks"
  [ "$NNODES" = 2 ] || warn "NNODES=$NNODES: the kit launches exactly one head and one worker"
  local others
  others=$(wssh docker ps --format '{{.Names}}' </dev/null 2>/dev/null | grep -vxF "$CONTAINER_WORKER" || true)
  [ -z "$others" ] || warn "other containers run on the worker: $(echo "$others" | tr '\n' ' ')"
  local port
  for port in "$PORT" "$MASTER_PORT"; do
    if [ -n "$(ss -Hltn "( sport = :$port )" 2>/dev/null)" ]; then
      # our own old head container holds it until it is removed
      [ "$(docker inspect -f '{{.State.Running}}' "$CONTAINER_HEAD" 2>/dev/null)" = true ] ||
        die "port $port is already in use on the head (PORT=$PORT MASTER_PORT=$MASTER_PORT)"
    fi
  done
}

ensure_image() {
  if [ "${SKIP_PULL:-0}" = 1 ]; then
    docker image inspect "$IMAGE" >/dev/null 2>&1 || die "SKIP_PULL=1 but $IMAGE is not on the head"
  else
    log "pulling $IMAGE on the head"
    docker pull -q "$IMAGE" >/dev/null || die "docker pull $IMAGE failed on the head"
  fi
  if [ "${SKIP_SHIP:-0}" = 1 ]; then
    wssh docker image inspect "$IMAGE" </dev/null >/dev/null 2>&1 || die "SKIP_SHIP=1 but $IMAGE is not on the worker"
  else
    log "pulling $IMAGE on the worker"
    wssh docker pull -q "$IMAGE" </dev/null >/dev/null || die "docker pull $IMAGE failed on the worker"
  fi
  local mine theirs
  mine=$(docker image inspect -f '{{json .RootFS.Layers}}' "$IMAGE")
  theirs=$(wssh docker image inspect -f '{{json .RootFS.Layers}}' "$IMAGE" </dev/null)
  [ "$mine" = "$theirs" ] || warn "$IMAGE has different layers on the head and the worker"
}

# resolve_snapshot WHERE HF_ROOT FOLDER REVISION: prints the snapshot commit staged on that node
resolve_snapshot() {
  local where=$1 dir="$2/hub/$3" rev=$4 main commit
  on "$where" test -d "$dir" ||
    die "$where: $dir is missing (the stand-in does not download: stage it in HF-cache layout)"
  main=$(on "$where" cat "$dir/refs/main" 2>/dev/null | tr -d '[:space:]' || true)
  if [ -n "$rev" ] && [ "$rev" != "$main" ]; then
    on "$where" test -d "$dir/snapshots/$rev" ||
      die "$where: $dir: refs/main is '${main}' and the revision $rev has no snapshots/$rev"
    commit=$rev
  else
    [ -n "$main" ] || die "$where: $dir has no refs/main"
    commit=$main
  fi
  on "$where" test -e "$dir/snapshots/$commit/config.json" ||
    die "$where: $dir/snapshots/$commit has no config.json"
  echo "$commit"
}

locate_weights() {
  MODEL_COMMIT=$(resolve_snapshot head "$HF_HOME" "$MODEL_CACHE_NAME" "$MODEL_REVISION")
  local worker_commit
  worker_commit=$(resolve_snapshot worker "$WORKER_HF_HOME" "$MODEL_CACHE_NAME" "$MODEL_REVISION")
  [ "$worker_commit" = "$MODEL_COMMIT" ] ||
    die "$MODEL_CACHE_NAME: the head serves snapshot $MODEL_COMMIT, the worker holds $worker_commit (the stand-in does not sync)"
  log "model $MODEL_CACHE_NAME at snapshot $MODEL_COMMIT on both nodes"
  case $SPEC_METHOD in
    dflash)
      local folder="models--${DFLASH_MODEL//\//--}" head_draft worker_draft
      head_draft=$(resolve_snapshot head "$HF_HOME" "$folder" "")
      worker_draft=$(resolve_snapshot worker "$WORKER_HF_HOME" "$folder" "")
      [ "$head_draft" = "$worker_draft" ] ||
        die "$folder: the head holds snapshot $head_draft, the worker $worker_draft"
      log "SPEC_METHOD=dflash: drafter $DFLASH_MODEL staged at $head_draft on both nodes; the stand-in's CPU engine" \
        "cannot run DFlash, so no --speculative-config is passed"
      ;;
    mtp) log "SPEC_METHOD=mtp: the lab's tiny model has no MTP layers, so no --speculative-config is passed" ;;
    none) ;;
    *) die "SPEC_METHOD=$SPEC_METHOD: expected dflash, mtp or none" ;;
  esac
}

# docker_run_argv RANK: the docker run argv of that rank (0 = head, 1 = worker)
docker_run_argv() {
  local rank=$1 name hf ip ifname hca gid
  if [ "$rank" = 0 ]; then
    name=$CONTAINER_HEAD hf=$HF_HOME ip=$HEAD_IP ifname=$HEAD_CX7_IF hca=$HEAD_CX7_IB gid=$HEAD_GID
  else
    name=$CONTAINER_WORKER hf=$WORKER_HF_HOME ip=$WORKER_IP ifname=$WORKER_CX7_IF hca=$WORKER_CX7_IB gid=$WORKER_GID
  fi
  RUN=(docker run -d --name "$name" --network host --ipc=host --shm-size 1g --cap-add IPC_LOCK
    -v "$hf:$CONTAINER_HF:ro"
    -e "VLLM_HOST_IP=$ip" -e "GLOO_SOCKET_IFNAME=$ifname" -e "NCCL_SOCKET_IFNAME=$ifname"
    -e "NCCL_IB_HCA=$hca" -e "NCCL_IB_GID_INDEX=$gid" -e "NCCL_DEBUG=$NCCL_DEBUG" -e HF_HUB_OFFLINE=1
    -e TRANSFORMERS_OFFLINE=1 -e VLLM_NO_USAGE_STATS=1 -e DO_NOT_TRACK=1 -e TMPDIR=/tmp -e NCCL_IB_DISABLE=1
    -e VLLM_ENGINE_READY_TIMEOUT_S=3600 -e VLLM_CPU_KVCACHE_SPACE=1 -e VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)
  [ -z "$VLLM_API_KEY" ] || RUN+=(-e VLLM_API_KEY)   # the value comes from docker's environment, not argv
  RUN+=(--entrypoint vllm "$IMAGE" serve "$CONTAINER_HF/hub/$MODEL_CACHE_NAME/snapshots/$MODEL_COMMIT"
    --served-model-name "$SERVED_MODEL_NAME" --port "$PORT" --host 0.0.0.0
    --tensor-parallel-size "$TP" --nnodes "$NNODES" --node-rank "$rank"
    --master-addr "$HEAD_IP" --master-port "$MASTER_PORT" --distributed-executor-backend mp
    --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45
    --enable-prefix-caching --no-enable-flashinfer-autotune
    --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS"
    --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS" --gpu-memory-utilization "$GPU_MEM_UTIL")
  [ "$ENFORCE_EAGER" != 1 ] || RUN+=(--enforce-eager)
  [ "$rank" = 0 ] || RUN+=(--headless)
  local extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  RUN+=("${extra[@]}")
}

remove_containers() {
  docker rm -f "$CONTAINER_HEAD" >/dev/null 2>&1 || true
  wssh docker rm -f "$CONTAINER_WORKER" </dev/null >/dev/null 2>&1 || true
}

launch_cluster() {
  remove_containers
  docker_run_argv 1
  log "starting the worker ($CONTAINER_WORKER on $WORKER_SSH, --node-rank 1 --headless)"
  if [ -n "$VLLM_API_KEY" ]; then
    # the key travels on ssh's stdin into the remote docker's environment: never on a command line
    printf '%s\n' "$VLLM_API_KEY" | "${SSH_WORKER[@]}" \
      "IFS= read -r VLLM_API_KEY && export VLLM_API_KEY && $(printf '%q ' "${RUN[@]}")" >/dev/null ||
      die "docker run failed on the worker"
  else
    wssh "${RUN[@]}" </dev/null >/dev/null || die "docker run failed on the worker"
  fi
  docker_run_argv 0
  log "starting the head ($CONTAINER_HEAD, --node-rank 0, API on port $PORT)"
  "${RUN[@]}" >/dev/null || die "docker run failed on the head"
}

running() {   # running head|worker
  local name=$CONTAINER_HEAD
  [ "$1" = head ] || name=$CONTAINER_WORKER
  [ "$(on "$1" docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ]
}

dump_logs() {
  mkdir -p "$SCRIPT_DIR/logs"
  local stamp; stamp=$(date +%Y%m%d-%H%M%S)
  docker logs "$CONTAINER_HEAD" >"$SCRIPT_DIR/logs/head-$stamp.log" 2>&1 || true
  wssh docker logs "$CONTAINER_WORKER" </dev/null >"$SCRIPT_DIR/logs/worker-$stamp.log" 2>&1 || true
  echo "----- head ($CONTAINER_HEAD), last $TAIL lines; whole log: logs/head-$stamp.log" >&2
  tail -n "$TAIL" "$SCRIPT_DIR/logs/head-$stamp.log" >&2 || true
  [ -s "$SCRIPT_DIR/logs/head-$stamp.log" ] || echo "(empty)" >&2
  echo "----- worker ($CONTAINER_WORKER), last $TAIL lines; whole log: logs/worker-$stamp.log" >&2
  tail -n "$TAIL" "$SCRIPT_DIR/logs/worker-$stamp.log" >&2 || true
  [ -s "$SCRIPT_DIR/logs/worker-$stamp.log" ] || echo "(empty)" >&2
}

wait_for_health() {
  local deadline=$((SECONDS + READY_TIMEOUT)) misses=0 next_note=$((SECONDS + 60))
  log "waiting for http://127.0.0.1:${PORT}/health (READY_TIMEOUT=${READY_TIMEOUT}s)"
  while :; do
    if curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:${PORT}/health"; then
      return 0
    fi
    if ! running head; then
      dump_logs
      die "the head container $CONTAINER_HEAD stopped before /health answered"
    fi
    if running worker; then misses=0; else misses=$((misses + 1)); fi
    if [ "$misses" -ge 3 ]; then
      dump_logs
      die "the worker container $CONTAINER_WORKER is not running (three checks in a row)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      dump_logs
      die "no answer from /health after ${READY_TIMEOUT}s"
    fi
    if [ "$SECONDS" -ge "$next_note" ]; then
      log "still starting ($((SECONDS - STARTED)) s)"
      next_note=$((SECONDS + 60))
    fi
    sleep "$HEALTH_POLL_SECONDS"
  done
}

post_ready_warmup() {   # one small, non-fatal chat request (the kit runs its boot-shape warm-up script)
  [ "$GLM53_BOOT_SHAPE_WARMUP" = 1 ] || return 0
  local body auth=()
  body=$(printf '{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":8}' "$SERVED_MODEL_NAME")
  # the key goes to curl as a config line on stdin, not on its command line
  [ -z "$VLLM_API_KEY" ] || auth=(-K -)
  if printf 'header = "Authorization: Bearer %s"\n' "$VLLM_API_KEY" |
    curl -sf -o /dev/null --max-time "$GLM53_WARMUP_REQ_TIMEOUT" "${auth[@]}" -H 'Content-Type: application/json' \
      -d "$body" "http://127.0.0.1:${PORT}/v1/chat/completions"; then
    log "warm-up request answered"
  else
    warn "warm-up request failed (not fatal)"
  fi
}

start() {
  validate_numeric_config
  require_staged_weights
  log "head $HEAD_IP ($HEAD_CX7_IF), worker $WORKER_SSH at $WORKER_IP ($WORKER_CX7_IF); image $IMAGE"
  preflight
  ensure_image
  locate_weights
  launch_cluster
  wait_for_health
  log "healthy after $((SECONDS - STARTED)) s: $SERVED_MODEL_NAME on http://${HEAD_IP}:${PORT}/v1"
  post_ready_warmup
}

stop() {
  remove_containers
  log "removed $CONTAINER_HEAD (head) and $CONTAINER_WORKER (worker)"
}

state_of() {   # state_of head|worker NAME
  on "$1" docker inspect -f '{{.State.Status}} since {{.State.StartedAt}}' "$2" 2>/dev/null | grep . || echo absent
}

status() {
  echo "head   $CONTAINER_HEAD: $(state_of head "$CONTAINER_HEAD")"
  echo "worker $CONTAINER_WORKER: $(state_of worker "$CONTAINER_WORKER")"
  if curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:${PORT}/health"; then
    echo "health http://127.0.0.1:${PORT}/health: ok"
  else
    echo "health http://127.0.0.1:${PORT}/health: no answer"
  fi
}

logs() {
  if [ "${1:-}" = worker ]; then
    wssh docker logs --tail "$TAIL" "$CONTAINER_WORKER" </dev/null
  else
    docker logs --tail "$TAIL" "$CONTAINER_HEAD"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  logs) logs "${2:-}" ;;
  *) sed -n '4,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
