# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """The descriptions of the attributes every module of the collection declares (support and details stay in each module)."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation
      indicates no change.
"""

    # The attributes of a module that only computes on the controller (plans, judges): extend with
    # dgxspark.vllm.attributes.pure next to dgxspark.vllm.attributes.
    PURE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Pure computation; the result is the same in check mode.
  diff_mode:
    support: none
    details: Nothing changes, so there is nothing to diff.
  idempotent:
    support: full
    details: Never changes anything.
"""
