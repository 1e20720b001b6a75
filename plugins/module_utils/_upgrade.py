# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Upgrades and rollbacks: what a run changes against the serving release, and the way back to a known-good one.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

- `plan_run`: before anything is stopped, what this run is against the cluster's history (``_release``): a **first
  start** (no release recorded), **no change** (the configuration asks for the serving release), or an **upgrade**
  from the serving release (the image, the model repository or revision, the profile's settings or the KV value
  differ), with the last known-good release an upgrade that fails rolls back to.
- `after_failure`: what follows a failed launch or verify: a rollback to the known-good, the failed release left
  stopped (``dgxspark_vllm_upgrade_rollback: false``), or the failure as it is (not an upgrade).
- `target` / `check_staged`: the release a rollback goes to (the known-good, or one named by hand) and whether it is
  still staged on every node (its image, by ID or digest; its checkpoint commit, by the stamp at the model path or of
  its tree parked beside it, ``_checkpoint_store``), or every missing part; refused while a staging runs.
- `pin` / `pinned_values`: the release as the configuration step takes it (``upgrade_release_pin``): its image
  by digest, its model commit, profile, settings and KV value, so launch and verify read ``dgxspark_vllm_config`` as
  always; and the image record each node gets back.
- `outcome`: the run's closing message, with the time from the failure found to serving again.
- `hub_info_url` / `disk`: before an upgrade's staging stops anything, the disk for the new image and commit next to
  the known-good's on every node (``_stage_disk``), refused naming the bytes needed and free.
- `recorded_images` / `prune`: after a known-good, what each node may free (``_checkpoint_store.plan_prune``): the
  parked commits and recorded images no release among the newest ``dgxspark_vllm_upgrade_keep_staged`` needs.
