# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Units as people read them (private: may change at any time)."""
from __future__ import annotations


def human_bytes(value: int | None) -> str:
    """Decimal units as disks and the recipe count them: 185000000000 -> '185.0 GB'."""
    if value is None:
        return "unknown"
    for unit, size in (("TB", 10 ** 12), ("GB", 10 ** 9), ("MB", 10 ** 6), ("kB", 10 ** 3)):
        if abs(value) >= size:
            return "%.1f %s" % (value / size, unit)
    return "%d B" % value
