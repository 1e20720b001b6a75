#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_history
short_description: Read the cluster's release history on the head, or record the serving release as known-good
version_added: 0.1.0
description:
  - A release is what a serving group is - the image digest the image staging recorded on the head, the model
    repository and the commit the checkpoint staging stamped, the profile and a hash of its resolved settings, the KV
    byte value the launch used - and how verify judged it. Its id is a short hash of that identity alone, the same on
    every run and every controller.
  - The history lives with the cluster, in O(path) on the head (JSON, root's, mode C(0600), written to a new file
    renamed into place); newest last, the last O(keep) kept, never dropping the serving release or the last
    known-good one.
  - V(query) reads the history. V(known_good) builds the serving release from the head's image record
    (O(image_record_path)), the checkpoint stamp (O(stamp_path)) and the given settings, and records it as serving and
    known-good; the same id again updates its entry (its verify result and time) instead of adding another.
  - With O(baseline) (verify's short benchmark), the release is recorded with it. When the history's last known-good
    release is another release whose baseline was measured with the same parameters, the two are compared with the
    thresholds of O(regression) first; a release that regressed is recorded as serving but B(not) known-good (its
    entry keeps the comparison as C(regression)), and RV(regression) says which figures regressed. The module does
    not fail for a regression; the caller does (the verify role fails the play with its C(message)).
  - V(report) keeps verify's report on the head (O(report) written as O(report_name) in O(reports_path), root-only
    like the history), so that a second controller or an AWX job finds it; the release recorded next names it as
    C(verify.head_report). Reports that no release of the history names are pruned beyond the newest
    O(reports_keep) (the one written is always kept).
  - A part that cannot be known (no image record, no stamp, a record of another image or repository) fails, naming
    it and the staging step that writes it. A history file that is a symlink, not root's, open to group or others,
    in a folder that is not root's alone, not a history, or another named cluster's is refused and left as it is.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  state:
    description: V(query) reads; V(known_good) records the serving release as known-good; V(report) keeps a verify
      report on the head.
    type: str
    choices: [query, known_good, report]
    default: query
  path:
    description: The history file on the head.
    type: path
    default: /var/lib/dgxspark/releases.json
  cluster:
    description: The cluster's name (C(dgxspark_vllm_config.cluster); empty for a single-cluster inventory).
    type: str
    default: ""
  keep:
    description: How many releases the history keeps (the serving and the last known-good are kept beyond it).
    type: int
    default: 10
  image:
    description: The configured image (C(dgxspark_vllm_config.image)). Required with O(state=known_good).
    type: str
  image_record_path:
    description: The image staging's record on the head.
    type: path
    default: /var/lib/dgxspark/image.json
  model_repo:
    description: The configured model repository. Required with O(state=known_good).
    type: str
  model_revision:
    description: The configured model revision (C(dgxspark_vllm_config.model_revision)), kept beside the stamped commit
      so that a later run asking for the same branch is not taken for an upgrade.
    type: str
    default: ""
  stamp_path:
    description: The checkpoint stamp on the head (C(.dgxspark-stamp.json) in the staged tree). Required with
      O(state=known_good).
    type: path
  profile:
    description: The profile's name. Required with O(state=known_good).
    type: str
  settings:
    description: The resolved settings (C(dgxspark_vllm_config.settings)). Required with O(state=known_good).
    type: dict
  serve_args:
    description: The head's serve container's arguments (C(docker inspect) C(Args)); its C(--kv-cache-memory-bytes)
      is the KV value the launch used.
    type: list
    elements: str
  kv_cache_memory_bytes:
    description: The configured KV byte value, used when O(serve_args) carries none; null when unset.
    type: raw
  verify:
    description: The verify result (C(ok), C(finished), C(report)). Required with O(state=known_good); C(ok) must be
      true.
    type: dict
  baseline:
    description:
      - The short benchmark's figures (C(decode_tok_s), C(ttft_ms_p50), C(output_throughput), all positive), its
        C(concurrency), the C(params) it was measured with, C(measured_at) and C(duration_s), as
        M(dgxspark.vllm.vllm_benchmark_baseline) returns them in RV(dgxspark.vllm.vllm_benchmark_baseline#module:baseline).
      - Stored in the release's entry; omitted, the entry keeps the baseline it had (records without one stay valid)
        and nothing is compared.
    type: dict
  report:
    description: Verify's report (the JSON the verify role writes on the controller). Required with
      O(state=report).
    type: dict
  report_name:
    description: The report's file name on the head (C(verify-<stamp>.json), the controller copy's name). Required
      with O(state=report).
    type: str
  reports_path:
    description: The folder of the verify reports on the head (C(dgxspark_vllm_config.verify_reports_path)).
    type: path
    default: /var/lib/dgxspark/verify-reports
  reports_keep:
    description: How many reports that no release names are kept beside the ones releases name (the newest first).
    type: int
    default: 10
  regression:
    description:
      - The regression thresholds, in percent of the last known-good's baseline (C(dgxspark_vllm_config.regression)).
        A figure that moves by more than its threshold is a regression.
    type: dict
    suboptions:
      decode_drop_percent:
        description: How far decode tok/s at concurrency 1 may fall (above 0, below 100).
        type: float
        default: 10
      ttft_rise_percent:
        description: How far TTFT p50 at the configured concurrency may rise (above 0).
        type: float
        default: 25
      throughput_drop_percent:
        description: How far output tok/s at the configured concurrency may fall (above 0, below 100).
        type: float
        default: 10
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reads and computes as in a real run and writes nothing. With O(state=known_good), a part that cannot be
      known yet (the stagings that write the record and the stamp did not run in check mode) is returned in RV(msg)
      instead of failing.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details: Recording the release that is already serving and known-good changes nothing that matters (changed is
      false) but refreshes its verify result and time in the file. V(report) writes a new file for each new
      O(report_name) (changed true).