"""
from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils import _checkpoint_store
from ansible_collections.dgxspark.vllm.plugins.module_utils import _pins
from ansible_collections.dgxspark.vllm.plugins.module_utils import _release
from ansible_collections.dgxspark.vllm.plugins.module_utils import _stage_disk

FIRST_START = "first_start"
NO_CHANGE = "no_change"
UPGRADE = "upgrade"
# The render settings a release does not carry: what the hardware gives each node (found by preflight), not a choice.
NODE_SETTINGS = frozenset({"cx7_iface", "ib_hca", "gid_index"})
PIN_FACT = "upgrade_release_pin"


class UpgradeError(ValueError):
    """A rollback that cannot be done as asked; the message names what is missing and what to do."""


def _short(value: Any) -> str:
    text = str(value or "")
    return text.partition(":")[2][:_release.SHORT] if text.startswith("sha256:") else text[:_release.SHORT]


def _image_key(entry: Mapping[str, Any]) -> str:
    image = entry.get("image") or {}
    return str(image.get("digest") or image.get("image_id") or "")


def _configured_image(entry: Mapping[str, Any]) -> str:
    image = entry.get("image") or {}
    return str(image.get("configured") or image.get("reference") or "")


def _image_change(wanted: str, entry: Mapping[str, Any], record: Mapping[str, Any] | None) -> str | None:
    """The image part of the difference (None: the same). A digest is compared with the release's digest; a tag with
    the image the release was staged as (its ``configured`` reference, else the head's image record when it holds
    the release's digest)."""
    digest = _pins.split_image(wanted).digest
    image = entry.get("image") or {}
    if digest:
        if digest == image.get("digest"):
            return None
        return f"image {wanted} (serving {_configured_image(entry)} {_short(_image_key(entry))})"
    if image.get("configured") == wanted:
        return None
    if (not image.get("configured") and record and record.get("image") == wanted
            and (record.get("digest") or record.get("image_id")) == _image_key(entry)):
        return None
    return f"image {wanted} (serving {_configured_image(entry) or '?'} {_short(_image_key(entry))})"


def _model_change(repo: str, revision: str, entry: Mapping[str, Any]) -> str | None:
    model = entry.get("model") or {}
    if repo != model.get("repo"):
        return f"model {repo}@{revision} (serving {model.get('repo')}@{_short(model.get('commit'))})"
    if _pins.is_commit(revision):
        if revision == model.get("commit"):
            return None
        return f"model commit {_short(revision)} (serving {_short(model.get('commit'))})"
    if model.get("revision") in (None, "", revision) or _pins.is_commit(model.get("revision")):
        return None   # the branch it was staged from, or not known (a pinned run): the staging says if it moved
    return f"model revision {revision} (serving {model.get('revision')}@{_short(model.get('commit'))})"


def wanted(config: Mapping[str, Any]) -> dict[str, Any]:
    """What the configuration asks for, as far as it is known before staging (a tag and a branch stay as written)."""
    settings = config.get("settings") or {}
    kv = config.get("kv_cache_memory_bytes")
    return {"image": str(config.get("image") or ""), "model_repo": str(config.get("model_repo") or ""),
            "model_revision": str(config.get("model_revision") or ""),
            "profile": str(config.get("profile_name") or ""),
            "settings_hash": _release.settings_hash(str(config.get("profile_name") or ""), settings),
            "kv_cache_memory_bytes": _release.launch_kv(None, kv)[0]}


def changes(want: Mapping[str, Any], entry: Mapping[str, Any], record: Mapping[str, Any] | None = None) -> list[str]:
    """Every part in which ``want`` differs from the release ``entry`` (empty: the same release)."""
    out = []
    image = _image_change(want["image"], entry, record)
    if image:
        out.append(image)
    model = _model_change(want["model_repo"], want["model_revision"], entry)
    if model:
        out.append(model)
    if want["settings_hash"] != entry.get("settings_hash"):
        shown = f"profile {want['profile']}" if want["profile"] != entry.get("profile") else "settings"
        out.append(f"{shown} {want['settings_hash']} (serving {entry.get('profile')} {entry.get('settings_hash')})")
    kv = want["kv_cache_memory_bytes"]
    if kv is not None and kv != entry.get("kv_cache_memory_bytes"):
        out.append(f"KV {kv} bytes (serving {entry.get('kv_cache_memory_bytes') or 'engine-sized'})")
    return out


def plan_run(history: Mapping[str, Any], config: Mapping[str, Any], record: Mapping[str, Any] | None = None,
             running: bool | None = None) -> dict[str, Any]:
    """What this run is, decided before anything is stopped.

    ``history``: the head's release history (``_release.parse_history``); ``config``: ``dgxspark_vllm_config``;
    ``record``: the head's image record (``_pins.parse_image_record``; None when absent); ``running``: whether the
    head's serve container runs now (None: not read). ``stage`` is true for an upgrade whose image or model changes
    (the staging then pulls or downloads, which the recipe never does next to a serving group).
    """
    want = wanted(config)
    current = _release.serving(history) or _release.last_known_good(history)
    good = _release.last_known_good(history)
    rollback = bool(config.get("upgrade_rollback", True))
    if current is None:
        return {"kind": FIRST_START, "from": None, "known_good": None, "changes": [], "stage": False,
                "rollback": False, "wanted": want,
                "message": "first start: no release is recorded on the head yet (one is recorded when verify passes)"}
    diff = changes(want, current, record)
    idle = " (its group does not run now)" if running is False else ""
    if not diff:
        return {"kind": NO_CHANGE, "from": current["id"], "known_good": good, "changes": [], "stage": False,
                "rollback": False, "wanted": want,
                "message": f"no change: the configuration asks for the serving release {current['id']}{idle}"}
    stage = any(part.startswith(("image", "model")) for part in diff)
    if good is None:
        after = "no release is known-good yet: a failure is not rolled back"
    elif not rollback:
        after = f"a failure leaves it stopped (dgxspark_vllm_upgrade_rollback: false; last known-good {good['id']})"
    else:
        after = f"a failed launch or verify rolls back to the last known-good {good['id']}"
    return {"kind": UPGRADE, "from": current["id"], "known_good": good, "changes": diff, "stage": stage,
            "rollback": rollback and good is not None, "wanted": want,
            "message": f"upgrade from {current['id']}{idle}: {'; '.join(diff)}; {after}"}


def after_failure(plan: Mapping[str, Any] | None, step: str, diagnosis: str) -> dict[str, Any]:
    """What follows a failed ``step`` (launch, verify) of this run: ``action`` rollback (to ``target``), stop (the
    failed release left stopped for inspection), or fail (not an upgrade: the failure as it is)."""
    plan = plan or {}
    good = plan.get("known_good")
    head = f"the {step} failed: {diagnosis}"
    if plan.get("kind") != UPGRADE:
        return {"action": "fail", "target": None, "message": head}
    if not good:
        return {"action": "fail", "target": None,
                "message": f"the upgrade from {plan.get('from')} failed; {head} No release is known-good yet: nothing "
                           "to roll back to."}
    if not plan.get("rollback"):
        return {"action": "stop", "target": good,
                "message": f"the upgrade from {plan.get('from')} failed; {head} Left stopped for inspection "
                           f"(dgxspark_vllm_upgrade_rollback: false), the group guard disarmed: nothing serves. Back "
                           f"to the last known-good: playbooks/rollback.yml -e release={good['id']}"}
    return {"action": "rollback", "target": good,
            "message": f"the upgrade from {plan.get('from')} failed; {head} Rolling back to the last known-good "
                       f"{good['id']}"}


def target(history: Mapping[str, Any], release: str) -> dict[str, Any]:
    """The recorded release ``release`` names (its id, or its first characters when they name one release)."""
    release = str(release or "").strip()
    if not release:
        raise UpgradeError("no release given: name one with -e release=<id> (playbooks/releases.yml lists them)")
    entries = history.get("releases") or []
    found = [entry for entry in entries if str(entry.get("id", "")).startswith(release)]
    exact = [entry for entry in found if entry.get("id") == release]
    if exact:
        return dict(exact[0])
    if len(found) == 1:
        return dict(found[0])
    known = ", ".join(str(entry.get("id")) for entry in entries) or "none"
    if found:
        several = ", ".join(str(entry.get("id")) for entry in found)
        raise UpgradeError(f"release {release!r} names several recorded releases ({several}): give more of the id")
    raise UpgradeError(f"release {release!r} is not in the cluster's history (recorded: {known}; "
                       "playbooks/releases.yml lists them): nothing was stopped")


def _holds_image(entry: Mapping[str, Any], images: Sequence[Mapping[str, Any]]) -> bool:
    image = entry.get("image") or {}
    image_id, digest = image.get("image_id"), image.get("digest")
    name = _pins.split_image(_configured_image(entry)).name
    for found in images or []:
        if image_id and found.get("Id") == image_id:
            return True
        if digest and digest in _pins.repo_digests_for(name, found.get("RepoDigests") or []):
            return True
    return False


def check_staged(entry: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], model_path: str) -> list[str]:
    """Refuse a release that is not staged on every node, or a node where a staging runs, naming each missing part;
    return the nodes whose model path holds another commit while the release's is parked beside it (in
    ``_checkpoint_store.store_dir(model_path)``: brought back after the group stops, nothing downloaded).

    ``nodes``: host -> ``images`` (what ``docker image inspect`` of the release's image found: dicts with ``Id`` and
    ``RepoDigests``), ``stamp`` (the checkpoint stamp in ``model_path``, parsed; None when absent), ``parked`` (the
    stamp of the release's commit in the store; None when absent), ``lock`` (the staging lock's text; empty when
    none).
    """
    if not nodes:
        raise UpgradeError("no node was read: run the rollback over the whole cluster (spark_cluster)")
    image = entry.get("image") or {}
    model = entry.get("model") or {}
    shown_image = f"{_configured_image(entry)} ({image.get('digest') or image.get('image_id') or 'no digest'})"
    locked = [f"{host} ({str(nodes[host].get('lock')).strip()})" for host in sorted(nodes)
              if str((nodes[host] or {}).get("lock") or "").strip()]
    if locked:
        raise UpgradeError(f"a staging runs (its lock is held on {', '.join(locked)}): release {entry.get('id')} is "
                           "not served while it runs, nothing was stopped. Run the rollback again once it ended (an "
                           "interrupted staging leaves the lock behind: remove it then)")
    missing: list[str] = []
    swap: list[str] = []
    if not image.get("digest") and not image.get("image_id"):
        missing.append("the release names no image digest nor ID: it cannot be run by digest")
    wanted = (model.get("repo"), model.get("commit"))
    store = f"{model_path}{_checkpoint_store.STORE_SUFFIX}"
    for host in sorted(nodes):
        state = nodes[host] or {}
        if not _holds_image(entry, state.get("images") or []):
            missing.append(f"{host} does not hold the image {shown_image} (pruned or never pulled there)")
        stamp = state.get("stamp") or {}
        parked = state.get("parked") or {}
        if (stamp.get("repo"), stamp.get("commit")) == wanted:
            continue
        if (parked.get("repo"), parked.get("commit")) == wanted:
            swap.append(host)
        elif not stamp:
            missing.append(f"{host} has no checkpoint stamp in {model_path} and {_short(model.get('commit'))} is not "
                           f"parked in {store}")
        else:
            missing.append(f"{host}'s checkpoint in {model_path} is {stamp.get('repo')}@{_short(stamp.get('commit'))}, "
                           f"not the release's {model.get('repo')}@{_short(model.get('commit'))}, which is not parked "
                           f"in {store} either (pruned, or staged over before commits were kept)")
    if missing:
        raise UpgradeError(f"release {entry.get('id')} is not staged any more, nothing was stopped or pulled: "
                           + "; ".join(missing) + ". Stage it again with site.yml and its image and revision "
                           "(dgxspark_vllm_image, dgxspark_vllm_model_revision) in the inventory")
    return swap


