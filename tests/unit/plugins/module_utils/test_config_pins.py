# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The configuration step and pins: an unpinned image or revision is a warning, an error with require_pins."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import ConfigError, Inputs, resolve
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data

BUILTIN = builtin_profile_data()
DIGEST = "sha256:" + "a" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def inputs(image_digest: str = "", **cluster: Any) -> Inputs:
    shared = {f"dgxspark_vllm_{key}": value for key, value in {"cx7_subnet": "192.168.100.0/24", **cluster}.items()}
    hostvars = {"spark-a": {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.11"},
                "spark-b": {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.12"}}
    return Inputs(hostvars=hostvars, head=["spark-a"], workers=["spark-b"], builtin_profiles=BUILTIN,
                  ansible_user="spark", image_digest=image_digest)


def test_the_profiles_tag_and_branch_are_warnings_that_name_the_variable_and_the_profile() -> None:
    config = resolve(inputs())
    assert config["require_pins"] is False
    image, revision = config["unpinned"]
    assert image.startswith("dgxspark_vllm_image 'ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8' is a tag")
    assert "dgxspark_vllm_image: ghcr.io/tonyd2wild/vllm-glm53-flash@sha256:<digest>" in image
    assert image.endswith("[the value comes from profile glm53_flash_nvfp4]")
    assert revision.startswith("dgxspark_vllm_model_revision 'main' of RedHatAI/GLM-5.3-Flash-NVFP4 is not a commit")


@pytest.mark.parametrize(("given", "image_digest"), [
    ({"image": f"ghcr.io/tonyd2wild/vllm-glm53-flash@{DIGEST}", "model_revision": COMMIT}, ""),
    ({"model_revision": COMMIT}, DIGEST),                  # the image role's image_digest pins the tag
])
def test_pinned_values_warn_of_nothing_and_pass_require_pins(given: dict[str, Any], image_digest: str) -> None:
    config = resolve(inputs(image_digest, require_pins=True, **given))
    assert config["unpinned"] == [] and config["require_pins"] is True


def test_require_pins_refuses_each_unpinned_value_before_anything_starts() -> None:
    with pytest.raises(ConfigError) as failure:
        resolve(inputs(require_pins="yes", model_revision=COMMIT))
    found = [problem for problem in failure.value.problems if "require_pins" in problem]
    assert len(found) == 1
    assert found[0].startswith("dgxspark_vllm_image 'ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8' is a tag")
    assert "dgxspark_vllm_require_pins is true" in found[0] and "dgxspark_vllm_require_pins: false" in found[0]


def test_require_pins_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError) as failure:
        resolve(inputs(require_pins="sometimes"))
    assert any(problem.startswith("dgxspark_vllm_require_pins must be true or false")
               for problem in failure.value.problems)
