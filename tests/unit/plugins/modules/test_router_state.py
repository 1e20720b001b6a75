# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""dgxspark.vllm.router_state and router_backend's state file: what the router loads at its next start or reload."""
from __future__ import annotations

import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import router_backend, router_state
from helpers.module_runner import ModuleFail, run_module

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
DUMP = (FIXTURES / "haproxy_servers_state.txt").read_text()   # pair_a maintenance, pair_b drained, pair_c down
KEPT = DUMP.replace("pair_a 127.0.0.1 0 1", "pair_a 127.0.0.1 2 1").replace("pair_c 127.0.0.1 0 0", "pair_c 127.0.0.1 2 0")
PLANNED = [{"backend": "model_0", "cluster": "pair_a", "address": "127.0.0.1", "port": 18001},
           {"backend": "model_0", "cluster": "pair_b", "address": "127.0.0.1", "port": 18002},
           {"backend": "model_1", "cluster": "pair_c", "address": "127.0.0.1", "port": 18003}]


class FakeRouter:
    """HAProxy's runtime socket as far as these modules use it: one command per connection."""

    def __init__(self, path: Path, answers: dict[str, str]) -> None:
        self.answers, self.asked = answers, []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn = self.server.accept()[0]
            except OSError:
                return
            with conn:
                line = conn.recv(4096).decode().strip()
                self.asked.append(line)
                answer = self.answers.get(line, self.answers.get(line.split(" ")[0], "\n"))
                conn.sendall(answer.encode())


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[FakeRouter, Path]]:
    path = tmp_path / "admin.sock"
    fake = FakeRouter(path, {"show servers state": DUMP})
    yield fake, path
    fake.server.close()


def test_the_running_routers_state_is_kept_then_left_alone(tmp_path: Path, router: tuple[FakeRouter, Path]) -> None:
    state = tmp_path / "router" / "server-state"
    state.parent.mkdir(mode=0o700)
    args = {"path": str(state), "socket": str(router[1]), "backends": PLANNED}
    first = run_module(router_state.main, args)
    assert (first["changed"], first["source"]) == (True, "router")
    assert first["kept"] == ["pair_a in model_0: maintenance", "pair_b in model_0: draining", "pair_c in model_1: ready"]
    assert state.read_text() == KEPT and stat.S_IMODE(state.stat().st_mode) == 0o600
    router[0].answers["show servers state"] = DUMP.replace("pair_b 127.0.0.1 2 8 1 1 0", "pair_b 127.0.0.1 2 8 1 1 40") \
        .replace("pair_c 127.0.0.1 0 0", "pair_c 127.0.0.1 2 0")
    assert run_module(router_state.main, args)["changed"] is False   # the time since the last change and the health
    assert state.read_text() == KEPT
    router[0].answers["show servers state"] = DUMP.replace("pair_b 127.0.0.1 2 8 ", "pair_b 127.0.0.1 2 0 ")
    again = run_module(router_state.main, args)   # pair_b put back by hand on the socket: the file follows
    assert again["changed"] is True and "pair_b in model_0: ready" in again["kept"]


def test_a_moved_cluster_loses_its_state_and_check_mode_writes_nothing(tmp_path: Path,
                                                                       router: tuple[FakeRouter, Path]) -> None:
    state = tmp_path / "server-state"
    state.write_text(DUMP)
    moved = [PLANNED[0], dict(PLANNED[1], port=18012), PLANNED[2]]
    args = {"path": str(state), "socket": str(router[1]), "backends": moved}
    checked = run_module(router_state.main, args, check_mode=True)
    assert checked["changed"] is True and state.read_text() == DUMP
    done = run_module(router_state.main, args)
    assert done["dropped"] == ["pair_b in model_0: now at 127.0.0.1:18012, not 127.0.0.1:18002 (its state is not kept)"]
    assert "pair_b" not in state.read_text() and "pair_a" in state.read_text()


def test_a_stopped_router_keeps_the_file_as_far_as_the_plan_still_holds(tmp_path: Path) -> None:
    state = tmp_path / "server-state"
    args = {"path": str(state), "socket": str(tmp_path / "none.sock"), "backends": PLANNED[:1]}
    first = run_module(router_state.main, args)   # the first start: no router, no file
    assert (first["changed"], first["source"], state.read_text()) == (True, "none", "1\n")
    state.write_text(DUMP)
    kept = run_module(router_state.main, args)
    assert (kept["source"], kept["kept"]) == ("file", ["pair_a in model_0: maintenance"])
    assert [line.split()[3] for line in state.read_text().splitlines()[2:]] == ["pair_a"]
    state.write_text("garbage\n")
    unreadable = run_module(router_state.main, args)
    assert unreadable["changed"] and state.read_text() == "1\n" and "garbage" not in str(unreadable["kept"])


def test_a_router_answering_another_format_fails_naming_it(tmp_path: Path, router: tuple[FakeRouter, Path]) -> None:
    router[0].answers["show servers state"] = "2\n# something else\n"
    with pytest.raises(ModuleFail, match="not in HAProxy's version 1 format"):
        run_module(router_state.main, {"path": str(tmp_path / "s"), "socket": str(router[1]), "backends": PLANNED})
    assert not (tmp_path / "s").exists()


SHOW_STAT = (FIXTURES / "haproxy_show_stat.csv").read_text()   # model_0: pair_a up, pair_b drained


def test_router_backend_writes_the_state_it_set(tmp_path: Path, router: tuple[FakeRouter, Path]) -> None:
    router[0].answers.update({"show stat": SHOW_STAT, "set": ""})
    state = tmp_path / "server-state"
    args = {"cluster": "pair_a", "state": "maint", "wait": False, "socket": str(router[1]), "state_file": str(state)}
    done = run_module(router_backend.main, args)
    assert done["changed"] is True
    assert "set server model_0/pair_a state maint" in router[0].asked
    assert router[0].asked.index("show servers state") > router[0].asked.index("set server model_0/pair_a state maint")
    assert state.read_text() == KEPT and stat.S_IMODE(state.stat().st_mode) == 0o600


def test_router_backend_without_a_change_or_a_state_file_writes_nothing(tmp_path: Path,
                                                                        router: tuple[FakeRouter, Path]) -> None:
    router[0].answers.update({"show stat": SHOW_STAT, "set": ""})
    state = tmp_path / "server-state"
    ready = run_module(router_backend.main, {"cluster": "pair_a", "state": "ready", "socket": str(router[1]),
                                             "state_file": str(state)})
    assert ready["changed"] is False and not state.exists()
    run_module(router_backend.main, {"cluster": "pair_a", "state": "maint", "wait": False, "socket": str(router[1]),
                                     "state_file": ""})
    assert not state.exists() and "show servers state" not in router[0].asked
