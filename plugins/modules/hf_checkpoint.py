#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_checkpoint
short_description: Download a Hugging Face checkpoint at one exact commit, verified file by file, resumable
version_added: 0.1.0
description:
  - Resolves O(revision) of O(repo) to a commit on the hub (O(endpoint), C(HF_ENDPOINT)) and reads every
    file's size, the SHA-256 of every LFS file and the git blob id of the others (the manifest).
  - Verifies the local tree against the manifest. A stamp file (C(.dgxspark-stamp.json) in the tree) records
    a verified tree with each file's size and modification time; a file the stamp still vouches for is not
    hashed again, every other file is hashed.
  - Downloads what is missing or wrong through huggingface_hub's HTTP layer into partial files that are kept
    between runs (C(.cache/dgxspark/) in a local_dir tree, C(blobs/*.dgxspark-part) in the HF cache), so an
    interrupted run resumes where it stopped. Each downloaded file is hashed before it is moved in place. A
    file that fails verification is fetched again; verified files and files the hub does not list are never
    deleted (the latter are reported in the C(extra) list of RV(verify)).
  - With O(download=false) it only verifies (and stamps a good tree), for example on a node that received the
    tree from another node; give it that node's RV(manifest) so that it needs no hub access.
  - Refuses denylisted repositories (RV(denylist_reason) says why) unless O(allow_denylisted=true).
  - huggingface_hub is imported only when the hub is contacted; without it the module fails with a message
    that says how to provide it.
  - Before anything else (the hub is not asked), the staged folder (O(local_dir), or O(cache_dir)) is checked, level
    by level from C(/) - each existing level must be a folder (not a symlink) owned by root, the user the module runs
    as or one of O(trusted_owners), and not writable by the group or others (a root-owned world-writable folder with
    the sticky bit, such as C(/tmp) or C(/var/tmp), is accepted as an ancestor). An unsafe level is refused with a
    message that names it, what is wrong and the fix. Missing levels are created, mode C(0755), owned by the user the
    module runs as.
  - Below that folder no symlink is followed when writing - partial files are opened with C(O_NOFOLLOW) relative to
    their folder's descriptor, and a file that failed verification is removed or set aside itself (a symlink is
    removed, never what it points to).
author:
  - dgxspark.vllm contributors (@dgxspark)
requirements:
  - huggingface_hub (on the node, for the hub calls; not needed with O(manifest) and O(download=false))
options:
  repo:
    description: Repository id on the hub, C(org/name).
    type: str
    required: true
  revision:
    description: Branch, tag or commit to stage. Resolved to a commit before anything is downloaded.
    type: str
    default: main
  layout:
    description:
      - C(local_dir) is the recipe's flat C(--local-dir) tree at O(local_dir).
      - C(hf_cache) is the hub cache layout (C(models--org--name/blobs|refs|snapshots)) under O(cache_dir).
    type: str
    choices: [local_dir, hf_cache]
    default: local_dir
  local_dir:
    description: The tree for O(layout=local_dir). Required with that layout.
    type: path
  cache_dir:
    description: The hub cache directory (C($HF_HOME/hub)) for O(layout=hf_cache). Required with that layout.
    type: path
  endpoint:
    description: The hub's base URL. Empty means huggingface_hub's default (C(HF_ENDPOINT) or huggingface.co).
    type: str
    default: ""
  token:
    description:
      - Hub access token for gated or private repositories. Never returned or logged.
      - Not for a task run with C(async) - Ansible writes an async task's arguments into the job's files on the
        node; give such a task O(token_file) instead.
    type: str
    default: ""
  token_file:
    description:
      - A file that holds the hub access token, for example one written by M(dgxspark.vllm.secret_file). Only its
        path is an argument, so the token is in none of the files Ansible writes for the task (an async job's
        module and result files included).
      - The file must be a regular file of mode C(0600) or stricter, owned by the user the module runs as or root;
        any other is refused with a message that names the fix. Surrounding whitespace is dropped.
      - Mutually exclusive with O(token).
    type: path
  download:
    description: Download what is missing or wrong. False only verifies and reports.
    type: bool
    default: true
  verify:
    description:
      - C(quick) trusts files the stamp vouches for (same size and modification time) and hashes the rest.
      - C(full) hashes every file.
    type: str
    choices: [quick, full]
    default: quick
  manifest:
    description:
      - A manifest returned by an earlier run of this module (RV(manifest)). When given, the hub is not asked.
    type: dict
  allow_denylisted:
    description: Stage a denylisted repository anyway.
    type: bool
    default: false
  progress_path:
    description:
      - File the module rewrites about every O(progress_interval) seconds while downloading, as JSON with
        C(bytes_done), C(bytes_total), C(rate_bytes_per_s), C(file), C(files_done), C(files_total), C(state).
    type: path
  progress_interval:
    description: Seconds between two writes of O(progress_path).
    type: float
    default: 2.0
  min_free_bytes:
    description: Free disk that must remain after the download; checked before anything is downloaded.
    type: int
    default: 1073741824
  trusted_owners:
    description:
      - Accounts, besides root and the user the module runs as, that may own levels of the staged folder's path (for
        example the EXL3 kit's user, who owns its hub cache and is in the docker group).
    type: list
    elements: str
    default: []
  folder_variable:
    description:
      - The setting a refusal of the staged folder names in its fix (for example C(dgxspark_vllm_model_path)).
        Empty names the option, O(local_dir) or O(cache_dir).
    type: str
    default: ""
  keep_commits:
    description:
      - With O(layout=local_dir), keep every verified commit staged - once the revision is resolved, the tree at
        O(local_dir) is made the wanted commit's. Another verified (stamped) commit there is moved whole into the store
        beside it, C(<local_dir>.commits/<commit>/), and the wanted commit, when it is parked there, is moved back
        (a rename - nothing is copied or downloaded). An unstamped tree stays and is completed, unless the wanted commit
        is parked - it then moves to C(<local_dir>.commits/.unverified). RV(store) says what moved.
      - A O(local_dir) that is a mount point (or on another filesystem than its parent) cannot be moved; that is
        refused, naming the fix. In check mode nothing moves; the wanted commit is verified where it is.
      - C(false) (default) - the recipe's single tree - another commit is staged over the one there.
    type: bool
    default: false
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: >-
      Checks the staged folder's levels, reads the hub metadata and verifies the local tree, then reports
      RV(would_download) without creating, downloading or writing anything.
  diff_mode:
    support: none
    details: The lists RV(downloaded) and RV(would_download) say what changes.
  idempotent:
    support: full
    details: A second run finds a valid stamp, downloads nothing and reports no change.
notes:
  - The token (O(token), or read from O(token_file)) is sent only to O(endpoint), in an C(Authorization) header. It
    is not written anywhere and is masked in anything the module returns.
  - A bit flip that keeps a file's size and modification time is caught only by O(verify=full).
seealso:
  - name: Hugging Face Hub download guide
    description: The hub's file layout, C(--local-dir) and the cache.
    link: https://huggingface.co/docs/huggingface_hub/guides/download
"""

EXAMPLES = r"""
- name: Download the NVFP4 checkpoint to the recipe's path, verified
  dgxspark.vllm.hf_checkpoint:
    repo: RedHatAI/GLM-5.3-Flash-NVFP4
    revision: main
    local_dir: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    token: "{{ dgxspark_vllm_hf_token }}"
  register: staged
  no_log: "{{ dgxspark_vllm_secure_logging }}"

- name: The same in the background, the token read from a root-only file (never an argument of the async job)
  dgxspark.vllm.hf_checkpoint:
    repo: RedHatAI/GLM-5.3-Flash-NVFP4
    local_dir: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    token_file: /run/dgxspark/hf-token-checkpoint
  async: 86400
  poll: 0
  register: staging_job

- name: Verify a copy received from the head against the head's manifest (no hub access)
  dgxspark.vllm.hf_checkpoint:
    repo: RedHatAI/GLM-5.3-Flash-NVFP4
    local_dir: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    manifest: "{{ staged.manifest }}"
    download: false
"""

RETURN = r"""
commit:
  description: The commit the revision resolved to.
  returned: always
  type: str
  sample: 0123456789abcdef0123456789abcdef01234567
root:
  description: The verified tree (O(local_dir), or C(snapshots/<commit>) in the HF cache).
  returned: always
  type: str
  sample: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
manifest:
  description: Repo, commit, total bytes and every file with size, sha256 (LFS) or blob_id.
  returned: always
  type: dict
  sample: {repo: org/name, commit: "0123456789abcdef0123456789abcdef01234567", total_bytes: 42, files: []}
verify:
  description: The tree after the run, file names by verdict (good, missing, wrong_size, wrong_hash, extra), ok, hashed_bytes.
  returned: always
  type: dict
  sample: {ok: true, good: [config.json], missing: [], wrong_size: [], wrong_hash: [], extra: [], hashed_bytes: 0}
complete:
  description: Every file of the manifest is present and verified.
  returned: always
  type: bool
  sample: true
downloaded:
  description: Files downloaded by this run.
  returned: always
  type: list
  elements: str
  sample: [model-00001-of-00004.safetensors]
downloaded_bytes:
  description: Sum of the sizes of RV(downloaded).
  returned: always
  type: int
  sample: 16777216
refetched:
  description: Files that were on disk but failed verification, and were fetched again.
  returned: always
  type: list
  elements: str
  sample: []
would_download:
  description: Files missing or wrong before the run (in check mode, what a real run downloads).
  returned: always
  type: list
  elements: str
  sample: []
would_download_bytes:
  description: Sum of the sizes of RV(would_download).
  returned: always
  type: int
  sample: 0
stamp_valid_before:
  description: Whether a valid stamp vouched for the whole tree when the run started.
  returned: always
  type: bool
  sample: true
stamp_reason:
  description: Why the stamp was or was not valid when the run started.
  returned: always
  type: str
  sample: stamp matches every file
generation_config:
  description: The checkpoint's generation_config.json (verified against the hub's commit), when complete and present.
  returned: always
  type: dict
  sample: {temperature: 1.0}
sampling:
  description: The sampling values RV(generation_config) sets (temperature, top_p, top_k, ...).
  returned: always
  type: dict
  sample: {temperature: 1.0}
denylist_reason:
  description: Why the repository is denylisted, when it is (and was staged with O(allow_denylisted)).
  returned: always
  type: str
  sample: ""
copy_root:
  description:
    - The folder a copy from another node is relative to - the tree for C(local_dir), the repository's cache folder
      (C(models--org--name)) for C(hf_cache).
  returned: always
  type: str
copy_paths:
  description:
    - The files RV(would_download) names, relative to RV(copy_root) - the tree's files, or the blobs for C(hf_cache)
      (the snapshot links and refs are made by the verify that follows the copy).
  returned: always
  type: list
  elements: str
store:
  description:
    - With O(keep_commits), what the store did - C(park) (the commit moved into the store, or null), C(unpark) (the
      commit brought back, or null), C(set_aside) (an unstamped tree moved to C(.unverified)), C(selected) (the wanted
      commit was there already), C(changed), C(root) (the tree verified) and a C(message). Empty without it.
  returned: always
  type: dict
  sample: {park: 0123456789abcdef0123456789abcdef01234567, unpark: null, selected: false, changed: true}
"""

import pwd

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils import _hub_stage as hs
from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf
from ansible_collections.dgxspark.vllm.plugins.module_utils import _secret_file as sf


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            repo=dict(type="str", required=True),
            revision=dict(type="str", default="main"),
            layout=dict(type="str", choices=["local_dir", "hf_cache"], default="local_dir"),
            local_dir=dict(type="path"),
            cache_dir=dict(type="path"),
            endpoint=dict(type="str", default=""),
            token=dict(type="str", default="", no_log=True),
            token_file=dict(type="path", no_log=False),   # a path, not the secret
            download=dict(type="bool", default=True),
            verify=dict(type="str", choices=["quick", "full"], default="quick"),
            manifest=dict(type="dict"),
            allow_denylisted=dict(type="bool", default=False),
            progress_path=dict(type="path"),
            progress_interval=dict(type="float", default=2.0),
            min_free_bytes=dict(type="int", default=1 << 30),
            trusted_owners=dict(type="list", elements="str", default=[]),
            folder_variable=dict(type="str", default=""),
            keep_commits=dict(type="bool", default=False),
        ),
        required_if=[("layout", "local_dir", ["local_dir"]), ("layout", "hf_cache", ["cache_dir"])],
        mutually_exclusive=[("token", "token_file")],
        supports_check_mode=True,
    )
    p = module.params
    token = p["token"] or None
    if p["token_file"]:
        try:
            token = sf.read_secret(p["token_file"]) or None
        except sf.SecretFileError as exc:
            module.fail_json(msg="token_file: %s" % exc)
    if token:
        module.no_log_values.add(token)   # masked in every message and result, as the token option is
    trusted = set()
    for owner in p["trusted_owners"]:
        try:
            trusted.add(pwd.getpwnam(owner).pw_uid)
        except KeyError:
            module.fail_json(msg="trusted_owners: no account %s on this node" % owner)
    try:
        given = mf.manifest_from_dict(p["manifest"]) if p["manifest"] else None
        out = hs.stage(repo=p["repo"], revision=p["revision"], layout_kind=p["layout"], local_dir=p["local_dir"],
                       cache_dir=p["cache_dir"], endpoint=p["endpoint"] or None, token=token,
                       download=p["download"], full_verify=p["verify"] == "full", check_mode=module.check_mode,
                       allow_denylisted=p["allow_denylisted"], manifest=given, progress_path=p["progress_path"],
                       progress_interval=p["progress_interval"], min_free_bytes=p["min_free_bytes"],
                       trusted_uids=trusted, folder_variable=p["folder_variable"],
                       keep_commits=p["keep_commits"])
    except (mf.ManifestError, hs.StageError, OSError) as exc:
        module.fail_json(msg=str(exc))
    gen = out.generation_config or {}
    module.exit_json(
        changed=out.changed or (module.check_mode and bool(out.would_download) and p["download"]),
        commit=out.manifest.commit, root=out.root, manifest=out.manifest.to_dict(), verify=out.verify.to_dict(),
        complete=out.verify.ok, downloaded=out.downloaded, downloaded_bytes=out.downloaded_bytes,
        refetched=out.refetched, would_download=out.would_download, would_download_bytes=out.would_download_bytes,
        stamp_valid_before=out.stamp_valid_before, stamp_reason=out.stamp_reason, generation_config=gen,
        sampling=mf.sampling_values(gen), denylist_reason=out.denylist_reason or "",
        copy_root=out.copy_root, copy_paths=out.copy_paths, store=out.store,
    )


if __name__ == "__main__":
    main()
