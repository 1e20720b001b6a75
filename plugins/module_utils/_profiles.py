# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving profiles: data in one schema, checked and turned into a `Profile`.

Private module: may change at any time. Pure: no I/O, no Ansible imports. The built-in profiles are YAML files
under the collection's ``profiles/`` folder (read on the controller by ``plugin_utils/_profile_files.py``); a
user's profiles come from the inventory (``dgxspark_vllm_profiles``). Both go through `build_profiles`, so a
built-in profile and a user's are the same thing.

Schema of one profile (every key optional except where noted):

``description``  free text.
``extends``      another profile's name: its data is the base, this one's keys change it (below).
``launcher``     ``docker_run`` (the launch role renders the container) or ``exl3_kit`` (the kit's start.sh).
                 Required without ``extends``.
``staging_layout`` ``local_dir`` (a flat tree at model_path) or ``hf_cache`` (the hub cache under hf_home).
``settings``     the profile's defaults for the cluster settings (`SETTING_KEYS`): merged key by key over the
                 base's; a null value unsets the base's. Among them the model's shape (`MODEL_KEYS`: its
                 config.json's ``num_attention_heads`` and ``num_key_value_heads``), which the config step checks the
                 tensor-parallel size against; a profile that extends another and serves another ``model_repo``
                 gives its own.
``container``    ``gpus`` (``all`` or null), ``devices``, ``ulimits``, ``capabilities``, ``volumes`` (lists),
                 ``network_mode``, ``ipc_mode``: merged key by key over the base's.
``env``          NAME: template, in ``docker run`` order; over a base, a known name keeps its place and takes the
                 new value, a new name is appended.
``remove_env``   names of the base's env left out.
``optional_env`` env names left out (instead of an error) when their placeholder's value is unset.
``args``         a list of ``--flag`` (no value) or ``{--flag: template}``; over a base, as for env.
``remove_args``  flags of the base left out.
``trust_remote_code`` true when vLLM must run the checkpoint's own Python (its config.json names an architecture
                 vLLM does not register, through ``auto_map``): renders ``--trust-remote-code``. Default false, and
                 the flag is refused in ``args`` and ``extra_args``: the container runs as root, so a profile says
                 why its model needs it. Over a base, the base's value unless given.

Templates: an env value, a volume or a flag value is a literal or a ``{name}`` placeholder filled by
`_serve_spec` from the settings and the node being rendered (see `_serve_spec.TEMPLATE_KEYS`).
"""
from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

LAUNCHERS = ("docker_run", "exl3_kit")
LAYOUTS = ("local_dir", "hf_cache")
DEFAULT_PROFILE = "glm53_flash_nvfp4"

# The settings a profile may give defaults for: what the render takes, and what staging takes.
RENDER_KEYS: tuple[str, ...] = (
    "image", "container_name", "model_path", "served_model_name", "host", "port", "master_port", "master_addr",
    "tensor_parallel_size", "pipeline_parallel_size", "gpus_per_node", "gpu_memory_utilization",
    "allow_high_gpu_memory_utilization", "max_model_len", "kv_cache_memory_bytes", "cx7_subnet", "cx7_iface",
    "ib_hca", "gid_index", "cache_path", "shm_size", "speculative_config", "default_chat_template_kwargs",
    "extra_env", "remove_env", "extra_args", "remove_args", "distributed_timeout_seconds", "log_max_size",
    "log_max_file",
)
STAGING_KEYS: tuple[str, ...] = ("model_repo", "model_revision", "drafter_repo", "drafter_revision")
# The model's shape: how many attention and KV heads the tensor-parallel ranks split (config.json's
# num_attention_heads and num_key_value_heads).
MODEL_KEYS: tuple[str, ...] = ("attention_heads", "kv_heads")
SETTING_KEYS: tuple[str, ...] = RENDER_KEYS + STAGING_KEYS + MODEL_KEYS

# The value of a setting no profile sets (the render's own defaults for optional keys).
UNSET_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "extra_env": MappingProxyType({}), "remove_env": (), "extra_args": (), "remove_args": (),
    "pipeline_parallel_size": 1, "gpus_per_node": 1, "allow_high_gpu_memory_utilization": False,
    "host": "0.0.0.0", "drafter_repo": "", "model_revision": "main", "drafter_revision": "main",
    "log_max_size": "100m", "log_max_file": 5,
})

_PROFILE_KEYS = frozenset({"description", "extends", "launcher", "staging_layout", "settings", "container", "env",
                           "remove_env", "optional_env", "args", "remove_args", "trust_remote_code"})
TRUST_REMOTE_CODE = "--trust-remote-code"
_CONTAINER_KEYS = frozenset({"gpus", "devices", "ulimits", "capabilities", "volumes", "network_mode", "ipc_mode"})
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9-]*$")


class ProfileError(ValueError):
    """Profiles that cannot be used; ``problems`` lists every one, each naming the profile and the key."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Profile:
    """One way of serving: launcher, container options, env, vLLM flags and default settings."""

    name: str
    description: str
    settings: Mapping[str, Any]
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[tuple[str, str | None], ...] = ()
    volumes: tuple[str, ...] = ()
    gpus: str | None = None
    devices: tuple[str, ...] = ()
    ulimits: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    network_mode: str = "host"
    ipc_mode: str = "host"
    # env names left out (instead of an error) when their placeholder's value is unset
    optional_env: frozenset[str] = frozenset()
    launcher: str = "docker_run"
    staging_layout: str = "local_dir"
    # vLLM runs the checkpoint's own Python (--trust-remote-code): only a model whose architecture vLLM lacks
    trust_remote_code: bool = False
    source: str = "built-in"
    data: Mapping[str, Any] = field(default_factory=dict, compare=False)


