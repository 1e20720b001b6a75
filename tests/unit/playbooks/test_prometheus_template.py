# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for playbooks/prometheus.yml and its template: render them with Jinja2 as Ansible would.

The play's own vars are resolved in order against a fake ``dgxspark_vllm_config`` fact, then the scrape config
template and the file_sd task's content are rendered. Checked: both parse (YAML, JSON), they name the same
target, the scrape config has the shape Prometheus' ``scrape_configs`` takes, and the API key appears only in the
0600 key file's task, never in the scrape config.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import to_json, to_nice_json

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOK = ROOT / "playbooks" / "prometheus.yml"
TEMPLATES = ROOT / "playbooks" / "templates"
TEMPLATE = "prometheus-scrape.yml.j2"
API_KEY = "sk-dgxspark-s3cret-4242"
HEAD_ADDRESS = "192.0.2.10"

# https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config (the keys used here)
SCRAPE_KEYS = {"job_name", "metrics_path", "scheme", "scrape_interval", "scrape_timeout", "authorization",
               "static_configs"}
DURATION_RE = re.compile(r"^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TARGET_RE = re.compile(r"^[^/\s:]+:\d+$")


def environment() -> jinja2.Environment:
    """Jinja2 set up like Ansible's template module (trim_blocks) with the filters the play and template use."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters.update({
        "bool": lambda value: str(value).lower() in ("true", "1", "yes"),
        "to_json": to_json,
        "ansible.builtin.to_json": to_json,
        "ansible.builtin.to_nice_json": to_nice_json,
        "ansible.builtin.expanduser": os.path.expanduser,
    })
    return env


def load_play() -> dict[str, Any]:
    with PLAYBOOK.open(encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    assert len(plays) == 1
    return plays[0]


def render_value(env: jinja2.Environment, value: Any, context: dict[str, Any]) -> Any:
    if isinstance(value, str):
        whole = re.fullmatch(r"\{\{(.*)\}\}", value.strip(), re.DOTALL)
        if whole and "{{" not in whole[1]:   # one expression: its value itself (a list stays a list), as Ansible gives it
            return env.compile_expression(whole[1])(**context)
        return env.from_string(value).render(context) if "{{" in value else value
    if isinstance(value, list):
        return [render_value(env, item, context) for item in value]
    if isinstance(value, dict):
        return {key: render_value(env, item, context) for key, item in value.items()}
    return value


def play_context(tmp_path: Path, api_key: str, extra: dict[str, Any] | None = None, guard: bool = True,
                 metrics_port: int = 9478, routers: dict[str, dict[str, Any]] | None = None,
                 head: str = "spark-a") -> dict[str, Any]:
    """The play's vars resolved in order, over the config fact and extra vars (which win, as -e does); ``routers``:
    the hosts of spark_router and their inventory vars (none: an inventory without a router)."""
    env = environment()
    extra = extra or {}
    hostvars: dict[str, dict[str, Any]] = {"spark-a": {"ansible_host": HEAD_ADDRESS},
                                           "spark-b": {"ansible_host": "192.0.2.11"},
                                           "spark-c": {"ansible_host": "192.0.2.12"}}
    groups: dict[str, list[str]] = {"all": [*hostvars], "spark_head": ["spark-a", "spark-c"]}
    if routers is not None:
        hostvars.update({name: dict(hostvars.get(name, {}), **vars_) for name, vars_ in routers.items()})
        groups["spark_router"] = list(routers)
    context: dict[str, Any] = {
        "dgxspark_vllm_config": {"head": head, "port": 8000, "api_key_set": bool(api_key),
                                 "secure_logging": True, "guard": guard, "guard_metrics_port": metrics_port},
        "dgxspark_vllm_api_key": api_key,
        "hostvars": hostvars,
        "groups": groups,
        "prometheus_output_dir": str(tmp_path / "prom"),
    }
    for name, value in load_play()["vars"].items():
        if name == "prometheus_output_dir":
            continue
        context[name] = extra[name] if name in extra else render_value(env, value, context)
    return context


def render_scrape(context: dict[str, Any]) -> str:
    return environment().get_template(TEMPLATE).render(context)


def task(name: str) -> dict[str, Any]:
    return next(t for t in load_play()["tasks"] if t["name"] == name)


def render_file_sd(context: dict[str, Any]) -> str:
    content = task("Write the file_sd targets file")["ansible.builtin.copy"]["content"]
    return environment().from_string(content).render(context)


@pytest.mark.parametrize("api_key", [API_KEY, ""])
def test_scrape_config_parses_and_keeps_the_key_out(tmp_path: Path, api_key: str) -> None:
    context = play_context(tmp_path, api_key)
    text = render_scrape(context)
    if api_key:
        assert api_key not in text
    config = yaml.safe_load(text)
    assert list(config) == ["scrape_configs"]
    (job, guard) = config["scrape_configs"]
    assert set(job) <= SCRAPE_KEYS
    assert (job["job_name"], job["metrics_path"], job["scheme"]) == ("dgxspark-vllm", "/metrics", "http")
    assert DURATION_RE.match(job["scrape_interval"]) and DURATION_RE.match(job["scrape_timeout"])
    assert job["static_configs"] == [{"targets": [f"{HEAD_ADDRESS}:8000"],
                                      "labels": {"cluster": "spark-a", "head": "spark-a", "component": "engine"}}]
    # the guard's endpoint on the head's management address, with no key (it serves no secret)
    assert set(guard) <= SCRAPE_KEYS and "authorization" not in guard
    assert (guard["job_name"], guard["metrics_path"]) == ("dgxspark-vllm-guard", "/metrics")
    assert guard["static_configs"] == [{"targets": [f"{HEAD_ADDRESS}:9478"],
                                        "labels": {"cluster": "spark-a", "head": "spark-a", "component": "guard"}}]
    if api_key:
        key_file = str(tmp_path / "prom" / "dgxspark-vllm-api-key")
        assert job["authorization"] == {"type": "Bearer", "credentials_file": key_file}
        assert "credentials" not in job["authorization"]
    else:
        assert "authorization" not in job


def test_template_never_reads_the_key() -> None:
    source = (TEMPLATES / TEMPLATE).read_text(encoding="utf-8")
    assert "dgxspark_vllm_api_key" not in source


@pytest.mark.parametrize("api_key", [API_KEY, ""])
def test_file_sd_is_valid_and_matches_static_configs(tmp_path: Path, api_key: str) -> None:
    context = play_context(tmp_path, api_key)
    text = render_file_sd(context)
    assert API_KEY not in text
    targets = json.loads(text)
    assert isinstance(targets, list) and targets
    for group in targets:
        assert set(group) == {"targets", "labels"}
        assert all(isinstance(t, str) and TARGET_RE.match(t) for t in group["targets"])
        assert all(LABEL_NAME_RE.match(k) and isinstance(v, str) for k, v in group["labels"].items())
    assert targets == yaml.safe_load(render_scrape(context))["scrape_configs"][0]["static_configs"]


@pytest.mark.parametrize("extra", [
    {"prometheus_cluster": 'lab: "a" #1', "prometheus_job_name": "vllm: {x}"},
    {"prometheus_target": "spark-a.example:8000", "prometheus_scrape_interval": "1m30s"},
    {"prometheus_credentials_file": "/etc/prometheus/secrets/dgx key"},
])
def test_values_with_yaml_syntax_stay_values(tmp_path: Path, extra: dict[str, Any]) -> None:
    context = play_context(tmp_path, API_KEY, extra)
    # the targets list is built from the (possibly overridden) cluster and target
    context["prometheus_targets"] = render_value(environment(), load_play()["vars"]["prometheus_targets"], context)
    job = yaml.safe_load(render_scrape(context))["scrape_configs"][0]
    assert job["job_name"] == context["prometheus_job_name"]
    assert job["static_configs"][0]["labels"]["cluster"] == context["prometheus_cluster"]
    assert job["static_configs"][0]["targets"] == [context["prometheus_target"]]
    assert job["scrape_interval"] == context["prometheus_scrape_interval"]
    assert job["authorization"]["credentials_file"] == context["prometheus_credentials_file"]
    assert json.loads(render_file_sd(context)) == job["static_configs"]


def test_key_file_task_is_private_and_quiet() -> None:
    key_task = task("Write the API key for Prometheus (mode 0600, read through credentials_file)")
    write = key_task["dgxspark.vllm.secret_file"]   # mode 0600 from its creation, no temporary copy
    assert write == {"path": "{{ prometheus_key_file }}", "content": "{{ dgxspark_vllm_api_key }}"}
    assert key_task["no_log"] == "{{ dgxspark_vllm_config.secure_logging and dgxspark_vllm_api_key | length > 0 }}"
    assert key_task["diff"] is False
    assert "dgxspark_vllm_config.api_key_set" in key_task["when"]
    # only that task may name the key
    others = [t for t in load_play()["tasks"] if t is not key_task and t["name"] != key_task["name"]]
    assert "dgxspark_vllm_api_key" not in json.dumps(others)


def test_every_task_runs_once_on_the_controller() -> None:
    play = load_play()
    assert play["roles"][0] in ("dgxspark.vllm.dgxspark_vllm", {"role": "dgxspark.vllm.dgxspark_vllm"})
    for entry in play["tasks"]:
        if "ansible.builtin.include_role" in entry:
            continue   # the router's entry point `metrics`: a fact on every host of the play, reading no host
        assert entry.get("run_once") is True, entry["name"]
        if "ansible.builtin.debug" not in entry:
            assert (entry["delegate_to"], entry["become"]) == ("localhost", False), entry["name"]


@pytest.mark.parametrize("guard, port", [(False, 9478), (True, 0)])
def test_no_guard_job_without_the_guard_or_its_endpoint(tmp_path: Path, guard: bool, port: int) -> None:
    context = play_context(tmp_path, "", guard=guard, metrics_port=port)
    jobs = yaml.safe_load(render_scrape(context))["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["dgxspark-vllm"]


def test_the_alert_rules_are_written_next_to_the_scrape_config() -> None:
    copy = task("Write the alert rules")["ansible.builtin.copy"]
    assert copy == {"src": "dgxspark-vllm-alerts.yml", "dest": "{{ prometheus_dir }}/dgxspark-vllm-alerts.yml", "mode": "0644"}
    assert (ROOT / "playbooks" / "files" / "dgxspark-vllm-alerts.yml").is_file()


# ---------------------------------------------------------------- the router (hosts of spark_router)
ROUTER_TEMPLATE = "prometheus-router-scrape.yml.j2"
ROUTER_ROLE = ROOT / "roles" / "router"
ROUTER_TASKS = ("Find the router's metrics port (the router role's entry point, with its defaults)",
                "Write the router's scrape config (the same from every cluster's run)",
                "Write the router's alert rules",
                "Show what to add to prometheus.yml for the router (once, not once per cluster)")
ROUTER_CLEANUP = "Remove the router's files left from an earlier run (no host in spark_router now)"


def router_default_port() -> int:
    return yaml.safe_load((ROUTER_ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))["router_metrics_port"]


def router_port(context: dict[str, Any], play_value: Any = None) -> str:
    """The router's entry point `metrics` run in the play (tasks/metrics.yml's set_fact): its router_metrics_port is
    the role's default, or the play's host's own value (``play_value``) when it has one."""
    tasks = yaml.safe_load((ROUTER_ROLE / "tasks" / "metrics.yml").read_text(encoding="utf-8"))
    expression = next(t for t in tasks if "ansible.builtin.set_fact" in t)["ansible.builtin.set_fact"][
        "router_metrics_scrape_port"]
    scope = {**context, "router_metrics_port": router_default_port() if play_value is None else play_value}
    return environment().from_string(expression).render(scope)


