# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade's disk check reads the free bytes where the new commit goes: of the model path, or, when the path is not
made yet (a teardown purged the checkpoint, a new model path), of its nearest existing parent. The task's own script,
rendered as Ansible renders it, runs here against real folders; its output is what the planner parses."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from ansible_collections.dgxspark.vllm.plugins.module_utils._stage_disk import parse_df

ROOT = Path(__file__).resolve().parents[3]


def _script(path: str) -> str:
    tasks = yaml.safe_load((ROOT / "roles" / "upgrade" / "tasks" / "disk.yml").read_text(encoding="utf-8"))
    probe = [task for task in tasks if task.get("register") == "__upgrade_disk_df"]
    assert len(probe) == 1
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["ansible.builtin.quote"] = shlex.quote
    return env.from_string(probe[0]["ansible.builtin.shell"]["cmd"]).render(item=path)


@pytest.mark.parametrize("relative", ["models/tiny-glm53", "models/not/made/yet", "models/with space/x"])
def test_the_free_bytes_come_from_the_path_or_its_nearest_existing_parent(tmp_path: Path, relative: str) -> None:
    (tmp_path / "models").mkdir()
    if relative == "models/tiny-glm53":
        (tmp_path / relative).mkdir()
    done = subprocess.run(["sh", "-c", _script(str(tmp_path / relative))], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    found = parse_df(done.stdout)
    expected = os.statvfs(tmp_path)
    assert found["avail"] > 0 and abs(found["avail"] - expected.f_bavail * expected.f_frsize) < 1 << 30
    assert str(tmp_path).startswith(found["target"])
