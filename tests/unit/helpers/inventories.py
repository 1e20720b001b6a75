"""The collection's inventories as a user would have them: the example ones with their placeholders filled in."""
from __future__ import annotations

import shutil
from pathlib import Path

INVENTORIES = Path(__file__).resolve().parents[3] / "inventories"
# What a user writes over inventories/example's placeholders: their own user and addresses of their own networks.
FILLED = {"<YOUR_USER>": "spark", "192.0.2.": "192.168.1.", "198.51.100.": "192.168.100.",
          "203.0.113.": "192.168.101.", "2001:db8:": "fd00:77:"}


def fill(text: str) -> str:
    for placeholder, value in FILLED.items():
        text = text.replace(placeholder, value)
    return text


def filled_copy(name: str, destination: Path) -> Path:
    """A copy of inventories/<name> with every placeholder replaced (FILLED), as a user's inventory."""
    target = destination / name
    shutil.copytree(INVENTORIES / name, target)
    for path in target.rglob("*.yml"):
        path.write_text(fill(path.read_text(encoding="utf-8")), encoding="utf-8")
    return target
