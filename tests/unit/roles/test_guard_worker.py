# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group guard's forced command on each worker (roles/guard/files/dgxspark_guard_worker.py): what the guard's SSH
key can do. The program is imported by path; the exec of docker and the auth log are fakes that record."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from helpers.programs import load_program

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "roles" / "guard" / "files" / "dgxspark_guard_worker.py"
CONTAINER = "vllm_glm53"
DOCKER = "/usr/bin/docker"

worker = load_program(SCRIPT, "dgxspark_guard_worker")


class Run:
    """One run of the forced command as sshd (through sudo) runs it: its exit status, stderr, exec and auth log."""

    def __init__(self, request, container: str = CONTAINER, docker: str | None = DOCKER, **environ) -> None:
        self.execs = []
        self.audits = []
        self.stderr = io.StringIO()
        env = dict(environ, SUDO_USER="dgxspark-guard")
        if request is not None:
            env["SSH_ORIGINAL_COMMAND"] = request

        def execute(argv, env):
            self.execs.append((argv, env))
            return 0

        self.rc = worker.main(["--container", container], environ=env, execute=execute,
                              which=lambda name, path: docker if (name, path) == ("docker", worker.SAFE_PATH) else None,
                              stderr=self.stderr, audit=lambda priority, message: self.audits.append((priority, message)))

    @property
    def error(self) -> str:
        return self.stderr.getvalue()


# ------------------------------------------------------------------------------------------------ allowed

STARTED = "2026-12-04T18:14:00.123456789Z"


@pytest.mark.parametrize("request_text, argv", [
    ("inspect --format '{{json .State}}' vllm_glm53", ["inspect", "--format", "{{json .State}}", CONTAINER]),
    ("logs --timestamps vllm_glm53", ["logs", "--timestamps", CONTAINER]),
    (f"logs --timestamps --since {STARTED} vllm_glm53", ["logs", "--timestamps", "--since", STARTED, CONTAINER]),
    ("logs --timestamps --since 2026-12-04T18:14:00+01:00 vllm_glm53",
     ["logs", "--timestamps", "--since", "2026-12-04T18:14:00+01:00", CONTAINER]),
    ("start vllm_glm53", ["start", CONTAINER]),
    ("stop --time 10 vllm_glm53", ["stop", "--time", "10", CONTAINER]),
    ("stop --time 0 vllm_glm53", ["stop", "--time", "0", CONTAINER]),
    ("stop --time 3600 vllm_glm53", ["stop", "--time", "3600", CONTAINER]),
    ("kill vllm_glm53", ["kill", CONTAINER]),
    ("unpause vllm_glm53", ["unpause", CONTAINER]),
    ("start 'vllm_glm53'", ["start", CONTAINER]),          # quoted as shlex quotes it: the same word
])
def test_the_guards_operations_run_docker_with_exactly_their_argv(request_text, argv):
    run = Run(request_text)
    assert run.execs == [([DOCKER] + argv, {"PATH": worker.SAFE_PATH})]   # exec, no shell, nothing of the caller's env
    assert (run.rc, run.error) == (0, "")


def test_only_the_operations_that_change_the_container_go_to_the_auth_log():
    assert Run("inspect --format '{{json .State}}' vllm_glm53").audits == []
    assert Run("logs --timestamps vllm_glm53").audits == []
    assert Run("stop --time 0 vllm_glm53").audits == [("LOG_NOTICE", "docker stop --time 0 vllm_glm53 for dgxspark-guard")]
    assert Run("start vllm_glm53").audits == [("LOG_NOTICE", "docker start vllm_glm53 for dgxspark-guard")]


def test_the_container_comes_from_the_command_line_of_the_key():
    run = Run("kill vllm_other", container="vllm_other")
    assert run.execs[0][0] == [DOCKER, "kill", "vllm_other"]


def test_the_forms_are_the_ones_the_readme_lists():
    assert worker.forms("NAME") == [
        "inspect --format '{{json .State}}' NAME",
        "logs --timestamps NAME",
        "logs --timestamps --since STARTED_AT NAME",
        "start NAME",
        "stop --time SECONDS NAME",
        "kill NAME",
        "unpause NAME",
    ]
    readme = (ROOT / "roles" / "guard" / "README.md").read_text(encoding="utf-8")
    for form in worker.forms("NAME"):
        assert "`%s`" % form in readme, form


# ------------------------------------------------------------------------------------------------ refused

