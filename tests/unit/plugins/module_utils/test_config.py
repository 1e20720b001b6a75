# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The configuration step: precedence, provenance, every check of the whole inventory, user profiles."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import (
    VARIABLES,
    ConfigError,
    Inputs,
    describe_sources,
    resolve,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import ProfileError, as_data, build_profiles
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import TEMPLATE_KEYS, render_spec
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data

BUILTIN = builtin_profile_data()
HEAD, WORKER = "spark-a", "spark-b"


def group(**cluster: Any) -> dict[str, Any]:
    """Group vars every host shares, as dgxspark_vllm_<name> (the example inventory's shape)."""
    values = {"cx7_subnet": "192.168.100.0/24"}
    values.update(cluster)
    return {f"dgxspark_vllm_{key}": value for key, value in values.items()}


def inputs(cluster: dict[str, Any] | None = None, head: dict[str, Any] | None = None,
           worker: dict[str, Any] | None = None, **kwargs: Any) -> Inputs:
    shared = group(**(cluster or {}))
    hostvars = {
        HEAD: {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.11", **(head or {})},
        WORKER: {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.12", **(worker or {})},
    }
    return Inputs(hostvars=hostvars, head=[HEAD], workers=[WORKER], builtin_profiles=BUILTIN,
                  ansible_user=kwargs.pop("ansible_user", "spark"), **kwargs)


def problems(given: Inputs) -> list[str]:
    with pytest.raises(ConfigError) as failure:
        resolve(given)
    return failure.value.problems


# --------------------------------------------------------------------------- precedence and provenance


def test_the_recipes_values_come_from_the_profile() -> None:
    config = resolve(inputs())
    assert config["profile_name"] == "glm53_flash_nvfp4" and config["launcher"] == "docker_run"
    assert config["image"] == "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"
    assert (config["port"], config["master_port"], config["served_model_name"]) == (8000, 29521, "glm-5.3-flash")
    assert config["model_repo"] == "RedHatAI/GLM-5.3-Flash-NVFP4"
    assert config["settings"]["max_model_len"] == 262144
    assert config["sources"]["port"] == "profile glm53_flash_nvfp4"
    assert config["sources"]["cx7_subnet"] == "dgxspark_vllm_cx7_subnet"
    assert config["hf_home"] == "/var/tmp/cache/huggingface"
    assert config["staging_lock_path"] == "/run/dgxspark/staging.lock"
    assert config["nodes"][HEAD] == {"cx7_ip": "192.168.100.11", "head": True, "rank": 0, "cx7_iface": "",
                                     "ib_hca": "", "gid_index": None}
    assert config["nodes"][WORKER]["rank"] == 1 and config["head_cx7_ip"] == "192.168.100.11"


@pytest.mark.parametrize("settings, explicit, value, source", [
    ({}, {}, 0.85, "profile glm53_flash_nvfp4"),
    ({"gpu_memory_utilization": 0.8}, {}, 0.8, "dgxspark_vllm_settings"),
    ({"gpu_memory_utilization": 0.8}, {"gpu_memory_utilization": 0.75}, 0.75, "dgxspark_vllm_gpu_memory_utilization"),
    ({}, {"gpu_memory_utilization": 0.7}, 0.7, "dgxspark_vllm_gpu_memory_utilization"),
])
def test_profile_then_settings_then_the_variable(
        settings: dict[str, Any], explicit: dict[str, Any], value: float, source: str) -> None:
    config = resolve(inputs(dict(explicit, settings=settings)))
    assert config["settings"]["gpu_memory_utilization"] == value
    assert config["sources"]["gpu_memory_utilization"] == source
    assert f"gpu_memory_utilization = {value!r} ({source})" in describe_sources(config)


def test_a_null_variable_keeps_the_profiles_value() -> None:
    config = resolve(inputs({"port": None, "max_model_len": None}))
    assert config["port"] == 8000 and config["settings"]["max_model_len"] == 262144


def test_secrets_never_enter_the_fact() -> None:
    config = resolve(inputs({"api_key": "k-123-secret", "hf_token": "hf_secret"}))
    assert "k-123-secret" not in repr(config) and "hf_secret" not in repr(config)
    assert config["api_key_set"] is True and config["hf_token_set"] is True
    assert "k-123-secret" not in "\n".join(describe_sources(config))
    assert "api_key = (hidden) (dgxspark_vllm_api_key)" in describe_sources(config)


def test_the_exl3_profile_stages_in_the_hub_cache_of_the_kit_user() -> None:
    config = resolve(inputs({"profile": "glm53_flash_exl3", "accept_noncommercial_drafter": True}))
    assert config["launcher"] == "exl3_kit" and config["staging_layout"] == "hf_cache"
    assert config["port"] == 8888 and config["served_model_name"] == "GLM-5.3-Flash-EXL3"
    assert config["drafter_repo"] == "incoai/GLM-5.3-Flash-DFlash2"
    assert config["kit_user"] == "spark" and config["hf_home"] == "/home/spark/.cache/huggingface"
    assert config["max_model_len"] is None   # the kit's own default (850000)
    root = resolve(inputs({"profile": "glm53_flash_exl3", "accept_noncommercial_drafter": True}, ansible_user=None))
    assert root["kit_user"] == "root" and root["hf_home"] == "/root/.cache/huggingface"


def test_per_node_network_identity_may_differ() -> None:
    config = resolve(inputs(head={"dgxspark_vllm_cx7_iface": "enp1s0f1np1", "dgxspark_vllm_gid_index": 3},
                            worker={"dgxspark_vllm_cx7_iface": "enP2p1s0f1np1", "dgxspark_vllm_gid_index": 5}))
    assert config["nodes"][HEAD]["cx7_iface"] == "enp1s0f1np1"
    assert config["nodes"][WORKER]["gid_index"] == 5


# --------------------------------------------------------------------------- the whole inventory, checked first


def test_every_problem_is_listed_at_once() -> None:
    found = problems(inputs(
        {"image": "ghcr.io/org/image", "served_model_name": "", "gpu_memory_utilization": 0.87,
         "model_repo": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "node_rank": 0, "port": "http"},
        head={"dgxspark_vllm_master_port": 29522, "dgxspark_vllm_master_addr": "192.168.100.11"}))
    text = "\n".join(found)
    assert len(found) >= 7, text
    assert "dgxspark_vllm_node_rank (on spark-a, spark-b) is not a variable" in text and "spark_head is rank 0" in text
    assert "dgxspark_vllm_master_addr (on spark-a)" in text and "cx7_ip is the master address" in text
    assert "dgxspark_vllm_master_port differs between hosts (spark-a: 29522; spark-b: not set)" in text
    assert "dgxspark_vllm_image 'ghcr.io/org/image' has no tag or digest" in text
    assert "dgxspark_vllm_served_model_name must be a non-empty string, got ''" in text
    assert "dgxspark_vllm_gpu_memory_utilization is 0.87, above 0.85" in text
    assert "set dgxspark_vllm_allow_high_gpu_memory_utilization: true" in text
    assert "dgxspark_vllm_model_repo LibertAIDAI/GLM-5.3-Flash-NVFP4 is refused" in text
    assert "dgxspark_vllm_port must be an integer, got 'http' (e.g. dgxspark_vllm_port: 8000)" in text


@pytest.mark.parametrize("cluster, message", [
    ({"mastr_port": 1}, r"dgxspark_vllm_mastr_port \(on spark-a, spark-b\) is not a variable of dgxspark\.vllm and "
                        r"would be ignored: did you mean dgxspark_vllm_master_port\?"),
    ({"served_model": "x"}, r"did you mean dgxspark_vllm_served_model_name\?"),
    ({"image": "ghcr.io/org/image:"}, r"is not an image reference"),
    ({"image": "ghcr.io/org/image@sha256:abc"}, r"is not an image reference"),
    ({"model_repo": "just-a-name"}, r"dgxspark_vllm_model_repo must be a hub repository id org/name"),
    ({"drafter_repo": "incoai/GLM-5.3-Flash-DFlash2"}, r"CC BY-NC-ND.*dgxspark_vllm_accept_noncommercial_drafter: true"),
    ({"lab": "maybe"}, r"dgxspark_vllm_lab must be true or false, got 'maybe'"),
    ({"staging_lock_path": "run/lock"}, r"dgxspark_vllm_staging_lock_path must be an absolute path"),
    ({"settings": ["x"]}, r"dgxspark_vllm_settings must be a mapping"),
    ({"settings": {"max_model_length": 5}}, r"dgxspark_vllm_settings\.max_model_length is not a setting of the render; "
                                            r"did you mean max_model_len\?"),
    ({"settings": {"port": 29521}}, r"dgxspark_vllm_settings\.port and dgxspark_vllm_master_port are both 29521"),
    ({"tensor_parallel_size": 4}, r"dgxspark_vllm_tensor_parallel_size x pipeline_parallel_size = 4 x 1 must equal "
                                  r"nodes x gpus_per_node = 2 x 1 = 2"),
    ({"cx7_subnet": "10.0.0.0/24"}, r"the cx7_ip of spark-a, 192\.168\.100\.11, is outside dgxspark_vllm_cx7_subnet"),
    ({"profile": "glm53"}, r"dgxspark_vllm_profile 'glm53' is not a profile; known: glm53_flash_exl3, glm53_flash_nvfp4"),
    ({"api_key": 12}, r"dgxspark_vllm_api_key must be a string, got \(hidden\)"),
    ({"settings": {"extra_args": ["--headless"]}}, r"must not contain --headless"),
])
def test_each_problem_names_the_variable_and_the_fix(cluster: dict[str, Any], message: str) -> None:
    assert any(__import__("re").search(message, problem) for problem in problems(inputs(cluster))), \
        problems(inputs(cluster))


def test_a_value_from_the_profile_says_which_variable_overrides_it() -> None:
    found = problems(inputs({"profiles": {"mine": {"extends": "glm53_flash_nvfp4",
                                                   "settings": {"gpu_memory_utilization": 0.9}}},
                             "profile": "mine"}))
    assert any("the value comes from profile mine; set dgxspark_vllm_gpu_memory_utilization to override it" in item
               for item in found), found


def test_the_allow_flag_lifts_the_memory_limit() -> None:
    config = resolve(inputs({"gpu_memory_utilization": 0.9, "allow_high_gpu_memory_utilization": True}))
    assert config["settings"]["gpu_memory_utilization"] == 0.9


def test_an_empty_secret_or_drafter_is_fine_and_an_empty_subnet_is_unset() -> None:
    config = resolve(inputs({"api_key": "", "drafter_repo": "", "cx7_subnet": "", "profile": "lab_cpu"}))
    # an empty key is no key: the one the collection generates (lab_cpu listens on 0.0.0.0) is used instead
    assert config["api_key_source"] == "generated" and config["api_key_generate"] is True
    assert config["drafter_repo"] == "" and config["cx7_subnet"] == ""


def test_the_render_needs_what_its_templates_use() -> None:
    assert problems(inputs({"cx7_subnet": ""})) == [
        "profile glm53_flash_nvfp4 needs cx7_subnet for NCCL_IB_ADDR_RANGE on node spark-a: set "
        "dgxspark_vllm_cx7_subnet (or drop NCCL_IB_ADDR_RANGE with dgxspark_vllm_settings.remove_env)"]


def test_the_denylist_can_be_overridden_where_the_checkpoint_role_allows_it() -> None:
    config = resolve(inputs({"model_repo": "LibertAIDAI/GLM-5.3-Flash-NVFP4"}, allow_denylisted=True))
    assert config["model_repo"] == "LibertAIDAI/GLM-5.3-Flash-NVFP4"


def test_a_digest_pins_the_image() -> None:
    digest = "ghcr.io/tonyd2wild/vllm-glm53-flash@sha256:" + "a" * 64
    assert resolve(inputs({"image": digest}))["image"] == digest
    assert resolve(inputs({"image": "localhost:5000/vllm:1"}))["image"] == "localhost:5000/vllm:1"


@pytest.mark.parametrize("head, workers, message", [
    ([], [WORKER], r"spark_head must hold exactly one host"),
    ([HEAD, WORKER], [], r"spark_workers holds no host"),
    ([HEAD], [HEAD, WORKER], r"spark-a is in both spark_head and spark_workers"),
])
def test_the_groups(head: list[str], workers: list[str], message: str) -> None:
    given = inputs()
    broken = Inputs(hostvars=given.hostvars, head=head, workers=workers, builtin_profiles=BUILTIN)
    assert any(__import__("re").search(message, item) for item in problems(broken))


def test_every_host_needs_its_cx7_ip() -> None:
    given = inputs()
    hostvars = copy.deepcopy(dict(given.hostvars))
    del hostvars[WORKER]["dgxspark_vllm_cx7_ip"]
    found = problems(Inputs(hostvars=hostvars, head=[HEAD], workers=[WORKER], builtin_profiles=BUILTIN))
    assert found == ["dgxspark_vllm_cx7_ip is not set for spark-b: give every host its address on the CX7 link in "
                     "the inventory (e.g. spark-b: {dgxspark_vllm_cx7_ip: 192.168.100.12})"]


def test_a_bad_per_node_value_names_the_host() -> None:
    found = problems(inputs(worker={"dgxspark_vllm_gid_index": "three"}))
    assert any("dgxspark_vllm_gid_index of spark-b must be an integer, got 'three'" in item for item in found), found


def test_the_facts_the_collection_sets_are_not_unknown_variables() -> None:
    config = resolve(inputs(head={"dgxspark_vllm_detected_cx7_iface": "eth1", "dgxspark_vllm_config": {}}))
    assert config["head"] == HEAD


def test_every_variable_has_an_example() -> None:
    assert all(var.example for var in VARIABLES.values())


# --------------------------------------------------------------------------- profiles as data


def test_the_builtin_profiles_render_the_recipe() -> None:
    profiles = build_profiles(BUILTIN, None, TEMPLATE_KEYS)
    assert set(profiles) == {"glm53_flash_nvfp4", "glm53_flash_exl3", "lab_cpu"}
    lab = profiles["lab_cpu"]
    assert lab.gpus is None and lab.devices == () and "--moe-backend" not in dict(lab.args)
    assert dict(lab.env)["NCCL_IB_DISABLE"] == "1" and "NCCL_NET" not in dict(lab.env)
    # an overridden env keeps its place in the docker run order; a new one is appended
    names = [name for name, _value in lab.env]
    assert names.index("NCCL_IB_DISABLE") < names.index("NCCL_IB_HCA") and names[-1] == "TORCHINDUCTOR_CACHE_DIR"


def test_a_user_profile_serves_another_name_without_editing_python() -> None:
    user = {"tiny_alias": {"extends": "lab_cpu", "description": "the tiny model under another name",
                           "settings": {"served_model_name": "tiny-alias", "max_model_len": 2048},
                           "env": {"VLLM_LOGGING_LEVEL": "INFO"}, "args": [{"--max-num-seqs": "4"}]}}
    config = resolve(inputs({"profiles": user, "profile": "tiny_alias"}))
    assert config["served_model_name"] == "tiny-alias" and config["sources"]["served_model_name"] == "profile tiny_alias"
    assert config["profile"]["source"] == "inventory (dgxspark_vllm_profiles)"
    from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import profile_from_data

    nodes = [{"name": HEAD, "cx7_ip": "192.168.100.11", "head": True, "cx7_iface": "eth1"},
             {"name": WORKER, "cx7_ip": "192.168.100.12", "cx7_iface": "eth1"}]
    spec = render_spec(profile_from_data(config["profile"]), nodes, WORKER, config["settings"])
    command = spec.container["command"]
    assert command[command.index("--served-model-name") + 1] == "tiny-alias"
    assert command[command.index("--max-num-seqs") + 1] == "4"
    assert command[command.index("--max-model-len") + 1] == "2048"
    assert spec.container["env"]["VLLM_LOGGING_LEVEL"] == "INFO" and command[-1] == "--headless"
    assert spec.container["labels"]["dgxspark.vllm.profile"] == "tiny_alias"


def test_as_data_round_trips() -> None:
    from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import from_data

    for profile in build_profiles(BUILTIN, None, TEMPLATE_KEYS).values():
        again = from_data(as_data(profile), TEMPLATE_KEYS)
        assert (again.env, again.args, again.settings, again.volumes, again.launcher) == \
            (profile.env, profile.args, dict(profile.settings), profile.volumes, profile.launcher)


@pytest.mark.parametrize("user, message", [
    ({"lab_cpu": {"extends": "lab_cpu"}}, r"lab_cpu is a built-in profile; give yours another name"),
    ({"a": {"extends": "b"}, "b": {"extends": "a"}}, r"extends forms a loop"),
    ({"a": {"extends": "nope"}}, r"profile a: extends 'nope', which is not a profile"),
    ({"a": {"launcher": "podman"}}, r"profile a: launcher must be one of docker_run, exl3_kit"),
    ({"a": {"extends": "lab_cpu", "settings": {"modle_path": "/m"}}}, r"settings\.modle_path is not a setting"),
    ({"a": {"extends": "lab_cpu", "env": {"X": "{hostip}"}}}, r"uses unknown placeholder \{hostip\}"),
    ({"a": {"extends": "lab_cpu", "args": ["--headless"]}}, r"--headless is added on every worker"),
    ({"a": {"extends": "lab_cpu", "args": [{"--x": True}]}}, r"the value of --x must be a string"),
    ({"a": {"extends": "lab_cpu", "container": {"gpus": 2}}}, r"container\.gpus must be all or null"),
    ({"a": {"extends": "lab_cpu", "colour": "red"}}, r"profile a has unknown key\(s\) colour"),
    ({"a": {"launcher": "docker_run"}}, r"a docker_run profile needs args"),
    ({"a b": {}}, r"'a b' is not a profile name"),
])
def test_a_broken_user_profile_is_refused_with_its_key(user: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as failure:
        build_profiles(BUILTIN, user, TEMPLATE_KEYS)
    assert any(__import__("re").search(message, item) for item in failure.value.problems), failure.value.problems
    assert any(__import__("re").search(message, item) for item in problems(inputs({"profiles": user})))


# --------------------------------------------------------------------------- the example inventory


def _example_hostvars(filled: bool = True) -> tuple[dict[str, dict[str, Any]], str]:
    """inventories/example's dgxspark_vllm_* variables per host and its ansible_user: with its placeholders filled in
    as a user would (helpers.inventories.FILLED), or as shipped."""
    import yaml

    from helpers.inventories import INVENTORIES, fill

    folder = INVENTORIES / "example"

    def read(name: str) -> Any:
        text = (folder / name).read_text(encoding="utf-8")
        return yaml.safe_load(fill(text) if filled else text)
    group = read("group_vars/spark_cluster.yml")
    hosts = read("hosts.yml")["spark_cluster"]["children"]
    hostvars = {}
    for name in ("spark_head", "spark_workers"):
        for host, values in hosts[name]["hosts"].items():
            hostvars[host] = {key: value for key, value in {**group, **values}.items() if key.startswith("dgxspark_vllm_")}
    return hostvars, group["ansible_user"]


@pytest.mark.parametrize("profile, served, repo", [
    ("glm53_flash_nvfp4", "glm-5.3-flash", "RedHatAI/GLM-5.3-Flash-NVFP4"),
    ("qwen3_coder_nvfp4", "qwen3-coder", "RedHatAI/Qwen3-Coder-30B-A3B-Instruct-NVFP4"),
])
def test_the_example_inventory_switches_models_with_one_variable(profile: str, served: str, repo: str) -> None:
    hostvars, user = _example_hostvars()
    for values in hostvars.values():
        values["dgxspark_vllm_profile"] = profile
    config = resolve(Inputs(hostvars, ["spark-a"], ["spark-b"], BUILTIN, user))
    assert (config["served_model_name"], config["model_repo"]) == (served, repo)
    from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import profile_from_data

    nodes = [{"name": "spark-a", "cx7_ip": "192.168.100.1", "head": True, "cx7_iface": "enp1s0f1np1",
              "ib_hca": "rocep1s0f1", "gid_index": 3},
             {"name": "spark-b", "cx7_ip": "192.168.100.2", "cx7_iface": "enP2p1s0f1np1", "ib_hca": "roceP2p1s0f1",
              "gid_index": 3}]
    command = render_spec(profile_from_data(config["profile"]), nodes, "spark-a", config["settings"]).container["command"]
    assert ("--reasoning-parser" in command) is (profile == "glm53_flash_nvfp4")
    assert ("--speculative-config" in command) is (profile == "glm53_flash_nvfp4")
    assert command[command.index("--served-model-name") + 1] == served


def test_the_example_inventory_as_shipped_is_refused_naming_each_placeholder_and_host() -> None:
    hostvars, user = _example_hostvars(filled=False)
    checked = {host: {"ansible_user": user, "ansible_host": address}
               for host, address in (("spark-a", "192.0.2.10"), ("spark-b", "192.0.2.11"))}
    found = problems(Inputs(hostvars, ["spark-a"], ["spark-b"], BUILTIN, user, checked_vars=checked))
    placeholders = [problem for problem in found if "reserved for documentation" in problem or "placeholder" in problem]
    assert placeholders == found[:len(placeholders)]   # named first, before what they may cause
    assert sorted(problem.split(" holds ")[0] for problem in placeholders) == sorted([
        "ansible_user on spark-a, spark-b", "ansible_host on spark-a", "ansible_host on spark-b",
        "dgxspark_vllm_cx7_ip on spark-a", "dgxspark_vllm_cx7_ip on spark-b", "dgxspark_vllm_cx7_subnet on spark-a, spark-b"])


@pytest.mark.parametrize("cluster, head, checked, expected", [
    ({"kit_user": "<YOUR_USER>"}, {}, {},
     "dgxspark_vllm_kit_user on spark-a, spark-b holds '<YOUR_USER>': a placeholder of the example inventory"),
    ({"api_allowed_cidrs": ["10.0.0.0/8", "203.0.113.0/24"]}, {}, {},
     "dgxspark_vllm_api_allowed_cidrs[1] on spark-a, spark-b holds '203.0.113.0/24': in 203.0.113.0/24"),
    ({"settings": {"extra_env": {"MY_IFACE": "<IFACE>"}}}, {}, {},
     "dgxspark_vllm_settings.extra_env.MY_IFACE on spark-a, spark-b holds '<IFACE>'"),
    ({}, {"dgxspark_vllm_cx7_ip": "2001:db8::11"}, {},
     "dgxspark_vllm_cx7_ip on spark-a holds '2001:db8::11': in 2001:db8::/32, a range reserved for documentation "
     "(RFC 3849)"),
    ({"api_key": "<API_KEY>"}, {}, {}, "dgxspark_vllm_api_key on spark-a, spark-b holds (hidden)"),
    ({}, {}, {"spark-b": {"kit_launch_hf_bin": "/home/<YOUR_USER>/.hf-cli/venv/bin/hf"}},
     "kit_launch_hf_bin on spark-b holds '<YOUR_USER>'"),
    ({}, {}, {"spark-a": {"inventory_hostname": "198.51.100.7"}}, "inventory_hostname on spark-a holds '198.51.100.7'"),
])
def test_a_placeholder_left_in_any_variable_is_refused_with_its_variable_and_hosts(
        cluster: dict[str, Any], head: dict[str, Any], checked: dict[str, Any], expected: str) -> None:
    found = problems(inputs(cluster, head, checked_vars=checked))
    assert any(expected in problem for problem in found), found
    assert not any("reserved" in problem or "placeholder" in problem for problem in found if expected not in problem)


def test_the_labs_addresses_and_real_values_are_not_placeholders() -> None:
    config = resolve(inputs({"cx7_subnet": "10.77.1.0/24", "api_allowed_cidrs": ["10.77.0.1/32", "192.0.3.0/24"],
                             "settings": {"extra_env": {"X": "<think>"}}},
                            {"dgxspark_vllm_cx7_ip": "10.77.1.11"}, {"dgxspark_vllm_cx7_ip": "10.77.1.12"},
                            checked_vars={"spark-a": {"ansible_host": "10.77.0.11", "ansible_user": "spark"}}))
    assert config["cx7_subnet"] == "10.77.1.0/24"


# --------------------------------------------------------------------------- the tensor-parallel size and the model


def cluster_of(count: int, cluster: dict[str, Any] | None = None, **kwargs: Any) -> Inputs:
    """A cluster of ``count`` Sparks (spark-1 the head), the group vars given."""
    shared = group(**(cluster or {}))
    hosts = [f"spark-{index}" for index in range(1, count + 1)]
    hostvars = {host: {**shared, "dgxspark_vllm_cx7_ip": f"192.168.100.{10 + index}"}
                for index, host in enumerate(hosts, start=1)}
    return Inputs(hostvars=hostvars, head=hosts[:1], workers=hosts[1:], builtin_profiles=BUILTIN, ansible_user="spark",
                  **kwargs)


@pytest.mark.parametrize("profile", ["glm53_flash_nvfp4", "glm53_flash_exl3"])
def test_three_sparks_are_refused_before_anything_starts(profile: str) -> None:
    found = [problem for problem in problems(cluster_of(3, {"profile": profile, "accept_noncommercial_drafter": True}))
             if "tensor-parallel" in problem]
    assert len(found) == 1, found
    assert found[0].startswith("the tensor-parallel size 3 (3 nodes x 1 GPU per node) does not fit the model: vLLM "
                               "splits its attention across the ranks, and its 64 attention heads do not divide by 3; "
                               "its 64 KV heads neither divide by 3 nor divide 3")
    assert "node counts that fit: 2, 4, 8 (the head and the hosts of spark_workers)" in found[0]
    assert f"[The head counts (64 and 64) come from profile {profile};" in found[0]


def test_a_tensor_parallel_size_set_to_three_is_refused_by_its_variable() -> None:
    found = problems(cluster_of(3, {"tensor_parallel_size": 3}))
    assert any(problem.startswith("dgxspark_vllm_tensor_parallel_size 3 does not fit the model") for problem in found)


@pytest.mark.parametrize("count, cluster", [
    (2, {}), (4, {}), (8, {}),
    (2, {"profile": "lab_cpu"}),
    (4, {"profile": "lab_cpu", "attention_heads": 4, "kv_heads": 4, "model_repo": "dgxspark-lab/tiny-glm53-tp4"}),
    (4, {"tensor_parallel_size": 4}),
])
def test_what_fits_resolves(count: int, cluster: dict[str, Any]) -> None:
    config = resolve(cluster_of(count, cluster))
    assert config["attention_heads"] >= 2 and config["kv_heads"] >= 2


def test_the_lab_model_on_four_nodes_is_refused_without_the_four_node_models_heads() -> None:
    found = [problem for problem in problems(cluster_of(4, {"profile": "lab_cpu"})) if "tensor-parallel" in problem]
    assert len(found) == 1 and "its 2 attention heads do not divide by 4" in found[0], found
    assert "node counts that fit: 2 (" in found[0] and "come from profile lab_cpu" in found[0]


def test_the_head_counts_come_from_the_profile_or_their_variables() -> None:
    config = resolve(inputs())
    assert (config["attention_heads"], config["kv_heads"]) == (64, 64)
    assert config["sources"]["attention_heads"] == "profile glm53_flash_nvfp4"
    config = resolve(inputs({"attention_heads": "32", "kv_heads": 4}))
    assert (config["attention_heads"], config["kv_heads"]) == (32, 4)
    assert config["sources"]["kv_heads"] == "dgxspark_vllm_kv_heads"


@pytest.mark.parametrize("cluster, message", [
    ({"attention_heads": "lots"}, r"dgxspark_vllm_attention_heads must be a whole number of 1 or more, got 'lots'"),
    ({"kv_heads": 0}, r"dgxspark_vllm_kv_heads must be a whole number of 1 or more, got 0"),
    ({"kv_heads": True}, r"dgxspark_vllm_kv_heads must be a whole number of 1 or more, got True"),
    ({"profiles": {"mine": {"extends": "glm53_flash_nvfp4", "settings": {"model_repo": "org/other-model"}}},
      "profile": "mine"},
     r"profile mine serves 'org/other-model', another model than glm53_flash_nvfp4's "
     r"\('RedHatAI/GLM-5.3-Flash-NVFP4'\), but takes settings.attention_heads and settings.kv_heads from it"),
    ({"profiles": {"mine": {"extends": "glm53_flash_nvfp4", "settings": {"attention_heads": None}}},
      "profile": "mine"},
     r"the model's attention heads \(dgxspark_vllm_attention_heads None\) must be whole numbers of 1 or more: set "
     r"them in the profile \(settings.attention_heads, settings.kv_heads\)"),
])
def test_unusable_head_counts_are_named(cluster: dict[str, Any], message: str) -> None:
    found = problems(inputs(cluster))
    assert any(__import__("re").search(message, problem) for problem in found), found


def test_a_profile_of_another_model_with_its_own_heads_is_checked_against_them() -> None:
    profile = {"mine": {"extends": "glm53_flash_nvfp4",
                        "settings": {"model_repo": "org/gqa-model", "attention_heads": 96, "kv_heads": 8}}}
    assert resolve(cluster_of(2, {"profiles": profile, "profile": "mine"}))["kv_heads"] == 8
    found = problems(cluster_of(3, {"profiles": profile, "profile": "mine"}))
    assert any("its 8 KV heads neither divide by 3 nor divide 3" in problem and "node counts that fit: 2, 4, 8" in
               problem for problem in found), found


# --------------------------------------------------------------------------- the group guard


def test_the_guard_is_on_for_docker_run_and_off_for_the_kit_unless_asked() -> None:
    assert resolve(inputs())["guard"] is True
    assert resolve(inputs({"guard": "no"}))["guard"] is False
    assert resolve(inputs({"guard": False}))["sources"]["guard"] == "dgxspark_vllm_guard"
    kit = {"profile": "glm53_flash_exl3", "accept_noncommercial_drafter": True}
    assert resolve(inputs(kit))["guard"] is False
    assert resolve(inputs(dict(kit, guard=False)))["guard"] is False


def test_the_guard_is_refused_for_the_kit_and_a_bad_value_is_named() -> None:
    found = problems(inputs({"profile": "glm53_flash_exl3", "accept_noncommercial_drafter": True, "guard": True}))
    assert len(found) == 1
    assert found[0].startswith("dgxspark_vllm_guard: true is refused for profile glm53_flash_exl3 (launcher exl3_kit)")
    assert "set dgxspark_vllm_guard: false" in found[0]
    assert problems(inputs({"guard": "sometimes"})) == [
        "dgxspark_vllm_guard must be true or false, got 'sometimes' (e.g. dgxspark_vllm_guard: true)"]


# --------------------------------------------------------------------------- the firewall and the API's exposure


def test_the_firewall_and_a_required_key_are_on_by_default_and_the_api_networks_default_to_the_controller() -> None:
    config = resolve(inputs())
    assert config["firewall"] is True and config["api_allowed_cidrs"] == [] and config["require_api_key"] is True
    assert config["sources"]["api_allowed_cidrs"] == "default (the controller's address and the nodes)"
    config = resolve(inputs({"firewall": "off", "require_api_key": "yes",
                             "api_allowed_cidrs": ["10.0.0.7", "192.168.1.9/24", "192.168.1.0/24", "fd00::1/64"]}))
    assert config["firewall"] is False and config["require_api_key"] is True
    assert config["api_allowed_cidrs"] == ["10.0.0.7/32", "192.168.1.0/24", "fd00::/64"]
    assert config["sources"]["api_allowed_cidrs"] == "dgxspark_vllm_api_allowed_cidrs"


def test_an_api_beyond_loopback_without_a_key_gets_a_generated_one() -> None:
    # the recipe's host 0.0.0.0, no key in the inventory: the dgxspark_vllm role generates it on the head
    config = resolve(inputs())
    assert (config["api_key_generate"], config["api_key_source"]) == (True, "generated")
    # a play's first resolution already counts the key the role generates right after it (preflight, Prometheus)
    assert config["api_key_file"] == "/etc/dgxspark/api-key" and config["api_key_set"] is True
    # once the role gave every node the generated key, it is read back, not made again, and still named generated
    marked = {"api_key": "k" * 43, "api_key_generated": True}
    config = resolve(inputs(marked, head=marked, worker=marked))
    assert (config["api_key_generate"], config["api_key_source"], config["api_key_set"]) == (False, "generated", True)
    # a key of the inventory: nothing generated
    config = resolve(inputs({"api_key": "from-a-vault-1234", "api_key_file": "/root/key"}))
    assert (config["api_key_generate"], config["api_key_source"]) == (False, "dgxspark_vllm_api_key")
    assert config["api_key_file"] == "/root/key" and config["sources"]["api_key_file"] == "dgxspark_vllm_api_key_file"
    # on loopback only, no key is needed and none is made
    config = resolve(inputs({"settings": {"host": "127.0.0.1"}}))
    assert (config["api_key_generate"], config["api_key_source"], config["api_key_set"]) == (False, "none", False)
    # the EXL3 kit binds 0.0.0.0 whatever the settings say
    config = resolve(inputs({"profile": "glm53_flash_exl3", "guard": False, "accept_noncommercial_drafter": True,
                             "settings": {"host": "127.0.0.1"}}))
    assert (config["api_key_generate"], config["api_key_source"]) == (True, "generated")
    assert problems(inputs({"api_key_file": "etc/key"}))[0].startswith("dgxspark_vllm_api_key_file must be an absolute")


def test_bad_api_networks_are_named_before_anything_runs() -> None:
    assert problems(inputs({"api_allowed_cidrs": "192.168.1.0/24"})) == [
        "dgxspark_vllm_api_allowed_cidrs must be a list of networks, got '192.168.1.0/24' "
        "(e.g. dgxspark_vllm_api_allowed_cidrs: [192.168.1.0/24])"]
    assert problems(inputs({"api_allowed_cidrs": ["192.168.1.0/24", "lan"]})) == [
        "dgxspark_vllm_api_allowed_cidrs: 'lan' is not an address or a network "
        "(e.g. dgxspark_vllm_api_allowed_cidrs: [192.168.1.0/24])"]
    assert problems(inputs({"firewall": "maybe"})) == [
        "dgxspark_vllm_firewall must be true or false, got 'maybe' (e.g. dgxspark_vllm_firewall: true)"]


def test_a_setting_given_in_dgxspark_vllm_settings_is_named_once() -> None:
    # the render's message names settings.master_addr; the inventory's name for it carries the prefix once
    found = problems(inputs({"settings": {"master_addr": "192.168.100.99"}}))
    assert found == ["dgxspark_vllm_settings.master_addr 192.168.100.99 is not the head's cx7_ip (spark-a: "
                     "192.168.100.11); leave it unset or make it the head's cx7_ip"]


def test_the_guard_metrics_port_is_one_setting_checked_against_the_other_ports() -> None:
    config = resolve(inputs())
    assert (config["guard_metrics_port"], config["sources"]["guard_metrics_port"]) == (9478, "default")
    config = resolve(inputs({"guard_metrics_port": "9100"}))
    assert (config["guard_metrics_port"], config["sources"]["guard_metrics_port"]) == (
        9100, "dgxspark_vllm_guard_metrics_port")
    assert resolve(inputs({"guard_metrics_port": 0}))["guard_metrics_port"] == 0
    for bad in (70000, "metrics", True, -1):
        assert problems(inputs({"guard_metrics_port": bad}))[0].startswith(
            "dgxspark_vllm_guard_metrics_port must be a port number (1-65535) or 0 for none"), bad
    assert problems(inputs({"guard_metrics_port": 8000}))[0].startswith(
        "dgxspark_vllm_guard_metrics_port and dgxspark_vllm_port are both 8000: the guard")


# --------------------------------------------------------------------------------------------- a release pinned


def test_a_pinned_release_is_served_instead_of_the_inventorys_image_model_profile_settings_and_kv() -> None:
    digest = "sha256:" + "a" * 64
    pin = {"id": "3f2a9c1e0b7d", "image": "ghcr.io/dgxspark-lab/vllm-openai-cpu@" + digest,
           "model_repo": "dgxspark-lab/tiny-glm53", "model_revision": "5d3f" + "0" * 36, "profile": "lab_cpu",
           "settings": {"max_model_len": 2048, "model_path": "/var/tmp/models/tiny-glm53", "cx7_iface": "pinned0"},
           "kv_cache_memory_bytes": 1288490188}
    given = inputs({"profile": "glm53_flash_nvfp4", "image": "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0-broken",
                    "max_model_len": 8192, "settings": {"extra_args": ["--max-num-seqs", "1"]}, "lab": True},
                   release_pin=pin)
    config = resolve(given)
    assert (config["profile_name"], config["image"], config["model_revision"]) == (
        "lab_cpu", pin["image"], pin["model_revision"])
    assert config["max_model_len"] == 2048 and config["kv_cache_memory_bytes"] == 1288490188
    assert "extra_args" not in config["settings"] and config["release_pin"] == "3f2a9c1e0b7d"
    assert config["sources"]["image"] == config["sources"]["max_model_len"] == "release 3f2a9c1e0b7d"
    assert config["settings"].get("cx7_iface") != "pinned0"   # found on each node, not the release's
    assert resolve(inputs())["release_pin"] == "" and resolve(inputs())["upgrade_rollback"] is True


def test_a_broken_pin_and_a_wrong_rollback_switch_are_refused() -> None:
    found = problems(inputs({"upgrade_rollback": "maybe"}, release_pin={"id": "x", "image": "i"}))
    assert any("has no model_repo" in problem for problem in found)
    wrong = problems(inputs({"upgrade_rollback": "maybe"}))
    assert any("dgxspark_vllm_upgrade_rollback must be true or false" in problem for problem in wrong)


def test_the_releases_kept_staged() -> None:
    assert resolve(inputs())["upgrade_keep_staged"] == 2
    assert resolve(inputs({"upgrade_keep_staged": "3"}))["upgrade_keep_staged"] == 3
    for wrong in (0, "two", -1):
        found = problems(inputs({"upgrade_keep_staged": wrong}))
        assert any("dgxspark_vllm_upgrade_keep_staged must be a whole number of 1 or more" in problem
                   for problem in found), found
