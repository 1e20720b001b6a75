# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the launch needs to know about one node before it decides anything, read in one pass.

The interface that carries the node's CX7 IP, the serve image's ID, the serve container (running? which config
hash?), the GPU's identity, the staged checkpoint's stamp and whether a staging lock is held: each used to be its
own task or fact gathering (a module run each on the node); `vllm_node_state` reads them together. Pure parsing
here; the module runs the commands.
"""
from __future__ import annotations

import ipaddress
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._firewall import table_state
from ansible_collections.dgxspark.vllm.plugins.module_utils._manifest import STAMP_NAME
from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import is_commit

CONFIG_HASH_LABEL = "dgxspark.vllm.config_hash"
GPU_QUERY = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]

RunCommand = Callable[[Sequence[str]], "tuple[int, str, str]"]


class NodeStateError(Exception):
    """A read that failed for a reason the user must fix (docker unreachable, an unreadable stamp)."""


def _missing(err: str) -> bool:
    return "No such" in err or "no such" in err


def parse_ipv4_addresses(ip_json: str) -> dict[str, list[str]]:
    """`ip -j -4 addr show` -> {interface: [its IPv4 addresses]}; interfaces without one are left out."""
    try:
        data = json.loads(ip_json or "[]")
    except ValueError as exc:
        raise NodeStateError("ip -j -4 addr show returned no JSON: %s" % exc) from exc
    if not isinstance(data, list):
        raise NodeStateError("ip -j -4 addr show returned %r, not a list" % (type(data).__name__,))
    out: dict[str, list[str]] = {}
    for link in data:
        if not isinstance(link, dict) or not link.get("ifname"):
            continue
        addresses = [str(info["local"]) for info in link.get("addr_info") or []
                     if isinstance(info, dict) and info.get("family") == "inet" and info.get("local")]
        if addresses:
            out.setdefault(str(link["ifname"]), []).extend(addresses)
    return out


def interface_with_ip(addresses: Mapping[str, Sequence[str]], ip: str) -> str | None:
    """The interface that carries `ip` (an IPv4 address, compared as an address), None when none does."""
    try:
        wanted = ipaddress.IPv4Address(ip.strip())
    except ValueError as exc:
        raise NodeStateError("the CX7 IP %r is not an IPv4 address: fix dgxspark_vllm_cx7_ip in the inventory"
                             % (ip,)) from exc
    for name, found in addresses.items():
        for address in found:
            try:
                if ipaddress.IPv4Address(address.split("/")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def no_interface_message(ip: str, addresses: Mapping[str, Sequence[str]]) -> str:
    """The fix when no interface carries the CX7 IP, with what the node has instead."""
    have = ", ".join("%s %s" % (name, "/".join(found)) for name, found in sorted(addresses.items())) or "none"
    return ("no interface of this node carries its CX7 IP %s (IPv4 interfaces: %s). Fix dgxspark_vllm_cx7_ip in "
            "the inventory, address the CX7 port, or name the port with dgxspark_vllm_cx7_iface." % (ip, have))


def parse_gpu(rc: int, out: str) -> dict[str, str | None] | None:
    """nvidia-smi's first CSV line -> {gpu_name, driver, gpu_memory}; None when it did not run."""
    if rc != 0:
        return None
    first = next((line for line in out.splitlines() if line.strip()), "")
    parts = [part.strip() for part in first.split(",")] + ["", "", ""]
    return {"gpu_name": parts[0] or None, "driver": parts[1] or None, "gpu_memory": parts[2] or None}


def parse_container(inspect_json: str | None) -> dict[str, Any]:
    """`docker container inspect` output (a JSON list, or None when absent) -> the state the launch compares."""
    if inspect_json is None:
        return {"exists": False, "running": False, "id": None, "exit_code": None, "config_hash": None,
                "started_at": None}
    try:
        data = json.loads(inspect_json)
    except ValueError as exc:
        raise NodeStateError("docker container inspect returned no JSON: %s" % exc) from exc
    item = data[0] if isinstance(data, list) and data else data
    if not isinstance(item, dict):
        raise NodeStateError("docker container inspect returned %r" % (type(item).__name__,))
    state = item.get("State") or {}
    labels = (item.get("Config") or {}).get("Labels") or {}
    return {"exists": True, "running": bool(state.get("Running")), "id": item.get("Id"),
            "exit_code": state.get("ExitCode"), "config_hash": labels.get(CONFIG_HASH_LABEL),
            "started_at": state.get("StartedAt")}


def parse_image_id(rc: int, out: str, err: str, image: str) -> str | None:
    """`docker image inspect --format {{.Id}}` -> the ID, None when the node does not hold the image."""
    if rc == 0:
        return out.strip() or None
    if _missing(err):
        return None
    raise NodeStateError("docker image inspect %s failed on this node: %s; is dockerd running and this user allowed "
                         "to use it (become: true, or the docker group)?" % (image, " ".join(err.split()) or rc))


