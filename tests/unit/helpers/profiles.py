"""The built-in profiles as the controller reads them (profiles/*.yml through plugin_utils/_profile_files)."""
from __future__ import annotations

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import Profile, build_profiles
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import TEMPLATE_KEYS
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data


def builtin_profiles() -> dict[str, Profile]:
    return build_profiles(builtin_profile_data(), None, TEMPLATE_KEYS)


PROFILES = builtin_profiles()
