# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import copy
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _kit
from helpers.profiles import PROFILES
from ansible_collections.dgxspark.vllm.plugins.module_utils._kit import (
    KIT_COMMIT,
    KIT_KEYS,
    KIT_OPTIONAL_KEYS,
    KitError,
    LicenceError,
    exl3_staging,
    hf_cache_folder,
    licence_guard,
    render_env,
    resolve_env,
)

# The `KEY=value` lines of the kit's .env.example at KIT_COMMIT, verbatim, with their line numbers: an
# independent copy of the real file's assignments, so a slip in _kit.EXAMPLE_KEYS (a key, a default, the order,
# the shell quoting of LIMIT_MM) shows here.
EXAMPLE_ASSIGNMENTS = """\
5:HEAD_IP=10.0.0.1
6:WORKER_IP=10.0.0.2
19:HEAD_CX7_IF=enp1s0f1np1
20:WORKER_CX7_IF=enp1s0f0np0
21:HEAD_CX7_IB=rocep1s0f1
22:WORKER_CX7_IB=rocep1s0f0
37:MODEL=Mia-AiLab/GLM-5.3-Flash-EXL3-TR3-4bpw
38:MODEL_FALLBACK=brandonmusic/GLM-5.3-Flash-tr3-4bpw
43:MODEL_REVISION=25a44fdbf16862a46b7cc9921142c6c81350af2f
64:IMAGE=ghcr.io/miaai-lab/glm-5.3-flash-2x-dgx-sparks:exl3
67:PORT=8888
68:TP=2
69:NNODES=2
70:MASTER_PORT=29521
71:QUANTIZATION=exl3
74:ENFORCE_EAGER=0
76:EXL3_FUSED_MOE=1
88:EXL3_FAT_KERNEL=1
95:EXL3_FAT_GROUPED=1
96:SERVED_MODEL_NAME=GLM-5.3-Flash-EXL3
101:SPEC_METHOD=dflash
102:DFLASH_MODEL=incoai/GLM-5.3-Flash-DFlash2
103:DFLASH_TOKENS=7
106:DFLASH_DRAFT_TP=2
107:MTP_TOKENS=2
135:MAX_MODEL_LEN=850000
136:MAX_NUM_SEQS=4
141:MAX_NUM_BATCHED_TOKENS=7168
142:GPU_MEM_UTIL=0.85
143:KV_CACHE_DTYPE=fp8
145:LANGUAGE_MODEL_ONLY=0
147:SKIP_MM_PROFILING=1
154:LIMIT_MM='{"image":100,"video":1}'
162:ABLIT=0
164:ABLIT_METHOD=auto
166:ABLIT_DIRECTION=dealign
168:ABLIT_LAYERS=15-45
171:ABLIT_ALPHA=3.0
173:ABLIT_INCLUDE_MTP=1
189:GLM53_BOOT_SHAPE_WARMUP=1
192:GLM53_SUPPRESS_STOPS_IN_REASONING=1
196:GLM53_MIXED_PREFILL_CHUNK=0
201:GLM53_INDEXER_WORKSPACE=rightsize
204:GLM53_SPINWAIT_MS=stock
210:USE_HOST_NCCL=0
213:NCCL_SO_NAME=libnccl.so.2.30.7
214:NCCL_IB_GID_INDEX=3
218:CG_ESTIMATE=1
219:NCCL_DEBUG=WARN
"""
# The commented keys the recipe needs, and where the example shows them.
EXAMPLE_COMMENTED = {"HEAD_GID": 31, "WORKER_GID": 32, "HF_BIN": 50, "SKIP_BUILD": 58}

HEAD = {"name": "spark1", "cx7_ip": "192.168.100.11", "head": True, "cx7_iface": "enp1s0f1np1",
        "ib_hca": "rocep1s0f1", "gid_index": 4}
WORKER = {"name": "spark2", "cx7_ip": "192.168.100.12", "cx7_iface": "enP2p1s0f0np0",
          "ib_hca": "roceP2p1s0f0", "gid_index": 3}
HF_BIN = "/opt/hf-cli/venv/bin/hf"

