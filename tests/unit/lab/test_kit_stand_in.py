# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's stand-in EXL3 kit (lab/kit): its .env.example and start.sh against the collection's model of the kit.

start.sh is run only up to the checks it makes before touching any node (no lab needed).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KIT_DIR = ROOT / "lab" / "kit"
START_SH = KIT_DIR / "start.sh"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make_env_example = _load("dgxspark_lab_make_env_example", KIT_DIR / "make_env_example.py")
kit = make_env_example.load_kit()


def test_committed_env_example_matches_the_generator():
    assert (KIT_DIR / ".env.example").read_text(encoding="utf-8") == make_env_example.render(kit), (
        "lab/kit/.env.example is out of date: run python3 lab/kit/make_env_example.py")


def test_env_example_has_every_key_of_the_model_in_order():
    lines = [line for line in (KIT_DIR / ".env.example").read_text(encoding="utf-8").splitlines()
             if re.match(r"^(# )?[A-Z][A-Z0-9_]*=", line)]
    assert [line.removeprefix("# ").split("=", 1)[0] for line in lines] == [key.name for key in kit.EXAMPLE_KEYS]
    assert [not line.startswith("# ") for line in lines] == [key.active for key in kit.EXAMPLE_KEYS]


def test_start_sh_fallbacks_are_the_kit_defaults():
    text = START_SH.read_text(encoding="utf-8")
    block = re.search(r"^KIT_DEFAULTS=\((.*?)^\)", text, re.S | re.M).group(1)
    pairs = [word.split("=", 1) for word in shlex.split(block, comments=True)]
    assert dict(pairs) == dict(kit.KIT_KEYS)
    assert [pair[0] for pair in pairs] == list(kit.KIT_KEYS)


def test_start_sh_parses():
    subprocess.run(["bash", "-n", str(START_SH)], check=True)


@pytest.fixture(name="checkout")
def fixture_checkout(tmp_path):
    for name in ("start.sh", ".env.example"):
        shutil.copy2(KIT_DIR / name, tmp_path / name)
    return tmp_path


def run(checkout: Path, env: dict[str, str] | None = None, *args: str) -> subprocess.CompletedProcess:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(checkout), "USER": "spark"}
    clean.update(env or {})
    return subprocess.run(["bash", str(checkout / "start.sh"), *args], env=clean, capture_output=True, text=True,
                          timeout=60, check=False)


def test_missing_env_is_copied_from_the_example(checkout):
    result = run(checkout)
    assert result.returncode == 1
    assert (checkout / ".env").read_text() == (checkout / ".env.example").read_text()
    assert "copied .env.example to .env" in result.stdout


def test_without_skip_download_and_sync_it_stops_before_any_node(checkout):
    result = run(checkout, {"SKIP_DOWNLOAD": "1"})
    assert result.returncode == 1
    assert "does not download" in result.stderr and "SKIP_DOWNLOAD=1 SKIP_SYNC=1" in result.stderr


@pytest.mark.parametrize(("env", "message"), [
    ({"GPU_MEM_UTIL": "1.5"}, "GPU_MEM_UTIL=1.5"),
    ({"GPU_MEM_UTIL": "0.0"}, "GPU_MEM_UTIL=0.0"),
    ({"MAX_MODEL_LEN": "1000001"}, "MAX_MODEL_LEN=1000001"),
    ({"MAX_NUM_SEQS": "0"}, "MAX_NUM_SEQS=0"),
    ({"MAX_NUM_BATCHED_TOKENS": "8388609"}, "MAX_NUM_BATCHED_TOKENS=8388609"),
    ({"GLM53_INDEXER_WORKSPACE": "big"}, "GLM53_INDEXER_WORKSPACE=big"),
    ({"GLM53_SPINWAIT_MS": "1001"}, "GLM53_SPINWAIT_MS=1001"),
])
def test_validate_numeric_config(checkout, env, message):
    result = run(checkout, env)
    assert result.returncode == 1
    assert message in result.stderr


def test_caller_overrides_win_over_env_only_for_the_kits_list(checkout):
    env_file = (checkout / ".env.example").read_text()
    (checkout / ".env").write_text(env_file + "MAX_MODEL_LEN=4096\nPORT=8888\nMASTER_PORT=29521\n")
    # MAX_MODEL_LEN is one of the kit's snapshotted overrides: the caller's value wins over .env
    assert "MAX_MODEL_LEN=1000001" in run(checkout, {"MAX_MODEL_LEN": "1000001"}).stderr
    # MASTER_PORT is not: .env wins, so the caller's clash with PORT never happens
    result = run(checkout, {"MASTER_PORT": "8888"})
    assert "MASTER_PORT" not in result.stderr and "does not download" in result.stderr


def test_port_and_master_port_must_differ(checkout):
    (checkout / ".env").write_text((checkout / ".env.example").read_text() + "MASTER_PORT=8888\n")
    assert "PORT and MASTER_PORT are both 8888" in run(checkout).stderr


def test_unknown_subcommand_prints_usage(checkout):
    result = run(checkout, None, "bogus")
    assert result.returncode == 2 and "./start.sh stop" in result.stderr