@pytest.mark.parametrize("request_text, why", [
    # what the key could do before: the whole Docker API, i.e. root on the worker
    ("system dial-stdio", "'system' is not one of the group guard's operations (inspect, logs, start, stop, kill, "
                          "unpause), each on vllm_glm53 only"),
    ("run --rm --privileged --pid host alpine", "'run' is not one of the group guard's operations"),
    ("docker run --rm alpine", "'docker' is not one of the group guard's operations"),
    ("exec vllm_glm53 id", "'exec' is not one of the group guard's operations"),
    ("exec -it vllm_glm53 bash", "'exec' is not one of the group guard's operations"),
    ("cp vllm_glm53:etc .", "'cp' is not one of the group guard's operations"),
    ("ps", "'ps' is not one of the group guard's operations"),
    ("events", "'events' is not one of the group guard's operations"),
    # a shell, however asked for
    ("sh", "'sh' is not one of the group guard's operations"),
    ("bash", "'bash' is not one of the group guard's operations"),
    ("bash -c id", "'bash' is not one of the group guard's operations"),
    ("bash -c 'docker run alpine'", "'bash' is not one of the group guard's operations"),
    ("''", "'' is not one of the group guard's operations"),
])
def test_other_operations_and_a_shell_are_refused(request_text, why):
    run = Run(request_text)
    assert run.execs == []
    assert run.rc == worker.EXIT_REFUSED == 126
    assert run.error.startswith("dgxspark-guard-worker: refused: " + why)
    assert run.error.count("\n") == 1 and run.error.endswith("\n")
    assert run.audits == [("LOG_WARNING", "refused %r for dgxspark-guard: %s" % (request_text, run.error.split("refused: ", 1)[1].strip()))]


@pytest.mark.parametrize("request_text, name", [
    ("inspect --format '{{json .State}}' other", "other"),
    ("start other", "other"),
    ("stop --time 0 vllm_glm53_2", "vllm_glm53_2"),
    ("kill registry", "registry"),
    ("unpause other", "other"),
    ("logs --timestamps other", "other"),
    (f"logs --timestamps --since {STARTED} other", "other"),
])
def test_an_operation_on_another_container_is_refused(request_text, name):
    run = Run(request_text)
    assert run.execs == [] and run.rc == 126
    assert run.error == f"dgxspark-guard-worker: refused: this key acts on the serve container vllm_glm53 only, not on {name!r}\n"


KILL, STOP, START = ["kill NAME"], ["stop --time SECONDS NAME"], ["start NAME"]
INSPECT, LOGS = ["inspect --format '{{json .State}}' NAME"], ["logs --timestamps NAME", "logs --timestamps --since STARTED_AT NAME"]


@pytest.mark.parametrize("request_text, takes", [
    ("kill --signal HUP vllm_glm53", KILL),
    ("kill -s KILL vllm_glm53", KILL),
    ("stop --time 10 --signal KILL vllm_glm53", STOP),
    ("stop vllm_glm53", STOP),
    ("stop --time 3601 vllm_glm53", STOP),
    ("stop --time 1e3 vllm_glm53", STOP),
    ("start -a vllm_glm53", START),
    ("start vllm_glm53 other", START),
    ("start", START),
    ("unpause --all", ["unpause NAME"]),
    ("inspect vllm_glm53", INSPECT),
    # the container's environment holds the API key and the HF token: never through this key
    ("inspect --format '{{json .Config.Env}}' vllm_glm53", INSPECT),
    ("inspect --format '{{json .}}' vllm_glm53", INSPECT),
    ("inspect --type image --format '{{json .State}}' vllm_glm53", INSPECT),
    ("logs --timestamps --follow vllm_glm53", LOGS),
    ("logs --timestamps --since 10m vllm_glm53", LOGS),
    ("logs --timestamps --since 2026-12-04 vllm_glm53", LOGS),
    ("logs vllm_glm53", LOGS),
    ("logs --timestamps --tail 10 vllm_glm53", LOGS),
])
def test_extra_or_other_flags_are_refused(request_text, takes):
    run = Run(request_text)
    assert run.execs == [] and run.rc == 126
    forms = " or ".join(repr(form.replace("NAME", CONTAINER)) for form in takes)
    assert run.error == (f"dgxspark-guard-worker: refused: {request_text!r} is not a form the guard uses: "
                         f"{request_text.split()[0]} takes exactly {forms}\n")


@pytest.mark.parametrize("request_text, chars", [
    ("start vllm_glm53; reboot", "';'"),
    ("start vllm_glm53 && id", "'&'"),
    ("start vllm_glm53 || id", "'|'"),
    ("start vllm_glm53 | sh", "'|'"),
    ("start $(id)", "'$', '(', ')'"),
    ("start `id`", "'`'"),
    ("start vllm_glm53 > /etc/passwd", "'/', '>'"),
    ("start vllm_glm53 < /dev/null", "'/', '<'"),
    ("start vllm_glm53\nid", "'\\n'"),
    ("start vllm_glm53\rid", "'\\r'"),
    ("start\tvllm_glm53", "'\\t'"),
    ("start vllm_glm53\x00", "'\\x00'"),
    ('start "vllm_glm53"', "'\"'"),
    ("start vllm\\_glm53", "'\\\\'"),
    ("start vllm_*", "'*'"),
    ("start vllm_glm5?", "'?'"),
    ("start ~root", "'~'"),
    ("start vllm_glm53 # comment", "'#'"),
    ("start vllm_glm53 &", "'&'"),
    ("start ${IFS}vllm_glm53", "'$'"),
    ("inspect --format '{{json .State}}' vllm_glm53 =x", "'='"),
    ("start vllm_glm53 \u00e9", "'\u00e9'"),
])
def test_shell_metacharacters_are_refused(request_text, chars):
    run = Run(request_text)
    assert run.execs == [] and run.rc == 126
    assert run.error == (f"dgxspark-guard-worker: refused: the request holds {chars}, which none of the guard's "
                         "operations uses (no shell runs here)\n")


