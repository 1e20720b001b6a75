"""The router's pure logic: backends from the clusters, the refusals, HAProxy's configuration, its runtime state."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _router as r

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "haproxy_show_stat.csv"
# HAProxy 2.6.12's `show servers state`: model_0/pair_a in maintenance (down), model_0/pair_b drained (up),
# model_1/pair_c up (its health check failing: down); all at 127.0.0.1, ports 18001-18003
SERVERS_STATE = Path(__file__).resolve().parents[3] / "fixtures" / "haproxy_servers_state.txt"
KEY_A, KEY_B, ROUTER_KEY = "key-a-0123456789", "key-b-0123456789", "router-key-0123456789"


def cluster(name: str, model: str = "glm-5.3-flash", address: str = "192.0.2.10", port: int = 8000) -> dict:
    return {"name": name, "head": f"{name}-head", "address": address, "port": port, "model": model,
            "max_model_len": 4096}


def params(clusters: list[dict], **extra: object) -> dict:
    out: dict = {"clusters": clusters, "keys": {"pair_a": KEY_A, "pair_b": KEY_B}, "router_key": ROUTER_KEY,
                 "allowed_cidrs": ["192.0.2.0/24"]}
    out.update(extra)
    return out


def problems(**extra: object) -> list[str]:
    with pytest.raises(r.RouterError) as caught:
        r.plan(params([cluster("pair_a"), cluster("pair_b", "qwen3-coder", "192.0.2.20")], **extra))
    return caught.value.problems


@pytest.mark.parametrize(("extra", "expected"), [
    ({"drain_timeout": 300, "request_timeout": 600},
     "router_drain_timeout (300 s) is shorter than the longest request the clusters allow through the router "
     "(router_request_timeout, 600 s)"),
    ({"allowed_cidrs": []}, "router_allowed_cidrs is empty"),
    ({"allowed_cidrs": ["192.0.2.0/33"]}, "router_allowed_cidrs: '192.0.2.0/33' is not an address or a network"),
    ({"port": 8404, "metrics_port": 8404}, "router_port and router_metrics_port are both 8404"),
    ({"host_ports": {"pair_a-head": 8080}}, "router_port is 8080, the API port of the cluster pair_a-head serves in"),
    ({"router_key": "short"}, "the router's API key (router_api_key"),
    ({"keys": {"pair_a": KEY_A}}, "cluster pair_b: no usable API key"),
    ({"bind_address": "every"}, "router_bind_address must be an IP address"),
    ({"fall": 0}, "router_fall must be a whole number of at least 1"),
])
def test_a_bad_input_is_refused_naming_its_fix(extra: dict, expected: str) -> None:
    found = problems(**extra)
    assert any(expected in problem for problem in found), found


def test_every_problem_is_listed_at_once() -> None:
    assert len(problems(drain_timeout=10, allowed_cidrs=[], router_key="")) == 3


def test_two_clusters_of_one_model_with_different_keys_are_refused() -> None:
    with pytest.raises(r.RouterError) as caught:
        r.plan(params([cluster("pair_a"), cluster("pair_b", address="192.0.2.20")]))
    assert "the clusters pair_a, pair_b all serve 'glm-5.3-flash' with different API keys" in str(caught.value)
    assert "the same dgxspark_vllm_api_key" in str(caught.value)


@pytest.mark.parametrize(("clusters", "expected"), [
    ([], "the inventory holds no cluster to route to"),
    ([cluster("pair a")], "cluster pair a: its name 'pair a' is not a group name"),
    ([cluster("pair_a", address="")], "has no address the router can reach it on"),
    ([cluster("pair_a", port=0)], "its API port 0 is not a port number"),
    ([cluster("pair_a", model="two words")], "its served model name 'two words' cannot be routed"),
    ([cluster("pair_a"), cluster("pair_a")], "the cluster pair_a is listed twice"),
])
def test_a_cluster_that_cannot_be_routed_is_refused(clusters: list[dict], expected: str) -> None:
    with pytest.raises(r.RouterError) as caught:
        r.backends(clusters)
    assert expected in str(caught.value)


def test_one_model_reads_no_body_and_sends_the_clusters_key() -> None:
    plan = r.plan(params([cluster("pair_a")], keys={"pair_a": KEY_A}))
    config = plan["config"]
    assert "default_backend model_0" in config
    assert "http-buffer-request" not in config and "json_query" not in config
    assert f'acl key_ok req.hdr(authorization) -m str "Bearer {ROUTER_KEY}"' in config
    assert "http-request del-header authorization" in config
    assert f'http-request set-header Authorization "Bearer {KEY_A}"' in config
    assert "server pair_a 192.0.2.10:8000 check" in config
    assert "option http-no-delay" in config   # streamed tokens are not held back to be merged
    assert "option httpchk GET /health" in config and "default-server inter 2s fall 2 rise 2" in config
    assert "tcp-request connection reject unless { src 192.0.2.0/24 127.0.0.0/8 ::1/128 }" in config
    assert "http-request use-service prometheus-exporter if { path /metrics }" in config
    assert "stats socket /run/dgxspark-router/admin.sock mode 600 level admin" in config
    assert plan["summary"] == ["pair_a (192.0.2.10:8000) serves glm-5.3-flash"]


def test_several_models_are_routed_by_the_body_and_listed_together() -> None:
    plan = r.plan(params([cluster("pair_a"), cluster("pair_b", "qwen3-coder", "2001:db8::20")]))
    config = plan["config"]
    assert "option http-buffer-request" in config
    assert "use_backend %[var(txn.model),map_str(/etc/dgxspark/router/models.map)]" in config
    assert plan["map"] == "glm-5.3-flash model_0\nqwen3-coder model_1\n"
    # each backend carries its own cluster's key, and an IPv6 head is bracketed
    backend_a, backend_b = config.split("backend model_0")[1], config.split("backend model_1")[1]
    assert f"Bearer {KEY_A}" in backend_a.split("backend model_1")[0] and f"Bearer {KEY_B}" in backend_b
    assert "server pair_b [2001:db8::20]:8000 check" in config
    import json
    listed = json.loads(plan["models"])
    expected = [("glm-5.3-flash", ["pair_a"]), ("qwen3-coder", ["pair_b"])]
    assert [(m["id"], m["clusters"]) for m in listed["data"]] == expected
    urls = ["http://192.0.2.10:8000/health", "http://[2001:db8::20]:8000/health"]
    assert [b["health_url"] for b in plan["backends"]] == urls


def test_two_clusters_of_one_model_share_its_backend() -> None:
    plan = r.plan(params([cluster("pair_a"), cluster("pair_b", address="192.0.2.20")],
                         keys={"pair_a": KEY_A, "pair_b": KEY_A}))
    assert plan["map"] == "glm-5.3-flash model_0\n"
    assert "server pair_a 192.0.2.10:8000 check\n    server pair_b 192.0.2.20:8000 check" in plan["config"]


def test_the_generated_keys_come_from_the_api_key_loop() -> None:
    results = [{"item": {"name": "pair_b"}, "key": KEY_B}, {"item": {"name": "pair_c"}, "skipped": True}]
    assert r.generated_keys(results) == {"pair_b": KEY_B}
    plan = r.plan(params([cluster("pair_a"), cluster("pair_b", "qwen3-coder")], keys={"pair_a": KEY_A},
                         generated=results))
    assert f"Bearer {KEY_B}" in plan["config"]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed here (Debian: apt install haproxy)")
def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    plan = r.plan(params([cluster("pair_a"), cluster("pair_b", "qwen3-coder")], socket=str(tmp_path / "s.sock"),
                         models_file=str(tmp_path / "models.json")))
    (tmp_path / "models.json").write_text(plan["models"])
    Path(plan["map_file"]).write_text(plan["map"])
    Path(plan["state_file"]).write_text(r.kept_server_state("", plan["backends"], lambda a: {a})["text"])
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(plan["config"])
    done = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr


def test_an_unreachable_cluster_is_named_with_the_fix() -> None:
    seen = r.probes({"lab-head": [
        {"item": {"name": "pair_a", "health_url": "http://192.0.2.10:8000/health"}, "status": 200,
         "url": "http://192.0.2.10:8000/health"},
        {"item": {"name": "pair_b", "health_url": "http://192.0.2.20:8000/health"}, "status": -1,
         "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"},
    ]})
    why = r.unreachable(seen)
    assert why is not None
    assert "lab-head -> cluster pair_b at http://192.0.2.20:8000/health: no answer (Status code was -1" in why
    assert "pair_a" not in why.split("\n")[1]
    assert "playbooks/firewall.yml --limit <cluster>" in why
    assert r.unreachable(seen[:1]) is None


def test_the_state_of_each_cluster_is_read_from_show_stat() -> None:
    states = r.server_states(FIXTURE.read_text(), r.map_models("m-a model_0\nm-c model_1\n"))
    assert [(s["cluster"], s["model"], s["state"], s["total"], s["check"]) for s in states] == [
        ("pair_a", "m-a", "up", 4, "L7OK"), ("pair_b", "m-a", "draining", 0, "L7OK"),
        ("pair_c", "m-c", "down", 0, "L4CON")]
    assert r.describe(states)[1] == "pair_b (m-a): draining, 0 running, 0 answered, last check L7OK"


@pytest.mark.parametrize(("status", "state"), [("UP 1/2", "up"), ("DOWN 1/2", "down"), ("MAINT", "maintenance"),
                                               ("NOLB", "draining"), ("MAINT (via x/y)", "maintenance")])
def test_haproxys_transitional_words_are_read(status: str, state: str) -> None:
    text = f"# pxname,svname,scur,stot,status,check_status\nmodel_0,pair_a,0,0,{status},L7OK\n"
    assert r.server_states(text)[0]["state"] == state


def test_a_drain_waits_until_no_request_runs_and_fails_after_its_timeout() -> None:
    running = [{"cluster": "pair_a", "backend": "model_0", "current": 2}, {"cluster": "pair_b", "current": 0}]
    assert r.drain_step(running, "pair_a", 1.0, 10)["step"] == "wait"
    failed = r.drain_step(running, "pair_a", 10.0, 10)
    assert failed["step"] == "fail" and "2 running request(s) after router_drain_timeout (10 s)" in failed["msg"]
    assert r.drain_step(running, "pair_b", 0.0, 10)["step"] == "done"
    assert "not behind the router (its clusters: pair_a, pair_b)" in r.drain_step(running, "pair_c", 0, 1)["msg"]
    assert r.state_commands(running, "pair_a", "drain") == ["set server model_0/pair_a state drain"]
    with pytest.raises(r.RouterError):
        r.state_commands(running, "pair_a", "down")


def test_a_key_that_could_not_be_read_is_named_with_its_head() -> None:
    results = [{"item": {"name": "pair_b", "head": "spark-b1"}, "unreachable": True,
                "msg": "Failed to connect to the host via ssh"}]
    with pytest.raises(r.RouterError) as caught:
        r.plan(params([cluster("pair_a"), cluster("pair_b", "qwen3-coder")], keys={"pair_a": KEY_A}, generated=results))
    assert caught.value.problems == ["cluster pair_b: its generated API key could not be read on its head spark-b1 "
                                     "(Failed to connect to the host via ssh)"]


PLANNED = [{"backend": "model_0", "cluster": "pair_a", "address": "127.0.0.1", "port": 18001},
           {"backend": "model_0", "cluster": "pair_b", "address": "127.0.0.1", "port": 18002},
           {"backend": "model_1", "cluster": "pair_c", "address": "127.0.0.1", "port": 18003}]


def same_address(address: str) -> set[str]:
    return {address}


def test_the_configuration_loads_the_server_state_file_from_the_routers_folder() -> None:
    plan = r.plan(params([cluster("pair_a")], models_file="/srv/router/models.json"))
    assert plan["state_file"] == "/srv/router/server-state"
    lines = plan["config"].splitlines()
    global_part = lines[lines.index("global"):lines.index("defaults")]
    defaults_part = lines[lines.index("defaults"):lines.index("frontend router")]
    assert "    server-state-file /srv/router/server-state" in global_part
    assert "    load-server-state-from-file global" in defaults_part


def test_every_planned_server_at_its_address_and_port_is_kept_with_its_state_and_its_health_afresh() -> None:
    dump = SERVERS_STATE.read_text()
    kept = r.kept_server_state(dump, PLANNED, same_address)
    assert kept["kept"] == ["pair_a in model_0: maintenance", "pair_b in model_0: draining", "pair_c in model_1: ready"]
    assert kept["dropped"] == []
    rows = r.parse_server_state(kept["text"])
    assert [(row["srv_name"], row["srv_admin_state"], row["srv_op_state"]) for row in rows] == [
        ("pair_a", "1", "2"), ("pair_b", "8", "2"), ("pair_c", "0", "2")]   # down in the dump, up as HAProxy starts it
    assert kept["text"].splitlines()[:2] == dump.splitlines()[:2]
    assert kept["text"] == r.normalized_server_state(dump)
    unchanged = [line.split() for line in dump.splitlines()[2:]]
    for line, before in zip(kept["text"].splitlines()[2:], unchanged):
        after = line.split()
        assert after[:5] == before[:5] and after[6:] == before[6:]   # only srv_op_state (column 6) is set


@pytest.mark.parametrize(("change", "why"), [
    ({"port": 18009}, "pair_b in model_0: now at 127.0.0.1:18009, not 127.0.0.1:18002"),
    ({"address": "192.0.2.7"}, "pair_b in model_0: now at 192.0.2.7:18002, not 127.0.0.1:18002"),
    ({"backend": "model_2"}, "pair_b in model_0: no longer behind the router"),
])
def test_a_server_that_moved_or_left_loses_its_line(change: dict, why: str) -> None:
    planned = [dict(PLANNED[0]), dict(PLANNED[1], **change), dict(PLANNED[2])]
    kept = r.kept_server_state(SERVERS_STATE.read_text(), planned, same_address)
    assert [line.split()[3] for line in kept["text"].splitlines()[2:]] == ["pair_a", "pair_c"]
    assert len(kept["dropped"]) == 1 and kept["dropped"][0].startswith(why)
    assert r.parse_server_state(kept["text"])[0]["srv_admin_state"] == "1"   # pair_a's maintenance is still kept


def test_a_host_name_is_compared_with_what_it_resolves_to() -> None:
    planned = [dict(p, address="spark-a.lan") for p in PLANNED]
    resolved = r.kept_server_state(SERVERS_STATE.read_text(), planned, lambda a: {"127.0.0.1", "::1"})
    assert len(resolved["kept"]) == 3
    elsewhere = r.kept_server_state(SERVERS_STATE.read_text(), planned, lambda a: {"192.0.2.9"})
    assert elsewhere["kept"] == [] and len(elsewhere["dropped"]) == 3
    assert elsewhere["text"].splitlines()[0] == "1" and len(elsewhere["text"].splitlines()) == 2


def test_nothing_to_keep_is_the_version_alone() -> None:
    assert r.kept_server_state("", PLANNED, same_address) == {"text": "1\n", "kept": [], "dropped": []}
    assert r.parse_server_state("1\n") == []


@pytest.mark.parametrize(("text", "expected"), [
    ("2\n# be_id be_name\n", "not in HAProxy's version 1 format"),
    ("1\n# be_id be_name srv_name\n", "lacks the columns srv_op_state, srv_addr, srv_port"),
    ("1\n# be_name srv_name srv_addr srv_port srv_op_state srv_admin_state srv_uweight srv_iweight\nmodel_0 a\n",
     "has a short line (2 of 8 columns)"),
])
def test_a_state_in_another_format_is_refused(text: str, expected: str) -> None:
    with pytest.raises(r.RouterError, match=re.escape(expected)):
        r.parse_server_state(text)


def test_the_time_since_the_last_change_does_not_make_a_new_state() -> None:
    dump = SERVERS_STATE.read_text()
    later = dump.replace("3 model_0 2 pair_b 127.0.0.1 2 8 1 1 0 15", "3 model_0 2 pair_b 127.0.0.1 2 8 1 1 97 15")
    assert later != dump and r.same_server_state(dump, later)
    ready = dump.replace("pair_b 127.0.0.1 2 8 ", "pair_b 127.0.0.1 2 0 ")
    assert ready != dump and not r.same_server_state(dump, ready)
    healthier = dump.replace("pair_c 127.0.0.1 0 0 ", "pair_c 127.0.0.1 2 0 ")
    assert healthier != dump and r.same_server_state(dump, healthier)   # the health is not kept
    moved = dump.replace("- 18003 -", "- 18013 -")
    assert moved != dump and not r.same_server_state(dump, moved)
    assert not r.same_server_state("", "1\n")   # no file, then the version alone: written
    assert r.same_server_state("1\n", "1\n")
    assert not r.same_server_state("garbage", "1\n")


def test_a_wait_until_the_router_is_up_takes_a_held_cluster_as_settled() -> None:
    up = {"cluster": "pair_a", "backend": "model_0", "model": "m", "state": "up", "current": 0, "total": 0,
          "check": "L7OK"}
    held = dict(up, cluster="pair_b", state="maintenance")
    down = dict(up, cluster="pair_c", state="down")
    settled = r.held_and_waiting([up, held])
    assert settled["settled"] and settled["waiting"] == []
    assert settled["held"] == ["pair_b (m): maintenance, as router_backend set it (kept across reloads; state=ready "
                               "puts it back)"]
    assert r.held_and_waiting([up, dict(held, state="draining"), down])["waiting"] == [
        "pair_c (m): down, 0 running, 0 answered, last check L7OK"]
    assert not r.held_and_waiting([up, down])["settled"]
    assert not r.held_and_waiting([])["settled"]
