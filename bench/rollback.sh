#!/usr/bin/env bash
# An upgrade that fails at start, rolled back to the known-good release by itself, on the lab: the time from the
# failure found to the known-good serving again (verified), against the known-good's own group start in that
# rollback, printed as a ratio (goal <= 1.2) - the figures the upgrade role's closing message gives, per run. Also
# each run's whole time. The failing upgrade is site.yml with the lab registry's engine tag that exits at start
# (v0.32.0-broken), BENCH_ROLLBACK_RUNS times (default 2), after a site.yml that serves the known-good.
# Usage: bench/rollback.sh   (brings the lab up, serves if needed; leaves the known-good serving)
# Logs: bench/out/rollback-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bin/lib.sh"
cd "$ROOT"
"$ROOT/bin/lab" up
venv_activate
inv=inventories/lab
broken=ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0-broken
tmp=$ROOT/bench/out/rollback-$(date +%Y%m%d-%H%M%S); mkdir -p "$tmp"
ansible-playbook -i $inv playbooks/site.yml >"$tmp/site.out" 2>&1 || { echo "site.yml failed: $tmp/site.out"; tail -n 30 "$tmp/site.out"; exit 1; }
for i in $(seq 1 "${BENCH_ROLLBACK_RUNS:-2}"); do
  t0=$SECONDS
  if ANSIBLE_CALLBACK_RESULT_FORMAT=json ansible-playbook -i $inv playbooks/site.yml -e "dgxspark_vllm_image=$broken" \
      >"$tmp/upgrade-$i.out" 2>&1; then
    echo "run $i: the upgrade to $broken passed: nothing to roll back ($tmp/upgrade-$i.out)"; exit 1
  fi
  python3 - "$tmp/upgrade-$i.out" "$i" "$((SECONDS - t0))" <<'PY'
import re
import sys
path, run, whole = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path, encoding="utf-8").read()
found = re.search(r"serving again (\d+) s after the failure was found \(the known-good's group start: (\d+) s; "
                  r"ratio ([0-9.]+)\)", text)
if not found:
    print(f"run {run}: no rollback figures in {path} (the upgrade failed without rolling back?)")
    sys.exit(1)
print(f"run {run}: serving again {found[1]} s after the failure was found, the known-good's group start {found[2]} s: "
      f"ratio {found[3]} (goal <= 1.2); the whole run {whole} s")
PY
done
echo "logs: $tmp"
