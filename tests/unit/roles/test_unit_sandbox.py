# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The systemd units the collection installs run sandboxed (the flush service and its follow mode, the group guard,
the firewall, and any unit template a role gains): every unit, rendered from its role template with the role
defaults, carries the sandbox directives with the values chosen for what its program does, and systemd-analyze
security rates it 5.0 or lower.

What each program needs, and why each value, is in the units' comments and the roles' READMEs.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from helpers.units import ROOT, render, unit_templates, units, write_units
import pytest

FLUSH, FOLLOW, GUARD, FIREWALL = ("dgxspark-cache-flush.service", "dgxspark-cache-flush-follow.service",
                                  "dgxspark-group-guard.service", "dgxspark-firewall.service")
UNITS = (FLUSH, FOLLOW, GUARD, FIREWALL)
ALL_UNITS = tuple(sorted(units()))   # these and any unit a role gains: the common sandbox and the figure
MAX_EXPOSURE = 5.0   # systemd-analyze security: up to 5.0 is OK or MEDIUM, above it EXPOSED or UNSAFE

# The same in every unit: root with a bounded capability set, read-only system, no devices, kernel and clock left
# alone, no new privileges, namespaces, realtime, set-uid files, W+X memory or foreign ABIs, a system call filter.
COMMON = {
    "AmbientCapabilities": [""],
    "NoNewPrivileges": ["yes"],
    "PrivateMounts": ["yes"],
    "ProtectSystem": ["strict"],
    "ProtectHome": ["yes"],
    "PrivateDevices": ["yes"],
    "ProtectKernelModules": ["yes"],
    "ProtectKernelLogs": ["yes"],
    "ProtectControlGroups": ["yes"],
    "ProtectClock": ["yes"],
    "ProtectHostname": ["yes"],
    "ProtectProc": ["invisible"],
    "RestrictNamespaces": ["yes"],
    "LockPersonality": ["yes"],
    "MemoryDenyWriteExecute": ["yes"],
    "RestrictRealtime": ["yes"],
    "RestrictSUIDSGID": ["yes"],
    "SystemCallArchitectures": ["native"],
    "SystemCallFilter": ["@system-service", "~@privileged @resources"],
    "SystemCallErrorNumber": ["EPERM"],
}


def _flush(name: str) -> dict:
    return {
        **COMMON,
        "User": ["root"],
        # uid 0 writes vm.drop_caches without any capability; the docker socket is root's own
        "CapabilityBoundingSet": [""],
        "PrivateTmp": ["yes"],
        # the docker socket and the notify socket are files: a network namespace of its own is enough
        "PrivateNetwork": ["yes"],
        "RestrictAddressFamilies": ["AF_UNIX"],
        "RuntimeDirectory": [name],
        "Environment": ["DOCKER_CONFIG=%t/" + name],
    }


EXPECTED = {
    FLUSH: _flush("dgxspark-cache-flush"),
    FOLLOW: _flush("dgxspark-cache-flush-follow"),
    GUARD: {
        **COMMON,
        "User": ["root"],
        "CapabilityBoundingSet": [""],
        "ProtectKernelTunables": ["yes"],
        "PrivateTmp": ["yes"],
        "RestrictAddressFamilies": ["AF_UNIX AF_INET AF_INET6"],
        "ReadWritePaths": ["/var/lib/dgxspark-guard"],
        "RuntimeDirectory": ["dgxspark-guard"],
        "RuntimeDirectoryPreserve": ["yes"],
        "Environment": ["DOCKER_CONFIG=%t/dgxspark-guard/docker"],
    },
    FIREWALL: {
        **COMMON,
        "CapabilityBoundingSet": ["CAP_NET_ADMIN"],
        "ProtectKernelTunables": ["yes"],
        "ProcSubset": ["pid"],
        "RestrictAddressFamilies": ["AF_NETLINK AF_UNIX"],
        "InaccessiblePaths": ["-/tmp -/var/tmp"],
    },
}
# Set in no unit: what no program here uses, and what would break one (see the tests below).
ABSENT = {
    FLUSH: ("ProtectKernelTunables", "ReadWritePaths", "ReadOnlyPaths"),
    FOLLOW: ("ProtectKernelTunables", "ReadWritePaths", "ReadOnlyPaths"),
    GUARD: ("PrivateNetwork", "ProcSubset"),
    FIREWALL: ("User", "PrivateTmp", "PrivateNetwork", "ReadWritePaths", "RuntimeDirectory"),   # root, the default
}


def sections(text: str) -> dict:
    """{section: {key: [values in order]}} of a unit file (comments and blank lines skipped)."""
    out: dict = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = out.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, "not a unit file line: %r" % line
        current.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture(name="rendered", scope="module")
def rendered_fixture() -> dict:
    return {name: sections(text) for name, text in units().items()}


def test_the_units_found_are_the_collections():
    """Every role's unit template is rendered (the flush template twice: its follow mode), these four among them."""
    templates = unit_templates()
    assert {("cache_flush", "cache-flush.service.j2"), ("guard", "guard.service.j2"),
            ("firewall", "firewall.service.j2")} <= set(templates)
    assert set(UNITS) <= set(ALL_UNITS)
    assert len(ALL_UNITS) == len(templates) + 1


@pytest.mark.parametrize("name", ALL_UNITS)
def test_every_unit_has_the_common_sandbox(rendered, name):
    """A unit a role gains is sandboxed like these: a bounded capability set and the directives of COMMON."""
    service = rendered[name]["Service"]
    assert "CapabilityBoundingSet" in service, name
    for key, values in COMMON.items():
        assert service.get(key) == values, "%s: %s" % (name, key)