# The recipe's values that differ from the kit defaults, under the kit's names, for HEAD/WORKER above.
RECIPE_CHANGED = {
    "HEAD_IP": "192.168.100.11",
    "WORKER_IP": "192.168.100.12",
    "HEAD_CX7_IF": "enp1s0f1np1",
    "WORKER_CX7_IF": "enP2p1s0f0np0",
    "HEAD_CX7_IB": "rocep1s0f1",
    "WORKER_CX7_IB": "roceP2p1s0f0",
    "HEAD_GID": "4",
    "WORKER_GID": "3",
    "HF_BIN": HF_BIN,
    "SKIP_BUILD": "1",
}
# The recipe's kept defaults, under the kit's names.
RECIPE_KEPT = {
    "TP": "2", "PORT": "8888", "MAX_MODEL_LEN": "850000", "GPU_MEM_UTIL": "0.85", "KV_CACHE_DTYPE": "fp8",
    "ENFORCE_EAGER": "0", "SPEC_METHOD": "dflash", "DFLASH_TOKENS": "7",
}


def example() -> list[tuple[int, str, str]]:
    out = []
    for row in EXAMPLE_ASSIGNMENTS.splitlines():
        line, _sep, assignment = row.partition(":")
        name, _eq, raw = assignment.partition("=")
        out.append((int(line), name, shlex.split(raw)[0]))
    return out


def settings(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"hf_bin": HF_BIN, "accept_noncommercial_drafter": True}
    base.update(extra)
    return base