def when(name: str, context: dict[str, Any], check_mode: bool = False) -> bool:
    """A task's `when` (a list is an and) as Ansible evaluates it; the output folder exists."""
    conditions = task(name).get("when", [])
    scope = {**context, "ansible_check_mode": check_mode, "prometheus_dir_stat": {"stat": {"exists": True}}}
    return all(environment().from_string("{{ %s }}" % c).render(scope) == "True"
               for c in (conditions if isinstance(conditions, list) else [conditions]))


def render_router(context: dict[str, Any]) -> str:
    context = {**context, "router_metrics_scrape_port": router_port(context)}
    return environment().get_template(ROUTER_TEMPLATE).render(context)


ROUTERS = {"router-1": {"ansible_host": "192.0.2.30"}, "router-2": {}}


def test_without_a_router_nothing_of_the_router_is_written(tmp_path: Path) -> None:
    context = play_context(tmp_path, API_KEY)
    assert context["prometheus_router_hosts"] == []
    assert [when(name, context) for name in ROUTER_TASKS] == [False] * len(ROUTER_TASKS)
    assert when(ROUTER_CLEANUP, context)   # a router file an earlier run left is removed
    assert task(ROUTER_CLEANUP)["loop"] == ["dgxspark-vllm-router-scrape.yml", "dgxspark-vllm-router-alerts.yml"]
    # the cluster's own scrape config is the same with or without a router: the router has a file of its own
    with_router = play_context(tmp_path, API_KEY, routers=ROUTERS)
    assert render_scrape(with_router) == render_scrape(context)
    jobs = yaml.safe_load(render_scrape(with_router))["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["dgxspark-vllm", "dgxspark-vllm-guard"]


def test_the_router_job_lists_every_router_host(tmp_path: Path) -> None:
    context = play_context(tmp_path, API_KEY, routers=ROUTERS)
    assert [when(name, context) for name in ROUTER_TASKS] == [True] * len(ROUTER_TASKS)
    assert not when(ROUTER_CLEANUP, context)
    text = render_router(context)
    assert API_KEY not in text
    config = yaml.safe_load(text)
    assert list(config) == ["scrape_configs"]
    (job,) = config["scrape_configs"]
    assert set(job) <= SCRAPE_KEYS and "authorization" not in job   # HAProxy's exporter takes no key
    assert (job["job_name"], job["metrics_path"], job["scheme"]) == ("dgxspark-vllm-router", "/metrics", "http")
    assert (job["scrape_interval"], job["scrape_timeout"]) == ("15s", "10s")
    port = router_default_port()
    assert job["static_configs"] == [
        {"targets": [f"192.0.2.30:{port}"], "labels": {"component": "router", "router": "router-1"}},
        {"targets": [f"router-2:{port}"], "labels": {"component": "router", "router": "router-2"}},   # its name
    ]
    for group in job["static_configs"]:
        assert all(TARGET_RE.match(t) for t in group["targets"])


def test_the_router_file_is_the_same_from_every_clusters_run(tmp_path: Path) -> None:
    first = play_context(tmp_path, API_KEY, routers=ROUTERS, head="spark-a")
    second = play_context(tmp_path, "", routers=ROUTERS, head="spark-c", guard=False)
    assert render_scrape(first) != render_scrape(second)
    assert render_router(first) == render_router(second)


@pytest.mark.parametrize("routers, play_value, port", [
    # the inventory's value for the router hosts (e.g. spark_router's group vars), on the first router host
    ({"router-1": {"router_metrics_port": 9500}, "router-2": {"router_metrics_port": 9500}}, None, "9500"),
    # one configuration for every router host: the first host's port, as the role renders it
    ({"router-1": {"router_metrics_port": 9501}, "router-2": {"router_metrics_port": 9502}}, None, "9501"),
    # unset: the router role's default, from its defaults/main.yml (the value the play's include of the role has)
    ({"router-1": {}, "router-2": {}}, None, str(router_default_port())),
    # a value for every host of the play (-e router_metrics_port=...), which the router hosts have too
    ({"router-1": {"router_metrics_port": 9600}}, 9600, "9600"),
])
def test_the_router_port_is_the_router_roles(tmp_path: Path, routers: dict[str, dict[str, Any]], play_value: Any,
                                             port: str) -> None:
    context = play_context(tmp_path, "", routers=routers)
    assert router_port(context, play_value) == port
    context["router_metrics_scrape_port"] = router_port(context, play_value)
    job = yaml.safe_load(environment().get_template(ROUTER_TEMPLATE).render(context))["scrape_configs"][0]
    assert {t.rsplit(":", 1)[1] for group in job["static_configs"] for t in group["targets"]} == {port}


def test_the_router_port_comes_from_the_router_role_only() -> None:
    include = task(ROUTER_TASKS[0])["ansible.builtin.include_role"]
    assert include == {"name": "dgxspark.vllm.router", "tasks_from": "metrics"}
    default = str(router_default_port())
    for path in (PLAYBOOK, TEMPLATES / ROUTER_TEMPLATE):
        assert default not in path.read_text(encoding="utf-8"), path
    specs = yaml.safe_load((ROUTER_ROLE / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    assert specs["argument_specs"]["metrics"]["options"]["router_metrics_port"]["default"] == router_default_port()


@pytest.mark.parametrize("extra", [{"prometheus_job_name": "vllm: {x}"}, {"prometheus_router_job_name": "r #1"}])
def test_router_values_with_yaml_syntax_stay_values(tmp_path: Path, extra: dict[str, Any]) -> None:
    context = play_context(tmp_path, "", extra, routers={"router-1": {"ansible_host": "router.example"}})
    job = yaml.safe_load(render_router(context))["scrape_configs"][0]
    assert job["job_name"] == extra.get("prometheus_router_job_name", "vllm: {x}-router")


def test_the_router_alert_rules_are_written_next_to_its_scrape_config() -> None:
    copy = task(ROUTER_TASKS[2])["ansible.builtin.copy"]
    assert copy == {"src": "dgxspark-vllm-router-alerts.yml",
                    "dest": "{{ prometheus_dir }}/dgxspark-vllm-router-alerts.yml", "mode": "0644"}
    assert (ROOT / "playbooks" / "files" / "dgxspark-vllm-router-alerts.yml").is_file()
    template = task(ROUTER_TASKS[1])["ansible.builtin.template"]
    assert template == {"src": ROUTER_TEMPLATE, "dest": "{{ prometheus_dir }}/dgxspark-vllm-router-scrape.yml",
                        "mode": "0644"}