@pytest.mark.parametrize("request_text", [None, "", " ", "   "])
def test_an_empty_command_or_a_login_is_refused(request_text):
    run = Run(request_text)
    assert run.execs == [] and run.rc == 126
    assert run.error == ("dgxspark-guard-worker: refused: no operation asked (an empty command or a login): this key "
                         "runs only the group guard's Docker operations on vllm_glm53\n")


def test_unbalanced_quoting_and_a_long_request_are_refused():
    run = Run("start 'vllm_glm53")
    assert run.rc == 126 and run.execs == []
    assert run.error == "dgxspark-guard-worker: refused: the request's quoting does not parse (No closing quotation)\n"
    run = Run("start " + "a" * 600)
    assert run.rc == 126 and run.execs == []
    assert run.error == ("dgxspark-guard-worker: refused: the request is 606 characters long; the guard's operations "
                         "take at most 512\n")


def test_the_callers_environment_does_not_reach_docker():
    run = Run("start vllm_glm53", DOCKER_HOST="tcp://elsewhere:2375", PATH="/tmp/evil", LD_PRELOAD="/tmp/x.so")
    assert run.execs == [([DOCKER, "start", CONTAINER], {"PATH": worker.SAFE_PATH})]


def test_no_docker_and_a_bad_container_argument():
    run = Run("start vllm_glm53", docker=None)
    assert (run.rc, run.execs) == (worker.EXIT_NO_DOCKER, [])
    assert run.error == "dgxspark-guard-worker: no docker CLI on this node (looked in %s)\n" % worker.SAFE_PATH
    run = Run("start vllm_glm53", container="../etc")
    assert (run.rc, run.execs) == (worker.EXIT_CONFIG, [])
    assert run.error == "dgxspark-guard-worker: --container '../etc' is not a container name\n"


# ------------------------------------------------------------------------------------------------ node operations

def test_meminfo_prints_the_nodes_meminfo_and_runs_no_docker(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   120000000 kB\n", encoding="ascii")
    out, err = io.StringIO(), io.StringIO()
    rc = worker.node_operation("meminfo", out, err, meminfo_path=str(meminfo))
    assert (rc, out.getvalue(), err.getvalue()) == (0, meminfo.read_text(encoding="ascii"), "")


def test_drop_caches_writes_3_and_names_a_failure(tmp_path):
    drop = tmp_path / "drop_caches"
    drop.write_text("", encoding="ascii")
    out, err = io.StringIO(), io.StringIO()
    assert worker.node_operation("drop-caches", out, err, drop_caches_path=str(drop)) == 0
    assert drop.read_text(encoding="ascii") == "3\n"
    assert worker.node_operation("drop-caches", out, err, drop_caches_path=str(tmp_path / "no" / "such")) == 1
    assert err.getvalue().startswith("dgxspark-guard-worker: drop-caches failed: [Errno 2]")


@pytest.mark.parametrize("request_text, audited", [("meminfo", []), ("drop-caches", [("LOG_NOTICE", "drop-caches for dgxspark-guard")])])
def test_node_operations_run_in_the_program_not_docker(request_text, audited):
    ran = []
    audits, execs = [], []
    rc = worker.main(["--container", CONTAINER], environ={"SSH_ORIGINAL_COMMAND": request_text, "SUDO_USER": "dgxspark-guard"},
                     execute=lambda argv, env: execs.append(argv) or 0, which=lambda name, path: DOCKER,
                     stderr=io.StringIO(), audit=lambda priority, message: audits.append((priority, message)),
                     node=lambda verb, out, err: ran.append(verb) or 0)
    assert (rc, ran, execs, audits) == (0, [request_text], [], audited)


@pytest.mark.parametrize("request_text", ["meminfo vllm_glm53", "drop-caches 1", "meminfo --all"])
def test_node_operations_take_no_argument(request_text):
    run = Run(request_text)
    assert run.rc == 126 and run.execs == []
    assert "takes no argument" in run.error


def test_the_node_operations_are_in_the_readme():
    readme = (ROOT / "roles" / "guard" / "README.md").read_text(encoding="utf-8")
    for verb in worker.NODE_OPERATIONS:
        assert "| `%s` |" % verb in readme, verb
