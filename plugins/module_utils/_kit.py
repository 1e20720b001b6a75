# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The MiaAI-Lab EXL3 kit's ``.env`` contract, as data, and its rendering from inventory.

Private module: may change at any time. Pure functions, no I/O, no Ansible imports.

The kit (`KIT_REPOSITORY`) is launched with its own ``./start.sh``, which sources ``.env`` (``set -a; source``)
on the head and drives the worker over ssh. Everything here is modelled on one commit, `KIT_COMMIT`: the keys,
their defaults and their order are those of that commit's ``.env.example`` (line numbers in `EXAMPLE_KEYS`);
docs/exl3-kit.md quotes the lines of ``.env.example`` and ``start.sh`` this module relies on. Pinning the kit
to another commit means re-reading that commit's ``.env.example`` and updating `EXAMPLE_KEYS` (and
`KIT_COMMIT`): a key of a newer kit (``LOAD_FORMAT``, ``NFS_SHARE``, ...) is refused here as unknown rather
than written into a file the pinned ``start.sh`` would ignore.

`render_env` writes the whole file (every key of the example, not only the changed ones), so the served
configuration never depends on the defaults of whichever kit checkout happens to be on disk. The text does
not depend on which node it is rendered for: ``./start.sh`` reads ``.env`` on the head only.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

KIT_REPOSITORY = "MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks"
KIT_URL = "https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks.git"
KIT_COMMIT = "008ae945181341da7fce399bea503d86474e3ea4"

PROFILE = "glm53_flash_exl3"
CHECKPOINT_REPO = "brandonmusic/GLM-5.3-Flash-tr3-4bpw"
DRAFTER_REPO = "incoai/GLM-5.3-Flash-DFlash2"
DRAFTER_LICENCE = "CC BY-NC-ND"
# The settings key (and the inventory variable the role maps onto it) that acknowledges non-commercial use.
ACK_SETTING = "accept_noncommercial_drafter"
ACK_VARIABLE = "dgxspark_vllm_accept_noncommercial_drafter"

Layout = Literal["hf_cache", "local_dir"]
# The EXL3 kit resolves weights through the hub cache (models--org--name/refs/main -> snapshots/<commit>), so its
# profile stages in the HF-cache layout (profiles/glm53_flash_exl3.yml says so as data; a unit test checks).
KIT_LAYOUT: Layout = "hf_cache"

# Largest GPU_MEM_UTIL rendered without an explicit opt-in: the recipe's "keep GPU_MEM_UTIL at 0.85; 0.87 has
# crashed heads" (the same limit as _serve_spec.MAX_GPU_MEMORY_UTILIZATION for the NVFP4 path).
MAX_GPU_MEM_UTIL = 0.85


class KitError(ValueError):
    """A setting or node that cannot be rendered into the kit's .env; the message names the variable and the fix."""


class LicenceError(KitError):
    """The non-commercial DFlash2 drafter would be staged or served without an acknowledgement."""


@dataclass(frozen=True)
class ExampleKey:
    """One key of the kit's .env.example at KIT_COMMIT.

    ``active``: an assignment in the example (its value is the kit default). Otherwise the key only appears in
    a comment (``# HF_BIN=...``, ``... SKIP_BUILD=1``) and ``value`` is the example shown there, not a default:
    start.sh then uses its own fallback. ``value`` is the shell value (quotes removed), ``line`` the example's
    line number, which fixes the order of the rendered file.
    """

    name: str
    value: str
    line: int
    active: bool = True


def _optional(name: str, value: str, line: int) -> ExampleKey:
    return ExampleKey(name, value, line, active=False)


