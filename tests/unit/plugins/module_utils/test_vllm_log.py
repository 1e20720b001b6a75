# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _vllm_log: fixture logs (table below) plus line-level cases.

The fmt_* fixtures are built from vLLM's format strings (see tests/fixtures/vllm_logs/README.md). To add a
captured log, drop it into that folder and add a row to FIXTURES.
"""
from __future__ import annotations


import pytest

from helpers.fixtures import log_names, read_log
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import (
    PHASES,
    KvChoiceError,
    KvSuggestion,
    LogLine,
    LogReport,
    NoKvSuggestionError,
    choose_kv_bytes,
    count_progress_lines,
    detect_engine_error,
    detect_phase,
    find_latest_start,
    merge_reports,
    normalise,
    normalise_line,
    notable_line,
    parse_kv_cache_size,
    parse_kv_suggestions,
    parse_log,
    parse_shards,
)


FOLLOWER = "worker started without --headless (follower assertion)"

# file -> expected values of LogReport.as_dict() (only the keys listed are compared)
FIXTURES: dict[str, dict[str, object]] = {
    "fmt_gpu_single_node_tp2_ready.log": {
        "suggestions": [
            {"requested_limit_bytes": 56132132454, "gpu_limit_bytes": 74700000000, "rank": 1},
            {"requested_limit_bytes": 56400000000, "gpu_limit_bytes": 74500000000, "rank": 0},
        ],
        "kv_cache_memory_bytes": 56132132454,
        "estimated_max_model_len": None,
        "kv_cache_tokens": 2097152,
        "kv_cache_pool": "GPU",
        "max_concurrency": 8.0,
        "available_kv_cache_gib": 46.25,
        "cpu_kv_cache": None,
        "phase": "api_up",
        "phase_line": "Starting vLLM server on http://0.0.0.0:8000",
        "engine_error": None,
        "starts_seen": 1,
        "last_line": "INFO:     Application startup complete.",
    },
    "fmt_gpu_head_two_starts.log": {
        "suggestions": [{"requested_limit_bytes": 10531412787, "gpu_limit_bytes": 26843545600, "rank": 0}],
        "kv_cache_memory_bytes": 10531412787,
        "estimated_max_model_len": None,  # the first start's failure does not count
        "kv_cache_tokens": 1234567,
        "kv_cache_pool": "GPU + host",
        "max_concurrency": 9.42,
        "available_kv_cache_gib": 9.1,
        "phase": "api_up",
        "engine_error": None,
        "error_line": None,
        "starts_seen": 2,
    },
    "fmt_gpu_worker_headless_kv.log": {
        "suggestions": [{"requested_limit_bytes": 10200547328, "gpu_limit_bytes": 26600000000, "rank": 1}],
        "kv_cache_memory_bytes": 10200547328,
        "kv_cache_tokens": None,
        "available_kv_cache_gib": 8.87,
        "phase": "kv_allocated",
        "phase_line": "Available KV cache memory: 8.87 GiB",
        "engine_error": None,
        "starts_seen": 1,
    },
    "fmt_gpu_worker_kv_bytes_set.log": {
        "suggestions": [],
        "kv_cache_memory_bytes": None,
        "phase": "kv_allocated",
        "engine_error": None,
    },
    "fmt_gpu_tp1_engine_core.log": {
        "suggestions": [{"requested_limit_bytes": 19468210074, "gpu_limit_bytes": 21679683072, "rank": 0}],
        "kv_cache_memory_bytes": 19468210074,
        "kv_cache_tokens": 305552,
        "max_concurrency": 9.32,
        "available_kv_cache_gib": 18.65,
        "phase": "kv_allocated",
        "starts_seen": 1,
    },
    "fmt_gpu_oom.log": {
        "phase": "rendezvous",
        "engine_error": "out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                        "GPU 0 has a total capacity of 121.69 GiB of which 1.12 GiB is free.",
        "suggestions": [],
    },
    "fmt_gpu_worker_died.log": {
        "phase": "weights_loaded",
        "phase_line": "Loading weights took 88.12 seconds",
        "engine_error": "worker process VllmWorker-0 died unexpectedly (exit code -9, SIGKILL)",
    },
    "fmt_cpu_head_ready.log": {
        "suggestions": [],
        "kv_cache_memory_bytes": None,
        "kv_cache_tokens": 2097152,
        "kv_cache_pool": "CPU",
        "max_concurrency": 4096.0,
        "cpu_kv_cache": {"kv_gib": 1.0, "total_gib": 13.71, "mode": "explicit", "numa_node": 0},
        "phase": "api_up",
        "engine_error": None,
    },
    "fmt_cpu_worker_ready.log": {
        "cpu_kv_cache": {"kv_gib": 2.73, "total_gib": 16.34, "mode": "auto", "numa_node": 0},
        "phase": "kv_allocated",
        "engine_error": None,
        "starts_seen": 1,
    },
    "fmt_cpu_head_waiting_rendezvous.log": {
        "phase": "rendezvous",
        "phase_line": "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.89.0.11:29521 backend=gloo",
        "last_line": "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.89.0.11:29521 backend=gloo",
        "engine_error": None,
    },
    "fmt_cpu_follower_assertion.log": {
        "phase": "weights_loaded",
        "engine_error": FOLLOWER,
        "error_line": "AssertionError: collective_rpc should not be called on follower node",
    },
    "fmt_cpu_rendezvous_timeout.log": {
        "phase": "rendezvous",
        "engine_error": "rendezvous timed out after 61 s: 1/2 clients joined (is every node started and able to "
                        "reach --master-addr:--master-port?)",
    },
    "fmt_cpu_eaddrinuse_after_restart.log": {
        "starts_seen": 2,
        "phase": "rendezvous",  # the first start's api_up does not count
        "kv_cache_tokens": None,
        "cpu_kv_cache": None,
        "engine_error": "master port 29521 already in use (EADDRINUSE): an earlier engine may still hold it",
    },
    "fmt_cpu_estimated_max_len.log": {
        "estimated_max_model_len": 1920,
        "engine_error": "max-model-len does not fit the KV cache: the estimated maximum model length is 1920",
        "cpu_kv_cache": {"kv_gib": 0.0, "total_gib": 13.71, "mode": "explicit", "numa_node": 0},
        "phase": "kv_allocated",
    },
    # captured from the lab (bin/lab: two nodes, vLLM 0.32.0 CPU engine, tiny GLM model); see the README
    "lab_cpu_tp2_head_ready.log.gz": {
        "suggestions": [],
        "kv_cache_memory_bytes": None,
        "estimated_max_model_len": None,
        "kv_cache_tokens": 4194304,
        "kv_cache_pool": "CPU",
        "max_concurrency": 1024.0,
        "available_kv_cache_gib": None,
        "cpu_kv_cache": {"kv_gib": 1.0, "total_gib": 17.46, "mode": "explicit", "numa_node": 0},
        "phase": "api_up",
        "phase_line": "Starting vLLM server on http://0.0.0.0:8000",
        "engine_error": None,
        "starts_seen": 1,
    },
    "lab_cpu_tp2_worker_ready.log.gz": {
        "suggestions": [],
        "kv_cache_tokens": None,
        "cpu_kv_cache": {"kv_gib": 1.0, "total_gib": 17.46, "mode": "explicit", "numa_node": 0},
        "phase": "kv_allocated",  # a headless follower never logs api_up
        "phase_line": "Explicitly set (1.0/17.46) GiB for KV cache on node 0.",
        "engine_error": None,
        "starts_seen": 1,
    },
    "lab_cpu_tp2_head_auto_kv.log.gz": {
        "suggestions": [],
        "kv_cache_tokens": 5085952,
        "kv_cache_pool": "CPU",
        "max_concurrency": 1241.69,
        "cpu_kv_cache": {"kv_gib": 1.21, "total_gib": 17.46, "mode": "auto", "numa_node": 0},
        "phase": "api_up",
        "engine_error": None,
        "starts_seen": 1,
    },
    "lab_cpu_tp2_worker_auto_kv.log.gz": {
        "cpu_kv_cache": {"kv_gib": 1.21, "total_gib": 17.46, "mode": "auto", "numa_node": 0},
        "phase": "kv_allocated",
        "phase_line": "Auto set (1.21/17.46) GiB for KV cache on node 0, with 1.75 GiB requested memory for the "
                      "worker. 0.53 GiB memory was consumed by non-kv usages.",
        "engine_error": None,
        "starts_seen": 1,
    },
    "lab_cpu_tp2_head_estimated_max_len.log.gz": {
        "estimated_max_model_len": 1048448,
        "engine_error": "max-model-len does not fit the KV cache: the estimated maximum model length is 1048448",
        "cpu_kv_cache": {"kv_gib": 0.25, "total_gib": 17.46, "mode": "explicit", "numa_node": 0},
        "kv_cache_tokens": None,  # the check fails before the pool line
        "phase": "kv_allocated",
        "starts_seen": 1,
        "last_line": "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    },
    "lab_cpu_tp2_worker_estimated_max_len.log.gz": {
        # the head failed; this headless worker kept running and logged nothing more
        "estimated_max_model_len": None,
        "engine_error": None,
        "cpu_kv_cache": {"kv_gib": 0.25, "total_gib": 17.46, "mode": "explicit", "numa_node": 0},
        "phase": "kv_allocated",
        "last_line": "Explicitly set (0.25/17.46) GiB for KV cache on node 0.",
    },
    "lab_cpu_head_rendezvous_timeout.log.gz": {
        "phase": "rendezvous",
        "phase_line": "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.77.1.11:29521 backend=gloo",
        "cpu_kv_cache": None,
        "engine_error": "rendezvous timed out after 61 s: 1/2 clients joined (is every node started and able to "
                        "reach --master-addr:--master-port?)",
        "error_line": "torch.distributed.DistStoreError: Timed out after 61 seconds waiting for clients. "
                      "1/2 clients joined.",
        "starts_seen": 1,
    },
    "lab_cpu_worker_follower_assertion.log.gz": {
        "phase": "weights_loaded",
        "phase_line": "Loading weights took 0.01 seconds",
        "cpu_kv_cache": None,
        "engine_error": FOLLOWER,
        "error_line": "AssertionError: collective_rpc should not be called on follower node",
        "starts_seen": 1,
    },
    "lab_cpu_head_after_follower_assertion.log.gz": {
        # the head hangs after its own KV allocation (removed with docker rm -f); no error is logged
        "phase": "kv_allocated",
        "cpu_kv_cache": {"kv_gib": 1.0, "total_gib": 17.46, "mode": "explicit", "numa_node": 0},
        "kv_cache_tokens": None,
        "engine_error": None,
        "last_line": "Explicitly set (1.0/17.46) GiB for KV cache on node 0.",
    },
}


def _read(name: str) -> str:
    return read_log(name)


def test_every_fixture_has_a_row() -> None:
    assert log_names() == set(FIXTURES)


@pytest.mark.parametrize("name, expected", sorted(FIXTURES.items()), ids=sorted(FIXTURES))
def test_fixture(name: str, expected: dict[str, object]) -> None:
    got = parse_log(_read(name)).as_dict()
    assert {key: got[key] for key in expected} == expected


# ---------------------------------------------------------------------------------------------------------
# normalisation

ESC = "\x1b"


@pytest.mark.parametrize("raw, expected", [
    ("plain message", (None, None, None, "plain message")),
    (
        "2026-11-30T20:01:02.123456789Z " + ESC + "[1;36m(Worker_TP0 pid=123)" + ESC + "[0;0m INFO 11-30 20:01:02 "
        "[gpu_worker.py:391] Available KV cache memory: 46.5 GiB",
        ("Worker_TP0", 123, "INFO", "Available KV cache memory: 46.5 GiB"),
    ),
    (
        "(EngineCore_DP0 pid=45) " + ESC + "[31mERROR" + ESC + "[0m 11-30 20:01:02 [core.py:708]   File \"x.py\"",
        ("EngineCore_DP0", 45, "ERROR", "  File \"x.py\""),
    ),
    ("(APIServer pid=1) INFO:     Application startup complete.",
     ("APIServer", 1, None, "INFO:     Application startup complete.")),
    ("WARNING 11-30 20:01:02 llm_engine.py:99] old-style location", (None, None, "WARNING", "old-style location")),
    ("2026-11-30T20:01:02+00:00 (EngineCore pid=7) (Worker_TP1 pid=8) DEBUG 11-30 20:01:02.123 [a/b.py:1] nested",
     ("Worker_TP1", 8, "DEBUG", "nested")),
    ("2026-11-30T20:01:02Z " + ESC + "[32mINFO" + ESC + "[0m 11-30 20:01:02 [x.py:1] trailing\r",
     (None, None, "INFO", "trailing")),
])
def test_normalise_line(raw: str, expected: tuple[object, ...]) -> None:
    line = normalise_line(raw)
    assert (line.source, line.pid, line.level, line.message) == expected


@pytest.mark.parametrize("source, rank", [
    ("Worker_TP0", 0), ("Worker_TP1", 1), ("Worker_DP0_TP3_EP3", 3), ("Worker_PP1_TP12", 12),
    ("EngineCore_DP0", None), ("Worker", None), (None, None),
])
def test_tp_rank(source: str | None, rank: int | None) -> None:
    assert LogLine(index=0, message="", source=source).tp_rank == rank


def test_normalise_splits_crlf_and_progress_bars() -> None:
    lines = normalise("INFO 11-30 20:01:02 [a.py:1] one\r\nINFO 11-30 20:01:02 [a.py:1] two\rthree\n")
    assert [line.message for line in lines] == ["one", "two", "three"]


# ---------------------------------------------------------------------------------------------------------
# KV values, line level

SUGGESTION = (
    "Free memory on device (119.5/121.69 GiB) on startup. Desired GPU memory utilization is (0.85, 103.44 GiB). "
    "Actual usage is 44.1 GiB for consumed memory (weights + non-torch), 6.2 GiB for peak activation, and 0.0 GiB "
    "for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory={n1}`{g1} to fit into "
    "requested memory, or `--kv-cache-memory={n2}`{g2} to fully utilize gpu memory. Current kv cache memory in "
    "use is 46.25 GiB."
)


@pytest.mark.parametrize("lines, expected", [
    # rank from the prefix, GiB annotations present
    ([("Worker_TP1", SUGGESTION.format(n1=100, g1=" (0.0 GiB)", n2=200, g2=" (0.0 GiB)"))], [(100, 200, 1)]),
    # older vLLM printed no GiB annotation
    ([("Worker_TP0", SUGGESTION.format(n1=45175492096, g1="", n2=59540753920, g2=""))],
     [(45175492096, 59540753920, 0)]),
    # no TP prefix: ranks by order
    ([("EngineCore_DP0", SUGGESTION.format(n1=5, g1="", n2=6, g2="")),
      (None, SUGGESTION.format(n1=7, g1="", n2=8, g2=""))], [(5, 6, 0), (7, 8, 1)]),
    ([("Worker_TP0", "Available KV cache memory: 46.5 GiB")], []),
])
def test_parse_kv_suggestions(lines: list[tuple[str | None, str]], expected: list[tuple[int, int, int]]) -> None:
    parsed = parse_kv_suggestions([LogLine(i, msg, source) for i, (source, msg) in enumerate(lines)])
    assert [(s.requested_limit_bytes, s.gpu_limit_bytes, s.rank) for s in parsed] == expected


@pytest.mark.parametrize("messages, expected", [
    (["GPU KV cache size: 2,097,152 tokens, Maximum concurrency for 262,144 tokens per request: 8.00x"],
     ("GPU", 2097152, 262144, 8.0)),
    (["GPU + host KV cache size: 1,234,567 tokens, Maximum concurrency for 131,072 tokens per request: 9.42x"],
     ("GPU + host", 1234567, 131072, 9.42)),
    (["CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x"],
     ("CPU", 2097152, 512, 4096.0)),
    # older vLLM: two lines
    (["GPU KV cache size: 514,688 tokens", "Maximum concurrency for 40,960 tokens per request: 12.57x"],
     ("GPU", 514688, 40960, 12.57)),
    (["GPU KV cache size: 999 tokens"], ("GPU", 999, None, None)),
])
def test_parse_kv_cache_size(messages: list[str], expected: tuple[object, ...]) -> None:
    kv = parse_kv_cache_size([LogLine(i, m, "EngineCore_DP0", 45) for i, m in enumerate(messages)])
    assert kv is not None
    assert (kv.pool, kv.tokens, kv.per_request_tokens, kv.concurrency) == expected


def test_parse_kv_cache_size_absent() -> None:
    assert parse_kv_cache_size([LogLine(0, "Loading weights took 3.2 seconds")]) is None


# ---------------------------------------------------------------------------------------------------------
# starts and phases

def _lines(*messages: str) -> list[LogLine]:
    return [LogLine(i, m) for i, m in enumerate(messages)]


VERSION = "vLLM API server version 0.32.0"
ARGS = "non-default args: {'model_tag': 'm'}"
LAUNCH = ("Launching vLLM (v0.32.0) headless multiproc executor, with head node address 10.0.0.1:29521 for "
          "torch.distributed process group.")
WORLD0 = "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.0.0.1:29521 backend=nccl"
WORLD1 = "world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.0.0.1:29521 backend=nccl"


@pytest.mark.parametrize("messages, expected", [
    ((), (0, 0)),
    (("some line", WORLD0), (0, 1)),                                   # no marker: whole log, one start
    (("noise", VERSION, ARGS, WORLD0), (1, 1)),                        # head preamble: two markers, one start
    (("noise", VERSION, ARGS, WORLD0, VERSION, ARGS, WORLD0), (4, 2)),  # restarted head
    ((LAUNCH, WORLD1, LAUNCH, WORLD1), (2, 2)),                        # restarted worker: marker is progress
    ((VERSION, ARGS, "Traceback (most recent call last):", "ValueError: bad", VERSION, ARGS), (4, 2)),
    ((WORLD0, "Loading weights took 1 seconds", WORLD0, WORLD1), (2, 2)),  # soft marker without hard ones
    ((VERSION, WORLD0, WORLD1, WORLD0), (0, 1)),                       # soft marker ignored with hard markers
])
def test_find_latest_start(messages: tuple[str, ...], expected: tuple[int, int]) -> None:
    assert find_latest_start(_lines(*messages)) == expected


def test_error_line_is_progress_for_the_next_marker() -> None:
    lines = [LogLine(0, VERSION), LogLine(1, "something odd", level="ERROR"), LogLine(2, ARGS)]
    # an ERROR line is progress: the next marker opens a new start
    assert find_latest_start(lines) == (2, 2)


@pytest.mark.parametrize("messages, expected", [
    ((), ("container_started", None)),
    ((VERSION, ARGS), ("container_started", None)),
    ((LAUNCH,), ("rendezvous", LAUNCH)),
    ((VERSION, WORLD0), ("rendezvous", WORLD0)),
    ((WORLD0, "Loading weights took 41.91 seconds"), ("weights_loaded", "Loading weights took 41.91 seconds")),
    ((WORLD0, "Model loading took 51.1 GiB memory and 41.9 seconds"),
     ("weights_loaded", "Model loading took 51.1 GiB memory and 41.9 seconds")),
    (("Available KV cache memory: 46.5 GiB",), ("kv_allocated", "Available KV cache memory: 46.5 GiB")),
    (("Explicitly set (1.0/13.71) GiB for KV cache on node 0.",),
     ("kv_allocated", "Explicitly set (1.0/13.71) GiB for KV cache on node 0.")),
    (("CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x",),
     ("kv_allocated", "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x")),
    (("Starting vLLM server on http://0.0.0.0:8000", "Application startup complete."),
     ("api_up", "Starting vLLM server on http://0.0.0.0:8000")),
    (("INFO:     Application startup complete.",), ("api_up", "INFO:     Application startup complete.")),
    # the highest phase wins even when a lower one is logged later
    (("Available KV cache memory: 1.0 GiB", WORLD1), ("kv_allocated", "Available KV cache memory: 1.0 GiB")),
])
def test_detect_phase(messages: tuple[str, ...], expected: tuple[str, str | None]) -> None:
    assert detect_phase(_lines(*messages)) == expected


def test_phases_are_ordered() -> None:
    assert PHASES == ("container_started", "rendezvous", "weights_loaded", "kv_allocated", "api_up")


# ---------------------------------------------------------------------------------------------------------
# engine errors

def _tb(exc_line: str, source: str = "EngineCore_DP0", pid: int = 45, level: str | None = None) -> list[LogLine]:
    raw = ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "    f()", "    ^^^", exc_line]
    return [LogLine(i, m, source, pid, level) for i, m in enumerate(raw)]


@pytest.mark.parametrize("lines, reason", [
    (_tb("AssertionError: collective_rpc should not be called on follower node"), FOLLOWER),
    (_tb("torch.distributed.DistStoreError: Timed out after 1800 seconds waiting for clients. 1/2 clients joined."),
     "rendezvous timed out after 1800 s: 1/2 clients joined (is every node started and able to reach "
     "--master-addr:--master-port?)"),
    (_tb("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
         "address. port: 29521, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"),
     "master port 29521 already in use (EADDRINUSE): an earlier engine may still hold it"),
    (_tb("torch.distributed.DistNetworkError: EADDRINUSE"),
     "master port already in use (EADDRINUSE): an earlier engine may still hold it"),
    (_tb("OSError: [Errno 12] Cannot allocate memory"), "out of memory: OSError: [Errno 12] Cannot allocate memory"),
    (_tb("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"),
     "out of memory: RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"),
    ([LogLine(0, "WorkerProc failed to start.", "Worker_TP0", 9, "ERROR")],
     "worker process failed to start (WorkerProc failed to start)"),
    (_tb("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
     "engine core initialization failed"),
    ([LogLine(0, "Worker proc VllmWorker-1 died unexpectedly (exit code: 1), shutting down executor.",
              level="ERROR")], "worker process VllmWorker-1 died unexpectedly (exit code 1)"),
    ([LogLine(0, "Worker proc VllmWorker-1 died unexpectedly, shutting down executor.", level="ERROR")],
     "worker process VllmWorker-1 died unexpectedly"),
    (_tb("ValueError: To serve at least one request ... Based on the available memory, the estimated maximum "
         "model length is 131072. Try increasing"),
     "max-model-len does not fit the KV cache: the estimated maximum model length is 131072"),
    (_tb("importlib.metadata.PackageNotFoundError: No package metadata was found for vllm"),
     "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm"),
    (_tb("AssertionError"), "AssertionError"),
    (_tb("KeyboardInterrupt"), "KeyboardInterrupt (engine stopped by a signal or by request)"),
])
def test_detect_engine_error(lines: list[LogLine], reason: str) -> None:
    found = detect_engine_error(lines)
    assert found is not None
    assert found.reason == reason


@pytest.mark.parametrize("lines", [
    [],
    _lines(VERSION, WORLD0, "Loading weights took 1 seconds"),
    # vLLM logs some harmless import tracebacks as warnings
    _tb("AssertionError", level="WARNING"),
    # a traceback that never reached its exception line
    _tb("  File \"y.py\", line 2, in g"),
])
def test_no_engine_error(lines: list[LogLine]) -> None:
    assert detect_engine_error(lines) is None


def test_most_specific_error_wins_over_order() -> None:
    wrapper = _tb("RuntimeError: Engine core initialization failed. See root cause above.", "APIServer", 1)
    follower = _tb("AssertionError: collective_rpc should not be called on follower node")
    lines = [LogLine(i, line.message, line.source, line.pid) for i, line in enumerate(wrapper + follower)]
    found = detect_engine_error(lines)
    assert found is not None and found.reason == FOLLOWER


def test_earliest_generic_error_is_the_root_cause() -> None:
    first = _tb("ValueError: first problem", "Worker_TP0", 101)
    second = _tb("RuntimeError: consequence", "EngineCore_DP0", 45)
    lines = [LogLine(i, line.message, line.source, line.pid) for i, line in enumerate(first + second)]
    found = detect_engine_error(lines)
    assert found is not None and found.reason == "ValueError: first problem"


def test_interleaved_tracebacks_are_kept_apart() -> None:
    # another process's (non-exception) output between the traceback lines must not end it
    lines = [
        LogLine(0, "Traceback (most recent call last):", "Worker_TP0", 101),
        LogLine(1, "Some other output", "EngineCore_DP0", 45),
        LogLine(2, '  File "x.py", line 1, in f', "Worker_TP0", 101),
        LogLine(3, "ZeroDivisionError: division by zero", "Worker_TP0", 101),
    ]
    found = detect_engine_error(lines)
    assert found is not None and found.reason == "ZeroDivisionError: division by zero"


def test_long_reason_is_shortened() -> None:
    found = detect_engine_error(_tb("ValueError: " + "x" * 1000))
    assert found is not None
    assert len(found.reason) == 300 and found.reason.endswith("...")


# ---------------------------------------------------------------------------------------------------------
# choosing the KV budget

RANKS = [KvSuggestion(56400000000, 74500000000, 0), KvSuggestion(56132132454, 74700000000, 1)]


@pytest.mark.parametrize("policy, margin, expected", [
    ("requested", 0, 56132132454),
    ("full", 0, 74500000000),
    ("requested", 132132454, 56000000000),
    ("full", 500000000, 74000000000),
])
def test_choose_kv_bytes(policy: str, margin: int, expected: int) -> None:
    assert choose_kv_bytes(RANKS, policy, margin) == expected


@pytest.mark.parametrize("suggestions, policy, margin, error, match", [
    ([], "requested", 0, NoKvSuggestionError, "no `--kv-cache-memory=` suggestion"),
    (RANKS, "maximum", 0, KvChoiceError, "unknown KV policy"),
    (RANKS, "requested", -1, KvChoiceError, "margin_bytes must be >= 0"),
    (RANKS, "requested", 56132132454, KvChoiceError, "no KV budget left"),
    (RANKS, "full", 10 ** 12, KvChoiceError, "no KV budget left"),
])
def test_choose_kv_bytes_errors(suggestions: list[KvSuggestion], policy: str, margin: int,
                                error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        choose_kv_bytes(suggestions, policy, margin)


def test_choose_kv_bytes_from_a_fixture() -> None:
    report = parse_log(_read("fmt_gpu_single_node_tp2_ready.log"))
    assert choose_kv_bytes(report.suggestions, "requested", 2 ** 30) == 56132132454 - 2 ** 30


# ---------------------------------------------------------------------------------------------------------
# merging nodes

def test_merge_reports_takes_the_minimum_across_nodes() -> None:
    head = parse_log(_read("fmt_gpu_head_two_starts.log"))
    worker = parse_log(_read("fmt_gpu_worker_headless_kv.log"))
    merged = merge_reports({"spark-head": head, "spark-worker": worker})
    assert merged.kv_cache_memory_bytes == 10200547328  # the worker's rank 1 is smaller
    assert merged.phase == "kv_allocated"  # the worker never reaches api_up
    assert merged.phases == {"spark-head": "api_up", "spark-worker": "kv_allocated"}
    assert merged.engine_errors == {}
    assert [s.as_dict() for s in merged.suggestions] == [
        {"requested_limit_bytes": 10531412787, "gpu_limit_bytes": 26843545600, "rank": 0, "node": "spark-head"},
        {"requested_limit_bytes": 10200547328, "gpu_limit_bytes": 26600000000, "rank": 1, "node": "spark-worker"},
    ]
    assert choose_kv_bytes(merged.suggestions, "full") == 26600000000


def test_merge_reports_errors_and_max_len() -> None:
    merged = merge_reports({
        "a": LogReport(estimated_max_model_len=131072, phase="kv_allocated", engine_error="x"),
        "b": LogReport(estimated_max_model_len=120000, phase="rendezvous"),
        "c": LogReport(),
    })
    assert merged.estimated_max_model_len == 120000
    assert merged.phase == "container_started"
    assert merged.engine_errors == {"a": "x"}
    assert merged.kv_cache_memory_bytes is None
    assert merged.as_dict()["phases"] == {"a": "kv_allocated", "b": "rendezvous", "c": "container_started"}


def test_merge_no_reports() -> None:
    merged = merge_reports({})
    assert (merged.phase, merged.kv_cache_memory_bytes, merged.estimated_max_model_len) == (
        "container_started", None, None)


# ---------------------------------------------------------------------------------------------------------
# parse_log on inline text

def test_parse_log_empty() -> None:
    report = parse_log("")
    assert report.as_dict() == {
        "suggestions": [], "kv_cache_memory_bytes": None, "estimated_max_model_len": None,
        "kv_cache_tokens": None, "kv_cache_pool": None, "max_concurrency": None, "available_kv_cache_gib": None,
        "cpu_kv_cache": None, "phase": "container_started", "phase_line": None, "engine_error": None,
        "error_line": None, "starts_seen": 0, "last_line": None, "shards_done": None, "shards_total": None,
        "progress_lines": 0, "start_seen": False,
    }


def test_parse_log_only_latest_start_suggestions() -> None:
    first = SUGGESTION.format(n1=111, g1="", n2=222, g2="")
    second = SUGGESTION.format(n1=333, g1="", n2=444, g2="")
    text = "\n".join([
        f"(APIServer pid=1) INFO 11-30 20:00:01 [api_server.py:1] {VERSION}",
        f"(Worker_TP0 pid=9) INFO 11-30 20:00:02 [gpu_worker.py:1] {first}",
        f"(APIServer pid=1) INFO 11-30 20:10:01 [api_server.py:1] {VERSION}",
        f"(Worker_TP0 pid=9) INFO 11-30 20:10:02 [gpu_worker.py:1] {second}",
    ])
    report = parse_log(text)
    assert report.kv_cache_memory_bytes == 333
    assert report.starts_seen == 2


# ---------------------------------------------------------------------------------------------------------
# load progress: checkpoint shards and the lines a stall watch sees move

SHARDS_50 = "Loading safetensors checkpoint shards:  50% Completed | 40/80 [01:02<01:02,  0.64it/s]"
SHARDS_EAGER = "Loading safetensors checkpoint shards (eager):  25% Completed | 20/80 [00:31<01:33,  0.64it/s]"
SHM_WAIT = ("(EngineCore pid=26) INFO 12-01 00:15:14 [shm_broadcast.py:466] No available shared memory broadcast "
            "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
            "time-consuming work (e.g. compilation, weight/kv cache loading).")
TS = "2026-12-01T00:15:12.496703695Z "


@pytest.mark.parametrize("messages, expected", [
    ((), (None, None)),
    (("no progress bar here", WORLD0, "Loading weights took 41.91 seconds"), (None, None)),
    ((SHARDS_50,), (40, 80)),
    ((SHARDS_EAGER,), (20, 80)),
    (("Loading safetensors checkpoint shards:   0% Completed | 0/80 [00:00<?, ?it/s]",), (0, 80)),
    (("Loading safetensors checkpoint shards: 100% Completed | 80/80 [02:04<00:00,  0.64it/s]",), (80, 80)),
    # the latest progress line wins, whatever follows it
    (("Loading safetensors checkpoint shards:   0% Completed | 0/80 [00:00<?, ?it/s]", SHARDS_EAGER, SHARDS_50,
      "something else"), (40, 80)),
])
def test_parse_shards(messages: tuple[str, ...], expected: tuple[int | None, int | None]) -> None:
    assert parse_shards(_lines(*messages)) == expected


def test_parse_shards_through_docker_timestamps_prefixes_and_carriage_returns() -> None:
    # vLLM's bar as `docker logs --timestamps` shows it: the `\r` comes after the timestamp, and one Docker
    # line may carry several `\r`-separated updates
    text = (TS + "\r(Worker_TP0 pid=9) Loading safetensors checkpoint shards:   0% Completed | 0/80 "
            "[00:00<?, ?it/s]\r\n"
            + TS + "\r" + SHARDS_EAGER + "\r" + SHARDS_50 + "\r\n")
    assert parse_shards(normalise(text)) == (40, 80)


@pytest.mark.parametrize("messages, expected", [
    ((), 0),
    (("", "   ", "\t"), 0),
    (("one", "", "two", "  three  "), 3),
    ((SHARDS_50, SHARDS_50), 2),   # a repeated line is still a line written
    (("No available shared memory broadcast block found in 60 seconds.",
      "No available shared memory broadcast block found in 1 second.", "real work"), 1),
])
def test_count_progress_lines(messages: tuple[str, ...], expected: int) -> None:
    assert count_progress_lines(_lines(*messages)) == expected


def test_wait_notices_with_their_prefixes_are_not_progress() -> None:
    lines = normalise("\n".join([TS + "(EngineCore pid=26) INFO 12-01 00:15:10 [core.py:1] working", TS + SHM_WAIT,
                                 SHM_WAIT, TS]))
    assert count_progress_lines(lines) == 1


def _log(*lines: str) -> str:
    return "".join(TS + line + "\n" for line in lines)


def test_parse_log_reports_shards_and_progress_lines() -> None:
    report = parse_log(_log(VERSION, ARGS, WORLD0, "\r" + SHARDS_EAGER, "\r" + SHARDS_50))
    assert (report.shards_done, report.shards_total, report.progress_lines) == (40, 80, 5)
    got = report.as_dict()
    assert (got["shards_done"], got["shards_total"], got["progress_lines"]) == (40, 80, 5)


def test_parse_log_progress_moves_with_work_not_with_wait_notices() -> None:
    lines = [VERSION, ARGS, WORLD0, SHARDS_50]
    before = parse_log(_log(*lines))
    waiting = parse_log(_log(*lines, SHM_WAIT, SHM_WAIT))
    assert (waiting.shards_done, waiting.progress_lines) == (before.shards_done, before.progress_lines)
    worked = parse_log(_log(*lines, "Loading weights took 41.91 seconds"))
    assert worked.progress_lines == before.progress_lines + 1
    loaded = parse_log(_log(*lines, SHARDS_50.replace("50%", "51%").replace("40/80", "41/80")))
    assert (loaded.shards_done, loaded.progress_lines) == (41, before.progress_lines + 1)


def test_parse_log_counts_progress_of_the_latest_start_only() -> None:
    first = [VERSION, ARGS, WORLD0, SHARDS_50, "first start line a", "first start line b"]
    report = parse_log(_log(*first, VERSION, ARGS, WORLD0))
    assert report.starts_seen == 2
    assert (report.shards_done, report.shards_total, report.progress_lines) == (None, None, 3)
    report = parse_log(_log(*first, VERSION, ARGS, WORLD0, SHARDS_EAGER))
    assert (report.shards_done, report.shards_total, report.progress_lines) == (20, 80, 4)


@pytest.mark.parametrize("name, expected", [
    ("fmt_gpu_single_node_tp2_ready.log", (41, 41)),
    ("lab_cpu_tp2_head_ready.log.gz", (1, 1)),
    ("lab_cpu_tp2_worker_ready.log.gz", (None, None)),   # the progress bar is rank 0's only
    ("fmt_gpu_head_two_starts.log", (None, None)),
])
def test_parse_log_shards_of_fixtures(name: str, expected: tuple[int | None, int | None]) -> None:
    report = parse_log(_read(name))
    assert (report.shards_done, report.shards_total) == expected
    assert report.progress_lines > 0


def test_start_seen_only_while_the_start_marker_is_in_the_log() -> None:
    text = read_log("lab_cpu_tp2_head_ready.log.gz")
    full = parse_log(text)
    assert full.start_seen and full.phase == "api_up"
    # the json-file log rotated: only the last 20 lines are left (no start marker, phases after the banner)
    rotated = parse_log("\n".join(text.splitlines()[-20:]))
    assert not rotated.start_seen


@pytest.mark.parametrize("raw", [
    "2026-12-01T07:05:12.123456789Z (EngineCore pid=42) INFO 12-01 07:05:12 [core.py:93] world_size=2 rank=1",
    "INFO 12-01 07:05:30 [gpu_model_runner.py:2] Model loading took 7.1 GiB and 20.5 seconds",
    "INFO 12-01 07:06:00 [kv_cache_utils.py:3] GPU KV cache size: 1,048,576 tokens",
    "INFO 12-01 07:06:30 [api_server.py:4] Starting vLLM API server 0 on http://0.0.0.0:8000",
    "INFO 12-01 07:05:00 [api_server.py:5] vLLM API server version 0.11.0",
    "ERROR 12-01 07:05:40 [core.py:6] EngineCore failed to start.",
    "Traceback (most recent call last):",
])
def test_a_phase_a_start_or_an_error_is_notable(raw: str) -> None:
    assert notable_line(raw) is True


@pytest.mark.parametrize("raw", [
    "Loading safetensors checkpoint shards:  50% Completed | 40/80 [00:20<00:20,  2.00it/s]",
    "INFO 12-01 07:05:20 [gpu_model_runner.py:7] Starting to load model /models/glm53...",
    "WARNING 12-01 07:05:21 [config.py:8] Casting torch.bfloat16 to torch.float16.",
    "",
])
def test_progress_and_routine_lines_are_not_notable(raw: str) -> None:
    assert notable_line(raw) is False


def test_every_line_that_moves_a_recorded_start_on_is_notable() -> None:
    # whatever line detect_phase takes a phase from in a real start, the follower wakes on it
    for name in ("lab_cpu_tp2_head_ready.log.gz", "lab_cpu_tp2_worker_ready.log.gz"):
        raws = read_log(name).splitlines()
        lines = normalise("\n".join(raws))
        moved = [i for i in range(1, len(lines)) if detect_phase(lines[:i + 1])[0] != detect_phase(lines[:i])[0]]
        assert len(moved) >= 3   # the recorded start goes through its phases
        for i in moved:
            assert notable_line(raws[i]), (name, i, raws[i])