"""

EXAMPLES = r"""
- name: Record the verified release as known-good on the head
  dgxspark.vllm.release_history:
    state: known_good
    cluster: "{{ dgxspark_vllm_config.cluster }}"
    image: "{{ dgxspark_vllm_config.image }}"
    model_repo: "{{ dgxspark_vllm_config.model_repo }}"
    stamp_path: "{{ dgxspark_vllm_config.model_path }}/.dgxspark-stamp.json"
    profile: "{{ dgxspark_vllm_config.profile_name }}"
    settings: "{{ dgxspark_vllm_config.settings }}"
    serve_args: ["--kv-cache-memory-bytes", "45175492096"]
    verify: {ok: true, finished: "2026-12-05T05:00:00Z", report: /home/me/dgxspark-vllm/verify/verify-x.json}
    baseline: "{{ verify_benchmark }}"
    regression: "{{ dgxspark_vllm_config.regression }}"
  delegate_to: "{{ dgxspark_vllm_config.head }}"
  run_once: true

- name: Keep verify's report on the head beside the history
  dgxspark.vllm.release_history:
    state: report
    report: "{{ verdict.report }}"
    report_name: verify-20261205T050000Z.json
  delegate_to: "{{ dgxspark_vllm_config.head }}"
  run_once: true

- name: Read the history
  dgxspark.vllm.release_history:
    cluster: "{{ dgxspark_vllm_config.cluster }}"
  register: releases
"""

RETURN = r"""
path:
  description: The history file.
  returned: always
  type: str
  sample: /var/lib/dgxspark/releases.json
history:
  description: The history (as written, or as it would be in check mode).
  returned: always
  type: dict
  sample: {format: 1, cluster: "", serving: 3f2a9c1e0b7d, releases: []}
release:
  description: The release recorded (null in check mode when a part cannot be known yet).
  returned: state is known_good
  type: dict
  sample: {id: 3f2a9c1e0b7d, model: {repo: dgxspark-lab/tiny-glm, commit: 5d3f...}, known_good: true}
serving:
  description: The release recorded as serving (null when none is).
  returned: always
  type: dict
last_known_good:
  description: The newest known-good release (null when none is).
  returned: always
  type: dict
rows:
  description: Each release as the listing shows it (id, when, image_digest and model_commit shortened,
    settings_hash, kv_cache_memory_bytes, verify, known_good, marks), oldest first.
  returned: always
  type: list
  elements: dict
lines:
  description: The history as a table, one line a release.
  returned: always
  type: list
  elements: str
summary:
  description: The serving release and the last known-good, in one line.
  returned: always
  type: str
  sample: "serving release: 3f2a9c1e0b7d (image sha256:..., ...); last known-good: the serving release"
regression:
  description:
    - The comparison with the last known-good release's baseline. C(compared) false (and C(reason) why) when there
      was nothing to compare - no O(baseline), no known-good release, the serving release is the last known-good, its
      baseline is missing or was measured with other parameters.
    - C(figures) lists each figure (C(name), C(label), C(baseline), C(now), C(change_percent), C(threshold),
      C(regressed)); C(message) names each figure that regressed, with both values and the threshold.
  returned: state is known_good
  type: dict
  sample: {compared: true, regressed: true, against: 3f2a9c1e0b7d, reason: regressed against the last known-good
           release 3f2a9c1e0b7d, figures: [], message: "release 9a... regressed against ..."}
report_path:
  description: The report's path on the head.
  returned: state is report
  type: str
  sample: /var/lib/dgxspark/verify-reports/verify-20261205T050000Z.json
pruned:
  description: The reports removed (or that would be, in check mode), oldest first.
  returned: state is report
  type: list
  elements: str
msg:
  description: What was done (or would be, in check mode).
  returned: always
  type: str
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils import _pins, _regression as reg, _release as rel
from ansible_collections.dgxspark.vllm.plugins.module_utils._node_state import NodeStateError, parse_stamp


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _view(history: dict, path: str, **extra: object) -> dict:
    return dict(path=path, history=history, serving=rel.serving(history), last_known_good=rel.last_known_good(history),
                rows=[rel.row(entry, history) for entry in history["releases"]], lines=rel.lines(history),
                summary=rel.summary(history), **extra)