# .env.example at KIT_COMMIT, in file order. Active assignments are exactly the file's 49 `KEY=value` lines;
# commented ones are the `# KEY=value` examples (and the switches the comments name) that start.sh reads.
EXAMPLE_KEYS: tuple[ExampleKey, ...] = (
    ExampleKey("HEAD_IP", "10.0.0.1", 5),
    ExampleKey("WORKER_IP", "10.0.0.2", 6),
    _optional("WORKER_USER", "", 9),
    _optional("WORKER_HOME", "/home/zurih", 10),
    _optional("WORKER_SSH", "zurih@10.0.0.2", 11),
    ExampleKey("HEAD_CX7_IF", "enp1s0f1np1", 19),
    ExampleKey("WORKER_CX7_IF", "enp1s0f0np0", 20),
    ExampleKey("HEAD_CX7_IB", "rocep1s0f1", 21),
    ExampleKey("WORKER_CX7_IB", "rocep1s0f0", 22),
    _optional("HEAD_GID", "4", 31),
    _optional("WORKER_GID", "3", 32),
    ExampleKey("MODEL", "Mia-AiLab/GLM-5.3-Flash-EXL3-TR3-4bpw", 37),
    ExampleKey("MODEL_FALLBACK", "brandonmusic/GLM-5.3-Flash-tr3-4bpw", 38),
    _optional("MODEL_CACHE_NAME", "models--brandonmusic--GLM-5.3-Flash-tr3-4bpw", 41),
    ExampleKey("MODEL_REVISION", "25a44fdbf16862a46b7cc9921142c6c81350af2f", 43),
    _optional("HF_HOME", "/home/you/.cache/huggingface", 45),
    _optional("HF_TOKEN", "hf_xxx", 46),
    _optional("HF_BIN", "/home/you/.hf-cli/venv/bin/hf", 50),
    _optional("BUILD", "1", 56),
    _optional("SKIP_BUILD", "1", 58),
    _optional("SKIP_PULL", "1", 59),
    _optional("SKIP_SHIP", "1", 60),
    _optional("FORCE_SYNC", "1", 62),
    ExampleKey("IMAGE", "ghcr.io/miaai-lab/glm-5.3-flash-2x-dgx-sparks:exl3", 64),
    _optional("GHCR_USER", "MiaAI-Lab", 65),
    _optional("GHCR_TOKEN", "ghp_xxx", 66),
    ExampleKey("PORT", "8888", 67),
    ExampleKey("TP", "2", 68),
    ExampleKey("NNODES", "2", 69),
    ExampleKey("MASTER_PORT", "29521", 70),
    ExampleKey("QUANTIZATION", "exl3", 71),
    ExampleKey("ENFORCE_EAGER", "0", 74),
    ExampleKey("EXL3_FUSED_MOE", "1", 76),
    _optional("EXL3_MOE_ROW_TILE", "0", 78),
    _optional("EXL3_TEMP_ROWS_FUSED", "32", 80),
    _optional("EXL3_FAT_SORTED", "0", 82),
    _optional("EXL3_FAT_BATCHED", "0", 84),
    ExampleKey("EXL3_FAT_KERNEL", "1", 88),
    ExampleKey("EXL3_FAT_GROUPED", "1", 95),
    ExampleKey("SERVED_MODEL_NAME", "GLM-5.3-Flash-EXL3", 96),
    ExampleKey("SPEC_METHOD", "dflash", 101),
    ExampleKey("DFLASH_MODEL", "incoai/GLM-5.3-Flash-DFlash2", 102),
    ExampleKey("DFLASH_TOKENS", "7", 103),
    ExampleKey("DFLASH_DRAFT_TP", "2", 106),
    ExampleKey("MTP_TOKENS", "2", 107),
    _optional("GLM53_ADAPTIVE_K", "ema", 115),
    _optional("GLM53_ADAPTIVE_K_SET", "2,4,7", 116),
    _optional("GLM53_DENSE_FP8", "dense,kda", 123),
    _optional("EXTRA_ARGS", "--cudagraph-capture-sizes 1 2 3 4 5 6 8 9 10 12 15 16 20 24 32 "
                            "--kv-cache-memory-bytes 15032385536", 130),
    ExampleKey("MAX_MODEL_LEN", "850000", 135),
    ExampleKey("MAX_NUM_SEQS", "4", 136),
    ExampleKey("MAX_NUM_BATCHED_TOKENS", "7168", 141),
    ExampleKey("GPU_MEM_UTIL", "0.85", 142),
    ExampleKey("KV_CACHE_DTYPE", "fp8", 143),
    ExampleKey("LANGUAGE_MODEL_ONLY", "0", 145),
    ExampleKey("SKIP_MM_PROFILING", "1", 147),
    ExampleKey("LIMIT_MM", '{"image":100,"video":1}', 154),
    ExampleKey("ABLIT", "0", 162),
    ExampleKey("ABLIT_METHOD", "auto", 164),
    ExampleKey("ABLIT_DIRECTION", "dealign", 166),
    ExampleKey("ABLIT_LAYERS", "15-45", 168),
    ExampleKey("ABLIT_ALPHA", "3.0", 171),
    ExampleKey("ABLIT_INCLUDE_MTP", "1", 173),
    _optional("VLLM_API_KEY", "", 180),
    _optional("TRITON_HOST_CACHE", "", 185),
    _optional("TILELANG_HOST_CACHE", "", 186),
    ExampleKey("GLM53_BOOT_SHAPE_WARMUP", "1", 189),
    _optional("GLM53_WARMUP_REQ_TIMEOUT", "240", 190),
    ExampleKey("GLM53_SUPPRESS_STOPS_IN_REASONING", "1", 192),
    ExampleKey("GLM53_MIXED_PREFILL_CHUNK", "0", 196),
    ExampleKey("GLM53_INDEXER_WORKSPACE", "rightsize", 201),
    ExampleKey("GLM53_SPINWAIT_MS", "stock", 204),
    _optional("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "1800", 206),
    ExampleKey("USE_HOST_NCCL", "0", 210),
    _optional("NCCL_HOST_DIR", "/home/you/nccl-2.30.7", 211),
    _optional("WORKER_NCCL_HOST_DIR", "/home/you/nccl-2.30.7", 212),
    ExampleKey("NCCL_SO_NAME", "libnccl.so.2.30.7", 213),
    ExampleKey("NCCL_IB_GID_INDEX", "3", 214),
    ExampleKey("CG_ESTIMATE", "1", 218),
    ExampleKey("NCCL_DEBUG", "WARN", 219),
)

# The kit's keys with the kit defaults: the active assignments of .env.example, in file order.
KIT_KEYS: Mapping[str, str] = MappingProxyType({key.name: key.value for key in EXAMPLE_KEYS if key.active})
# Keys the example only shows in comments (start.sh reads them, with its own fallback when unset).
KIT_OPTIONAL_KEYS: Mapping[str, str] = MappingProxyType(
    {key.name: key.value for key in EXAMPLE_KEYS if not key.active})
_LINE: Mapping[str, int] = MappingProxyType({key.name: key.line for key in EXAMPLE_KEYS})

# The recipe's "kit defaults kept", under the kit's key names. Rendered explicitly (not left to start.sh).
RECIPE_KEPT: Mapping[str, str] = MappingProxyType({
    "TP": "2",
    "PORT": "8888",
    "MAX_MODEL_LEN": "850000",
    "GPU_MEM_UTIL": "0.85",
    "KV_CACHE_DTYPE": "fp8",
    "ENFORCE_EAGER": "0",
    "SPEC_METHOD": "dflash",
    "DFLASH_TOKENS": "7",
})
# What the recipe keeps that is no key of the kit at KIT_COMMIT (see docs/exl3-kit.md for the lines).
UNKEYED_RECIPE_VALUES: Mapping[str, str] = MappingProxyType({
    "mp executor": "hard-coded: start.sh passes --distributed-executor-backend mp on both ranks",
    "reasoning-parser glm45": "hard-coded: start.sh passes --reasoning-parser glm45 on both ranks",
    "tool-call-parser glm47": "hard-coded: start.sh passes --tool-call-parser glm47 on both ranks",
    "instanttensor": f"no LOAD_FORMAT key at kit commit {KIT_COMMIT[:12]}: neither .env.example nor start.sh "
                     "mentions a load format, and its default IMAGE is the :exl3 tag, not :exl3-instanttensor",
})

# The caller exports start.sh snapshots before it sources .env and re-applies after it (start.sh:96-122): a value
# of one of these in the environment of ./start.sh silently wins over the rendered .env, so the role unsets them.
CALLER_OVERRIDES: tuple[str, ...] = tuple(sorted(
    {"MTP_TOKENS", "SPEC_METHOD", "ENFORCE_EAGER", "MAX_NUM_BATCHED_TOKENS", "IMAGE", "GPU_MEM_UTIL",
     "LANGUAGE_MODEL_ONLY", "MAX_NUM_SEQS", "MAX_MODEL_LEN", "GLM53_DENSE_FP8", "GLM53_INDEXER_WORKSPACE",
     "GLM53_SPINWAIT_MS"}
    | {key.name for key in EXAMPLE_KEYS if key.name.startswith(("EXL3_", "ABLIT", "GLM53_ADAPTIVE_K"))}))

# Keys the render derives from the nodes and settings; settings.env must not set them.
_DERIVED: Mapping[str, str] = MappingProxyType({
    "HEAD_IP": "the head node's cx7_ip",
    "WORKER_IP": "the worker node's cx7_ip",
    "HEAD_CX7_IF": "the head node's cx7_iface",
    "WORKER_CX7_IF": "the worker node's cx7_iface",
    "HEAD_CX7_IB": "the head node's ib_hca",
    "WORKER_CX7_IB": "the worker node's ib_hca",
    "HEAD_GID": "the head node's gid_index",
    "WORKER_GID": "the worker node's gid_index",
    "HF_BIN": "settings.hf_bin",
    "SKIP_BUILD": "settings.skip_build",
})
# Never written into .env by this module: pass them in the environment of the ./start.sh task (no_log).
SECRET_KEYS = frozenset({"HF_TOKEN", "GHCR_TOKEN", "VLLM_API_KEY"})
# The collection's variable for each secret the kit_launch role hands to ./start.sh.
_SECRET_VARIABLES = {"VLLM_API_KEY": "dgxspark_vllm_api_key", "HF_TOKEN": "dgxspark_vllm_hf_token"}

# Settings the collection renders into a kit key (optional: unset, the key keeps the kit default). While one is
# given, settings.env must not set its key. MODEL_CACHE_NAME follows `model` (the kit's own default folder).
SETTING_TO_KEY: Mapping[str, str] = MappingProxyType({
    "image": "IMAGE",
    "model": "MODEL",
    "model_revision": "MODEL_REVISION",
    "drafter": "DFLASH_MODEL",
    "served_model_name": "SERVED_MODEL_NAME",
    "port": "PORT",
    "master_port": "MASTER_PORT",
    "hf_home": "HF_HOME",
    "worker_user": "WORKER_USER",
    "worker_home": "WORKER_HOME",
})
SETTING_KEYS: tuple[str, ...] = (
    "hf_bin", "skip_build", "env", ACK_SETTING, "allow_high_gpu_memory_utilization", "kit_commit",
) + tuple(SETTING_TO_KEY)
NODE_KEYS: tuple[str, ...] = ("name", "cx7_ip", "head", "cx7_iface", "ib_hca", "gid_index")

_IFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
_HCA = re.compile(r"^[A-Za-z0-9_.-]+$")
_BARE = re.compile(r"^[A-Za-z0-9_./:,@%+=-]*$")
_FORBIDDEN = re.compile(r"['\x00-\x1f\x7f]")
_INT = re.compile(r"^[0-9]+$")


# --------------------------------------------------------------------------- licence and layout


def licence_guard(acknowledged: bool) -> None:
    """Refuse the DFlash2 drafter unless non-commercial use is acknowledged (exactly ``True``)."""
    if not isinstance(acknowledged, bool):
        raise KitError(f"{ACK_VARIABLE} (settings.{ACK_SETTING}) must be true or false, got {acknowledged!r}")
    if acknowledged:
        return
    raise LicenceError(
        f"the {PROFILE} profile speculates with the DFlash2 drafter {DRAFTER_REPO} (the kit's DFLASH_MODEL with "
        f"SPEC_METHOD=dflash), whose licence is {DRAFTER_LICENCE}: non-commercial use only, no derivatives. "
        f"It is neither staged nor started until {ACK_VARIABLE}: true acknowledges that this deployment is "
        "non-commercial (personal or research use). For a commercial deployment serve without it "
        "(SPEC_METHOD=mtp in settings.env, the kit's rollback) or use the NVFP4 profile.")


def drafter_guard(repo: str, acknowledged: bool) -> None:
    """`licence_guard` when ``repo`` is the non-commercial DFlash2 drafter; other drafters pass."""
    if repo == DRAFTER_REPO:
        licence_guard(acknowledged)


def served_drafter(settings: Mapping[str, Any]) -> str:
    """The drafter the rendered .env speculates with (DFLASH_MODEL under SPEC_METHOD=dflash), else ``""``.

    Read from the settings alone (no nodes needed), as `render_env` resolves them: settings.drafter over
    settings.env's DFLASH_MODEL over the kit default; SPEC_METHOD from settings.env over the kit default.
    """
    env = settings.get("env") or {}
    if str(env.get("SPEC_METHOD", KIT_KEYS["SPEC_METHOD"])) != "dflash":
        return ""
    return str(settings.get("drafter") or env.get("DFLASH_MODEL") or KIT_KEYS["DFLASH_MODEL"])


def check_example(text: str) -> None:
    """Refuse a kit checkout whose ``.env.example`` does not have the keys this module renders.

    ``text`` is the checkout's ``.env.example``. Every active key of `EXAMPLE_KEYS` must be assigned in it, and
    it must assign no key `EXAMPLE_KEYS` does not know: otherwise the rendered ``.env`` would set keys that
    checkout ignores, or leave keys it reads at whatever default it has. Comments are not compared.
    """
    if not isinstance(text, str):
        raise KitError(f"the kit's .env.example must be text, got {type(text).__name__}")
    assigned = set()
    for line in text.splitlines():
        match = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", line)
        if match:
            assigned.add(match.group(1))
    missing = sorted(set(KIT_KEYS) - assigned)
    unknown = sorted(assigned - set(_LINE))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"it does not assign {', '.join(missing)}")
        if unknown:
            parts.append(f"it assigns keys this collection does not model: {', '.join(unknown)}")
        raise KitError(f"the kit checkout's .env.example is not the contract modelled at {KIT_COMMIT[:12]}: "
                       f"{'; '.join(parts)}. Pin the kit to a commit with that contract (kit_launch_commit), or "
                       "re-read the new commit's .env.example and start.sh and update _kit.EXAMPLE_KEYS")