def pin(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The release as the configuration step takes it (the fact ``upgrade_release_pin``), with the image record
    each node gets back: the image by its digest (by its tag, checked by image ID, when it has none)."""
    image = entry.get("image") or {}
    model = entry.get("model") or {}
    configured = _configured_image(entry)
    if not configured or not (image.get("digest") or image.get("image_id")):
        raise UpgradeError(f"release {entry.get('id')} names no image digest nor ID: it cannot be pinned")
    if not model.get("repo") or not _pins.is_commit(model.get("commit")):
        raise UpgradeError(f"release {entry.get('id')} names no model commit: it cannot be pinned")
    settings = entry.get("settings")
    if not isinstance(settings, Mapping) or not entry.get("profile"):
        raise UpgradeError(f"release {entry.get('id')} names no profile and settings: it cannot be pinned")
    reference = _pins.digest_reference(configured, image["digest"]) if image.get("digest") else configured
    record = {"format": _pins.RECORD_FORMAT, "image": reference, "reference": reference,
              "digest": image.get("digest") or "", "source": f"release {entry.get('id')}",
              "image_id": image.get("image_id") or "", "configured": configured}
    return {"id": entry.get("id"), "image": reference, "image_configured": configured,
            "model_repo": model["repo"], "model_revision": model["commit"], "profile": entry["profile"],
            "settings": dict(settings), "kv_cache_memory_bytes": entry.get("kv_cache_memory_bytes"),
            "image_record": record}


def pinned_values(release_pin: Mapping[str, Any], render_keys: Sequence[str]) -> dict[str, Any]:
    """The configuration values a pin sets: every render setting as the release had it (unset when it had none;
    the node-found ones left to preflight), its image by digest, model commit and KV value."""
    for key in ("id", "image", "model_repo", "model_revision", "profile", "settings"):
        if not release_pin.get(key):
            raise UpgradeError(f"{PIN_FACT} has no {key}: it is set by the rollback from a recorded release")
    settings = release_pin["settings"]
    if not isinstance(settings, Mapping):
        raise UpgradeError(f"{PIN_FACT}.settings is not a mapping")
    values: dict[str, Any] = {key: settings.get(key) for key in render_keys if key not in NODE_SETTINGS}
    values.update(image=release_pin["image"], model_repo=release_pin["model_repo"],
                  model_revision=release_pin["model_revision"],
                  kv_cache_memory_bytes=release_pin.get("kv_cache_memory_bytes"))
    return values


def outcome(decision: Mapping[str, Any], serving: str, found_at: float, served_at: float,
            launch_started_at: float) -> dict[str, Any]:
    """The closing message of a rolled-back run, with the time from the failure found to the known-good serving
    again against the relaunch's own group start (the ratio the rollback's overhead adds)."""
    total = max(0.0, served_at - found_at)
    start = max(0.0, served_at - launch_started_at)
    ratio = total / start if start > 0 else None
    good = (decision.get("target") or {}).get("id")
    timing = (f"serving again {total:.0f} s after the failure was found (the known-good's group start: {start:.0f} s; "
              f"ratio {ratio:.2f})" if ratio is not None else f"serving again {total:.0f} s after the failure")
    base = str(decision.get("message") or "").removesuffix(f"Rolling back to the last known-good {good}").rstrip()
    if serving != good:
        msg = (f"{base} Rolled back, but the release now serving is {serving}, not the known-good {good}: "
               "check playbooks/releases.yml")
    else:
        msg = f"{base} Rolled back: the cluster serves the known-good {good} again (verified); {timing}."
    return {"message": msg, "seconds": round(total, 1), "start_seconds": round(start, 1),
            "ratio": None if ratio is None else round(ratio, 3)}


# ----------------------------------------------------------------------------------- the release_plan task

# The release_plan task's arguments (the action plugin validates with it; the module's documentation stub declares it).
ARGUMENT_SPEC: dict[str, Any] = dict(
    mode=dict(type="str", required=True, choices=["plan", "failure", "rollback", "outcome", "prune", "disk"]),
    history=dict(type="dict"),
    config=dict(type="dict"),
    record=dict(type="raw"),
    running=dict(type="bool"),
    plan=dict(type="dict"),
    step=dict(type="str", default="launch"),
    diagnosis=dict(type="str", default=""),
    release=dict(type="str", default=""),
    nodes=dict(type="dict"),
    decision=dict(type="dict"),
    serving=dict(type="str", default=""),
    found_at=dict(type="float", default=0.0),
    served_at=dict(type="float", default=0.0),
    launch_started_at=dict(type="float", default=0.0),
    endpoint=dict(type="str", default=""),
    model_info=dict(type="dict"),
)


def _parse_record(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        return dict(value)
    return _pins.parse_image_record(value if isinstance(value, str) else None)


def _parse_stamp(value: Any, host: str) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        return dict(value)
    try:
        data = json.loads(str(value))
    except ValueError:
        raise UpgradeError(f"{host}'s checkpoint stamp is not JSON: re-run the checkpoint staging") from None
    return data if isinstance(data, dict) else None


def recorded_images(history: Mapping[str, Any]) -> list[str]:
    """The images the history's releases name, as references ``docker image inspect`` finds (by digest, else by ID)."""
    out: list[str] = []
    for entry in history.get("releases") or []:
        image = entry.get("image") or {}
        configured = _configured_image(entry)
        if image.get("digest") and configured:
            ref = _pins.digest_reference(configured, image["digest"])
        else:
            ref = str(image.get("image_id") or "")
        if ref and ref not in out:
            out.append(ref)
    return out