def parse_stamp(text: str | None, path: str) -> dict[str, Any] | None:
    """The stamp file's JSON (None when the file is absent); a stamp that is not a JSON object is an error."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise NodeStateError("the stamp %s is not JSON (%s): re-run the checkpoint staging" % (path, exc)) from exc
    if not isinstance(data, dict):
        raise NodeStateError("the stamp %s is not a JSON object: re-run the checkpoint staging" % path)
    return data


def hf_staged(hub_dir: str, repos: Sequence[Mapping[str, Any]], read_text: Callable[[str], str | None],
              exists: Callable[[str], bool]) -> list[dict[str, Any]]:
    """Which commit of each repository (``{repo, revision}``; an empty repo is skipped) the hub cache under
    ``hub_dir`` holds staged and verified: the commit ``refs/<revision>`` points at (the revision itself when it is a
    commit id), and whether its snapshot carries the staging's stamp. One ``{repo, revision, commit, staged,
    stamp_path}`` per repository (``commit`` None when the ref is missing)."""
    found: list[dict[str, Any]] = []
    for item in repos:
        repo, revision = str(item.get("repo") or ""), str(item.get("revision") or "main")
        if not repo:
            continue
        folder = posixpath.join(hub_dir, "models--" + repo.replace("/", "--"))
        if is_commit(revision):
            commit: str | None = revision
        else:
            text = read_text(posixpath.join(folder, "refs", revision))
            commit = text.strip() if text and is_commit(text.strip()) else None
        stamp = posixpath.join(folder, "snapshots", commit, STAMP_NAME) if commit else None
        found.append({"repo": repo, "revision": revision, "commit": commit,
                      "staged": bool(stamp) and exists(stamp), "stamp_path": stamp})
    return found


def mem_total_mb(meminfo: str) -> int | None:
    """MemTotal from /proc/meminfo in MiB, rounded down as Ansible's memtotal_mb fact is (GB10: unified memory)."""
    for line in meminfo.splitlines():
        name, _sep, rest = line.partition(":")
        if name == "MemTotal":
            fields = rest.split()
            if fields and fields[0].isdigit():
                return int(fields[0]) // 1024
    return None


def read_state(run: RunCommand, docker: str | None, container: str | None, image: str | None,
               nvidia_smi: str | None, stamp_text: str | None, stamp_path: str | None, lock_exists: bool | None,
               meminfo: str = "", firewall_table: str | None = None, nft: str | None = None) -> dict[str, Any]:
    """Run the reads (run: argv -> (rc, out, err)) and return the node's state (container None: not read;
    firewall None: not asked)."""
    state: dict[str, Any] = {"container": None, "firewall": None}
    if firewall_table:
        if nft:
            rc, out, _err = run([nft, "list", "table", *firewall_table.split()])
            state["firewall"] = table_state(rc, out)
        else:
            state["firewall"] = table_state(None, "")
    if (container or image) and not docker:
        raise NodeStateError("the docker CLI is not installed on this node (not found on PATH)")
    if container and docker:
        rc, out, err = run([docker, "container", "inspect", container])
        if rc != 0 and not _missing(err):
            raise NodeStateError("docker container inspect %s failed on this node: %s; is dockerd running?"
                                 % (container, " ".join(err.split()) or rc))
        state["container"] = parse_container(out if rc == 0 else None)
    if image and docker:
        rc, out, err = run([docker, "image", "inspect", "--format", "{{.Id}}", image])
        state["image_id"] = parse_image_id(rc, out, err, image)
    else:
        state["image_id"] = None
    if nvidia_smi:
        rc, out, _err = run([nvidia_smi] + GPU_QUERY)
        state["gpu"] = parse_gpu(rc, out)
    else:
        state["gpu"] = None
    state["stamp"] = parse_stamp(stamp_text, stamp_path or "") if stamp_path else None
    state["staging_lock"] = lock_exists
    state["mem_total_mb"] = mem_total_mb(meminfo)
    return state


# ------------------------------------------------------------------------------------------- description

_DESCRIBED = ("cx7_iface", "ib_hca", "gid_index")


def _given(value: Any) -> bool:
    return value is not None and value != ""


def wants_rdma(inventory: Mapping[str, Any], detected: Mapping[str, Any]) -> bool:
    """Whether the RDMA facts must be read from sysfs: neither preflight (in this run) nor the inventory gave both
    the HCAs and the GID index."""
    if _given(detected.get("gid_index")):
        return False
    return not (_given(inventory.get("ib_hca")) and _given(inventory.get("gid_index")))


def chosen_iface(inventory: Mapping[str, Any], detected: Mapping[str, Any]) -> str | None:
    """The CX7 interface the inventory names, else the one preflight found in this run (None: find it by IP)."""
    for source in (inventory, detected):
        if _given(source.get("cx7_iface")):
            return str(source["cx7_iface"])
    return None


def describe(name: str, cx7_ip: str, head: bool, cx7_iface: str | None, inventory: Mapping[str, Any],
             detected: Mapping[str, Any], rdma: Mapping[str, Any] | None) -> dict[str, Any]:
    """The node as the render takes it (`vllm_serve_spec`'s nodes entry): each RDMA fact from the inventory, else
    from preflight in this run, else from the sysfs read (when it succeeded); unknown facts are left out."""
    read = rdma if rdma and rdma.get("ok") else {}
    out: dict[str, Any] = {"name": name, "cx7_ip": cx7_ip, "head": head}
    if _given(cx7_iface):
        out["cx7_iface"] = cx7_iface
    for key in ("ib_hca", "gid_index"):
        for source in (inventory, detected, read):
            if _given(source.get(key)):
                out[key] = source[key]
                break
    return out


def identity(name: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """The node's part of the KV calibration key: serve image ID and hardware (GPU, driver, memory)."""
    gpu = state.get("gpu") or {}
    mem_mb = state.get("mem_total_mb")
    return {
        "name": name,
        "image_id": state.get("image_id") or "",
        "hardware": {
            "gpu_name": gpu.get("gpu_name") or "" if state.get("gpu") else None,
            "driver": gpu.get("driver") or "" if state.get("gpu") else None,
            "gpu_memory": gpu.get("gpu_memory") or "" if state.get("gpu") else None,
            "mem_total_bytes": mem_mb * 1048576 if mem_mb else None,
        },
    }