def hf_cache_folder(repo: str) -> str:
    """The hub-cache folder of a repository: ``models--org--name`` (start.sh's ``models--${MODEL//\\//--}``)."""
    if not isinstance(repo, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise KitError(f"{repo!r} is not a hub repository id of the form org/name")
    return "models--" + repo.replace("/", "--")


@dataclass(frozen=True)
class StagedRepo:
    """One repository the EXL3 profile stages, and where the kit looks for it under the hub cache."""

    repo: str
    role: str
    layout: Layout
    cache_folder: str
    licence_note: str = ""


def exl3_staging(acknowledged: bool, spec_method: str = "dflash") -> tuple[StagedRepo, ...]:
    """The repositories to stage for the EXL3 profile; the drafter only with ``SPEC_METHOD=dflash``, guarded."""
    if spec_method not in ("dflash", "mtp", "none"):
        raise KitError(f"spec_method must be dflash, mtp or none (the kit's SPEC_METHOD), got {spec_method!r}")
    layout = KIT_LAYOUT
    repos = [StagedRepo(CHECKPOINT_REPO, "checkpoint", layout, hf_cache_folder(CHECKPOINT_REPO))]
    if spec_method == "dflash":
        licence_guard(acknowledged)
        repos.append(StagedRepo(DRAFTER_REPO, "drafter", layout, hf_cache_folder(DRAFTER_REPO),
                                f"{DRAFTER_LICENCE} (non-commercial), acknowledged"))
    return tuple(repos)


# --------------------------------------------------------------------------- scalar checks


def _text(where: str, value: Any) -> str:
    """A scalar as the string the shell will see; booleans are refused (write 0/1 or true/false as text)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise KitError(f"{where} must be a string or a number, got {value!r}")
    text = value if isinstance(value, str) else str(value)
    if _FORBIDDEN.search(text):
        raise KitError(f"{where} {text!r} contains a single quote or a control character (newline, tab, ...): "
                       "start.sh hands values to the worker inside single quotes (ssh ... -e NAME='value'), "
                       "so such a value cannot reach the worker intact")
    return text


def _int(where: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, str) and _INT.match(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise KitError(f"{where} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise KitError(f"{where} must be between {minimum} and {maximum}, got {value}")
    return value


def _ipv4(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise KitError(f"{where} is missing: the node's CX7 IPv4 address (e.g. 192.168.100.11)")
    try:
        address = ipaddress.ip_address(value.strip())
    except ValueError:
        raise KitError(f"{where} must be an IPv4 address (e.g. 192.168.100.11), got {value!r}") from None
    if address.version != 4:
        raise KitError(f"{where} must be an IPv4 address, got {value!r}: the kit's preflight looks for it in "
                       "`ip -4 addr show` on the head")
    return str(address)


def _iface(where: str, value: Any) -> str:
    if value is None or value == "":
        raise KitError(f"{where} is missing: the node's CX7 network interface (e.g. enp1s0f1np1); "
                       "the kit pins NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to it per node")
    if not isinstance(value, str) or not _IFACE.match(value):
        raise KitError(f"{where} must be one network interface name (at most 15 characters), got {value!r}")
    return value


def _hca(where: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        if not all(isinstance(item, str) for item in value):
            raise KitError(f"{where} must be an RDMA device name such as rocep1s0f1, got {value!r}")
        value = ",".join(value)
    if value is None or value == "":
        raise KitError(f"{where} is missing: the node's CX7 RDMA device (e.g. rocep1s0f1); "
                       "the kit passes it as that rank's NCCL_IB_HCA")
    if not isinstance(value, str):
        raise KitError(f"{where} must be an RDMA device name such as rocep1s0f1, got {value!r}")
    if "," in value:
        raise KitError(f"{where} is {value!r}: the kit at {KIT_COMMIT[:12]} takes one RDMA device per node "
                       "(its preflight reads /sys/class/infiniband/<device>/ports/1/gids/<index>, which a "
                       "comma-separated list breaks); give the device whose GID table holds the node's CX7 IP")
    if not _HCA.match(value):
        raise KitError(f"{where} must be an RDMA device name such as rocep1s0f1, got {value!r}")
    return value


def _gid(where: str, value: Any) -> int:
    if value is None or value == "":
        raise KitError(f"{where} is missing: the node's RoCE v2 GID index (detected by preflight, or set it in "
                       "inventory); the index is per NIC and may differ between the nodes")
    return _int(where, value, 0, 255)


# --------------------------------------------------------------------------- kit value checks


def _check_enum(*allowed: str) -> Callable[[str, str], None]:
    def check(where: str, text: str) -> None:
        if text not in allowed:
            raise KitError(f"{where} must be one of {', '.join(allowed)}, got {text!r}")
    return check


def _check_int(minimum: int, maximum: int, why: str = "") -> Callable[[str, str], None]:
    def check(where: str, text: str) -> None:
        if not _INT.match(text) or not minimum <= int(text) <= maximum:
            raise KitError(f"{where} must be an integer from {minimum} to {maximum}{why}, got {text!r}")
    return check


def _check_fixed(expected: str, why: str) -> Callable[[str, str], None]:
    def check(where: str, text: str) -> None:
        if text != expected:
            raise KitError(f"{where} must be {expected} ({why}), got {text!r}")
    return check


# The checks start.sh itself makes before launching (validate_numeric_config), plus the recipe's hard limits.
_KIT_CHECKS: Mapping[str, Callable[[str, str], None]] = MappingProxyType({
    "TP": _check_fixed("2", "two nodes with one GB10 each; start.sh expects TP=2"),
    "NNODES": _check_fixed("2", "the kit launches exactly one head and one worker"),
    "PORT": _check_int(1, 65535),
    "MASTER_PORT": _check_int(1, 65535),
    "MAX_MODEL_LEN": _check_int(1, 1000000, " (start.sh refuses more than 1000000)"),
    "MAX_NUM_SEQS": _check_int(1, 4096),
    "MAX_NUM_BATCHED_TOKENS": _check_int(1, 8388608),
    "DFLASH_TOKENS": _check_int(1, 64),
    "KV_CACHE_DTYPE": _check_fixed("fp8", "the SM121 sparse-MLA kernel only takes packed fp8_ds_mla"),
    "ENFORCE_EAGER": _check_enum("0", "1"),
    "SPEC_METHOD": _check_enum("dflash", "mtp", "none"),
    "GLM53_INDEXER_WORKSPACE": _check_enum("stock", "rightsize"),
})


# start.sh's own GPU_MEM_UTIL syntax (validate_numeric_config): 0, 0.x, .x, 1 or 1.0...
_GPU_MEM_UTIL = re.compile(r"^(0([.][0-9]+)?|[.][0-9]+|1([.]0+)?)$")


def _check_gpu_mem_util(where: str, text: str, allow_high: bool) -> None:
    if not _GPU_MEM_UTIL.match(text) or not 0 < float(text) <= 1:
        raise KitError(f"{where} must be a decimal greater than 0 and at most 1, such as 0.85, got {text!r}")
    if float(text) > MAX_GPU_MEM_UTIL and not allow_high:
        raise KitError(f"{where} is {text}, above {MAX_GPU_MEM_UTIL}: the recipe keeps GPU_MEM_UTIL at 0.85 because "
                       "0.87 has crashed heads. Keep 0.85, or set settings.allow_high_gpu_memory_utilization: true "
                       "to accept the risk")


# --------------------------------------------------------------------------- settings and nodes


@dataclass(frozen=True)
class _Settings:
    hf_bin: str
    skip_build: bool
    env: Mapping[str, str]
    acknowledged: bool
    allow_high: bool
    derived: Mapping[str, str]


def _settings(raw: Any) -> _Settings:
    if not isinstance(raw, Mapping):
        raise KitError(f"settings must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in SETTING_KEYS)
    if unknown:
        raise KitError(f"settings has unknown key(s): {', '.join(unknown)}; known keys: {', '.join(SETTING_KEYS)}")
    commit = raw.get("kit_commit")
    if commit is not None and commit != KIT_COMMIT:
        raise KitError(f"settings.kit_commit is {commit!r}, but this renderer models the kit's .env at {KIT_COMMIT}: "
                       "pin the kit to that commit, or re-read the new commit's .env.example and update "
                       "_kit.EXAMPLE_KEYS and _kit.KIT_COMMIT")
    hf_bin = raw.get("hf_bin")
    if hf_bin is None or (isinstance(hf_bin, str) and not hf_bin.strip()):
        raise KitError("settings.hf_bin is missing: the absolute path of the hf CLI on the head (the kit's HF_BIN, "
                       "which the recipe sets)")
    hf_bin = _text("settings.hf_bin", hf_bin)
    if not hf_bin.split()[0].startswith("/"):
        raise KitError(f"settings.hf_bin must start with the absolute path of the hf CLI on the head "
                       f"(arguments may follow), got {hf_bin!r}")
    flags = {}
    for key, default in (("skip_build", True), (ACK_SETTING, False), ("allow_high_gpu_memory_utilization", False)):
        value = raw.get(key, default)
        value = default if value is None else value
        if not isinstance(value, bool):
            name = f"{ACK_VARIABLE} (settings.{key})" if key == ACK_SETTING else f"settings.{key}"
            raise KitError(f"{name} must be true or false, got {value!r}")
        flags[key] = value
    derived = _derived_settings(raw)
    env = _env(raw.get("env"))
    for setting, key in SETTING_TO_KEY.items():
        if setting in derived and key in env:
            raise KitError(f"settings.env must not set {key}: it is rendered from settings.{setting} "
                           f"({derived[setting]!r}); change that instead")
    if "model" in derived and "MODEL_CACHE_NAME" in env:
        raise KitError("settings.env must not set MODEL_CACHE_NAME: it follows settings.model "
                       f"({hf_cache_folder(derived['model'])})")
    return _Settings(hf_bin=hf_bin, skip_build=flags["skip_build"], env=env,
                     acknowledged=flags[ACK_SETTING], allow_high=flags["allow_high_gpu_memory_utilization"],
                     derived=derived)


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _derived_settings(raw: Mapping[str, Any]) -> dict[str, str]:
    """The optional settings that name a kit key's value, checked; None (or absent) leaves the kit default."""
    out: dict[str, str] = {}
    for setting in SETTING_TO_KEY:
        value = raw.get(setting)
        if value is None:
            continue
        where = f"settings.{setting}"
        if setting in ("port", "master_port"):
            out[setting] = str(_int(where, value, 1, 65535))
            continue
        text = _text(where, value)
        if not text.strip():
            raise KitError(f"{where} is empty: leave it unset (null) to keep the kit default")
        if setting in ("model", "drafter"):
            hf_cache_folder(text)   # an org/name repository id
        elif setting == "model_revision" and not _COMMIT.match(text):
            raise KitError(f"{where} must be the 40-hex commit the checkpoint was staged at (the kit resolves "
                           f"snapshots/<commit> with it), got {text!r}")
        elif setting in ("hf_home", "worker_home") and not text.startswith("/"):
            raise KitError(f"{where} must be an absolute path, got {text!r}")
        out[setting] = text
    return out


def _env(raw: Any) -> Mapping[str, str]:
    """settings.env: kit keys to set besides the recipe's; only keys of the example at KIT_COMMIT."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise KitError(f"settings.env must be a dict of KIT_KEY: value, got {raw!r}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if key in SECRET_KEYS:
            instead = _SECRET_VARIABLES.get(key)
            raise KitError(f"settings.env must not set {key}: it is a secret and this file is plain text; " + (
                f"set {instead} instead, which the kit_launch role hands to ./start.sh through a 0600 file that "
                "the start reads and removes (start.sh keeps a caller's value when .env does not set it)"
                if instead else "the collection stages the image itself (log the nodes in to the registry)"))
        if key in _DERIVED:
            raise KitError(f"settings.env must not set {key}: it is rendered from {_DERIVED[key]}")
        if key not in _LINE:
            raise KitError(f"settings.env has unknown key {key!r}: not a key of the kit's .env.example at "
                           f"{KIT_COMMIT[:12]} (known: {', '.join(sorted(_LINE))})")
        out[key] = _text(f"settings.env.{key}", value)
    return out


@dataclass(frozen=True)
class _Node:
    name: str
    cx7_ip: str
    head: bool
    cx7_iface: str
    ib_hca: str
    gid_index: int


def _node(where: str, raw: Any) -> _Node:
    if not isinstance(raw, Mapping):
        raise KitError(f"{where} must be a dict with name, cx7_ip, head, cx7_iface, ib_hca and gid_index, got {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise KitError(f"{where}.name is missing: the node's inventory name")
    where = f"{where} ({name})"
    unknown = sorted(str(key) for key in raw if key not in NODE_KEYS)
    if unknown:
        raise KitError(f"{where} has unknown key(s): {', '.join(unknown)}; known keys: {', '.join(NODE_KEYS)}")
    head = raw.get("head", False)
    head = False if head is None else head
    if not isinstance(head, bool):
        raise KitError(f"{where}.head must be true or false, got {head!r}")
    return _Node(
        name=name,
        cx7_ip=_ipv4(f"{where}.cx7_ip", raw.get("cx7_ip")),
        head=head,
        cx7_iface=_iface(f"{where}.cx7_iface", raw.get("cx7_iface")),
        ib_hca=_hca(f"{where}.ib_hca", raw.get("ib_hca")),
        gid_index=_gid(f"{where}.gid_index", raw.get("gid_index")),
    )


def _cluster(node: Any, peers: Any) -> tuple[_Node, _Node]:
    if isinstance(peers, (str, bytes, Mapping)) or not isinstance(peers, Sequence):
        raise KitError(f"peers must be a list of node dicts, got {peers!r}")
    nodes = [_node("node", node)] + [_node(f"peers[{index}]", item) for index, item in enumerate(peers)]
    if len(nodes) != 2:
        raise KitError(f"the kit serves on exactly two nodes (one head, one worker); got {len(nodes)}: "
                       f"{', '.join(item.name for item in nodes)}")
    first, second = nodes
    if first.name == second.name:
        raise KitError(f"both nodes are named {first.name!r}: node names must be unique")
    if first.cx7_ip == second.cx7_ip:
        raise KitError(f"{first.name} and {second.name} have the same cx7_ip {first.cx7_ip}: each node needs its own")
    heads = [item for item in nodes if item.head]
    if len(heads) != 1:
        raise KitError(f"exactly one of {first.name}, {second.name} must have head: true (the node that runs "
                       f"./start.sh and serves the API); got {len(heads)}")
    head = heads[0]
    worker = second if head is first else first
    return head, worker


# --------------------------------------------------------------------------- render


def quote(value: str) -> str:
    """A value as written into the shell-sourced .env: bare when safe, else single-quoted.

    Values with a single quote or a control character are refused before they get here (see `_text`), so
    single quotes need no escaping and nothing inside them (``$``, backticks, spaces, ``#``) is interpreted.
    """
    if _FORBIDDEN.search(value):
        raise KitError(f"value {value!r} cannot be written safely into the kit's .env")
    return value if _BARE.match(value) else f"'{value}'"


def _resolve(settings: Mapping[str, Any], node: Mapping[str, Any],
             peers: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], _Node]:
    options = _settings(settings)
    head, worker = _cluster(node, peers)
    values: dict[str, str] = dict(KIT_KEYS)
    values.update(options.env)
    values.update({
        "HEAD_IP": head.cx7_ip,
        "WORKER_IP": worker.cx7_ip,
        "HEAD_CX7_IF": head.cx7_iface,
        "WORKER_CX7_IF": worker.cx7_iface,
        "HEAD_CX7_IB": head.ib_hca,
        "WORKER_CX7_IB": worker.ib_hca,
        "HEAD_GID": str(head.gid_index),
        "WORKER_GID": str(worker.gid_index),
        "HF_BIN": options.hf_bin,
    })
    for setting, value in options.derived.items():
        values[SETTING_TO_KEY[setting]] = value
    if "model" in options.derived:
        values["MODEL_CACHE_NAME"] = hf_cache_folder(options.derived["model"])
    if options.skip_build:
        values["SKIP_BUILD"] = "1"
    for key, check in _KIT_CHECKS.items():
        check(_where(key, options), values[key])
    _check_gpu_mem_util(_where("GPU_MEM_UTIL", options), values["GPU_MEM_UTIL"], options.allow_high)
    if values["PORT"] == values["MASTER_PORT"]:
        raise KitError(f"PORT and MASTER_PORT are both {values['PORT']}: the API and the rendezvous need "
                       "different ports (set one of them in settings.env)")
    if values["SPEC_METHOD"] == "dflash":
        drafter_guard(values["DFLASH_MODEL"], options.acknowledged)
    return {key: values[key] for key in sorted(values, key=lambda name: _LINE[name])}, head


def _where(key: str, options: _Settings) -> str:
    return f"settings.env.{key}" if key in options.env else f"{key} (kit default)"


def resolve_env(settings: Mapping[str, Any], node: Mapping[str, Any],
                peers: Sequence[Mapping[str, Any]] = ()) -> dict[str, str]:
    """Every key `render_env` writes and its value, in the example's order. Raises KitError (LicenceError)."""
    return _resolve(settings, node, peers)[0]


def render_env(settings: Mapping[str, Any], node: Mapping[str, Any],
               peers: Sequence[Mapping[str, Any]] = ()) -> str:
    """The kit's .env for the cluster of ``node`` and ``peers``, as written on ``node``.

    ``settings``: hf_bin (required), skip_build (default true), env (more kit keys, by their kit name),
    accept_noncommercial_drafter (must be true while the DFlash2 drafter is used),
    allow_high_gpu_memory_utilization, kit_commit (checked against KIT_COMMIT when given).
    ``node`` and each of ``peers``: name, cx7_ip, head, cx7_iface, ib_hca, gid_index (all but head required).
    The text is the same whichever of the two nodes is ``node``. Raises KitError (LicenceError).
    """
    values, head = _resolve(settings, node, peers)
    lines = [
        f"# Rendered by the dgxspark.vllm collection (profile {PROFILE}); edits are overwritten.",
        f"# Keys and order: .env.example of {KIT_REPOSITORY} at {KIT_COMMIT}.",
        f"# ./start.sh reads this file on the head ({head.name}) only; it drives the worker over ssh.",
    ]
    lines += [f"{key}={quote(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"
