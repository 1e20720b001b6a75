# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The built-in serving profiles: the YAML files in the collection's ``profiles/`` folder, read on the controller.

Private: may change at any time. The files are data in `_profiles`' schema; a profile's name is its file's name.
"""
from __future__ import annotations

import os
from typing import Any

import yaml

PROFILES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "profiles")


class ProfileFileError(Exception):
    """A built-in profile file that cannot be read (a broken installation of the collection)."""


def builtin_profile_data(folder: str = PROFILES_DIR) -> dict[str, Any]:
    """name -> the profile's data, for every ``*.yml`` in ``folder``."""
    data: dict[str, Any] = {}
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".yml"))
    except OSError as exc:
        raise ProfileFileError(f"the collection's profiles folder {folder} cannot be read ({exc}): "
                               "reinstall the collection") from None
    for file_name in names:
        path = os.path.join(folder, file_name)
        try:
            with open(path, encoding="utf-8") as handle:
                body = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise ProfileFileError(f"the built-in profile {path} cannot be read: {exc}") from None
        if not isinstance(body, dict):
            raise ProfileFileError(f"the built-in profile {path} is not a mapping")
        data[file_name[:-len(".yml")]] = body
    if not data:
        raise ProfileFileError(f"no built-in profile in {folder}: reinstall the collection")
    return data