@pytest.mark.parametrize("name", UNITS)
def test_each_unit_has_its_sandbox(rendered, name):
    service = rendered[name]["Service"]
    for key, values in EXPECTED[name].items():
        assert service.get(key) == values, "%s: %s" % (name, key)
    for key in ABSENT[name]:
        assert key not in service, "%s: %s" % (name, key)


@pytest.mark.parametrize("name", (FLUSH, FOLLOW))
def test_the_flush_units_keep_proc_sys_writable(rendered, name):
    """ProtectKernelTunables=yes would make /proc/sys read-only: the flush could not write vm.drop_caches (its start
    checks that drop_caches is writable and fails). ProtectSystem=strict leaves /proc alone, so strict is kept."""
    service = rendered[name]["Service"]
    assert "ProtectKernelTunables" not in service
    assert service["ProtectSystem"] == ["strict"]


def test_a_test_rig_drop_caches_file_gets_its_folder_writable():
    """cache_flush_drop_caches_path off /proc (a test rig): the folder holding the file is the one writable path."""
    rendered = sections(units(cache_flush_drop_caches_path="/var/lib/rig/drop_caches")[FLUSH])["Service"]
    assert rendered["ReadWritePaths"] == ["/var/lib/rig"]


def test_the_guard_writes_where_its_state_file_is():
    rendered = sections(units(guard_state_path="/srv/guard/state/state.json")[GUARD])["Service"]
    assert rendered["ReadWritePaths"] == ["/srv/guard/state"]


def test_the_flush_and_follow_units_have_runtime_folders_of_their_own(rendered):
    """Both run at once on a node (the load-window unit and the follow mode); each stop removes its own folder."""
    assert rendered[FLUSH]["Service"]["RuntimeDirectory"] != rendered[FOLLOW]["Service"]["RuntimeDirectory"]


def test_the_firewall_still_runs_before_the_network(rendered):
    """The sandbox adds no ordering: no PrivateTmp= (it would order the unit after systemd-tmpfiles-setup.service,
    after local-fs.target, and need /tmp writable), and the early-boot dependencies as before."""
    unit = rendered[FIREWALL]["Unit"]
    assert unit["DefaultDependencies"] == ["no"]
    assert unit["Wants"] == ["network-pre.target"]
    assert unit["Before"] == ["network-pre.target docker.service shutdown.target"]
    assert unit["Conflicts"] == ["shutdown.target"]
    after = " ".join(unit.get("After", [])).split()
    assert not {"systemd-tmpfiles-setup.service", "local-fs.target", "sysinit.target", "basic.target"} & set(after)
    assert "RequiresMountsFor" not in unit
    assert "PrivateTmp" not in rendered[FIREWALL]["Service"]
    assert rendered[FIREWALL]["Install"]["WantedBy"] == ["sysinit.target"]


# ---------------------------------------------------------------- systemd-analyze security


def _systemd_analyze() -> tuple:
    """(path, version) of systemd-analyze, or (None, why not)."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        return None, "systemd-analyze is not installed here"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"systemd (\d+)", out)
    if match is None:
        return None, "systemd-analyze --version says %r" % out[:80]
    if int(match.group(1)) < 250:
        return None, "systemd-analyze %s has no security --offline (systemd 250 added it)" % match.group(1)
    return exe, int(match.group(1))


ANALYZE, ANALYZE_VERSION = _systemd_analyze()
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason=str(ANALYZE_VERSION))


def exposure(unit_file: Path) -> float:
    proc = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(unit_file)],
                          capture_output=True, text=True, check=False, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", proc.stdout)
    assert match, "systemd-analyze security %s: exit %d, %s %s" % (unit_file.name, proc.returncode, proc.stdout[-500:],
                                                                   proc.stderr[-500:])
    return float(match.group(1))


def readme_figures() -> dict:
    """{unit: exposure} from the README's table of units (`| `unit` | ... | 9.6 → 1.1 |` rows)."""
    rows = re.findall(r"^\| `(dgxspark-[a-z-]+)` \|.*\| [\d.]+ \S+ → ([\d.]+) \S+ \|$",
                      (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    return {name + ".service": float(figure) for name, figure in rows}


@needs_analyze
@pytest.mark.parametrize("name", ALL_UNITS)
def test_systemd_analyze_rates_each_unit_ok_or_medium(tmp_path, name):
    figure = exposure(write_units(tmp_path)[name])
    assert figure <= MAX_EXPOSURE, "%s: exposure %.1f" % (name, figure)


def test_the_readme_gives_each_units_figure():
    """The README's table names these units (and only units the collection installs) with figures within the goal."""
    figures = readme_figures()
    assert set(UNITS) <= set(figures) <= set(ALL_UNITS)
    assert all(figure <= MAX_EXPOSURE for figure in figures.values()), figures


@pytest.mark.skipif(ANALYZE_VERSION != 252, reason="the README's figures are systemd 252's (the lab's node image, "
                    "Debian 12); systemd-analyze here: %s" % ANALYZE_VERSION)
def test_the_readmes_figures_are_the_ones_measured(tmp_path):
    paths = write_units(tmp_path)
    figures = readme_figures()
    assert {name: exposure(paths[name]) for name in figures} == figures


def test_the_guard_requires_the_firewall_while_it_is_on():
    """With the firewall on, the guard restores no rank without its table: its unit requires the firewall's."""
    on = sections(render("guard", "guard.service.j2"))["Unit"]
    assert on["Requires"] == ["dgxspark-firewall.service"]
    assert "dgxspark-firewall.service" in on["After"]
    off = sections(render("guard", "guard.service.j2", dgxspark_vllm_config={"firewall": False}))["Unit"]
    assert "Requires" not in off and "dgxspark-firewall.service" not in off["After"]
