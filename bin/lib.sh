# Shared by bin/lab, bin/test and .ci/run (sourced, not run).
# shellcheck shell=bash
CACHE=${DGXSPARK_LAB_CACHE:-/var/cache/dgxspark-lab}
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}

# wait_for SECONDS WHAT CMD...: poll CMD until it succeeds; on expiry say what was awaited and for how long
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "timed out after ${limit}s waiting for: $what" >&2
      return 1
    fi
    sleep 0.5
  done
}

# The host's Docker engine (Debian's docker.io). The host has no systemd: dockerd is started by hand.
ensure_host_docker() {
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || ! command -v ssh >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap openssh-client openssl curl
  fi
  if ! docker info >/dev/null 2>&1; then
    # a daemon keeps none of its caller's descriptors: a lock the caller holds (flock) would stay held by dockerd
    (for fd in /proc/"$BASHPID"/fd/*; do fd=${fd##*/}; [ "$fd" -le 2 ] || eval "exec $fd>&-"; done
     exec nohup dockerd >/var/log/dockerd.log 2>&1) &
    wait_for 60 "the host's dockerd (log: /var/log/dockerd.log)" docker info
  fi
}

# promtool (Debian's prometheus package): the unit tests check and test the shipped alert rules with it, and the guard
# scenario runs that package's Prometheus against the lab.
ensure_promtool() {
  if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
  fi
}

# The controller's virtualenv, built from requirements/dev.txt and keyed by the hash of it and of the
# requirements file it includes (controller.txt), so a change in either builds a new one.
venv_path() { echo "$CACHE/venv-$(cat "$ROOT/requirements/dev.txt" "$ROOT/requirements/controller.txt" | sha256sum | cut -c1-12)"; }
ensure_venv() { build_venv "$(venv_path)" "$ROOT/requirements/dev.txt" molecule; }
# build_venv DIR REQUIREMENTS PROGRAM: a virtualenv at DIR from one requirements file, kept when its PROGRAM is there
# and its last build completed.
build_venv() {
  local v=$1 requirements=$2 program=$3
  [ -x "$v/bin/$program" ] && [ -f "$v/.complete" ] && return 0
  rm -rf "$v"
  python3 -m venv "$v"
  "$v/bin/pip" install -q -r "$requirements"
  touch "$v/.complete"
}
# The clean controller bin/artifact installs the built collection with (requirements/controller.txt only, the
# collection's users' way), keyed by the hash of that file; bin/test builds it in the background with the lab.
artifact_venv_path() { echo "$CACHE/artifact-venv-$(sha256sum <"$ROOT/requirements/controller.txt" | cut -c1-12)"; }
ensure_artifact_venv() { build_venv "$(artifact_venv_path)" "$ROOT/requirements/controller.txt" ansible-playbook; }
venv_activate() {
  ensure_venv
  # shellcheck disable=SC1091
  . "$(venv_path)/bin/activate"
  # Nothing the tooling runs may phone home
  export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1
  export ANSIBLE_GALAXY_DISABLE_GPG_VERIFY=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1
  export ANSIBLE_CONFIG=$ROOT/ansible.cfg DGXSPARK_LAB_STATE=$ROOT/.lab
}