# --------------------------------------------------------------------------- checks of one profile's data


def _strings(where: str, value: Any, problems: list[str]) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        problems.append(f"{where} must be a list of strings, got {value!r}")
        return []
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            problems.append(f"{where}[{index}] must be a non-empty string, got {item!r}")
        else:
            out.append(item)
    return out


def _template_ok(where: str, template: str, known: frozenset[str], problems: list[str]) -> None:
    try:
        fields = [name for _lit, name, _spec, _conv in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        problems.append(f"{where} {template!r} is not a valid template ({exc}); write a literal {{ as {{{{")
        return
    for name in fields:
        if name not in known:
            problems.append(f"{where} {template!r} uses unknown placeholder {{{name}}}; known: "
                            f"{', '.join(sorted(known))}")


def _env_items(where: str, value: Any, problems: list[str]) -> list[tuple[str, str]]:
    if not isinstance(value, Mapping):
        problems.append(f"{where} must be a mapping of NAME: value, got {value!r}")
        return []
    out = []
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            problems.append(f"{where}: {name!r} is not an environment variable name")
        elif isinstance(item, bool) or not isinstance(item, (str, int, float)):
            problems.append(f"{where}.{name} must be a string (quote numbers and booleans), got {item!r}")
        else:
            out.append((name, str(item)))
    return out


def _arg_items(where: str, value: Any, problems: list[str]) -> list[tuple[str, str | None]]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        problems.append(f"{where} must be a list of --flag or {{--flag: value}} items, got {value!r}")
        return []
    out: list[tuple[str, str | None]] = []
    for index, item in enumerate(value):
        here = f"{where}[{index}]"
        if isinstance(item, str):
            flag, template = item, None
        elif isinstance(item, Mapping) and len(item) == 1:
            flag, raw = next(iter(item.items()))
            if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
                problems.append(f"{here}: the value of {flag} must be a string (quote numbers), got {raw!r}")
                continue
            template = str(raw)
        else:
            problems.append(f"{here} must be --flag or {{--flag: value}}, got {item!r}")
            continue
        if not isinstance(flag, str) or not _FLAG.match(flag):
            problems.append(f"{here}: {flag!r} is not a flag name such as --max-num-seqs")
            continue
        if flag == "--headless":
            problems.append(f"{here}: --headless is added on every worker and never on the head; "
                            "a profile must not list it")
            continue
        if flag == TRUST_REMOTE_CODE:
            problems.append(f"{here}: {TRUST_REMOTE_CODE} is rendered from the profile's trust_remote_code: set "
                            "trust_remote_code: true, with a comment that says why the model needs it (its "
                            "config.json's architectures and auto_map), instead of listing the flag")
            continue
        if any(flag == seen for seen, _t in out):
            problems.append(f"{here}: {flag} is listed twice")
            continue
        out.append((flag, template))
    return out


def _merge_items(base: list[tuple[str, Any]], new: list[tuple[str, Any]], remove: list[str]) -> list[tuple[str, Any]]:
    """Base order, new values in place, new names appended, removed names dropped."""
    updates = dict(new)
    merged = [(name, updates.pop(name) if name in updates else value) for name, value in base]
    merged += [(name, value) for name, value in new if name in updates]
    return [(name, value) for name, value in merged if name not in set(remove)]


def _resolve_one(name: str, raw: Mapping[str, Any], base: Profile | None, source: str,
                 known_placeholders: frozenset[str], problems: list[str]) -> Profile | None:
    where = f"profile {name}"
    count = len(problems)
    unknown = sorted(str(key) for key in raw if key not in _PROFILE_KEYS)
    if unknown:
        problems.append(f"{where} has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_PROFILE_KEYS))}")
    description = raw.get("description", base.description if base else "")
    if not isinstance(description, str):
        problems.append(f"{where}: description must be text, got {description!r}")
        description = ""
    launcher = raw.get("launcher", base.launcher if base else None)
    if launcher not in LAUNCHERS:
        problems.append(f"{where}: launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    layout = raw.get("staging_layout", base.staging_layout if base else "local_dir")
    if layout not in LAYOUTS:
        problems.append(f"{where}: staging_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")

    settings = dict(base.settings) if base else {}
    raw_settings = raw.get("settings") or {}
    if not isinstance(raw_settings, Mapping):
        problems.append(f"{where}: settings must be a mapping of setting: value, got {raw_settings!r}")
        raw_settings = {}
    for key, value in raw_settings.items():
        if key not in SETTING_KEYS:
            problems.append(f"{where}: settings.{key} is not a setting; known: {', '.join(SETTING_KEYS)}")
        elif value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    repo = raw_settings.get("model_repo")
    if base is not None and "model_repo" in raw_settings and repo != base.settings.get("model_repo"):
        inherited = [f"settings.{key}" for key in MODEL_KEYS if key not in raw_settings and key in base.settings]
        if inherited:
            problems.append(f"{where} serves {repo!r}, another model than {base.name}'s "
                            f"({base.settings.get('model_repo')!r}), but takes {' and '.join(inherited)} from it: give "
                            "the head counts of its own config.json (num_attention_heads, num_key_value_heads; the "
                            "tensor-parallel size is checked against them)")

    container = raw.get("container") or {}
    if not isinstance(container, Mapping):
        problems.append(f"{where}: container must be a mapping, got {container!r}")
        container = {}
    for key in sorted(str(key) for key in container if key not in _CONTAINER_KEYS):
        problems.append(f"{where}: container.{key} is not known; known: {', '.join(sorted(_CONTAINER_KEYS))}")

    def listed(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        if key not in container:
            return default
        return tuple(_strings(f"{where}: container.{key}", container[key] or [], problems))

    gpus = container.get("gpus", base.gpus if base else None)
    if gpus not in (None, "all"):
        problems.append(f"{where}: container.gpus must be all or null, got {gpus!r}")
    modes = {}
    for key in ("network_mode", "ipc_mode"):
        modes[key] = container.get(key, getattr(base, key) if base else "host")
        if not isinstance(modes[key], str) or not modes[key]:
            problems.append(f"{where}: container.{key} must be a non-empty string, got {modes[key]!r}")
    volumes = listed("volumes", base.volumes if base else ())
    for index, volume in enumerate(volumes):
        _template_ok(f"{where}: container.volumes[{index}]", volume, known_placeholders, problems)

    remove_env = _strings(f"{where}: remove_env", raw.get("remove_env") or [], problems)
    env = _merge_items(list(base.env) if base else [],
                       _env_items(f"{where}: env", raw.get("env") or {}, problems), remove_env)
    for env_name, template in env:
        _template_ok(f"{where}: env.{env_name}", template, known_placeholders, problems)
    remove_args = _strings(f"{where}: remove_args", raw.get("remove_args") or [], problems)
    args = _merge_items(list(base.args) if base else [],
                        _arg_items(f"{where}: args", raw.get("args") or [], problems), remove_args)
    for flag, template in args:
        if template is not None:
            _template_ok(f"{where}: args {flag}", template, known_placeholders, problems)
    trust = raw.get("trust_remote_code", base.trust_remote_code if base else False)
    if not isinstance(trust, bool):
        problems.append(f"{where}: trust_remote_code must be true or false, got {trust!r}")
    optional = set(base.optional_env) if base else set()
    optional.update(_strings(f"{where}: optional_env", raw.get("optional_env") or [], problems))
    if launcher == "docker_run" and not args and len(problems) == count:
        problems.append(f"{where}: a docker_run profile needs args (the vLLM flags); extend a built-in profile "
                        "(extends: glm53_flash_nvfp4) to start from the recipe's")
    if len(problems) > count:
        return None
    return Profile(
        name=name, description=description, settings=MappingProxyType(settings), env=tuple(env),
        args=tuple(args), volumes=volumes, gpus=gpus, devices=listed("devices", base.devices if base else ()),
        ulimits=listed("ulimits", base.ulimits if base else ()),
        capabilities=listed("capabilities", base.capabilities if base else ()),
        network_mode=modes["network_mode"], ipc_mode=modes["ipc_mode"], optional_env=frozenset(optional),
        launcher=str(launcher), staging_layout=str(layout), trust_remote_code=trust is True, source=source,
        data=MappingProxyType(dict(raw)),
    )


def build_profiles(builtin: Mapping[str, Mapping[str, Any]], user: Mapping[str, Any] | None,
                   known_placeholders: frozenset[str]) -> dict[str, Profile]:
    """Every profile, built-in and the user's, resolved through ``extends``; ProfileError lists every problem.

    A user's profile may not reuse a built-in name (extend it instead).
    """
    problems: list[str] = []
    raw: dict[str, tuple[Mapping[str, Any], str]] = {}
    for name, data in builtin.items():
        raw[name] = (data, "built-in")
    if user is not None and not isinstance(user, Mapping):
        raise ProfileError([f"dgxspark_vllm_profiles must be a mapping of name: profile, got {user!r}"])
    for name, data in (user or {}).items():
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(f"dgxspark_vllm_profiles: {name!r} is not a profile name (letters, digits, _)")
            continue
        if name in builtin:
            problems.append(f"dgxspark_vllm_profiles.{name}: {name} is a built-in profile; give yours another name "
                            f"and extends: {name}")
            continue
        if not isinstance(data, Mapping):
            problems.append(f"dgxspark_vllm_profiles.{name} must be a mapping (description, extends, settings, "
                            f"env, args, ...), got {data!r}")
            continue
        raw[name] = (data, "inventory (dgxspark_vllm_profiles)")
    done: dict[str, Profile] = {}

    def build(name: str, chain: tuple[str, ...]) -> Profile | None:
        if name in done:
            return done[name]
        data, source = raw[name]
        parent = data.get("extends")
        base = None
        if parent is not None:
            if parent not in raw:
                problems.append(f"profile {name}: extends {parent!r}, which is not a profile; known: "
                                f"{', '.join(sorted(raw))}")
                return None
            if parent in chain:
                problems.append(f"profile {name}: extends forms a loop ({' -> '.join(chain + (name, parent))})")
                return None
            base = build(parent, chain + (name,))
            if base is None:
                return None
        profile = _resolve_one(name, data, base, source, known_placeholders, problems)
        if profile is not None:
            done[name] = profile
        return profile

    for name in raw:
        build(name, ())
    if problems:
        raise ProfileError(list(dict.fromkeys(problems)))
    return done


def as_data(profile: Profile) -> dict[str, Any]:
    """A resolved profile as plain data in the schema above, without ``extends`` (it is already applied)."""
    return {
        "name": profile.name,
        "description": profile.description,
        "source": profile.source,
        "launcher": profile.launcher,
        "staging_layout": profile.staging_layout,
        "settings": {key: plain(value) for key, value in profile.settings.items()},
        "container": {"gpus": profile.gpus, "devices": list(profile.devices), "ulimits": list(profile.ulimits),
                      "capabilities": list(profile.capabilities), "volumes": list(profile.volumes),
                      "network_mode": profile.network_mode, "ipc_mode": profile.ipc_mode},
        "env": dict(profile.env),
        "optional_env": sorted(profile.optional_env),
        "args": [flag if template is None else {flag: template} for flag, template in profile.args],
        "trust_remote_code": profile.trust_remote_code,
    }


def from_data(data: Mapping[str, Any], known_placeholders: frozenset[str]) -> Profile:
    """The `Profile` of `as_data`'s output (a resolved profile passed between tasks); ProfileError if broken."""
    if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
        raise ProfileError([f"profile data must be a mapping with a name, got {data!r}"])
    body = {key: value for key, value in data.items() if key not in ("name", "source")}
    profiles = build_profiles({data["name"]: body}, None, known_placeholders)
    profile = profiles[data["name"]]
    return Profile(**{**profile.__dict__, "source": str(data.get("source", profile.source))})


def plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists, scalars as their base types (JSON-ready; also drops the
    subclasses a templating engine wraps values in)."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value