def prune(history: Mapping[str, Any], keep: Any, nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The retention choice on every node (``_checkpoint_store.plan_prune``). ``nodes``: host -> ``parked`` (what
    ``checkpoint_store`` listed: commit -> {bytes, ...}) and ``images`` (``docker image inspect`` of
    ``recorded_images``)."""
    try:
        plans = {host: _checkpoint_store.plan_prune(
            history, keep, {commit: int((item or {}).get("bytes") or 0)
                            for commit, item in ((state or {}).get("parked") or {}).items()},
            (state or {}).get("images") or [])
            for host, state in sorted(nodes.items())}
    except _checkpoint_store.StoreError as exc:
        raise UpgradeError(str(exc)) from None
    total = sum(plan["bytes"] for plan in plans.values())
    lines = [f"{host}: {plan['message']}" for host, plan in plans.items()]
    return {"prune": plans, "bytes": total, "msg": "; ".join(lines) or "no node was read"}


def hub_info_url(config: Mapping[str, Any], endpoint: str) -> str:
    """The hub's model info of the configured repository at the configured revision, with every file's size."""
    base = (endpoint or "https://huggingface.co").rstrip("/")
    repo = str(config.get("model_repo") or "")
    revision = urllib.parse.quote(str(config.get("model_revision") or "main"), safe="")
    if not repo:
        raise UpgradeError("the configuration names no model repository")
    return f"{base}/api/models/{repo}/revision/{revision}?blobs=true"


def disk(config: Mapping[str, Any], model_info: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]],
         ) -> dict[str, Any]:
    """The disk an upgrade's staging needs on every node next to the known-good (``_stage_disk.plan``), from what
    each node read: ``image_present``, ``manifest`` (``docker manifest inspect -v``'s output), ``architecture``,
    ``selected`` / ``parked`` (``checkpoint_store``), ``model_df`` / ``docker_df`` (``df``'s output)."""
    try:
        commit, total = _stage_disk.checkpoint_bytes(model_info)
        plan_nodes = {}
        for host, state in nodes.items():
            state = state or {}
            present = bool(state.get("image_present"))
            plan_nodes[host] = {
                "image": {"ref": config.get("image"), "present": present,
                          "bytes": None if present else _stage_disk.image_bytes(str(state.get("manifest") or ""),
                                                                                str(state.get("architecture") or ""))},
                "checkpoint": {"repo": config.get("model_repo"), "commit": commit, "bytes": total,
                               "staged": _stage_disk.staged(commit, state.get("selected"), state.get("parked") or {})},
                "model_fs": _stage_disk.parse_df(str(state.get("model_df") or "")),
                "docker_fs": _stage_disk.parse_df(str(state.get("docker_df") or "")),
            }
        return _stage_disk.plan(plan_nodes)
    except _stage_disk.DiskError as exc:
        raise UpgradeError(str(exc)) from None


def run(params: Mapping[str, Any]) -> dict[str, Any]:
    """The release_plan task: one of the decisions above, by ``mode``. UpgradeError or ReleaseError to fail it."""
    mode = params["mode"]
    if mode == "plan":
        history = _release.parse_history(json.dumps(params.get("history") or {}) if params.get("history") else None)
        plan = plan_run(history, params.get("config") or {}, _parse_record(params.get("record")), params.get("running"))
        return {"plan": plan, "msg": plan["message"]}
    if mode == "failure":
        decision = after_failure(params.get("plan"), params["step"], params["diagnosis"])
        return {"decision": decision, "msg": decision["message"]}
    if mode == "rollback":
        history = params.get("history") or {}
        entry = target(history, params["release"])
        config = params.get("config") or {}
        if params.get("nodes") is None:
            pinned = pin(entry)
            return {"release": entry, "pin": pinned, "msg": f"release {entry['id']} is recorded; checking it is staged"}
        nodes = {host: {"images": (state or {}).get("images") or [],
                        "stamp": _parse_stamp((state or {}).get("stamp"), host),
                        "parked": _parse_stamp((state or {}).get("parked"), host),
                        "lock": str((state or {}).get("lock") or "")}
                 for host, state in (params.get("nodes") or {}).items()}
        swap = check_staged(entry, nodes, str(config.get("model_path") or "model_path"))
        pinned = pin(entry)
        brought = (f"; its commit is brought back from {config.get('model_path')}{_checkpoint_store.STORE_SUFFIX} on "
                   f"{', '.join(swap)} once the group stopped (nothing downloaded)" if swap else "")
        return {"release": entry, "pin": pinned, "swap": swap,
                "msg": f"release {entry['id']} is staged on every node ({', '.join(sorted(nodes))}): image "
                       f"{pinned['image']}, model {pinned['model_repo']}@{_short(pinned['model_revision'])}, profile "
                       f"{pinned['profile']}, KV {pinned['kv_cache_memory_bytes'] or 'engine-sized'}{brought}"}
    if mode == "disk":
        config = params.get("config") or {}
        if params.get("nodes") is None:
            url = hub_info_url(config, params.get("endpoint") or "")
            return {"url": url, "msg": f"the new commit's files: {url}"}
        return disk(config, params.get("model_info") or {}, params["nodes"])
    if mode == "prune":
        history = params.get("history") or {}
        if params.get("nodes") is None:
            images = recorded_images(history)
            return {"images": images, "msg": f"the history records {len(images)} images"}
        return prune(history, (params.get("config") or {}).get("upgrade_keep_staged", _checkpoint_store.DEFAULT_KEEP),
                     params["nodes"])
    result = outcome(params.get("decision") or {}, params["serving"], params["found_at"], params["served_at"],
                     params["launch_started_at"])
    return {**result, "msg": result["message"]}