def _keep_report(module: AnsibleModule, history: dict, path: str) -> None:
    p = module.params
    folder = p["reports_path"].rstrip("/") or "/"
    name = rel.check_report_name(p["report_name"])
    found = rel.list_reports(folder)
    report_path = rel.write_report(folder, name, json.dumps(p["report"], indent=1, sort_keys=True) + "\n",
                                   check_mode=module.check_mode)
    prune = rel.reports_to_prune(found, rel.referenced_reports(history, folder), p["reports_keep"], current=name)
    pruned = rel.remove_reports(folder, prune, check_mode=module.check_mode)
    verb = "would keep" if module.check_mode else "kept"
    module.exit_json(changed=True, report_path=report_path, pruned=pruned,
                     msg=f"{verb} the verify report as {report_path}"
                         + (f"; {'would prune' if module.check_mode else 'pruned'} {len(pruned)} older report(s) no "
                            "release names" if pruned else ""),
                     **_view(history, path))


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["query", "known_good", "report"], default="query"),
            path=dict(type="path", default=rel.HISTORY_PATH),
            cluster=dict(type="str", default=""),
            keep=dict(type="int", default=rel.DEFAULT_KEEP),
            image=dict(type="str"),
            image_record_path=dict(type="path", default=_pins.RECORD_PATH),
            model_repo=dict(type="str"),
            model_revision=dict(type="str", default=""),
            stamp_path=dict(type="path"),
            profile=dict(type="str"),
            settings=dict(type="dict"),
            serve_args=dict(type="list", elements="str"),
            kv_cache_memory_bytes=dict(type="raw"),
            verify=dict(type="dict"),
            baseline=dict(type="dict"),
            report=dict(type="dict"),
            report_name=dict(type="str"),
            reports_path=dict(type="path", default=rel.REPORTS_PATH),
            reports_keep=dict(type="int", default=rel.DEFAULT_KEEP),
            regression=dict(type="dict", options=dict(
                decode_drop_percent=dict(type="float", default=reg.DEFAULT_THRESHOLDS["decode_drop_percent"]),
                ttft_rise_percent=dict(type="float", default=reg.DEFAULT_THRESHOLDS["ttft_rise_percent"]),
                throughput_drop_percent=dict(type="float",
                                             default=reg.DEFAULT_THRESHOLDS["throughput_drop_percent"]),
            )),
        ),
        required_if=[("state", "known_good", ("image", "model_repo", "stamp_path", "profile", "settings", "verify")),
                     ("state", "report", ("report", "report_name"))],
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    try:
        history = rel.parse_history(rel.read_file(path), path)
        rel.check_cluster(history, p["cluster"], path)
        if p["state"] == "query":
            module.exit_json(changed=False, msg=f"read {path}", **_view(history, path))
        if p["state"] == "report":
            _keep_report(module, history, path)
        if p["keep"] < 1:
            raise rel.ReleaseError(f"keep is {p['keep']}: the history keeps at least the serving release")
        if (p["verify"] or {}).get("ok") is not True:
            raise rel.ReleaseError("verify did not pass: nothing is recorded as known-good")
        thresholds = reg.check_thresholds(p["regression"])
        try:
            record = _pins.parse_image_record(_read_text(p["image_record_path"]))
            stamp = parse_stamp(_read_text(p["stamp_path"]), p["stamp_path"])
            release = rel.build_release(
                image=p["image"], image_record=record, model_repo=p["model_repo"], stamp=stamp,
                profile=p["profile"], settings=p["settings"], serve_args=p["serve_args"],
                kv_configured=p["kv_cache_memory_bytes"], verify=p["verify"], cluster=p["cluster"],
                image_record_path=p["image_record_path"], stamp_path=p["stamp_path"],
                model_revision=p["model_revision"])
        except (rel.ReleaseError, NodeStateError) as exc:
            if module.check_mode:
                module.exit_json(changed=False, release=None, msg=f"check mode: would record nothing yet: {exc}",
                                 **_view(history, path))
            raise
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if p["baseline"] is not None:
            p["baseline"]["measured_at"] = p["baseline"].get("measured_at") or now
        regression = reg.compare(release["id"], p["baseline"], rel.last_known_good(history), thresholds,
                                 serving=release)
        history, changed = rel.record(history, release, now=now, known_good=not regression["regressed"],
                                      keep=p["keep"], baseline=p["baseline"], regression=regression)
        rel.write_file(path, rel.dumps(history), check_mode=module.check_mode)
    except (rel.ReleaseError, reg.RegressionError, OSError) as exc:
        module.fail_json(msg=f"{path}: {exc}", path=path)
    verb = "would record" if module.check_mode else "recorded"
    what = ("serving, NOT known-good (it regressed against the last known-good release "
            f"{regression['against']})" if regression["regressed"] else "serving and known-good")
    module.exit_json(changed=changed, release=rel.find(history, release["id"]), regression=regression,
                     msg=f"{verb} release {release['id']} as {what} in {path}", **_view(history, path))


if __name__ == "__main__":
    main()
