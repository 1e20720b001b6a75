"""Read a captured log from tests/fixtures/vllm_logs: plain ``*.log`` or gzip'd ``*.log.gz``.

Logs captured from a real engine are stored gzip'd, byte for byte (vLLM's progress bars end lines with
``\\r\\n``, which a plain text file in the collection may not carry). Both read as text with universal
newlines, as ``docker logs`` output read by the modules is.
"""
import gzip
import os

FIXTURE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "vllm_logs")
SUFFIXES = (".log", ".log.gz")


def read_log(name: str) -> str:
    path = os.path.join(FIXTURE_DIR, name)
    if name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def log_names() -> set:
    return {name for name in os.listdir(FIXTURE_DIR) if name.endswith(SUFFIXES)}