def nodes(**changes: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    head, worker = copy.deepcopy(HEAD), copy.deepcopy(WORKER)
    head.update(changes.get("head", {}))
    worker.update(changes.get("worker", {}))
    return head, [worker]


def render(node: str = "head", **extra: Any) -> str:
    head, peers = nodes()
    if node == "worker":
        return render_env(settings(**extra), peers[0], [head])
    return render_env(settings(**extra), head, peers)


def rendered_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _eq, raw = line.partition("=")
        words = shlex.split(raw)
        pairs.append((name, words[0] if words else ""))
    return pairs


def sourced(text: str, tmp_path: Path) -> dict[str, str]:
    """What bash sees after start.sh's `set -a; source .env`."""
    env_file = tmp_path / ".env"
    env_file.write_text(text)
    names = [name for name, _value in rendered_pairs(text)]
    script = 'set -a; source "$1"; shift; for k in "$@"; do printf "%s\\0%s\\0" "$k" "${!k}"; done'
    out = subprocess.run(["bash", "-c", script, "bash", str(env_file), *names], check=True,
                         capture_output=True, env={"PATH": "/usr/bin:/bin"}).stdout.decode()
    fields = out.split("\0")[:-1]
    return dict(zip(fields[::2], fields[1::2]))


# --------------------------------------------------------------------------- the kit's keys


def test_kit_keys_are_the_examples_assignments_in_order_with_their_defaults() -> None:
    assert list(KIT_KEYS.items()) == [(name, value) for _line, name, value in example()]
    active = {key.name: key.line for key in _kit.EXAMPLE_KEYS if key.active}
    assert active == {name: line for line, name, _value in example()}


def test_example_keys_are_in_file_order_and_commented_keys_are_where_the_example_shows_them() -> None:
    lines = [key.line for key in _kit.EXAMPLE_KEYS]
    assert lines == sorted(lines) and len(set(lines)) == len(lines)
    commented = {key.name: key.line for key in _kit.EXAMPLE_KEYS if not key.active}
    for name, line in EXAMPLE_COMMENTED.items():
        assert commented[name] == line
    assert not set(KIT_KEYS) & set(KIT_OPTIONAL_KEYS)


def test_recipe_kept_defaults_are_the_kit_defaults() -> None:
    assert dict(_kit.RECIPE_KEPT) == RECIPE_KEPT
    for name, value in RECIPE_KEPT.items():
        assert KIT_KEYS[name] == value, name


def test_instanttensor_and_parsers_are_no_keys_at_the_pinned_commit() -> None:
    assert "LOAD_FORMAT" not in KIT_KEYS and "LOAD_FORMAT" not in KIT_OPTIONAL_KEYS
    assert set(_kit.UNKEYED_RECIPE_VALUES) == {"mp executor", "reasoning-parser glm45", "tool-call-parser glm47",
                                               "instanttensor"}
    assert KIT_KEYS["IMAGE"].endswith(":exl3")


# --------------------------------------------------------------------------- render


def test_every_rendered_key_is_a_kit_key_and_every_kit_key_is_rendered() -> None:
    names = [name for name, _value in rendered_pairs(render())]
    assert len(names) == len(set(names))
    assert set(names) <= set(KIT_KEYS) | set(KIT_OPTIONAL_KEYS)
    assert set(KIT_KEYS) <= set(names)
    assert set(names) - set(KIT_KEYS) == set(EXAMPLE_COMMENTED)


def test_keys_come_in_the_examples_order() -> None:
    line = {key.name: key.line for key in _kit.EXAMPLE_KEYS}
    names = [name for name, _value in rendered_pairs(render())]
    assert [line[name] for name in names] == sorted(line[name] for name in names)
    assert names.index("WORKER_CX7_IB") < names.index("HEAD_GID") < names.index("MODEL")
    assert names.index("HF_BIN") < names.index("SKIP_BUILD") < names.index("IMAGE")


def test_recipe_values_replace_the_kit_defaults_and_kept_defaults_stay() -> None:
    values = dict(rendered_pairs(render()))
    for name, value in RECIPE_CHANGED.items():
        assert values[name] == value, name
    for name, value in RECIPE_KEPT.items():
        assert values[name] == value, name
    untouched = set(KIT_KEYS) - set(RECIPE_CHANGED)
    assert {name: values[name] for name in untouched} == {name: KIT_KEYS[name] for name in untouched}


def test_per_node_values_come_from_each_node() -> None:
    values = resolve_env(settings(), *nodes())
    assert (values["HEAD_IP"], values["WORKER_IP"]) == (HEAD["cx7_ip"], WORKER["cx7_ip"])
    assert (values["HEAD_CX7_IF"], values["WORKER_CX7_IF"]) == (HEAD["cx7_iface"], WORKER["cx7_iface"])
    assert (values["HEAD_CX7_IB"], values["WORKER_CX7_IB"]) == (HEAD["ib_hca"], WORKER["ib_hca"])
    assert (values["HEAD_GID"], values["WORKER_GID"]) == ("4", "3")
    # the head is whichever node says head: true, not the first one given
    head, peers = nodes(head={"head": False}, worker={"head": True})
    swapped = resolve_env(settings(), head, peers)
    assert (swapped["HEAD_IP"], swapped["HEAD_CX7_IF"], swapped["HEAD_GID"]) == (WORKER["cx7_ip"], WORKER["cx7_iface"], "3")
    assert (swapped["WORKER_IP"], swapped["WORKER_GID"]) == (HEAD["cx7_ip"], "4")


def test_the_text_does_not_depend_on_the_node_it_is_rendered_for() -> None:
    assert render("head") == render("worker")
    assert "on the head (spark1) only" in render("worker")


def test_a_list_of_one_hca_is_accepted() -> None:
    head, peers = nodes(head={"ib_hca": ["rocep1s0f1"]})
    assert resolve_env(settings(), head, peers)["HEAD_CX7_IB"] == "rocep1s0f1"


def test_gid_index_given_as_text_is_accepted() -> None:
    head, peers = nodes(head={"gid_index": "5"})
    assert resolve_env(settings(), head, peers)["HEAD_GID"] == "5"


def test_settings_env_sets_other_kit_keys() -> None:
    values = resolve_env(settings(env={"MODEL_CACHE_NAME": "models--brandonmusic--GLM-5.3-Flash-tr3-4bpw",
                                       "HF_HOME": "/var/tmp/cache/huggingface", "MAX_MODEL_LEN": 500000,
                                       "GPU_MEM_UTIL": 0.84}), *nodes())
    assert values["MODEL_CACHE_NAME"] == "models--brandonmusic--GLM-5.3-Flash-tr3-4bpw"
    assert values["HF_HOME"] == "/var/tmp/cache/huggingface"
    assert (values["MAX_MODEL_LEN"], values["GPU_MEM_UTIL"]) == ("500000", "0.84")


def test_skip_build_false_leaves_the_key_out() -> None:
    assert "SKIP_BUILD" not in resolve_env(settings(skip_build=False), *nodes())
    assert resolve_env(settings(), *nodes())["SKIP_BUILD"] == "1"


def test_bash_sources_exactly_the_rendered_values(tmp_path: Path) -> None:
    awkward = {"SERVED_MODEL_NAME": "GLM 5.3 $HOME `id` #x", "EXTRA_ARGS": "--kv-cache-memory-bytes 15032385536",
               "ABLIT_DIRECTION": "/path with spaces/dir.pt", "TRITON_HOST_CACHE": ""}
    hf_bin = "/opt/hf/bin/hf --quiet"   # the kit's HF_BIN may carry arguments
    text = render(env=awkward, hf_bin=hf_bin)
    values = resolve_env(settings(env=awkward, hf_bin=hf_bin), *nodes())
    assert sourced(text, tmp_path) == values
    assert "LIMIT_MM='{\"image\":100,\"video\":1}'" in text.splitlines()
    assert "SERVED_MODEL_NAME='GLM 5.3 $HOME `id` #x'" in text.splitlines()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("extra, message", [
    ({"bogus": 1}, r"settings has unknown key\(s\): bogus"),
    ({"env": {"LOAD_FORMAT": "instanttensor"}}, r"settings.env has unknown key 'LOAD_FORMAT': not a key of the kit"),
    ({"env": {"NFS_SHARE": "0"}}, r"settings.env has unknown key 'NFS_SHARE'"),
    ({"env": {"HEAD_IP": "10.0.0.9"}}, r"settings.env must not set HEAD_IP: it is rendered from the head node's cx7_ip"),
    ({"env": {"WORKER_GID": 2}}, r"settings.env must not set WORKER_GID: it is rendered from the worker node's gid"),
    ({"env": {"SKIP_BUILD": "0"}}, r"settings.env must not set SKIP_BUILD: it is rendered from settings.skip_build"),
    ({"env": {"VLLM_API_KEY": "s3cret"}}, r"settings.env must not set VLLM_API_KEY: it is a secret"),
    ({"env": {"HF_TOKEN": "hf_x"}}, r"settings.env must not set HF_TOKEN: .* set dgxspark_vllm_hf_token instead"),
    ({"env": {"GHCR_TOKEN": "g"}}, r"settings.env must not set GHCR_TOKEN: .* stages the image itself"),
    ({"env": ["TP=2"]}, r"settings.env must be a dict"),
    ({"env": {"TP": 4}}, r"settings.env.TP must be 2"),
    ({"env": {"NNODES": "3"}}, r"settings.env.NNODES must be 2"),
    ({"env": {"GPU_MEM_UTIL": "0.87"}}, r"settings.env.GPU_MEM_UTIL is 0.87, above 0.85: .*crashed heads"),
    ({"env": {"GPU_MEM_UTIL": "85%"}}, r"settings.env.GPU_MEM_UTIL must be a decimal"),
    ({"env": {"GPU_MEM_UTIL": "0"}}, r"settings.env.GPU_MEM_UTIL must be a decimal greater than 0"),
    ({"env": {"MAX_MODEL_LEN": 1000001}}, r"settings.env.MAX_MODEL_LEN must be an integer from 1 to 1000000"),
    ({"env": {"MAX_NUM_BATCHED_TOKENS": "7k"}}, r"settings.env.MAX_NUM_BATCHED_TOKENS must be an integer"),
    ({"env": {"KV_CACHE_DTYPE": "auto"}}, r"settings.env.KV_CACHE_DTYPE must be fp8"),
    ({"env": {"SPEC_METHOD": "eagle"}}, r"settings.env.SPEC_METHOD must be one of dflash, mtp, none"),
    ({"env": {"ENFORCE_EAGER": "true"}}, r"settings.env.ENFORCE_EAGER must be one of 0, 1"),
    ({"env": {"GLM53_INDEXER_WORKSPACE": "RIGHTSIZE"}}, r"settings.env.GLM53_INDEXER_WORKSPACE must be one of"),
    ({"env": {"PORT": 29521}}, r"PORT and MASTER_PORT are both 29521"),
    ({"env": {"PORT": 70000}}, r"settings.env.PORT must be an integer from 1 to 65535"),
    ({"env": {"ABLIT": True}}, r"settings.env.ABLIT must be a string or a number"),
    ({"env": {"SERVED_MODEL_NAME": "it's"}}, r"settings.env.SERVED_MODEL_NAME .* contains a single quote"),
    ({"env": {"EXTRA_ARGS": "--a\n--b"}}, r"settings.env.EXTRA_ARGS .* control character"),
    ({"hf_bin": None}, r"settings.hf_bin is missing"),
    ({"hf_bin": "  "}, r"settings.hf_bin is missing"),
    ({"hf_bin": "hf"}, r"settings.hf_bin must start with the absolute path"),
    ({"skip_build": "yes"}, r"settings.skip_build must be true or false"),
    ({"accept_noncommercial_drafter": "yes"}, r"dgxspark_vllm_accept_noncommercial_drafter .* must be true or false"),
    ({"kit_commit": "0" * 40}, r"settings.kit_commit is '0{40}', but this renderer models the kit's .env at 008ae945"),
])
def test_bad_settings_raise_naming_the_variable(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(KitError, match=message):
        resolve_env(settings(**extra), *nodes())


def test_high_gpu_mem_util_needs_the_explicit_opt_in() -> None:
    values = resolve_env(settings(env={"GPU_MEM_UTIL": "0.87"}, allow_high_gpu_memory_utilization=True), *nodes())
    assert values["GPU_MEM_UTIL"] == "0.87"


def test_settings_without_hf_bin_key_raise() -> None:
    with pytest.raises(KitError, match=r"settings.hf_bin is missing"):
        resolve_env({"accept_noncommercial_drafter": True}, *nodes())


def test_the_pinned_commit_is_accepted() -> None:
    assert resolve_env(settings(kit_commit=KIT_COMMIT), *nodes())["TP"] == "2"


@pytest.mark.parametrize("changes, message", [
    ({"head": {"cx7_ip": "192.168.100.300"}}, r"node \(spark1\).cx7_ip must be an IPv4 address .* got '192.168.100.300'"),
    ({"worker": {"cx7_ip": "spark2.local"}}, r"peers\[0\] \(spark2\).cx7_ip must be an IPv4 address"),
    ({"worker": {"cx7_ip": "fd00::2"}}, r"peers\[0\] \(spark2\).cx7_ip must be an IPv4 address, got 'fd00::2'"),
    ({"worker": {"cx7_ip": None}}, r"peers\[0\] \(spark2\).cx7_ip is missing"),
    ({"head": {"cx7_iface": None}}, r"node \(spark1\).cx7_iface is missing"),
    ({"worker": {"cx7_iface": ""}}, r"peers\[0\] \(spark2\).cx7_iface is missing"),
    ({"worker": {"cx7_iface": "enp1s0f0np0-too-long"}}, r"peers\[0\] \(spark2\).cx7_iface must be one network"),
    ({"head": {"ib_hca": None}}, r"node \(spark1\).ib_hca is missing"),
    ({"worker": {"ib_hca": []}}, r"peers\[0\] \(spark2\).ib_hca is missing"),
    ({"head": {"ib_hca": "rocep1s0f1,roceP2p1s0f1"}}, r"node \(spark1\).ib_hca is 'rocep1s0f1,roceP2p1s0f1': the kit"),
    ({"head": {"ib_hca": ["rocep1s0f1", "roceP2p1s0f1"]}}, r"node \(spark1\).ib_hca is 'rocep1s0f1,roceP2p1s0f1'"),
    ({"worker": {"ib_hca": "roce p2"}}, r"peers\[0\] \(spark2\).ib_hca must be an RDMA device name"),
    ({"head": {"gid_index": None}}, r"node \(spark1\).gid_index is missing: the node's RoCE v2 GID index"),
    ({"worker": {"gid_index": -1}}, r"peers\[0\] \(spark2\).gid_index must be between 0 and 255, got -1"),
    ({"worker": {"gid_index": "three"}}, r"peers\[0\] \(spark2\).gid_index must be an integer, got 'three'"),
    ({"worker": {"gid_index": 256}}, r"peers\[0\] \(spark2\).gid_index must be between 0 and 255"),
    ({"worker": {"gid_index": True}}, r"peers\[0\] \(spark2\).gid_index must be an integer"),
    ({"worker": {"rank": 1}}, r"peers\[0\] \(spark2\) has unknown key\(s\): rank"),
    ({"worker": {"name": ""}}, r"peers\[0\].name is missing"),
    ({"worker": {"head": "no"}}, r"peers\[0\] \(spark2\).head must be true or false"),
    ({"worker": {"head": True}}, r"exactly one of spark1, spark2 must have head: true .* got 2"),
    ({"head": {"head": False}}, r"exactly one of spark1, spark2 must have head: true .* got 0"),
    ({"worker": {"name": "spark1"}}, r"both nodes are named 'spark1'"),
    ({"worker": {"cx7_ip": "192.168.100.11"}}, r"spark1 and spark2 have the same cx7_ip 192.168.100.11"),
])
def test_bad_nodes_raise_naming_the_node_and_the_variable(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(KitError, match=message):
        resolve_env(settings(), *nodes(**changes))


def test_the_kit_needs_exactly_two_nodes() -> None:
    head, peers = nodes()
    third = dict(WORKER, name="spark3", cx7_ip="192.168.100.13")
    with pytest.raises(KitError, match=r"exactly two nodes .* got 3: spark1, spark2, spark3"):
        resolve_env(settings(), head, peers + [third])
    with pytest.raises(KitError, match=r"exactly two nodes .* got 1: spark1"):
        resolve_env(settings(), head, [])
    with pytest.raises(KitError, match=r"peers must be a list of node dicts"):
        resolve_env(settings(), head, peers[0])  # type: ignore[arg-type]


def test_quote_refuses_what_the_worker_cannot_receive() -> None:
    assert _kit.quote("enp1s0f1np1") == "enp1s0f1np1"
    assert _kit.quote("") == ""
    assert _kit.quote("a b") == "'a b'"
    with pytest.raises(KitError):
        _kit.quote("it's")


# --------------------------------------------------------------------------- licence guard


def test_licence_guard_refuses_without_acknowledgement_and_says_why() -> None:
    with pytest.raises(LicenceError) as caught:
        licence_guard(False)
    text = str(caught.value)
    for part in ("incoai/GLM-5.3-Flash-DFlash2", "CC BY-NC-ND", "non-commercial",
                 "dgxspark_vllm_accept_noncommercial_drafter: true", "SPEC_METHOD=mtp"):
        assert part in text, part
    licence_guard(True)


@pytest.mark.parametrize("value", ["true", 1, None, "yes"])
def test_licence_guard_takes_only_a_real_boolean(value: Any) -> None:
    with pytest.raises(KitError, match=r"must be true or false"):
        licence_guard(value)


def test_render_refuses_the_drafter_without_acknowledgement() -> None:
    for extra in ({}, {"accept_noncommercial_drafter": False}, {"accept_noncommercial_drafter": None}):
        base = {"hf_bin": HF_BIN, **extra}
        with pytest.raises(LicenceError, match=r"CC BY-NC-ND"):
            render_env(base, *nodes())


def test_render_without_the_drafter_needs_no_acknowledgement() -> None:
    for method in ("mtp", "none"):
        values = resolve_env({"hf_bin": HF_BIN, "env": {"SPEC_METHOD": method}}, *nodes())
        assert values["SPEC_METHOD"] == method


def test_staging_refuses_the_drafter_without_acknowledgement() -> None:
    with pytest.raises(LicenceError, match=r"neither staged nor started"):
        exl3_staging(False)
    only_checkpoint = exl3_staging(False, spec_method="mtp")
    assert [item.repo for item in only_checkpoint] == ["brandonmusic/GLM-5.3-Flash-tr3-4bpw"]
    with pytest.raises(KitError, match=r"spec_method must be dflash, mtp or none"):
        exl3_staging(True, spec_method="eagle")


# --------------------------------------------------------------------------- layout


def test_exl3_stages_in_hub_cache_layout_nvfp4_in_a_local_dir() -> None:
    assert PROFILES["glm53_flash_exl3"].staging_layout == "hf_cache"
    assert PROFILES["glm53_flash_nvfp4"].staging_layout == "local_dir"
    assert PROFILES["lab_cpu"].staging_layout == "local_dir"


def test_the_kit_layout_is_the_exl3_profiles() -> None:
    assert _kit.KIT_LAYOUT == PROFILES["glm53_flash_exl3"].staging_layout
    assert PROFILES["glm53_flash_exl3"].launcher == "exl3_kit"


def test_exl3_staging_plan_uses_the_kits_cache_folders() -> None:
    plan = exl3_staging(True)
    assert [(item.repo, item.role, item.layout, item.cache_folder) for item in plan] == [
        ("brandonmusic/GLM-5.3-Flash-tr3-4bpw", "checkpoint", "hf_cache", "models--brandonmusic--GLM-5.3-Flash-tr3-4bpw"),
        ("incoai/GLM-5.3-Flash-DFlash2", "drafter", "hf_cache", "models--incoai--GLM-5.3-Flash-DFlash2"),
    ]
    # the folder the kit's example offers for an upstream download (MODEL_CACHE_NAME, line 41)
    assert KIT_OPTIONAL_KEYS["MODEL_CACHE_NAME"] == hf_cache_folder(_kit.CHECKPOINT_REPO)
    assert KIT_KEYS["MODEL_FALLBACK"] == _kit.CHECKPOINT_REPO and KIT_KEYS["DFLASH_MODEL"] == _kit.DRAFTER_REPO
    with pytest.raises(KitError, match=r"not a hub repository id"):
        hf_cache_folder("no-slash")


# --------------------------------------------------------------------------- settings the collection derives

COLLECTION = {
    "image": "ghcr.io/miaai-lab/glm-5.3-flash-2x-dgx-sparks@sha256:" + "a" * 64,
    "model": "brandonmusic/GLM-5.3-Flash-tr3-4bpw",
    "model_revision": "5ab363a8" + "0" * 32,
    "drafter": "incoai/GLM-5.3-Flash-DFlash2",
    "served_model_name": "glm-5.3-flash",
    "port": 8888,
    "master_port": "29521",
    "hf_home": "/home/spark/.cache/huggingface",
    "worker_user": "spark",
    "worker_home": "/home/spark",
}


def test_collection_settings_render_their_kit_keys() -> None:
    head, peers = nodes()
    values = resolve_env(settings(**COLLECTION), head, peers)
    assert values["IMAGE"] == COLLECTION["image"]
    assert values["MODEL"] == "brandonmusic/GLM-5.3-Flash-tr3-4bpw"
    assert values["MODEL_CACHE_NAME"] == "models--brandonmusic--GLM-5.3-Flash-tr3-4bpw"
    assert values["MODEL_REVISION"] == COLLECTION["model_revision"]
    assert values["DFLASH_MODEL"] == "incoai/GLM-5.3-Flash-DFlash2"
    assert values["SERVED_MODEL_NAME"] == "glm-5.3-flash"
    assert (values["PORT"], values["MASTER_PORT"]) == ("8888", "29521")
    assert values["HF_HOME"] == "/home/spark/.cache/huggingface"
    assert (values["WORKER_USER"], values["WORKER_HOME"]) == ("spark", "/home/spark")
    # the file keeps the example's order: MODEL_CACHE_NAME (41) between MODEL_FALLBACK (38) and MODEL_REVISION (43)
    keys = list(values)
    assert keys.index("MODEL_FALLBACK") < keys.index("MODEL_CACHE_NAME") < keys.index("MODEL_REVISION")


def test_unset_collection_settings_keep_the_kit_defaults() -> None:
    head, peers = nodes()
    values = resolve_env(settings(image=None, model=None), head, peers)
    assert values["IMAGE"] == KIT_KEYS["IMAGE"]
    assert values["MODEL"] == KIT_KEYS["MODEL"]
    assert "MODEL_CACHE_NAME" not in values


@pytest.mark.parametrize(("setting", "key"), sorted(_kit.SETTING_TO_KEY.items()))
def test_a_derived_key_cannot_also_come_from_env(setting: str, key: str) -> None:
    head, peers = nodes()
    with pytest.raises(KitError, match=rf"must not set {key}: it is rendered from settings\.{setting}"):
        resolve_env(settings(env={key: COLLECTION[setting]}, **{setting: COLLECTION[setting]}), head, peers)


def test_model_cache_name_follows_the_model() -> None:
    head, peers = nodes()
    with pytest.raises(KitError, match="MODEL_CACHE_NAME: it follows settings.model"):
        resolve_env(settings(model=COLLECTION["model"], env={"MODEL_CACHE_NAME": "models--x--y"}), head, peers)


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("model", "not-a-repo", "not a hub repository id"),
    ("drafter", "a/b/c", "not a hub repository id"),
    ("model_revision", "main", "40-hex commit"),
    ("port", 0, "between 1 and 65535|at least 1|1..65535|must be"),
    ("master_port", "http", "must be an integer"),
    ("hf_home", "relative/hf", "absolute path"),
    ("worker_home", "~spark", "absolute path"),
    ("image", "", "leave it unset"),
    ("image", "bad'quote", "single quote"),
])
def test_bad_collection_settings_are_refused(setting: str, value: Any, message: str) -> None:
    head, peers = nodes()
    with pytest.raises(KitError, match=message):
        resolve_env(settings(**{setting: value}), head, peers)


def test_the_port_setting_meets_the_port_checks() -> None:
    head, peers = nodes()
    with pytest.raises(KitError, match="PORT and MASTER_PORT are both 29521"):
        resolve_env(settings(port=29521), head, peers)


def test_the_drafter_guard_follows_the_rendered_drafter() -> None:
    head, peers = nodes()
    with pytest.raises(LicenceError, match="dgxspark_vllm_accept_noncommercial_drafter"):
        resolve_env(settings(accept_noncommercial_drafter=False, drafter=_kit.DRAFTER_REPO), head, peers)
    # another drafter is not the non-commercial one; the guard does not apply
    values = resolve_env(settings(accept_noncommercial_drafter=False, drafter="someone/other-drafter"), head, peers)
    assert values["DFLASH_MODEL"] == "someone/other-drafter"
    _kit.drafter_guard("someone/other-drafter", False)
    with pytest.raises(LicenceError):
        _kit.drafter_guard(_kit.DRAFTER_REPO, False)
    _kit.drafter_guard(_kit.DRAFTER_REPO, True)


# --------------------------------------------------------------------------- the checkout's .env.example


def example_text(drop: str = "", add: str = "") -> str:
    lines = [f"# {key.name}={key.value}" if not key.active else f"{key.name}={_kit.quote(key.value)}"
             for key in _kit.EXAMPLE_KEYS if key.name != drop]
    if add:
        lines.append(add)
    return "\n".join(["# a kit .env.example"] + lines) + "\n"


def test_check_example_accepts_the_modelled_contract() -> None:
    _kit.check_example(example_text())
    # the real file's assignments, as the test above keeps them, pass too
    _kit.check_example("\n".join(f"{name}={_kit.quote(value)}" for _line, name, value in example()))


def test_check_example_refuses_a_missing_key() -> None:
    with pytest.raises(KitError, match="does not assign GPU_MEM_UTIL.*kit_launch_commit"):
        _kit.check_example(example_text(drop="GPU_MEM_UTIL"))


def test_check_example_refuses_an_unknown_key() -> None:
    with pytest.raises(KitError, match="does not model: LOAD_FORMAT"):
        _kit.check_example(example_text(add="LOAD_FORMAT=instanttensor"))


def test_check_example_ignores_comments_but_reads_exports() -> None:
    _kit.check_example(example_text(add="# LOAD_FORMAT=instanttensor"))
    with pytest.raises(KitError, match="NFS_SHARE"):
        _kit.check_example(example_text(add="export NFS_SHARE=/srv"))


def test_caller_overrides_cover_the_kit_snapshot() -> None:
    # start.sh:96-122 snapshots these names (and the EXL3_*, ABLIT*, GLM53_ADAPTIVE_K* families)
    for name in ("MTP_TOKENS", "SPEC_METHOD", "ENFORCE_EAGER", "IMAGE", "GPU_MEM_UTIL", "MAX_MODEL_LEN",
                 "EXL3_FUSED_MOE", "EXL3_FAT_SORTED", "ABLIT", "ABLIT_ALPHA", "GLM53_ADAPTIVE_K_SET",
                 "GLM53_DENSE_FP8", "GLM53_SPINWAIT_MS"):
        assert name in _kit.CALLER_OVERRIDES
    assert "HEAD_IP" not in _kit.CALLER_OVERRIDES and "PORT" not in _kit.CALLER_OVERRIDES
    assert list(_kit.CALLER_OVERRIDES) == sorted(set(_kit.CALLER_OVERRIDES))


@pytest.mark.parametrize("extra", [
    {},
    {"drafter": "someone/other-drafter"},
    {"env": {"DFLASH_MODEL": "someone/env-drafter"}},
    {"env": {"SPEC_METHOD": "mtp"}},
    {"env": {"SPEC_METHOD": "none"}, "drafter": "someone/other-drafter"},
])
def test_served_drafter_is_what_the_render_speculates_with(extra: dict[str, Any]) -> None:
    head, peers = nodes()
    values = resolve_env(settings(**extra), head, peers)
    expected = values["DFLASH_MODEL"] if values["SPEC_METHOD"] == "dflash" else ""
    assert _kit.served_drafter(settings(**extra)) == expected
